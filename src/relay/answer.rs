//! The `/answer` event stream: `meta` first, `token` per chunk of text, then `done` (or `error`).
//!
//! ```text
//! retry: 3000
//! id: 0
//! event: meta
//! data: {"request_id":"…","lane":"small","estimated_input_tokens":312,"output_budget":120,"queue_wait_ms":0.4}
//!
//! id: 1
//! event: token
//! data: {"text":" The"}
//!
//! id: end
//! event: done
//! data: {"finish_reason":"stop","usage":{"input_tokens":312,"output_tokens":118,"cached_tokens":0},"timings":{…}}
//! ```
//!
//! A course with tools may get tool calls instead of (or besides) text: each piece the engine
//! streams is a `tool_call` event numbered with the tokens, `{"index":0,"id":"call_a",
//! "type":"function","name":"run_tests","arguments":"{\"path"}` (the id, type and name on a
//! call's first piece; `arguments` pieces joined in order make its JSON), and `done` carries the
//! calls joined as `tool_calls` (OpenAI's message shape). A reasoning model's reasoning is
//! counted, not shown.
//!
//! `meta` has the id 0, token and tool-call events are numbered from 1, and the last event (`done` or
//! `error`) has the id `end`. A browser `EventSource` that reconnects sends the last id it saw as
//! `Last-Event-ID` (so one cut off between `meta` and its first token sends `0`); `/answer`
//! answers any such request with 204 (it never restarts or resumes a generation), which stops
//! the browser's retry loop. `retry:` asks browsers to wait 3 s before that reconnect.

use bytes::Bytes;
use serde_json::json;

use crate::classify::Classification;
use crate::telemetry::{LatencySplit, UpstreamView};
use crate::upstream::{Chunk, ToolCallDelta};

/// The id of a stream's first event (`meta`): a browser cut off before the first token
/// reconnects with it, and is told to stop, as after any other event.
const META_ID: u32 = 0;

/// The id of a stream's last event (`done` or `error`).
pub const END_ID: &str = "end";

/// The reconnection delay suggested to browsers, ms.
const RETRY_MS: u32 = 3000;

fn event(name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

fn event_with_id(id: impl std::fmt::Display, name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("id: {id}\nevent: {name}\ndata: {data}\n\n"))
}

/// `meta`: who we are and which lane we got; for a course request with code, what focusing
/// did (`focus`: outcome, original and sent tokens of the code, functions sent).
pub fn meta_event(
    request_id: &str,
    class: &Classification,
    t: LatencySplit,
    focus: Option<&serde_json::Value>,
) -> Bytes {
    let mut data = json!({
        "request_id": request_id,
        "lane": class.lane.as_str(),
        "estimated_input_tokens": class.input_tokens_estimate,
        "output_budget": class.output_budget,
        "queue_wait_ms": t.queue_wait_ms,
    });
    if let (Some(f), Some(obj)) = (focus, data.as_object_mut()) {
        obj.insert("focus".into(), f.clone());
    }
    let meta = event_with_id(META_ID, "meta", &data);
    let mut out = format!("retry: {RETRY_MS}\n").into_bytes();
    out.extend_from_slice(&meta);
    Bytes::from(out)
}

/// `token` number `seq` (from 1): the text of one chunk; nothing for chunks without text.
pub fn token_event(chunk: &Chunk, seq: u32) -> Option<Bytes> {
    (!chunk.text.is_empty()).then(|| event_with_id(seq, "token", &json!({ "text": chunk.text })))
}

/// `tool_call` number `seq`: one piece of a tool call as the engine streamed it (id, type and
/// name only where the piece has them).
pub fn tool_call_event(piece: &ToolCallDelta, seq: u32) -> Bytes {
    let mut data = json!({ "index": piece.index, "arguments": piece.arguments });
    for (key, value) in [
        ("id", &piece.id),
        ("type", &piece.kind),
        ("name", &piece.name),
    ] {
        if let Some(v) = value {
            data[key] = json!(v);
        }
    }
    event_with_id(seq, "tool_call", &data)
}

/// `error`, the last event of a failed stream: `{"code","message"}`.
pub fn error_event(code: &str, message: &str) -> Bytes {
    error_event_with(&json!({ "code": code, "message": message }))
}

/// `error` with `data` (at least `code` and `message`).
pub fn error_event_with(data: &serde_json::Value) -> Bytes {
    event_with_id(END_ID, "error", data)
}

/// `meta` between the runs of a pre-empted stream (`jobs.preempt_notice`): it was pre-empted
/// `n` times so far and goes on.
pub fn preempted_event(n: u32) -> Bytes {
    event("meta", &json!({ "preempted": n }))
}

/// `done`: finish reason, usage and timings, from what the engine told (`up`: the whole
/// answer's, across the runs of a pre-empted stream).
/// `calls`: the tool calls streamed, joined (listed as `tool_calls` when there are any).
pub fn done_event(
    up: &UpstreamView,
    class: &Classification,
    t: LatencySplit,
    calls: &[ToolCallDelta],
) -> Bytes {
    done_event_with(up, class, t, calls, None)
}

/// `done` with the finish reason overridden (a cut stream ends with `length`).
pub fn done_event_with(
    up: &UpstreamView,
    class: &Classification,
    t: LatencySplit,
    calls: &[ToolCallDelta],
    finish_reason: Option<&str>,
) -> Bytes {
    let usage = up.usage;
    let mut data = json!({
        "finish_reason": finish_reason.or(up.finish_reason.as_deref()),
        "usage": {
            "input_tokens": usage.map_or(class.input_tokens_estimate, |u| u.prompt_tokens),
            "output_tokens": up.output_tokens,
            "cached_tokens": usage.and_then(|u| u.cached_tokens).unwrap_or(0),
        },
        "timings": t,
    });
    if !calls.is_empty() {
        data["tool_calls"] = calls.iter().map(ToolCallDelta::to_json).collect();
    }
    event_with_id(END_ID, "done", &data)
}
