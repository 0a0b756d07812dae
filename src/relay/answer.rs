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
use serde::Serialize;
use serde_json::json;

use super::Clock;
use crate::classify::Classification;
use crate::upstream::{Chunk, UpstreamStream};

/// Per-request latency split (M1): never one merged "response time".
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timings {
    /// Waiting for a lane slot and token budget in the gateway.
    pub queue_wait_ms: f64,
    /// Admission to first token (engine queue + prefill).
    pub ttft_ms: Option<f64>,
    /// Arrival to first token: what the student felt.
    pub time_to_first_token_ms: Option<f64>,
    /// Output tokens per second from first token to end; null with fewer than two tokens.
    pub decode_tps: Option<f64>,
    /// Arrival to end (or to now, while streaming).
    pub total_ms: f64,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Timings {
    /// The timings of `upstream` so far.
    pub fn of(upstream: &UpstreamStream, clock: Clock) -> Self {
        let t = upstream.timings();
        let end = t.ended_at.unwrap_or_else(tokio::time::Instant::now);
        let tokens = upstream.output_tokens().count;
        let decode_tps = t.first_content_at.and_then(|first| {
            let secs = end.saturating_duration_since(first).as_secs_f64();
            (tokens > 1 && secs > 0.0).then(|| f64::from(tokens - 1) / secs)
        });
        Self {
            queue_wait_ms: ms(clock.queue_wait),
            ttft_ms: t
                .first_content_at
                .map(|f| ms(f.saturating_duration_since(clock.admitted))),
            time_to_first_token_ms: t
                .first_content_at
                .map(|f| ms(f.saturating_duration_since(clock.arrival))),
            decode_tps,
            total_ms: ms(end.saturating_duration_since(clock.arrival)),
        }
    }
}

fn event(name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// `meta`: who we are and which lane we got.
pub fn meta_event(request_id: &str, class: &Classification, t: Timings) -> Bytes {
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
pub fn done_event(upstream: &UpstreamStream, class: &Classification, t: Timings) -> Bytes {
    let usage = upstream.usage();
    event(
        "done",
        &json!({
            "finish_reason": upstream.finish_reason(),
            "usage": {
                "input_tokens": usage.map_or(class.input_tokens_estimate, |u| u.prompt_tokens),
                "output_tokens": upstream.output_tokens().count,
                "cached_tokens": usage.and_then(|u| u.cached_tokens).unwrap_or(0),
            },
            "timings": t,
        }),
    )
}
