//! HTTP/2 answers a client resets ("rapid reset", CVE-2023-44487). Each request a client opens
//! and resets costs the gateway a classification and an admission, often an engine request and
//! its abort: all given back, but at the pace of the client's writes on one connection, where
//! HTTP/1 needs a new connection for every request it gives up. A connection whose client
//! resets more than [`MAX_RESETS`] answers in a burst (a bucket that drains [`MAX_RESETS`] every
//! [`WINDOW`]) is closed, and counted as `tutor_gateway_refused_total{limit="stream_resets"}`.
//!
//! A reset is an HTTP/2 request (not `HEAD`) whose answer the server dropped before its end
//! within [`RAPID`] of its arrival: the client gave it up at once. A client that gives up a
//! request it waited for (a student who leaves, a timeout) is not counted, nor are the answers
//! dropped with a connection the gateway closes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::relay::ConnectionCloser;
use crate::telemetry::Metrics;

/// Resets a connection's client may make in a burst.
pub(super) const MAX_RESETS: f64 = 100.0;
/// The bucket drains [`MAX_RESETS`] every this long.
pub(super) const WINDOW: Duration = Duration::from_secs(10);
/// A request given up within this long of its arrival counts as a reset.
pub(super) const RAPID: Duration = Duration::from_secs(1);

/// One connection's resets.
#[derive(Debug, Clone)]
pub(super) struct Resets {
    bucket: Arc<Mutex<Bucket>>,
    closer: ConnectionCloser,
    metrics: Metrics,
}

#[derive(Debug)]
struct Bucket {
    level: f64,
    at: Instant,
    closed: bool,
}

impl Resets {
    /// The resets of the connection `closer` closes.
    pub(super) fn new(closer: ConnectionCloser, metrics: Metrics) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(Bucket {
                level: 0.0,
                at: Instant::now(),
                closed: false,
            })),
            closer,
            metrics,
        }
    }

    /// A watch on `req`'s answer: counts a reset if dropped before [`ResetWatch::answered`].
    pub(super) fn watch<B>(&self, req: &hyper::Request<B>) -> ResetWatch {
        let counted =
            req.version() == hyper::Version::HTTP_2 && req.method() != hyper::Method::HEAD;
        ResetWatch {
            resets: counted.then(|| self.clone()),
            arrived: Instant::now(),
        }
    }

    fn count(&self) {
        if self.closer.is_closed() {
            // The gateway closes the connection: its answers go with it.
            return;
        }
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let drained = now.duration_since(b.at).as_secs_f64() * MAX_RESETS / WINDOW.as_secs_f64();
        b.level = (b.level - drained).max(0.0) + 1.0;
        b.at = now;
        if b.level > MAX_RESETS && !b.closed {
            b.closed = true;
            self.metrics.refused("stream_resets");
            tracing::debug!(
                max_resets = MAX_RESETS,
                window_s = WINDOW.as_secs(),
                "closing an HTTP/2 connection whose client resets its requests faster than allowed"
            );
            self.closer.close();
        }
    }
}

/// Held by a request until its answer ended; dropped before that, it counts a reset.
#[derive(Debug)]
pub(super) struct ResetWatch {
    resets: Option<Resets>,
    arrived: Instant,
}

impl ResetWatch {
    /// The answer ended (or failed on the server's side): no reset.
    pub(super) fn answered(&mut self) {
        self.resets = None;
    }
}

impl Drop for ResetWatch {
    fn drop(&mut self) {
        if let Some(resets) = self.resets.take() {
            if self.arrived.elapsed() <= RAPID {
                resets.count();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h2_request() -> hyper::Request<()> {
        hyper::Request::builder()
            .version(hyper::Version::HTTP_2)
            .uri("/v1/chat/completions")
            .method("POST")
            .body(())
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_resets_closes_the_connection_a_steady_few_do_not() {
        let closer = ConnectionCloser::new();
        let metrics = Metrics::new();
        let resets = Resets::new(closer.clone(), metrics.clone());
        let closed = || futures::FutureExt::now_or_never(closer.closed()).is_some();
        // Nine a second for a minute, every answer reset: within the bucket's drain.
        for _ in 0..540 {
            drop(resets.watch(&h2_request()));
            tokio::time::sleep(Duration::from_millis(111)).await;
        }
        assert!(!closed());
        // Given up after waiting (a student who left, a client's timeout): never counted.
        let waited: Vec<_> = (0..1000).map(|_| resets.watch(&h2_request())).collect();
        tokio::time::sleep(RAPID * 2).await;
        drop(waited);
        assert!(!closed());
        // Answered ones never count; HTTP/1 and HEAD requests neither.
        for _ in 0..1000 {
            resets.watch(&h2_request()).answered();
            drop(resets.watch(&hyper::Request::new(())));
            let head = hyper::Request::builder()
                .version(hyper::Version::HTTP_2)
                .method("HEAD")
                .body(())
                .unwrap();
            drop(resets.watch(&head));
        }
        assert!(!closed());
        // A burst: closed once it passes the bucket, and counted once.
        for _ in 0..200 {
            drop(resets.watch(&h2_request()));
        }
        assert!(closed());
        assert_eq!(metrics.refused_count("stream_resets"), 1);
    }
}
