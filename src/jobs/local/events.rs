//! `GET /jobs/{id}/events` from the in-process store: the job's record is watched, and every
//! change is rendered with the one renderer (`jobs/events.rs`). In process a job runs once:
//! piece ids are plain numbers.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use futures::Stream;
use tokio::sync::watch;

use crate::jobs::entry::{Answer, Entry};
use crate::jobs::events::{Render, KEEPALIVE, KEEPALIVE_COMMENT};

struct Cursor {
    entry: Arc<Entry>,
    rx: watch::Receiver<u64>,
    out: Render,
}

/// The event stream of `entry`, starting after piece `from`.
pub fn stream(
    entry: Arc<Entry>,
    from: usize,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let rx = entry.watch();
    let cursor = Cursor {
        out: Render::new(entry.id.clone(), from),
        entry,
        rx,
    };
    futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if c.out.ended {
                return None;
            }
            c.rx.borrow_and_update();
            let out = c.render();
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), c));
            }
            match tokio::time::timeout(KEEPALIVE, c.rx.changed()).await {
                Ok(Ok(())) => {}
                // The job is gone (forgotten): nothing more will come.
                Ok(Err(_)) => return None,
                Err(_) => return Some((Ok(Bytes::from_static(KEEPALIVE_COMMENT)), c)),
            }
        }
    })
}

impl Cursor {
    fn render(&mut self) -> String {
        let s = self.entry.lock();
        let pieces = (self.out.sent..s.ends.len()).map(|i| {
            let start = i.checked_sub(1).map_or(0, |p| s.ends[p]);
            &s.text[start..s.ends[i]]
        });
        let done = s.answer.as_ref().map(Answer::to_json);
        let error = s.error.as_ref().map(|(c, m)| (*c, m.as_str()));
        self.out.render(s.status, pieces, done.as_ref(), error)
    }
}
