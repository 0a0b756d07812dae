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
//!
//! A busy response is *owed* by the server while it waits for the server to take its next frame:
//! from its creation until the server first asks it for a frame, and from each frame it handed
//! over until the server asks again. A response that is waiting for the engine (it answered
//! "not yet") is not owed. The server stops asking only when the client takes nothing: an
//! HTTP/1 socket that stays full, or an HTTP/2 flow-control window kept shut, which no socket
//! write ever notices (the client reads its socket and answers pings). A response owed longer
//! than [`Activity::until_stalled`]'s limit closes its connection, so such a client holds
//! neither the connection nor the request's `server.max_requests_in_flight` permit, nor the
//! response's bytes, past that.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;
use tower_service::Service;

use super::resets::{ResetWatch, Resets};
use crate::relay::ConnectionCloser;

/// Counts one connection's busy requests. Cloned into its service; [`Activity::until_idle`]
/// waits on it.
#[derive(Debug, Clone)]
pub(super) struct Activity {
    busy: watch::Sender<usize>,
    owed: Arc<Owed>,
}

/// The connection's owed responses (see the module doc): since when each is owed.
#[derive(Debug, Default)]
struct Owed {
    since: Mutex<HashMap<u64, Instant>>,
    next_id: AtomicU64,
}

impl Owed {
    fn set(&self, id: u64, owed: bool) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if owed {
            since.insert(id, Instant::now());
        } else {
            since.remove(&id);
        }
    }

    fn oldest(&self) -> Option<Instant> {
        let since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since.values().min().copied()
    }
}

/// One response's place in [`Owed`], given up when the response is dropped.
#[derive(Debug)]
struct OwedSlot {
    owed: Arc<Owed>,
    id: u64,
}

impl OwedSlot {
    fn new(owed: &Arc<Owed>) -> Self {
        let id = owed.next_id.fetch_add(1, Ordering::Relaxed);
        // Owed until the server first asks for a frame.
        owed.set(id, true);
        Self {
            owed: Arc::clone(owed),
            id,
        }
    }
}

impl Drop for OwedSlot {
    fn drop(&mut self) {
        self.owed.set(self.id, false);
    }
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
            owed: Arc::default(),
        }
    }

    fn begin(&self) -> Busy {
        self.busy.send_modify(|n| *n = n.saturating_add(1));
        Busy(self.busy.clone())
    }

    /// `router` as the connection's service, marking each request busy until its response
    /// body is over; each request carries `closer`, which closes the connection, in its
    /// extensions; each answer its client gives up counts in `resets`.
    pub(super) fn track(
        &self,
        router: Router,
        closer: ConnectionCloser,
        resets: Resets,
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
            let owed = Arc::clone(&activity.owed);
            // Dropped with this future when the client resets the request before its answer.
            let reset = resets.watch(&req);
            let mut router = router.clone();
            async move {
                let resp = router.call(req).await?;
                let owed = OwedSlot::new(&owed);
                Ok(resp.map(|body| {
                    Body::new(Tracked {
                        body,
                        owed,
                        reset,
                        _busy: busy,
                    })
                }))
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

    /// Returns once a response has been owed for `limit` (see the module doc): its client takes
    /// nothing. Looks every quarter of `limit` while a request is busy, so it returns within
    /// 1.25 times `limit` of the moment the response began to be owed.
    pub(super) async fn until_stalled(&self, limit: Duration) {
        let mut busy = self.busy.subscribe();
        let every = (limit / 4).max(Duration::from_millis(10));
        loop {
            if busy.wait_for(|n| *n > 0).await.is_err() {
                // A closed channel cannot happen (`self` holds the sender).
                std::future::pending::<()>().await;
            }
            if self
                .owed
                .oldest()
                .is_some_and(|since| since.elapsed() >= limit)
            {
                return;
            }
            tokio::time::sleep(every).await;
        }
    }
}

/// A response body that keeps its request busy until it is over or dropped, and says when it
/// is owed (see the module doc).
struct Tracked {
    body: Body,
    owed: OwedSlot,
    /// Dropped before the end: the client reset the answer.
    reset: ResetWatch,
    _busy: Busy,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // A body at its end may be dropped without being asked for its end.
        if hyper::body::Body::is_end_stream(&self.body) {
            self.reset.answered();
        }
    }
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let poll = Pin::new(&mut self.body).poll_frame(cx);
        // Owed again once it handed a frame over; not while it waits for its own source (or
        // is over).
        let owed = matches!(poll, Poll::Ready(Some(Ok(_))));
        self.owed.owed.set(self.owed.id, owed);
        // Over, or failed on the server's side (a cut stream): not the client's reset.
        if matches!(poll, Poll::Ready(None | Some(Err(_)))) || self.body.is_end_stream() {
            self.reset.answered();
        }
        poll
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

    /// A response body fed by `rx`, tracked by `a` as the connection's service does.
    fn tracked(a: &Activity, rx: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Tracked {
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
        });
        let resets = Resets::new(ConnectionCloser::new(), crate::telemetry::Metrics::new());
        Tracked {
            body: Body::from_stream(stream),
            owed: OwedSlot::new(&a.owed),
            reset: resets.watch(&hyper::Request::new(())),
            _busy: a.begin(),
        }
    }

    /// Polls `body` once (as the server does when it wants the next frame).
    fn poll_once(body: &mut Tracked) -> Poll<Option<Result<Frame<bytes::Bytes>, axum::Error>>> {
        use hyper::body::Body as _;
        let waker = futures::task::noop_waker();
        Pin::new(body).poll_frame(&mut Context::from_waker(&waker))
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_the_server_never_asks_for_is_stalled() {
        let a = Activity::new();
        let limit = Duration::from_secs(60);
        let (_tx, rx) = tokio::sync::mpsc::channel(1);
        let _body = tracked(&a, rx);
        let t0 = Instant::now();
        a.until_stalled(limit).await;
        assert!(t0.elapsed() >= limit && t0.elapsed() <= limit * 5 / 4);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_the_engine_is_not_stalled_a_frame_never_taken_on_is() {
        let a = Activity::new();
        let limit = Duration::from_secs(60);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut body = tracked(&a, rx);
        // Asked for a frame, the body has none yet (the engine is slow): ten limits pass.
        assert!(poll_once(&mut body).is_pending());
        let waited = tokio::time::timeout(limit * 10, a.until_stalled(limit)).await;
        assert!(
            waited.is_err(),
            "a body waiting for its source is not stalled"
        );
        // A frame handed over, and the server never asks again (its client takes nothing).
        tx.send(bytes::Bytes::from_static(b"data: x\n\n"))
            .await
            .unwrap();
        assert!(matches!(poll_once(&mut body), Poll::Ready(Some(Ok(_)))));
        let t0 = Instant::now();
        a.until_stalled(limit).await;
        assert!(t0.elapsed() >= limit && t0.elapsed() <= limit * 5 / 4);
        // Asked again (the client took it): owed no more; over, and dropped: nothing left.
        assert!(poll_once(&mut body).is_pending());
        assert_eq!(a.owed.oldest(), None);
        drop(tx);
        assert!(matches!(poll_once(&mut body), Poll::Ready(None)));
        drop(body);
        assert_eq!(a.owed.oldest(), None);
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
