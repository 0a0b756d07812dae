//! The `/answer` event stream: `meta` first, `token` per chunk of text, then `done` (or `error`).
//!
//! ```text
//! event: meta
//! data: {"request_id":"…","lane":"small","estimated_input_tokens":312,"output_budget":120,"queue_wait_ms":0.4}
//!
//! event: token
//! data: {"text":" The"}
//!
//! event: done
//! data: {"finish_reason":"stop","usage":{"input_tokens":312,"output_tokens":118,"cached_tokens":0},"timings":{…}}
//! ```

use bytes::Bytes;
use serde_json::json;

use crate::classify::Classification;
use crate::telemetry::LatencySplit;
use crate::upstream::{Chunk, UpstreamStream};

fn event(name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// `meta`: who we are and which lane we got.
pub fn meta_event(request_id: &str, class: &Classification, t: LatencySplit) -> Bytes {
    event(
        "meta",
        &json!({
            "request_id": request_id,
            "lane": class.lane.as_str(),
            "estimated_input_tokens": class.input_tokens_estimate,
            "output_budget": class.output_budget,
            "queue_wait_ms": t.queue_wait_ms,
        }),
    )
}

/// `token`: the text of one chunk; nothing for chunks without text.
pub fn token_event(chunk: &Chunk) -> Option<Bytes> {
    (!chunk.text.is_empty()).then(|| event("token", &json!({ "text": chunk.text })))
}

/// `done`: finish reason, usage and timings.
pub fn done_event(upstream: &UpstreamStream, class: &Classification, t: LatencySplit) -> Bytes {
    done_event_with(upstream, class, t, None)
}

/// `done` with the finish reason overridden (a cut stream ends with `length`).
pub fn done_event_with(
    upstream: &UpstreamStream,
    class: &Classification,
    t: LatencySplit,
    finish_reason: Option<&str>,
) -> Bytes {
    let usage = upstream.usage();
    event(
        "done",
        &json!({
            "finish_reason": finish_reason.or(upstream.finish_reason()),
            "usage": {
                "input_tokens": usage.map_or(class.input_tokens_estimate, |u| u.prompt_tokens),
                "output_tokens": upstream.output_tokens().count,
                "cached_tokens": usage.and_then(|u| u.cached_tokens).unwrap_or(0),
            },
            "timings": t,
        }),
    )
}
