//! A whole answer assembled from vLLM's stream, for `/v1` clients that asked for no streaming.
//! The gateway always streams from vLLM (one code path for tokens, timeouts and aborts) and
//! answers in the shape of vLLM's non-streaming response.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::telemetry::Route;
use crate::upstream::{Chunk, Usage};

/// What the stream said, accumulated.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// `chatcmpl-…` / `cmpl-…` from vLLM's chunks.
    pub id: Option<String>,
    /// Unix seconds from vLLM's chunks.
    pub created: Option<u64>,
    /// Model name from vLLM's chunks.
    pub model: Option<String>,
    /// The generated text.
    pub text: String,
    /// Why generation stopped.
    pub finish_reason: Option<String>,
    /// Final usage.
    pub usage: Option<Usage>,
    /// Set when the answer was cut at its lane's limit.
    pub cut: Option<super::cut::CutInfo>,
}

/// What the client gets of a chunk that carries `usage`: the final usage-only chunk
/// (`"choices": []`) only if it asked for usage; a token chunk with running usage (the gateway
/// asks vLLM for `continuous_usage_stats` to count tokens) without the `usage` field unless it
/// asked for running usage itself. `None`: drop the chunk.
pub fn usage_for_client(
    chunk: &Chunk,
    include_usage: bool,
    continuous_usage: bool,
) -> Option<Bytes> {
    let Ok(mut v) = serde_json::from_slice::<Value>(&chunk.raw) else {
        return Some(chunk.raw.clone());
    };
    let final_usage = v
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty);
    if final_usage {
        return include_usage.then(|| chunk.raw.clone());
    }
    if continuous_usage {
        return Some(chunk.raw.clone());
    }
    if let Some(obj) = v.as_object_mut() {
        obj.remove("usage");
    }
    Some(Bytes::from(v.to_string()))
}

impl Collected {
    /// Adds one chunk.
    pub fn add(&mut self, chunk: &Chunk) {
        if self.id.is_none() {
            if let Ok(v) = serde_json::from_slice::<Value>(&chunk.raw) {
                self.id = v.get("id").and_then(Value::as_str).map(str::to_owned);
                self.created = v.get("created").and_then(Value::as_u64);
                self.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
            }
        }
        self.text.push_str(&chunk.text);
        if let Some(f) = &chunk.finish_reason {
            self.finish_reason = Some(f.clone());
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
    }

    /// vLLM's non-streaming response body for `route`.
    pub fn into_json(self, route: Route) -> Value {
        let usage = self.usage.map(|u| {
            let mut v = json!({
                "prompt_tokens": u.prompt_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens,
                "completion_tokens": u.completion_tokens,
            });
            if let Some(c) = u.cached_tokens {
                v["prompt_tokens_details"] = json!({ "cached_tokens": c });
            }
            v
        });
        let choice = match route {
            Route::Completions => json!({
                "index": 0,
                "text": self.text,
                "logprobs": null,
                "finish_reason": self.finish_reason,
                "stop_reason": null,
                "prompt_logprobs": null,
            }),
            Route::ChatCompletions | Route::Answer => json!({
                "index": 0,
                "message": {"role": "assistant", "content": self.text, "tool_calls": []},
                "logprobs": null,
                "finish_reason": self.finish_reason,
                "stop_reason": null,
            }),
        };
        let object = match route {
            Route::Completions => "text_completion",
            Route::ChatCompletions | Route::Answer => "chat.completion",
        };
        let mut body = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        });
        if let Some(cut) = self.cut {
            body["tutor_gateway"] = json!(cut);
        }
        body
    }
}
