//! What the gateway asks vLLM for: [`UpstreamRequest`], and the body rules applied to it.

use serde_json::{Map, Value};

/// vLLM's two generation endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions` (messages).
    ChatCompletions,
    /// `POST /v1/completions` (a raw prompt).
    Completions,
}

impl Endpoint {
    /// The path under the upstream base URL.
    pub const fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// One streaming generation request to send upstream.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// The gateway's request id: sent as `X-Request-Id`, from which vLLM derives its own
    /// (`chatcmpl-<id>`, `cmpl-<id>-0`), the one the abort call names. Must be a valid header
    /// value (the gateway generates it).
    pub request_id: String,
    /// W3C `traceparent` to propagate, so vLLM's span joins the gateway's trace; an invalid
    /// value is dropped rather than sent.
    pub traceparent: Option<String>,
    /// The OpenAI-style JSON body. See [`prepare_body`] for what the client changes.
    pub body: Map<String, Value>,
    /// The routing key: the prompt's prefix fingerprint when it has a stable prefix (a system
    /// prompt or tools), so requests sharing it go to the replica that has it cached.
    pub affinity: Option<String>,
    /// The replica (by name) it must go to when that one takes traffic: where the pieces of a
    /// prompt prefilled in pieces went (`crate::pipeline::pieces`). `None`: routed as usual.
    pub pin: Option<String>,
    /// The gateway's own continuation of an answer (pre-empted work, [`continues_answer`]):
    /// what the engine streams as reasoning is read as the answer's text
    /// ([`super::Chunk::reasoning_as_answer`]). Never for a client's `/v1` request, whose
    /// answer stays as vLLM gives it.
    pub continues_answer: bool,
}

/// Applies the upstream body rules in place:
/// - `"stream": true` always (the client streams; a non-streaming API answer is assembled by
///   the caller from the stream);
/// - `"stream_options"` gets `"include_usage": true`, other keys the client sent (e.g.
///   `continuous_usage_stats`) are kept; a missing or non-object value is replaced;
/// - `"model"` is set to `model` when the body has none.
pub fn prepare_body(body: &mut Map<String, Value>, model: &str) {
    body.insert("stream".into(), Value::Bool(true));
    match body.get_mut("stream_options") {
        Some(Value::Object(opts)) => {
            opts.insert("include_usage".into(), Value::Bool(true));
        }
        _ => {
            let mut opts = Map::new();
            opts.insert("include_usage".into(), Value::Bool(true));
            body.insert("stream_options".into(), Value::Object(opts));
        }
    }
    if !body.contains_key("model") {
        body.insert("model".into(), Value::String(model.to_owned()));
    }
}

/// Whether `body` continues an answer: `continue_final_message` on a final assistant message
/// with text (as the gateway's continuations of pre-empted work are).
pub fn continues_answer(body: &Map<String, Value>) -> bool {
    let continued = body.get("continue_final_message") == Some(&Value::Bool(true));
    let last = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last());
    continued
        && last.is_some_and(|m| {
            m.get("role").and_then(Value::as_str) == Some("assistant")
                && m.get("content").is_some_and(|c| match c {
                    Value::String(s) => !s.is_empty(),
                    Value::Array(parts) => !parts.is_empty(),
                    _ => false,
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prepared(v: Value) -> Value {
        let Value::Object(mut map) = v else { panic!() };
        prepare_body(&mut map, "m");
        Value::Object(map)
    }

    #[test]
    fn forces_streaming_with_usage() {
        let v = prepared(json!({"model": "x", "stream": false, "prompt": "p"}));
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"], json!({"include_usage": true}));
        assert_eq!(v["model"], "x");
        assert_eq!(v["prompt"], "p");
    }

    #[test]
    fn keeps_other_stream_options_and_overrides_include_usage() {
        let v = prepared(json!({
            "stream_options": {"include_usage": false, "continuous_usage_stats": true}
        }));
        assert_eq!(
            v["stream_options"],
            json!({"include_usage": true, "continuous_usage_stats": true})
        );
    }

    #[test]
    fn replaces_non_object_stream_options_and_fills_model() {
        let v = prepared(json!({"stream_options": null}));
        assert_eq!(v["stream_options"], json!({"include_usage": true}));
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn only_a_continued_assistant_message_with_text_continues_an_answer() {
        let body = |v: Value| {
            let Value::Object(map) = v else { panic!() };
            continues_answer(&map)
        };
        let said = json!([{"role": "user", "content": "why?"}, {"role": "assistant", "content": "Because"}]);
        assert!(body(
            json!({"messages": said, "continue_final_message": true})
        ));
        assert!(!body(json!({"messages": said})), "not continued");
        assert!(!body(
            json!({"messages": said, "continue_final_message": false})
        ));
        let empty =
            json!([{"role": "user", "content": "why?"}, {"role": "assistant", "content": ""}]);
        assert!(!body(
            json!({"messages": empty, "continue_final_message": true})
        ));
        let user_last = json!([{"role": "user", "content": "why?"}]);
        assert!(!body(
            json!({"messages": user_last, "continue_final_message": true})
        ));
        assert!(!body(
            json!({"prompt": "why?", "continue_final_message": true})
        ));
    }

    #[test]
    fn endpoint_paths() {
        assert_eq!(Endpoint::ChatCompletions.path(), "/v1/chat/completions");
        assert_eq!(Endpoint::Completions.path(), "/v1/completions");
    }
}
