//! The accept loop, with the bounds a connection meets before and between its requests:
//!
//! - at most `server.max_connections` open at once: one more is answered `503` with
//!   `Retry-After: 1` and closed (`tutor_gateway_refused_total{limit="connections"}`), never
//!   left hanging; fewer where the process's open-file limit could not hold them
//!   ([`super::fds`], with a warning at start);
//! - its first request head complete within `server.header_read_timeout` of being accepted,
//!   or the connection is closed. The clock starts at the accept, not at the first byte: a
//!   client that connects and says nothing, sends half a head (slow loris), or sends only the
//!   HTTP/2 preface holds its seat no longer than that. With TLS ([`super::tls`]) the
//!   handshake, in the connection's own task, is inside the same bound;
//! - after a request, idle (no request in progress: an HTTP/1 keep-alive connection between
//!   requests, an HTTP/2 connection with no open stream) for `server.keep_alive_idle`, or the
//!   connection is closed (HTTP/2: `GOAWAY`); the next head must be complete within it. A
//!   request in progress (an SSE stream included, however long) is never cut by it
//!   ([`super::idle`] says what counts);
//! - on HTTP/2, a `PING` every [`H2_PING_INTERVAL`]; a connection that does not answer one
//!   within [`H2_PING_TIMEOUT`] is closed (a peer that vanished mid-stream);
//! - a request head of at most `server.max_head_bytes` (HTTP/1: as sent, which bounds what a
//!   connection buffers of a head still arriving; HTTP/2: the decoded header list), else 431;
//! - at most [`H2_MAX_STREAMS`] concurrent HTTP/2 streams per connection;
//! - `TCP_NODELAY`, so small SSE writes go out at once;
//! - writes that fail once the client has taken nothing for twice `server.client_write_timeout`
//!   ([`WriteTimeout`]): a client that stops reading loses its connection.
//!
//! A connection asked to close (idle, or at shutdown) that has not closed within [`END_WAIT`]
//! (an HTTP/2 peer that never acknowledges the `GOAWAY`, say) is dropped.
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
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::idle::Activity;
use super::resets::Resets;
use super::tls::TlsFront;
use super::write_timeout::WriteTimeout;
use crate::config::ServerConfig;
use crate::relay::{ConnectionCloser, Drain};
use crate::telemetry::Metrics;

/// Concurrent HTTP/2 streams one connection may open.
pub const H2_MAX_STREAMS: u32 = 64;

/// Bytes of a stream's answer HTTP/2 may buffer for a client that has not opened its window.
pub const H2_SEND_BUFFER_BYTES: usize = 64 << 10;

/// How often an HTTP/2 connection is pinged.
pub const H2_PING_INTERVAL: Duration = Duration::from_secs(20);

/// How long an HTTP/2 ping may go unanswered before the connection is closed.
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// What a connection beyond `server.max_connections` gets before it is closed.
const REFUSAL_BODY: &str = r#"{"error":{"message":"the gateway has as many open connections as it may; retry shortly","type":"server_error","param":null,"code":"overloaded"}}"#;

/// How long connections get, once their streams were ended (or, on the admin listener, once
/// it stopped), to write their last bytes before they are closed; and how long a connection
/// asked to close gets to do so.
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

/// When a connection is asked to close, besides shutdown.
#[derive(Debug, Clone, Copy)]
struct Idle {
    /// Its first request head must be complete by then (accept + header timeout).
    first_head_by: Instant,
    /// Idle this long after a request: closed.
    keep_alive: Duration,
}

/// Serves `router` on `listener` until `shutdown.stop`, then drains (see the module doc). Its
/// open connections are `tutor_gateway_connections_open{listener=name}`.
pub async fn serve(
    listener: TcpListener,
    name: &'static str,
    router: Router,
    server: &ServerConfig,
    metrics: Metrics,
    tls: Option<TlsFront>,
    shutdown: Shutdown,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    // Heads are bounded by the connection's own timers (from the accept, and between
    // requests), not by hyper's header timer, which starts at a head's first byte.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        // A head still arriving is buffered up to this, not hyper's 400 KB: every open
        // connection may hold one.
        .max_buf_size(server.max_head_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(server.max_head_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(H2_MAX_STREAMS)
        // What a stream's answer may hold in HTTP/2's send buffer beyond the relay's own
        // buffer (hyper's default is 400 KiB a stream).
        .max_send_buf_size(H2_SEND_BUFFER_BYTES)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    // Asks every connection to finish its requests and close (shutdown).
    let finish = CancellationToken::new();
    let close_now = CancellationToken::new();
    // Every connection's task, so shutdown can wait for them (none is left detached).
    let conns = TaskTracker::new();
    let files = super::fds::open_file_limit();
    let cap =
        super::fds::connection_cap(server.max_connections, server.max_requests_in_flight, files);
    if cap < server.max_connections {
        tracing::warn!(
            max_connections = server.max_connections,
            max_requests_in_flight = server.max_requests_in_flight,
            open_file_limit = files.unwrap_or_default(),
            accepting = cap,
            "the open-file limit cannot hold server.max_connections plus an upstream connection \
             per request in flight: connections are capped at this many (beyond, 503); raise \
             the limit (ulimit -n, systemd LimitNOFILE=) or lower the settings"
        );
    }
    let open = Arc::new(Semaphore::new(cap));
    // "Too many open files" and the like, logged at most once a second.
    let mut accept_errors: (u64, Option<tokio::time::Instant>) = (0, None);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    accept_errors.0 += 1;
                    let now = tokio::time::Instant::now();
                    if accept_errors.1.is_none_or(|t| now >= t) {
                        tracing::warn!(error = %e, failures = accept_errors.0, "accept failed");
                        accept_errors = (0, Some(now + Duration::from_secs(1)));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = shutdown.stop.cancelled() => break,
        };
        let idle = Idle {
            first_head_by: Instant::now() + server.header_read_timeout,
            keep_alive: server.keep_alive_idle,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an accepted connection");
        }
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            metrics.refused("connections");
            // A TLS client would read a plain-text answer as a broken handshake: closed.
            if tls.is_none() {
                conns.spawn(refuse(tcp));
            }
            continue;
        };
        // Given back, and counted down, when the connection's task ends.
        let seat = (permit, metrics.connection_open(name));
        let (builder, router, metrics) = (builder.clone(), router.clone(), metrics.clone());
        let (finish, close_now) = (finish.clone(), close_now.clone());
        let acceptor = tls.as_ref().map(TlsFront::acceptor);
        // Twice the stream's own limit: a stream's pump cuts a client that takes nothing for
        // client_write_timeout first (recording client_too_slow and aborting the engine's
        // work); the connection's guard is the backstop for everything else.
        let backstop = server.client_write_timeout.saturating_mul(2);
        conns.spawn(async move {
            let activity = Activity::new();
            // Closed by a stream cut for not reading whose body the connection never takes
            // down (an HTTP/2 window kept at zero): `relay::client`.
            let closer = ConnectionCloser::new();
            let resets = Resets::new(closer.clone(), metrics.clone());
            let service = activity.track(router, closer.clone(), resets);
            let served = async {
                match acceptor {
                    None => {
                        let tcp = WriteTimeout::new(tcp, backstop);
                        let conn =
                            builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                        drive(conn, &activity, idle, &finish).await;
                    }
                    Some(acceptor) => {
                        // Plain HTTP sent to a TLS listener: answered in plain HTTP, saying to
                        // use https (a TLS alert reads as a broken connection to a curl or a
                        // browser).
                        if plain_http(&tcp, idle.first_head_by).await {
                            refuse_plain_http(tcp).await;
                            return;
                        }
                        let tcp = WriteTimeout::new(tcp, backstop);
                        let handshake = acceptor.accept(tcp);
                        let Ok(Ok(tls)) =
                            tokio::time::timeout_at(idle.first_head_by, handshake).await
                        else {
                            return;
                        };
                        let conn =
                            builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
                        drive(conn, &activity, idle, &finish).await;
                    }
                }
            };
            tokio::select! {
                () = served => {}
                () = close_now.cancelled() => {}
                () = closer.closed() => {}
                // A response the server could not hand on for as long (an HTTP/2 window kept
                // shut never blocks a socket write): `idle`.
                () = activity_stalled(&activity, backstop) => {}
            }
            drop(seat);
        });
    }
    drop(listener);
    finish.cancel();
    conns.close();
    if tokio::time::timeout(shutdown.grace, conns.wait())
        .await
        .is_err()
    {
        let grace_ms = shutdown.grace.as_millis() as u64;
        match &shutdown.drain {
            Some(drain) => {
                tracing::warn!(grace_ms, "shutdown grace over; ending open streams");
                drain.end_streams();
                if tokio::time::timeout(END_WAIT, conns.wait()).await.is_err() {
                    tracing::warn!(
                        "connections still open after their streams ended; closing them"
                    );
                    close_now.cancel();
                }
            }
            None => close_now.cancel(),
        }
    }
    // Closed connections end at their next poll; this bounds a task stuck elsewhere.
    if tokio::time::timeout(END_WAIT, conns.wait()).await.is_err() {
        tracing::warn!(
            open = conns.len(),
            "connection tasks still running at shutdown"
        );
    }
}

/// Serves one connection until it ends. It is asked to close (finish its requests, then close;
/// HTTP/2: `GOAWAY`) when it stays idle past its bounds ([`Idle`]) or at shutdown (`finish`),
/// and dropped if it has not closed [`END_WAIT`] after an idle close was asked.
async fn drive<C: GracefulConnection>(
    conn: C,
    activity: &Activity,
    idle: Idle,
    finish: &CancellationToken,
) {
    tokio::pin!(conn);
    let idle_close = activity.until_idle(idle.first_head_by, idle.keep_alive);
    tokio::pin!(idle_close);
    let mut finishing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = &mut idle_close => {
                if !finishing {
                    conn.as_mut().graceful_shutdown();
                }
                let _ = tokio::time::timeout(END_WAIT, conn.as_mut()).await;
                return;
            }
            // Shutdown: the requests in progress may take the grace period (the accept loop
            // ends them through `close_now` after it).
            () = finish.cancelled(), if !finishing => {
                conn.as_mut().graceful_shutdown();
                finishing = true;
            }
        }
    }
}

/// Returns once a response of the connection waited `limit` for its client to take bytes.
async fn activity_stalled(activity: &Activity, limit: Duration) {
    activity.until_stalled(limit).await;
    tracing::debug!(
        limit_ms = limit.as_millis() as u64,
        "closing a connection whose client took nothing of a response for twice \
         server.client_write_timeout_ms"
    );
}

/// The answer to plain HTTP on a TLS listener.
const TLS_ONLY_BODY: &str = r#"{"error":{"message":"this port speaks TLS only (server.tls_cert): use https://","type":"invalid_request_error","param":null,"code":"tls_required"}}"#;

/// Whether a connection to a TLS listener opened with plain HTTP: its first byte, waited for
/// until `by`, is an upper-case letter (a method: `GET`, `POST`, ...), where a TLS client sends a
/// handshake record (0x16). No byte by then, or a closed connection: not plain HTTP (the
/// handshake's own deadline then ends it).
async fn plain_http(tcp: &TcpStream, by: Instant) -> bool {
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(by, tcp.peek(&mut first)).await {
        Ok(Ok(1)) => first[0].is_ascii_uppercase(),
        _ => false,
    }
}

/// Answers plain HTTP on a TLS listener with 400 `tls_required` and closes, after reading what
/// the client sent: a socket closed with unread bytes sends a reset, which the client may see
/// before the answer.
async fn refuse_plain_http(tcp: TcpStream) {
    answer_and_close(tcp, "400 Bad Request", "", TLS_ONLY_BODY, true).await;
}

/// Answers a connection over the limit with a 503 and closes it. What the client sent is not
/// read: a flood of connections over the limit must not each stay open for its second.
async fn refuse(tcp: TcpStream) {
    answer_and_close(
        tcp,
        "503 Service Unavailable",
        "retry-after: 1\r\n",
        REFUSAL_BODY,
        false,
    )
    .await;
}

/// Writes a fixed JSON answer (`status`: the status line's code and reason; `headers`: further
/// header lines, each ending in CRLF) and closes the connection, all within a second. With
/// `drain`, the client's bytes are then read and dropped (at most 1 MiB) until it closes.
async fn answer_and_close(
    mut tcp: TcpStream,
    status: &str,
    headers: &str,
    body: &str,
    drain: bool,
) {
    use tokio::io::AsyncReadExt;
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{headers}connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let answer = async {
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(body.as_bytes()).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 16 * 1024];
        let mut read = 0usize;
        while drain && read < 1 << 20 {
            match tcp.read(&mut sink).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}
