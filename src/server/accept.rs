//! The accept loop, with the bounds a connection meets before any request is read:
//!
//! - at most `server.max_connections` open at once: one more is answered `503` with
//!   `Retry-After: 1` and closed (`tutor_gateway_refused_total{limit="connections"}`), never
//!   left hanging;
//! - request headers within `server.header_read_timeout`, or the connection is closed (a
//!   slow-loris client holds its seat no longer than that);
//! - at most [`H2_MAX_STREAMS`] concurrent HTTP/2 streams per connection;
//! - `TCP_NODELAY`, so small SSE writes go out at once;
//! - writes that fail once the client has taken nothing for `server.client_write_timeout`
//!   ([`WriteTimeout`]): a client that stops reading loses its connection;
//! - with TLS ([`super::tls`]), the handshake in the connection's own task, within
//!   `server.header_read_timeout` (a client that never finishes it holds its seat no longer).
//!
//! On shutdown ([`Shutdown`]) it stops accepting and asks every connection to finish its
//! requests and close, then waits up to the grace period. On the public listener the streams
//! still open then are ended through the gateway's [`Drain`] (each gets its `shutdown` error
//! event, aborts its engine work and gives its seat back) and get [`END_WAIT`] to write that
//! event; a connection still open after that is closed. It returns only when every
//! connection's task has ended, so nothing of a request outlives it.

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
use tokio_util::task::TaskTracker;

use super::tls::TlsFront;
use super::write_timeout::WriteTimeout;
use crate::config::ServerConfig;
use crate::relay::Drain;
use crate::telemetry::Metrics;

/// Concurrent HTTP/2 streams one connection may open.
pub const H2_MAX_STREAMS: u32 = 64;

/// What a connection beyond `server.max_connections` gets before it is closed.
const REFUSAL_BODY: &str = r#"{"error":{"message":"the gateway has as many open connections as it may; retry shortly","type":"server_error","param":null,"code":"overloaded"}}"#;

/// How long connections get, once their streams were ended (or, on the admin listener, once
/// it stopped), to write their last bytes before they are closed.
pub const END_WAIT: Duration = Duration::from_secs(1);

/// How a listener shuts down.
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// Stops accepting when cancelled.
    pub stop: CancellationToken,
    /// How long open connections get to finish their requests.
    pub grace: Duration,
    /// Set on the public listener: the streams still open when the grace is over are ended
    /// through it. Without it the connections are closed then.
    pub drain: Option<Drain>,
}

/// Serves `router` on `listener` until `shutdown.stop`, then drains (see the module doc).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    server: &ServerConfig,
    metrics: Metrics,
    tls: Option<TlsFront>,
    shutdown: Shutdown,
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
    // Every connection's task, so shutdown can wait for them (none is left detached).
    let conns = TaskTracker::new();
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
            () = shutdown.stop.cancelled() => break,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an accepted connection");
        }
        let Ok(seat) = Arc::clone(&open).try_acquire_owned() else {
            metrics.refused("connections");
            conns.spawn(refuse(tcp));
            continue;
        };
        let (builder, router, watcher) = (builder.clone(), router.clone(), graceful.watcher());
        let close_now = close_now.clone();
        let acceptor = tls.as_ref().map(TlsFront::acceptor);
        let handshake_within = server.header_read_timeout;
        let tcp = WriteTimeout::new(tcp, server.client_write_timeout);
        conns.spawn(async move {
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
    let all_closed = graceful.shutdown();
    tokio::pin!(all_closed);
    if tokio::time::timeout(shutdown.grace, &mut all_closed)
        .await
        .is_err()
    {
        let grace_ms = shutdown.grace.as_millis() as u64;
        match &shutdown.drain {
            Some(drain) => {
                tracing::warn!(grace_ms, "shutdown grace over; ending open streams");
                drain.end_streams();
                if tokio::time::timeout(END_WAIT, &mut all_closed)
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        "connections still open after their streams ended; closing them"
                    );
                    close_now.cancel();
                }
            }
            None => close_now.cancel(),
        }
    }
    conns.close();
    // Closed connections end at their next poll; this bounds a task stuck elsewhere.
    if tokio::time::timeout(END_WAIT, conns.wait()).await.is_err() {
        tracing::warn!(
            open = conns.len(),
            "connection tasks still running at shutdown"
        );
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
