//! `GET /jobs/{id}/events` from the shared store: the same events as in process, from the same
//! renderer (`jobs/events.rs`), read from Redis whenever the job is announced on `:jobs:changed` (and at
//! least once a second, should an announcement be missed while the subscription reconnects).
//!
//! When the job's runner was lost and it runs again, the stream sends
//! `event: status` `{"status":"queued","attempt":n,"restarted":true}`: the text so far is void,
//! and the new run's pieces are numbered from 1 again.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::store::{changed, shown, RedisStore};
use crate::jobs::entry::Status;
use crate::jobs::events::{Render, KEEPALIVE, KEEPALIVE_COMMENT};

/// How often a stream reads the job when nothing was announced.
const POLL: Duration = Duration::from_secs(1);

struct Cursor {
    store: Arc<RedisStore>,
    id: String,
    changes: broadcast::Receiver<Arc<str>>,
    out: Render,
    /// The run whose pieces were sent.
    attempt: Option<u64>,
    /// When something was last sent (keep-alive comments after [`KEEPALIVE`] of silence).
    last_sent: Instant,
}

/// What one read of the job gives.
struct Read {
    status: Option<Status>,
    attempt: u64,
    answer: Option<serde_json::Value>,
    error: Option<serde_json::Value>,
    pieces: Vec<String>,
}

/// The event stream of job `id`, starting after piece `from` of run `run`.
pub fn stream(
    store: Arc<RedisStore>,
    id: String,
    (run, from): (u64, usize),
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let mut out = Render::new(id.clone(), from);
    out.attempt = run;
    let cursor = Cursor {
        changes: store.changes.subscribe(),
        out,
        store,
        id,
        // A client resuming knows its run; a new one takes whichever is current.
        attempt: (from > 0).then_some(run),
        last_sent: Instant::now(),
    };
    futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if c.out.ended {
                return None;
            }
            let out = match c.read().await {
                Ok(Some(out)) => out,
                // The job is gone (forgotten): nothing more will come.
                Ok(None) => return None,
                // Redis unreachable: try again at the next announcement or poll.
                Err(()) => String::new(),
            };
            if !out.is_empty() {
                c.last_sent = Instant::now();
                return Some((Ok(Bytes::from(out)), c));
            }
            if c.last_sent.elapsed() >= KEEPALIVE {
                c.last_sent = Instant::now();
                return Some((Ok(Bytes::from_static(KEEPALIVE_COMMENT)), c));
            }
            let _ = tokio::time::timeout(POLL, changed(&mut c.changes, &c.id)).await;
        }
    })
}

impl Cursor {
    /// Everything new as SSE text; `None` when the job no longer exists.
    async fn read(&mut self) -> Result<Option<String>, ()> {
        let r = self.fetch().await?;
        let Some(status) = r.status else {
            return Ok(None);
        };
        match self.attempt {
            Some(seen) if r.attempt > seen.max(1) => {
                // A new run: its pieces start over (read again from the first).
                self.attempt = Some(r.attempt);
                return Ok(Some(self.out.restarted(r.attempt)));
            }
            Some(_) => {}
            None => {
                self.attempt = Some(r.attempt);
                self.out.attempt = r.attempt.max(1);
            }
        }
        let error = r.error.as_ref().map(|e| {
            (
                e["code"].as_str().unwrap_or("internal"),
                e["message"].as_str().unwrap_or_default(),
            )
        });
        Ok(Some(self.out.render(
            status,
            r.pieces.iter().map(String::as_str),
            r.answer.as_ref(),
            error,
        )))
    }

    /// The job's status, run, result and the pieces after those sent, in one atomic read.
    async fn fetch(&self) -> Result<Read, ()> {
        let mut conn = self.store.conn().await.map_err(|_| ())?;
        let (fields, pieces): (Vec<Option<String>>, Vec<String>) = redis::pipe()
            .atomic()
            .cmd("HMGET")
            .arg(self.store.job_key(&self.id))
            .arg(&["status", "attempt", "answer", "error", "progress"])
            // `sent` is at most MAX_PIECE_ID plus the pieces that exist; never a negative
            // (from the end) index, which would send the whole list again.
            .lrange(
                self.store.text_key(&self.id),
                isize::try_from(self.out.sent).unwrap_or(isize::MAX),
                -1,
            )
            .query_async(&mut conn)
            .await
            .map_err(|_| ())?;
        let get = |i: usize| fields.get(i).cloned().flatten();
        let json = |i: usize| get(i).and_then(|v| serde_json::from_str(&v).ok());
        Ok(Read {
            status: get(0)
                .and_then(|s| Status::parse(&s))
                .map(|s| shown(s, get(4).is_some())),
            attempt: get(1).and_then(|a| a.parse().ok()).unwrap_or(0),
            answer: json(2),
            error: json(3),
            pieces,
        })
    }
}
