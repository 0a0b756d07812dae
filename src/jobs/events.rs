//! `GET /jobs/{id}/events`: a job as Server-Sent Events.
//!
//! ```text
//! event: status
//! data: {"id":"…","status":"queued"}
//!
//! id: 1
//! event: token
//! data: {"text":"Your"}
//!
//! event: done
//! data: {"finish_reason":"stop","usage":{…},"timings":{…}}
//! ```
//!
//! A `status` event whenever the status changes (`queued`, `running`; a `cancelled` or `expired`
//! status ends the stream); a `token` event per streamed piece, numbered from 1 in `id:`; then
//! `done` (as `/answer`'s) or `error` (`{"code","message"}`). The last event has the id `end`. A
//! client that attaches late gets every piece so far first; with `Last-Event-ID: n` it gets the
//! pieces after `n`; with `Last-Event-ID: end` (a browser `EventSource` reconnecting after the
//! end) it gets 204, which stops the `EventSource`. A comment line every 15 s keeps idle
//! connections open through proxies.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::time::Duration;

use serde_json::json;

use super::entry::Status;

/// The id of a job stream's last event; a request that resumes after it gets 204.
pub const END_ID: &str = "end";

/// The highest piece number a `Last-Event-ID` may name: more pieces than any answer streams
/// (one per engine chunk, within the model's length), and small enough that every use (a
/// Redis list index, `+ 1`) stays in range on every platform.
pub const MAX_PIECE_ID: usize = 1_000_000;

/// The highest run a `Last-Event-ID` may name (`jobs.max_attempts` is at most 100).
pub const MAX_RUN: u64 = 1_000;

/// A piece id from `Last-Event-ID`: `n` (the first run) or `<run>.<n>`, with `n` in
/// `0..=`[`MAX_PIECE_ID`] and `run` in `1..=`[`MAX_RUN`] (plain ASCII digits); `None`
/// otherwise.
pub fn parse_piece_id(id: &str) -> Option<(u64, usize)> {
    /// A bounded decimal: digits only (no sign, no spaces), at most `max`.
    fn bounded<T: std::str::FromStr + PartialOrd>(text: &str, max: T) -> Option<T> {
        if text.is_empty() || text.len() > 7 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse().ok().filter(|n| *n <= max)
    }
    match id.split_once('.') {
        None => Some((1, bounded(id, MAX_PIECE_ID)?)),
        Some((run, n)) => Some((
            bounded(run, MAX_RUN).filter(|r| *r >= 1)?,
            bounded(n, MAX_PIECE_ID)?,
        )),
    }
}

/// How long an idle stream waits before a keep-alive comment.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// The keep-alive comment an idle stream sends.
pub const KEEPALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// Renders a job's events from what changed since the last call: the one renderer of both
/// backends (each reads its store: `local/events.rs`, `redis/events.rs`).
#[derive(Debug)]
pub struct Render {
    id: String,
    /// The run whose pieces are sent (shared store; 1 in process): from the second run on,
    /// piece ids are `<run>.<n>`, so a client resuming across a restart is noticed.
    pub attempt: u64,
    /// Pieces already sent.
    pub sent: usize,
    /// The last status sent.
    status: Option<Status>,
    /// The last event went out.
    pub ended: bool,
}

impl Render {
    /// A renderer for job `id` whose client has the pieces up to `from`.
    pub fn new(id: String, from: usize) -> Self {
        Self {
            id,
            attempt: 1,
            sent: from,
            status: None,
            ended: false,
        }
    }

    /// The `id:` of piece `n` of this run.
    fn piece_id(&self, n: usize) -> String {
        if self.attempt <= 1 {
            n.to_string()
        } else {
            format!("{}.{n}", self.attempt)
        }
    }

    /// The job restarted (its runner was lost and it runs again): its text starts over, so
    /// the client is told, and the pieces are numbered from 1 again.
    pub fn restarted(&mut self, attempt: u64) -> String {
        self.sent = 0;
        self.status = None;
        self.attempt = attempt;
        format!(
            "event: status\ndata: {}\n\n",
            json!({ "id": self.id, "status": "queued", "attempt": attempt, "restarted": true })
        )
    }

    /// Everything new as SSE text: a status change, the `pieces` after the ones sent, and the
    /// end (`done` with `done`'s data, `error`, or the final status); marks the end.
    pub fn render<'a>(
        &mut self,
        status: Status,
        pieces: impl Iterator<Item = &'a str>,
        done: Option<&serde_json::Value>,
        error: Option<(&str, &str)>,
    ) -> String {
        let mut out = String::new();
        let event = |out: &mut String, name: &str, data: &serde_json::Value| {
            out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
        };
        if self.status != Some(status) {
            self.status = Some(status);
            // `running` before its first token; a final status after the last one (below).
            if !status.is_final() {
                event(
                    &mut out,
                    "status",
                    &json!({ "id": self.id, "status": status.as_str() }),
                );
            }
        }
        for text in pieces {
            // At most MAX_PIECE_ID from a client plus the pieces that exist: never near the
            // top of usize; saturating all the same.
            self.sent = self.sent.saturating_add(1);
            out.push_str(&format!("id: {}\n", self.piece_id(self.sent)));
            event(&mut out, "token", &json!({ "text": text }));
        }
        // The last event carries the id `end`: an `EventSource` reconnecting with it gets 204.
        let end = |out: &mut String| out.push_str(&format!("id: {END_ID}\n"));
        match (status, done, error) {
            (Status::Done, Some(done), _) => {
                end(&mut out);
                event(&mut out, "done", done);
            }
            (Status::Failed, _, Some((code, message))) => {
                end(&mut out);
                event(
                    &mut out,
                    "error",
                    &json!({ "code": code, "message": message }),
                );
            }
            (status, _, _) if status.is_final() => {
                end(&mut out);
                event(
                    &mut out,
                    "status",
                    &json!({ "id": self.id, "status": status.as_str() }),
                );
            }
            _ => {}
        }
        self.ended = status.is_final();
        out
    }
}
