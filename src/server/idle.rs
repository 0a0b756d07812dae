//! What a connection is doing, for the accept loop's idle timers ([`super::accept`]).
//!
//! A connection is *busy* from the moment a request's head is complete (the router is called)
//! until its response body is over (fully written, or dropped because the client left), and
//! *idle* otherwise: before its first request, between HTTP/1 keep-alive requests, and while an
//! HTTP/2 connection has no open stream. Bytes alone (a partial head, HTTP/2 `SETTINGS` or
//! `PING` frames) never make it busy, so they cannot keep a connection open.
//!
//! A long SSE stream is one busy request for as long as it streams: the idle timers never cut
//! it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;
use tower_service::Service;

use crate::relay::ConnectionCloser;

/// Counts one connection's busy requests. Cloned into its service; [`Activity::until_idle`]
/// waits on it.
#[derive(Debug, Clone)]
pub(super) struct Activity {
    busy: watch::Sender<usize>,
}

/// Held while one request is busy (its response body is alive).
#[derive(Debug)]
struct Busy(watch::Sender<usize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Activity {
    /// A connection with nothing busy yet.
    pub(super) fn new() -> Self {
        Self {
            busy: watch::Sender::new(0),
        }
    }

    fn begin(&self) -> Busy {
        self.busy.send_modify(|n| *n = n.saturating_add(1));
        Busy(self.busy.clone())
    }

    /// `router` as the connection's service, marking each request busy until its response
    /// body is over; each request carries `closer`, which closes the connection, in its
    /// extensions.
    pub(super) fn track(
        &self,
        router: Router,
        closer: ConnectionCloser,
    ) -> impl hyper::service::Service<
        hyper::Request<Incoming>,
        Response = hyper::Response<Body>,
        Error = Infallible,
        Future = impl Future<Output = Result<hyper::Response<Body>, Infallible>> + Send,
    > + Clone {
        let activity = self.clone();
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(closer.clone());
            let busy = activity.begin();
            let mut router = router.clone();
            async move {
                let resp = router.call(req).await?;
                Ok(resp.map(|body| Body::new(Tracked { body, _busy: busy })))
            }
        })
    }

    /// Returns at `first_by` if no request began by then (the connection never completed a
    /// request head), or once it has been idle for `then` since its last request ended. Never
    /// returns while a request is busy.
    pub(super) async fn until_idle(&self, first_by: Instant, then: Duration) {
        let mut busy = self.busy.subscribe();
        let mut deadline = first_by;
        loop {
            if *busy.borrow_and_update() > 0 {
                // A closed channel cannot happen (`self` holds the sender); treat it as idle.
                if busy.wait_for(|n| *n == 0).await.is_err() {
                    return;
                }
                deadline = Instant::now() + then;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    // Idle all along only if nothing began (and ended) in the meantime.
                    if !busy.has_changed().unwrap_or(false) {
                        return;
                    }
                }
                _ = busy.changed() => {}
            }
            // A request began (and may have ended already).
            deadline = Instant::now() + then;
        }
    }
}

/// A response body that keeps its request busy until it is over or dropped.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_only_after_the_last_request_ended() {
        let a = Activity::new();
        let first = Duration::from_secs(2);
        let then = Duration::from_secs(5);
        // Nothing ever happens: idle after `first`.
        let t0 = Instant::now();
        a.until_idle(t0 + first, then).await;
        assert_eq!(t0.elapsed(), first);

        // A request busy for 10 s, then idle `then` after it ended.
        let a = Activity::new();
        let busy = a.begin();
        let t0 = Instant::now();
        let ended = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            drop(busy);
        });
        a.until_idle(t0 + first, then).await;
        assert_eq!(t0.elapsed(), Duration::from_secs(15));
        ended.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_request_restarts_the_wait() {
        let a = Activity::new();
        let first = Duration::from_secs(2);
        let then = Duration::from_secs(5);
        let t0 = Instant::now();
        let b = a.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(b.begin());
        });
        a.until_idle(t0 + first, then).await;
        assert_eq!(t0.elapsed(), Duration::from_secs(6));
    }
}
