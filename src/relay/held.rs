//! A response held until it is sent: [`until_sent`] keeps a guard (a request's
//! `server.max_requests_in_flight` permit, a tenant's request slot) with the response body until
//! the server has taken its last frame, or drops it. A whole answer (a non-streaming `/v1`
//! answer, a job's status with its text) is no different from a stream here: it used to give its
//! guard back as its handler returned, while its bytes still waited for a client that read
//! nothing, so such answers counted against no limit and a client could keep any number of them
//! (HTTP/2: 64 a connection) in the server's memory. Data is handed over in frames of at most
//! [`FRAME_BYTES`]: the server asks for the next one only when its client has taken enough of
//! the last (HTTP/2 flow control), so the guard is held until all but the last frame has gone.
//! The size hint is the body's own, so a whole answer keeps its `content-length`.
//!
//! [`until_taken_within`] bounds how long a whole answer may take to go, as a finished stream's
//! buffer is bounded (`super::client`): its client must take it all within the write timeout
//! plus its size at [`super::client::MIN_DRAIN_RATE`], else its body ends with an error there
//! (the server resets the stream) and its guards go. A client that took one 16 KiB frame every
//! minute (each take restarting the connection's write timeout) held a 1 MiB answer, its permit
//! and its tenant's slot for an hour.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

/// The largest data frame handed to the server at once.
pub const FRAME_BYTES: usize = 16 * 1024;

/// `resp`, its body holding `guard` until its end (or until the server drops it).
pub fn until_sent<G: Send + Unpin + 'static>(resp: Response, guard: G) -> Response {
    held(resp, guard, None)
}

/// [`until_sent`], and a whole answer (its size known) must be taken within `write_timeout`
/// plus its size at [`super::client::MIN_DRAIN_RATE`] from its first frame; past that its body
/// ends with an error and `guard` goes. A stream (size unknown) is bounded by its relay.
pub fn until_taken_within<G: Send + Unpin + 'static>(
    resp: Response,
    guard: G,
    write_timeout: Duration,
) -> Response {
    held(resp, guard, Some(write_timeout))
}

fn held<G: Send + Unpin + 'static>(
    resp: Response,
    guard: G,
    write_timeout: Option<Duration>,
) -> Response {
    resp.map(|body| {
        let taken_by = write_timeout.map(Drain::Within);
        Body::new(Held {
            body,
            rest: Bytes::new(),
            guard: Some(guard),
            taken_by,
        })
    })
}

/// A whole answer's drain bound: the write timeout until its first frame, then the instant.
#[derive(Debug, Clone, Copy)]
enum Drain {
    Within(Duration),
    By(tokio::time::Instant),
}

/// A body and its guard.
struct Held<G> {
    body: Body,
    /// Of the body's last frame, what is still to hand over.
    rest: Bytes,
    guard: Option<G>,
    /// When a whole answer must have gone ([`until_taken_within`]); `None`: unbounded here.
    taken_by: Option<Drain>,
}

impl<G> Held<G> {
    /// The next frame of at most [`FRAME_BYTES`] from `data`, the rest kept.
    fn frame(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > FRAME_BYTES {
            self.rest = data.split_off(FRAME_BYTES);
        }
        Frame::data(data)
    }
}

impl<G: Unpin> hyper::body::Body for Held<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        match this.taken_by {
            Some(Drain::Within(write_timeout)) => {
                // From its first frame: a whole answer's size is known (a stream's is not, and
                // its relay bounds it).
                this.taken_by = hyper::body::Body::size_hint(&*this).exact().map(|size| {
                    let drain = Duration::from_millis(
                        size.saturating_mul(1000) / super::client::MIN_DRAIN_RATE,
                    );
                    Drain::By(tokio::time::Instant::now() + write_timeout + drain)
                });
            }
            Some(Drain::By(by)) if tokio::time::Instant::now() > by => {
                this.guard.take();
                this.rest = Bytes::new();
                this.taken_by = None;
                tracing::debug!("a whole answer's client took too long to take it: cut");
                return Poll::Ready(Some(Err(axum::Error::new(
                    "the client took too long to take its answer",
                ))));
            }
            _ => {}
        }
        if !this.rest.is_empty() {
            let rest = std::mem::take(&mut this.rest);
            return Poll::Ready(Some(Ok(this.frame(rest))));
        }
        let poll = Pin::new(&mut this.body).poll_frame(cx);
        let poll = match poll {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(this.frame(data)))),
                Err(other) => Poll::Ready(Some(Ok(other))),
            },
            other => other,
        };
        if matches!(poll, Poll::Ready(None | Some(Err(_)))) {
            this.guard.take();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use hyper::body::Body as _;

    use super::*;

    async fn next(body: &mut Body) -> Option<Result<Frame<Bytes>, axum::Error>> {
        futures::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    /// Counts itself out when dropped.
    struct Guard(Arc<AtomicUsize>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_whole_answer_keeps_its_length_and_its_guard_until_its_last_frame() {
        let held = Arc::new(AtomicUsize::new(1));
        let text = "x".repeat(FRAME_BYTES * 2 + 100);
        let resp = until_sent(
            Response::new(Body::from(text.clone())),
            Guard(Arc::clone(&held)),
        );
        let mut body = resp.into_body();
        assert_eq!(body.size_hint().exact(), Some(text.len() as u64));
        let mut sizes = Vec::new();
        while let Some(frame) = next(&mut body).await {
            assert_eq!(held.load(Ordering::SeqCst), 1, "held while frames remain");
            sizes.push(frame.unwrap().into_data().unwrap().len());
            if !body.is_end_stream() {
                let left = text.len() - sizes.iter().sum::<usize>();
                assert_eq!(body.size_hint().exact(), Some(left as u64));
            }
        }
        assert_eq!(sizes, [FRAME_BYTES, FRAME_BYTES, 100]);
        assert_eq!(held.load(Ordering::SeqCst), 0, "given back at the end");
    }

    /// A whole answer taken too slowly (a frame now and then, each restarting the connection's
    /// write timeout) is cut at its drain bound, its guard given back; one taken at the pace
    /// of a slow link goes whole.
    #[tokio::test(start_paused = true)]
    async fn a_whole_answer_taken_too_slowly_is_cut_at_its_drain_bound() {
        let write_timeout = Duration::from_secs(30);
        let text = "x".repeat(FRAME_BYTES * 8);
        // Its bound: the write timeout plus 128 KiB at 4 KiB a second, 62 s.
        let bound = write_timeout + Duration::from_secs(32);
        // `text` held to be taken within `write_timeout`, and its guard's count.
        let answer = || {
            let held = Arc::new(AtomicUsize::new(1));
            let resp = until_taken_within(
                Response::new(Body::from(text.clone())),
                Guard(Arc::clone(&held)),
                write_timeout,
            );
            (resp.into_body(), held)
        };
        let (mut body, held) = answer();
        let mut ended = None;
        for _ in 0..8 {
            match next(&mut body).await {
                Some(Ok(_)) => tokio::time::sleep(bound / 4).await,
                other => {
                    ended = Some(other.map(|r| r.is_err()));
                    break;
                }
            }
        }
        assert_eq!(ended, Some(Some(true)), "cut with an error past its bound");
        assert_eq!(
            held.load(Ordering::SeqCst),
            0,
            "its guard went with the cut"
        );

        // A frame every 3 s: 8 frames in 24 s, within the bound.
        let (mut body, held) = answer();
        let mut taken = 0;
        while let Some(frame) = next(&mut body).await {
            taken += frame.unwrap().into_data().unwrap().len();
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        assert_eq!(taken, text.len(), "taken whole");
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_body_dropped_unsent_gives_its_guard_back() {
        let held = Arc::new(AtomicUsize::new(1));
        let resp = until_sent(
            Response::new(Body::from("never read")),
            Guard(Arc::clone(&held)),
        );
        assert_eq!(held.load(Ordering::SeqCst), 1);
        drop(resp);
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }
}
