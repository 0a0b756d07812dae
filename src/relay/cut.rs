//! The cut message (M14): how a stream ends when it outgrew its lane and the next lane had no
//! room. Safe to show a student; machine-readable for the frontend.
//!
//! - `/answer`: `event: cut` with `{"code":"lane_limit","message":…,"lane":…,"after_tokens":N}`,
//!   then the usual `done` event with `finish_reason: "length"`.
//! - `/v1` streams: one last chunk in vLLM's shape with an empty delta, `finish_reason: "length"`
//!   and a `"tutor_gateway": {"cut": "lane_limit", "lane": …, "after_tokens": N, "message": …}`
//!   object, then `data: [DONE]`. Non-streaming `/v1`: `finish_reason: "length"` and the same
//!   `tutor_gateway` object in the response.

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

use crate::lane::Lane;
use crate::upstream::Chunk;

/// The `code` of a cut.
pub const CODE: &str = "lane_limit";

/// Why and where a stream was cut.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CutInfo {
    /// Always [`CODE`].
    pub cut: &'static str,
    /// The lane whose limit was reached.
    pub lane: &'static str,
    /// Output tokens sent before the cut.
    pub after_tokens: u32,
    /// A message a frontend can show.
    pub message: String,
}

impl CutInfo {
    /// A cut in `lane` after `after_tokens` tokens.
    pub fn new(lane: Lane, after_tokens: u32) -> Self {
        Self {
            cut: CODE,
            lane: lane.as_str(),
            after_tokens,
            message: format!(
                "This answer was stopped after {after_tokens} tokens because the tutor is busy \
                 with longer work right now. Ask a follow-up question to continue."
            ),
        }
    }
}

/// `id`, `object`, `created` and `model` of a stream's chunks, to write one more like them.
#[derive(Debug, Clone)]
pub struct ChunkIdentity {
    id: Value,
    object: Value,
    created: Value,
    model: Value,
}

impl ChunkIdentity {
    /// Read from a chunk (`None` if it is not JSON with these fields).
    pub fn of(chunk: &Chunk) -> Option<Self> {
        let v: Value = serde_json::from_slice(&chunk.raw).ok()?;
        Some(Self {
            id: v.get("id")?.clone(),
            object: v.get("object")?.clone(),
            created: v.get("created").cloned().unwrap_or(Value::Null),
            model: v.get("model").cloned().unwrap_or(Value::Null),
        })
    }
}

/// The last `/v1` chunk of a cut stream, framed as `data: …\n\n`.
pub fn final_chunk(identity: Option<&ChunkIdentity>, info: &CutInfo) -> Vec<u8> {
    let completions = identity.is_some_and(|i| i.object == "text_completion");
    let choice = if completions {
        json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "length", "stop_reason": null})
    } else {
        json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"})
    };
    framed(identity, json!([choice]), ("tutor_gateway", json!(info)))
}

/// A `/v1` chunk in vLLM's shape (`identity`'s fields), with `choices` and one more member,
/// framed as `data: …\n\n`.
fn framed(
    identity: Option<&ChunkIdentity>,
    choices: Value,
    (key, value): (&str, Value),
) -> Vec<u8> {
    let mut chunk = json!({
        "id": identity.map_or(Value::Null, |i| i.id.clone()),
        "object": identity.map_or(Value::from("chat.completion.chunk"), |i| i.object.clone()),
        "created": identity.map_or(Value::Null, |i| i.created.clone()),
        "model": identity.map_or(Value::Null, |i| i.model.clone()),
        "choices": choices,
    });
    chunk[key] = value;
    format!("data: {chunk}\n\n").into_bytes()
}

/// The usage-only chunk (`"choices": []`) of a cut `/v1` stream whose client asked for usage
/// (`stream_options.include_usage`): vLLM's last chunk, which the cut took the place of.
pub fn usage_chunk(
    identity: Option<&ChunkIdentity>,
    prompt_tokens: u32,
    completion_tokens: u32,
    cached_tokens: Option<u32>,
) -> Vec<u8> {
    let mut usage = json!({
        "prompt_tokens": prompt_tokens,
        "total_tokens": u64::from(prompt_tokens) + u64::from(completion_tokens),
        "completion_tokens": completion_tokens,
    });
    if let Some(c) = cached_tokens {
        usage["prompt_tokens_details"] = json!({ "cached_tokens": c });
    }
    framed(identity, json!([]), ("usage", usage))
}

/// The `/answer` `cut` event.
pub fn cut_event(info: &CutInfo) -> Bytes {
    let data = json!({
        "code": CODE,
        "message": info.message,
        "lane": info.lane,
        "after_tokens": info.after_tokens,
    });
    Bytes::from(format!("event: cut\ndata: {data}\n\n"))
}
