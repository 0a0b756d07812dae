//! The accept loop, with the bounds a connection meets before any request is read:
//!
//! - at most `server.max_connections` open at once: one more is answered `503` with
//!   `Retry-After: 1` and closed (`tutor_gateway_refused_total{limit="connections"}`), never
//!   left hanging;
//! - request headers within `server.header_read_timeout`, or the connection is closed (a
//!   slow-loris client holds its seat no longer than that);
//! - at most [`H2_MAX_STREAMS`] concurrent HTTP/2 streams per connection;
//! - `TCP_NODELAY`, so small SSE writes go out at once;
//! - with TLS ([`super::tls`]), the handshake in the connection's own task, within
//!   `server.header_read_timeout` (a client that never finishes it holds its seat no longer).
//!
//! On shutdown it stops accepting, asks every connection to finish its requests and close,
//! waits up to the grace period, then closes what is left (their relays abort the engine work).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::tls::TlsFront;
use crate::config::ServerConfig;
use crate::telemetry::Metrics;

/// Concurrent HTTP/2 streams one connection may open.
pub const H2_MAX_STREAMS: u32 = 64;

/// What a connection beyond `server.max_connections` gets before it is closed.
const REFUSAL_BODY: &str = r#"{"error":{"message":"the gateway has as many open connections as it may; retry shortly","type":"server_error","param":null,"code":"overloaded"}}"#;

/// Serves `router` on `listener` until `stop`, then drains for up to `grace`.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: TcpListener,
    router: Router,
    server: &ServerConfig,
    metrics: Metrics,
    tls: Option<TlsFront>,
    stop: CancellationToken,
    grace: Duration,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS);
    let graceful = GracefulShutdown::new();
    let close_now = CancellationToken::new();
    let open = Arc::new(Semaphore::new(server.max_connections));
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an accepted connection");
        }
        let Ok(seat) = Arc::clone(&open).try_acquire_owned() else {
            metrics.refused("connections");
            tokio::spawn(refuse(tcp));
            continue;
        };
        let (builder, router, watcher) = (builder.clone(), router.clone(), graceful.watcher());
        let close_now = close_now.clone();
        let acceptor = tls.as_ref().map(TlsFront::acceptor);
        let handshake_within = server.header_read_timeout;
        tokio::spawn(async move {
            let service = TowerToHyperService::new(router);
            let served = async {
                match acceptor {
                    None => {
                        let conn =
                            builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                        let _ = watcher.watch(conn.into_owned()).await;
                    }
                    Some(acceptor) => {
                        let Ok(Ok(tls)) =
                            tokio::time::timeout(handshake_within, acceptor.accept(tcp)).await
                        else {
                            return;
                        };
                        let conn =
                            builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
                        let _ = watcher.watch(conn.into_owned()).await;
                    }
                }
            };
            tokio::select! {
                () = served => {}
                () = close_now.cancelled() => {}
            }
            drop(seat);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(grace_ms = grace.as_millis() as u64, "shutdown grace over; closing open streams");
            close_now.cancel();
        }
    }
}

/// Answers a connection over the limit with a 503 and closes it.
async fn refuse(mut tcp: TcpStream) {
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        REFUSAL_BODY.len()
    );
    let write = async {
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(REFUSAL_BODY.as_bytes()).await?;
        tcp.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}
