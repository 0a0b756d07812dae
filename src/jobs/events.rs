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

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use serde_json::json;
use tokio::sync::watch;

use super::entry::{Entry, Status};

/// The id of a job stream's last event; a request that resumes after it gets 204.
pub const END_ID: &str = "end";

/// How long an idle stream waits before a keep-alive comment.
const KEEPALIVE: Duration = Duration::from_secs(15);

struct Cursor {
    entry: Arc<Entry>,
    rx: watch::Receiver<u64>,
    /// Pieces already sent.
    sent: usize,
    /// The last status sent.
    status: Option<Status>,
    ended: bool,
}

/// The event stream of `entry`, starting after piece `from`.
pub fn stream(
    entry: Arc<Entry>,
    from: usize,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let rx = entry.watch();
    let cursor = Cursor {
        entry,
        rx,
        sent: from,
        status: None,
        ended: false,
    };
    futures::stream::unfold(cursor, |mut c| async move {
        loop {
            if c.ended {
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
                Err(_) => return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), c)),
            }
        }
    })
}

impl Cursor {
    /// Everything new since the last call, as SSE text; marks the end when the job ended.
    fn render(&mut self) -> String {
        let s = self.entry.lock();
        let mut out = String::new();
        let event = |out: &mut String, name: &str, data: &serde_json::Value| {
            out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
        };
        if self.status != Some(s.status) {
            self.status = Some(s.status);
            // `running` before its first token; a final status after the last one (below).
            if !s.status.is_final() {
                event(
                    &mut out,
                    "status",
                    &json!({ "id": self.entry.id, "status": s.status.as_str() }),
                );
            }
        }
        while self.sent < s.ends.len() {
            let start = match self.sent {
                0 => 0,
                i => s.ends[i - 1],
            };
            let text = &s.text[start..s.ends[self.sent]];
            self.sent += 1;
            out.push_str(&format!("id: {}\n", self.sent));
            event(&mut out, "token", &json!({ "text": text }));
        }
        // The last event carries the id `end`: an `EventSource` reconnecting with it gets 204.
        let end = |out: &mut String| out.push_str(&format!("id: {END_ID}\n"));
        match (s.status, &s.answer, &s.error) {
            (Status::Done, Some(a), _) => {
                end(&mut out);
                event(
                    &mut out,
                    "done",
                    &json!({
                        "finish_reason": a.finish_reason,
                        "usage": a.usage,
                        "timings": a.timings,
                    }),
                );
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
                    &json!({ "id": self.entry.id, "status": status.as_str() }),
                );
            }
            _ => {}
        }
        self.ended = s.status.is_final();
        out
    }
}
