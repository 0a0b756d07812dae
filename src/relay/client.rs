//! The client's side of a stream: a bounded buffer between the relay's pump, which reads vLLM
//! at the engine's pace, and the HTTP response body, which takes from it as the client reads.
//!
//! - The pump never waits for the client. A frame goes in at once, unless more than
//!   `server.client_buffer_bytes` would then wait in the buffer ([`Full`]; a frame always goes
//!   into an empty buffer, whatever its size): the client is that far behind the engine.
//! - [`ClientTx::stalled`] resolves once bytes have waited `server.client_write_timeout` with
//!   the client taking none of them.
//! - The response body ([`ClientBody`]) yields the frames in order and ends when the pump is
//!   done with them; after [`ClientTx::cut`] it ends with an error instead, so the server
//!   closes the connection (HTTP/1) or resets the stream (HTTP/2) when it next writes.
//! - Dropping the body (the client went away) resolves [`ClientTx::closed`] at once.
//! - Once the pump is done ([`ClientTx::finish`]: the engine's stream ended), the client still
//!   takes what is buffered at its own pace, under the same rule: nothing taken for
//!   `server.client_write_timeout` while bytes wait, and it is cut. And it must take all of it
//!   within the write timeout plus the time the buffered bytes need at [`MIN_DRAIN_RATE`]: a
//!   client taking a few bytes every 20 s (each take restarts the write timeout) otherwise held
//!   its request's permit and the buffer for hours after the engine had finished.
//! - A cut body that is still not dropped `server.client_write_timeout` after the cut closes
//!   the client's connection ([`ConnectionCloser`]). The server takes the body's error only when
//!   it next writes, which a client that keeps its window closed never lets happen: an HTTP/2
//!   stream whose flow-control window stays at zero is never polled again, while the
//!   connection answers pings. Closing it drops the body and, with it, the request's
//!   `server.max_requests_in_flight` permit, its tenant's slot and the buffered bytes.
//!
//! One per stream; memory is bounded by the buffer size plus the frame being sent.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;

/// The slowest a client may take a finished stream's buffered bytes, bytes a second (a 32
/// kbit/s link, a poor mobile one): the whole buffer (`server.client_buffer_bytes`, 1 MiB by
/// default) in 256 s, on top of the write timeout.
pub const MIN_DRAIN_RATE: u64 = 4 * 1024;

/// How far a stream's client may fall behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// `server.client_buffer_bytes`: bytes read from vLLM waiting for the client, at most.
    pub buffer_bytes: usize,
    /// `server.client_write_timeout`: longest the client may take nothing while bytes wait.
    pub write_timeout: Duration,
}

impl ClientLimits {
    /// The limits configured in `[server]`.
    pub fn from_config(server: &ServerConfig) -> Self {
        Self {
            buffer_bytes: server.client_buffer_bytes,
            write_timeout: server.client_write_timeout,
        }
    }
}

/// Closes one client connection at once, every stream on it with it: the server's side
/// waits on [`ConnectionCloser::closed`], a stream's side calls [`ConnectionCloser::close`]
/// (see the module doc). Each request on a connection the server accepted carries it in its
/// extensions.
#[derive(Debug, Clone, Default)]
pub struct ConnectionCloser(CancellationToken);

impl ConnectionCloser {
    /// A closer for a new connection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the server to close the connection now.
    pub fn close(&self) {
        self.0.cancel();
    }

    /// Resolves once [`ConnectionCloser::close`] was called.
    pub async fn closed(&self) {
        self.0.cancelled().await;
    }

    /// Whether [`ConnectionCloser::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// The frame did not fit: the client is more than the buffer behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Full;

/// What the pump and the body share.
#[derive(Debug)]
struct Shared {
    /// Bytes put in and not yet taken.
    buffered: AtomicUsize,
    /// When the body last took a frame: milliseconds after `base`, plus one (0: never).
    taken_at_ms: AtomicU64,
    base: Instant,
    /// The pump cut the client: the body ends with an error.
    cut: AtomicBool,
}

impl Shared {
    fn taken_at(&self) -> Option<Instant> {
        match self.taken_at_ms.load(Ordering::Acquire) {
            0 => None,
            ms => Some(self.base + Duration::from_millis(ms.saturating_sub(1))),
        }
    }

    /// When bytes waiting since `waiting_since` have waited `timeout` with the client taking
    /// none of them.
    fn stall_deadline(&self, waiting_since: Instant, timeout: Duration) -> Instant {
        let since = self
            .taken_at()
            .map_or(waiting_since, |t| t.max(waiting_since));
        since + timeout
    }
}

/// A new buffer for one stream: the pump's end and the response body.
pub(super) fn buffer(
    limits: ClientLimits,
    connection: Option<ConnectionCloser>,
) -> (ClientTx, ClientBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        buffered: AtomicUsize::new(0),
        taken_at_ms: AtomicU64::new(0),
        base: Instant::now(),
        cut: AtomicBool::new(false),
    });
    let pump = ClientTx {
        tx,
        shared: Arc::clone(&shared),
        limits,
        waiting_since: Instant::now(),
        connection,
    };
    (pump, ClientBody { rx, shared })
}

/// The pump's end of the buffer.
#[derive(Debug)]
pub(super) struct ClientTx {
    tx: mpsc::UnboundedSender<Bytes>,
    shared: Arc<Shared>,
    limits: ClientLimits,
    /// When the buffer last went from empty to holding bytes.
    waiting_since: Instant,
    /// The client's connection (`None`: served without the gateway's accept loop).
    connection: Option<ConnectionCloser>,
}

/// The write timeout's timer of one stream, reset as its client takes bytes.
#[derive(Debug)]
pub(super) struct Watch(Pin<Box<Sleep>>);

impl ClientTx {
    /// Puts `frame` in the buffer, unless the client is more than the buffer behind. A client
    /// that already went away is not an error here ([`ClientTx::closed`] tells).
    pub(super) fn send(&mut self, frame: Bytes) -> Result<(), Full> {
        let len = frame.len();
        let before = self.shared.buffered.load(Ordering::Acquire);
        if before > 0 && before.saturating_add(len) > self.limits.buffer_bytes {
            return Err(Full);
        }
        if before == 0 {
            self.waiting_since = Instant::now();
        }
        self.shared.buffered.fetch_add(len, Ordering::AcqRel);
        let _ = self.tx.send(frame);
        Ok(())
    }

    /// Resolves when the client has gone away (the response body was dropped).
    pub(super) async fn closed(&self) {
        self.tx.closed().await;
    }

    /// A timer for [`ClientTx::stalled`].
    pub(super) fn watch(&self) -> Watch {
        Watch(Box::pin(tokio::time::sleep(self.limits.write_timeout)))
    }

    /// Resolves once bytes have waited the write timeout without the client taking any. Never
    /// resolves while the buffer is empty (only [`ClientTx::send`] fills it). Cancel-safe.
    pub(super) async fn stalled(&self, watch: &mut Watch) {
        let watch = &mut watch.0;
        loop {
            if self.shared.buffered.load(Ordering::Acquire) == 0 {
                return std::future::pending().await;
            }
            let deadline = self
                .shared
                .stall_deadline(self.waiting_since, self.limits.write_timeout);
            if Instant::now() >= deadline {
                return;
            }
            if watch.deadline() != deadline {
                watch.as_mut().reset(deadline);
            }
            watch.as_mut().await;
        }
    }

    /// The pump is done: the body ends after the frames buffered now. While some wait, the
    /// client must go on taking them: nothing taken for the write timeout, and the stream is
    /// cut as [`ClientTx::cut`] does (`on_cut` is called then). Without this, an HTTP/2 client
    /// that keeps its stream's window shut held the stream, its body's bytes and its
    /// `server.max_requests_in_flight` permit for as long as it kept the connection open,
    /// once the engine had finished before the write timeout.
    pub(super) fn finish(self, on_cut: impl FnOnce() + Send + 'static) {
        if self.shared.buffered.load(Ordering::Acquire) == 0 {
            return;
        }
        let Self {
            tx,
            shared,
            limits,
            waiting_since,
            connection,
        } = self;
        // The body ends once it took the last frame.
        drop(tx);
        // All of it, at the slowest rate a client may read, after the write timeout.
        let buffered = shared.buffered.load(Ordering::Acquire) as u64;
        let drain_by = Instant::now()
            + limits.write_timeout
            + Duration::from_millis(buffered.saturating_mul(1000) / MIN_DRAIN_RATE);
        tokio::spawn(async move {
            loop {
                // Taken whole, or the body dropped (only this task holds the state then).
                if shared.buffered.load(Ordering::Acquire) == 0 || Arc::strong_count(&shared) == 1 {
                    return;
                }
                let deadline = shared
                    .stall_deadline(waiting_since, limits.write_timeout)
                    .min(drain_by);
                if Instant::now() < deadline {
                    tokio::time::sleep_until(deadline).await;
                    continue;
                }
                on_cut();
                shared.cut.store(true, Ordering::Release);
                tokio::time::sleep(limits.write_timeout).await;
                if Arc::strong_count(&shared) > 1 {
                    if let Some(connection) = connection {
                        tracing::info!(
                            "closing a client connection: a finished stream's bytes were not \
                             taken, nor the stream taken down, within the write timeout"
                        );
                        connection.close();
                    }
                }
                return;
            }
        });
    }

    /// Ends the client's stream with an error: what is still buffered is not sent. If the body
    /// is not dropped within the write timeout, the connection is closed (see the module doc).
    pub(super) fn cut(self) {
        self.shared.cut.store(true, Ordering::Release);
        // Wakes a body that waits on an empty buffer: it sees the cut before this frame.
        let _ = self.tx.send(Bytes::new());
        let Some(connection) = self.connection else {
            return;
        };
        let (tx, wait) = (self.tx, self.limits.write_timeout);
        tokio::spawn(async move {
            if tokio::time::timeout(wait, tx.closed()).await.is_err() {
                tracing::info!(
                    "closing a client connection: a stream cut for not reading was not taken \
                     down within the write timeout"
                );
                connection.close();
            }
        });
    }
}

/// The response body: the buffer's frames as the client takes them.
#[derive(Debug)]
pub struct ClientBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
    shared: Arc<Shared>,
}

impl Stream for ClientBody {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.shared.cut.swap(false, Ordering::AcqRel) {
            self.rx.close();
            return Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not take the stream's bytes in time",
            ))));
        }
        let frame = match self.rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => frame,
            other => return other.map(|f| f.map(Ok)),
        };
        let shared = &self.shared;
        shared.buffered.fetch_sub(frame.len(), Ordering::AcqRel);
        let ms = u64::try_from(shared.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        shared
            .taken_at_ms
            .store(ms.saturating_add(1), Ordering::Release);
        Poll::Ready(Some(Ok(frame)))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn limits(buffer_bytes: usize, write_timeout_ms: u64) -> ClientLimits {
        ClientLimits {
            buffer_bytes,
            write_timeout: Duration::from_millis(write_timeout_ms),
        }
    }

    #[tokio::test]
    async fn frames_arrive_in_order_and_room_comes_back_as_the_client_takes_them() {
        let (mut tx, mut body) = buffer(limits(10, 60_000), None);
        tx.send(Bytes::from_static(b"abcdef")).unwrap();
        assert_eq!(tx.send(Bytes::from_static(b"ghijkl")), Err(Full));
        tx.send(Bytes::from_static(b"ghij")).unwrap();
        assert_eq!(body.next().await.unwrap().unwrap(), "abcdef");
        tx.send(Bytes::from_static(b"klmnop")).unwrap();
        assert_eq!(body.next().await.unwrap().unwrap(), "ghij");
        assert_eq!(body.next().await.unwrap().unwrap(), "klmnop");
        // Into an empty buffer a frame goes whatever its size.
        tx.send(Bytes::from(vec![b'x'; 100])).unwrap();
        drop(tx);
        assert_eq!(body.next().await.unwrap().unwrap().len(), 100);
        assert!(body.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_nothing_stalls_after_the_write_timeout_and_no_sooner() {
        let (mut tx, mut body) = buffer(limits(1000, 1000), None);
        let mut watch = tx.watch();
        tx.send(Bytes::from_static(b"one")).unwrap();
        tx.send(Bytes::from_static(b"two")).unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        // Taking a frame restarts the clock.
        assert_eq!(body.next().await.unwrap().unwrap(), "one");
        let started = Instant::now();
        tx.stalled(&mut watch).await;
        assert!(started.elapsed() >= Duration::from_millis(999));
        tx.cut();
        assert!(
            body.next().await.unwrap().is_err(),
            "the body ends in error"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_buffer_never_stalls_and_a_dropped_body_closes() {
        let (tx, body) = buffer(limits(1000, 10), None);
        let mut watch = tx.watch();
        let stalled = tokio::time::timeout(Duration::from_secs(60), tx.stalled(&mut watch)).await;
        assert!(stalled.is_err());
        drop(body);
        tx.closed().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_body_never_taken_down_closes_its_connection_after_the_write_timeout() {
        let closer = ConnectionCloser::new();
        let (mut tx, body) = buffer(limits(1000, 500), Some(closer.clone()));
        tx.send(Bytes::from_static(b"abc")).unwrap();
        let started = Instant::now();
        tx.cut();
        // The server never polls the body again (an HTTP/2 window kept at zero).
        closer.closed().await;
        assert!(started.elapsed() >= Duration::from_millis(500));
        drop(body);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_on_an_empty_buffer_ends_at_the_cut() {
        let closer = ConnectionCloser::new();
        let (mut tx, mut body) = buffer(limits(1000, 500), Some(closer.clone()));
        tx.send(Bytes::from_static(b"abc")).unwrap();
        assert_eq!(body.next().await.unwrap().unwrap(), "abc");
        // The body waits for the next frame when the cut comes.
        let waiting = tokio::spawn(async move { body.next().await.map(|r| r.is_err()) });
        tokio::task::yield_now().await;
        tx.cut();
        assert_eq!(
            waiting.await.unwrap(),
            Some(true),
            "it ends in error at once"
        );
        let closed = tokio::time::timeout(Duration::from_secs(60), closer.closed()).await;
        assert!(closed.is_err(), "the connection stays open");
    }

    /// A finished stream's client that takes a frame now and then, each within the write
    /// timeout, is still cut once the buffered bytes have had their time at the slowest rate.
    #[tokio::test(start_paused = true)]
    async fn a_finished_streams_trickling_client_is_cut_when_its_drain_time_is_up() {
        let (mut tx, mut body) = buffer(limits(1 << 20, 1000), None);
        // 16 KiB in 64 frames: 1 s of write timeout and 4 s at the slowest rate.
        for _ in 0..64 {
            tx.send(Bytes::from(vec![b'x'; 256])).unwrap();
        }
        let cut = Arc::new(AtomicBool::new(false));
        let on_cut = Arc::clone(&cut);
        let started = Instant::now();
        tx.finish(move || on_cut.store(true, Ordering::Release));
        let mut taken = 0;
        loop {
            // A frame every 900 ms: never a whole write timeout without taking one.
            tokio::time::sleep(Duration::from_millis(900)).await;
            match body.next().await {
                Some(Ok(_)) => taken += 1,
                Some(Err(_)) => break,
                None => panic!("the trickle took it all: {taken} frames"),
            }
        }
        assert!(cut.load(Ordering::Acquire), "counted as cut");
        assert!(taken < 64, "{taken}");
        let after = started.elapsed();
        assert!(
            after >= Duration::from_secs(5),
            "not before its time: {after:?}"
        );
        assert!(after < Duration::from_secs(7), "{after:?}");
    }

    /// One that takes the bytes at the slowest rate allowed gets them all.
    #[tokio::test(start_paused = true)]
    async fn a_finished_streams_client_reading_at_the_slowest_rate_gets_everything() {
        let (mut tx, mut body) = buffer(limits(1 << 20, 1000), None);
        for _ in 0..64 {
            tx.send(Bytes::from(vec![b'x'; 256])).unwrap();
        }
        tx.finish(|| panic!("cut"));
        let mut taken = 0;
        // 256 bytes every 62 ms: 4.1 KiB a second.
        while let Some(frame) = body.next().await {
            frame.unwrap();
            taken += 1;
            tokio::time::sleep(Duration::from_millis(62)).await;
        }
        assert_eq!(taken, 64);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_body_taken_down_in_time_leaves_its_connection_open() {
        let closer = ConnectionCloser::new();
        let (tx, mut body) = buffer(limits(1000, 500), Some(closer.clone()));
        tx.cut();
        assert!(body.next().await.unwrap().is_err());
        drop(body);
        let closed = tokio::time::timeout(Duration::from_secs(60), closer.closed()).await;
        assert!(closed.is_err(), "the connection stays open");
    }
}
