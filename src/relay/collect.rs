//! A whole answer assembled from vLLM's stream, for `/v1` clients that asked for no streaming.
//! The gateway always streams from vLLM (one code path for tokens, timeouts and aborts) and
//! answers in the shape of vLLM's non-streaming response.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::telemetry::{LatencySplit, Route};
use crate::upstream::{Chunk, ToolCallDelta, Usage};

/// The most bytes a whole answer of a model with `max_model_len` tokens may take as vLLM
/// streams it: 4 KiB a token (a token's chunk, with 20 log-probabilities, is under 2 KiB).
pub fn most_bytes(max_model_len: u32) -> u64 {
    u64::from(max_model_len.max(1)) * 4096
}

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
    /// A reasoning model's reasoning.
    pub reasoning: String,
    /// Whether it came as `reasoning_content` (older vLLM) rather than `reasoning`: the message
    /// says it under the same name.
    pub reasoning_content: bool,
    /// The answer's tool calls, each joined from its pieces ([`ToolCallDelta::join`]), in the
    /// order they opened.
    pub tool_calls: Vec<ToolCallDelta>,
    /// The log-probabilities, joined: each list the chunks carried (chat `content`,
    /// completions `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) one after the
    /// other; `None` when no chunk had any (not asked for).
    pub logprobs: Option<serde_json::Map<String, Value>>,
    /// Why generation stopped.
    pub finish_reason: Option<String>,
    /// What matched, when a stop string or token stopped it (vLLM's `stop_reason`).
    pub stop_reason: Option<Value>,
    /// Final usage.
    pub usage: Option<Usage>,
    /// Set when the answer was cut at its lane's limit.
    pub cut: Option<super::cut::CutInfo>,
    /// The message's role as the first chunk gave it (`assistant`, or the last message's role
    /// when the client continued it).
    pub role: Option<String>,
    /// The final usage as vLLM wrote it (its details included: reasoning tokens, cache).
    pub raw_usage: Option<Value>,
    /// What vLLM puts beside the final usage only: `system_fingerprint`, per-request `metrics`.
    pub beside_usage: serde_json::Map<String, Value>,
    /// The request forced a tool call (`tool_choice` `"required"` or a named function): vLLM
    /// then answers `content: ""` beside the calls, otherwise `null`.
    pub forced_tool_call: bool,
    /// The latency split at the end.
    pub timings: LatencySplit,
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
    if chunk.usage_only {
        return include_usage.then(|| chunk.raw.clone());
    }
    if continuous_usage {
        return Some(chunk.raw.clone());
    }
    // Cut the field out of the bytes vLLM sent (no parse and re-serialise per token).
    Some(match top_level_field(&chunk.raw, b"usage") {
        Some(span) => {
            let mut out = Vec::with_capacity(chunk.raw.len());
            out.extend_from_slice(&chunk.raw[..span.start]);
            out.extend_from_slice(&chunk.raw[span.end..]);
            Bytes::from(out)
        }
        None => chunk.raw.clone(),
    })
}

/// The bytes to cut to remove member `key` from the JSON object `raw`: the member with the comma
/// that separates it from its neighbour. `None` when `raw` is not an object, lacks the key at
/// its top level, or is malformed. The key must need no escaping.
fn top_level_field(raw: &[u8], key: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut i = skip_ws(raw, 0);
    if raw.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    // End of the previous member's value (just before its comma), if any.
    let mut prev_end: Option<usize> = None;
    loop {
        i = skip_ws(raw, i);
        let key_start = i;
        if raw.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(raw, i)?;
        let colon = skip_ws(raw, key_end);
        if raw.get(colon) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(raw, colon + 1);
        let value_end = skip_value(raw, value_start)?;
        let after = skip_ws(raw, value_end);
        let found = &raw[key_start + 1..key_end - 1] == key;
        match raw.get(after) {
            Some(b',') if found => return Some(key_start..skip_ws(raw, after + 1)),
            Some(b'}') if found => return Some(prev_end.unwrap_or(key_start)..value_end),
            Some(b',') => {
                prev_end = Some(value_end);
                i = after + 1;
            }
            _ => return None,
        }
    }
}

fn skip_ws(raw: &[u8], mut i: usize) -> usize {
    while raw.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// `raw[i]` is `"`: the index just past the closing quote.
fn skip_string(raw: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match raw.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// The index just past the JSON value starting at `raw[i]` (strings and brackets matched; the
/// scalars inside are not validated: vLLM's chunk was already parsed as JSON).
fn skip_value(raw: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    loop {
        match raw.get(i)? {
            b'"' => i = skip_string(raw, i)?,
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' if depth == 0 => return Some(i),
            b'}' | b']' => {
                depth -= 1;
                i += 1;
            }
            b',' if depth == 0 => return Some(i),
            c if depth == 0 && c.is_ascii_whitespace() => return Some(i),
            _ => i += 1,
        }
        if depth == 0 && matches!(raw.get(i - 1), Some(b'}' | b']' | b'"')) {
            return Some(i);
        }
    }
}

impl Collected {
    /// Adds one chunk.
    pub fn add(&mut self, chunk: &Chunk) {
        if self.id.is_none() || chunk.usage_only {
            if let Ok(v) = serde_json::from_slice::<Value>(&chunk.raw) {
                if self.id.is_none() {
                    self.id = v.get("id").and_then(Value::as_str).map(str::to_owned);
                    self.created = v.get("created").and_then(Value::as_u64);
                    self.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
                    self.role = v["choices"][0]["delta"]["role"].as_str().map(str::to_owned);
                }
                if chunk.usage_only {
                    self.raw_usage = v.get("usage").filter(|u| u.is_object()).cloned();
                    for key in ["system_fingerprint", "metrics"] {
                        if let Some(x) = v.get(key).filter(|x| !x.is_null()) {
                            self.beside_usage.insert(key.to_owned(), x.clone());
                        }
                    }
                }
            }
        }
        self.text.push_str(&chunk.text);
        if !chunk.reasoning.is_empty() {
            self.reasoning.push_str(&chunk.reasoning);
            self.reasoning_content = chunk.reasoning_content;
        }
        for piece in &chunk.tool_calls {
            ToolCallDelta::join_into(&mut self.tool_calls, piece);
        }
        if let Some(lp) = &chunk.logprobs {
            let joined = self.logprobs.get_or_insert_with(Default::default);
            for (key, value) in lp {
                match (joined.get_mut(key), value) {
                    (Some(Value::Array(all)), Value::Array(more)) => {
                        all.extend(more.iter().cloned())
                    }
                    _ => {
                        joined.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        if let Some(f) = &chunk.finish_reason {
            self.finish_reason = Some(f.clone());
        }
        if chunk.stop_reason.is_some() {
            self.stop_reason.clone_from(&chunk.stop_reason);
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
    }

    /// vLLM's non-streaming response body for `route`.
    pub fn into_json(mut self, route: Route) -> Value {
        // vLLM's own final usage when it came (a cut answer has only the running one).
        let raw_usage = self.raw_usage.take().filter(|_| self.cut.is_none());
        let usage = raw_usage.or_else(|| {
            self.usage.map(|u| {
                let mut v = json!({
                    "prompt_tokens": u.prompt_tokens,
                    "total_tokens": u64::from(u.prompt_tokens) + u64::from(u.completion_tokens),
                    "completion_tokens": u.completion_tokens,
                });
                if let Some(c) = u.cached_tokens {
                    v["prompt_tokens_details"] = json!({ "cached_tokens": c });
                }
                v
            })
        });
        let logprobs = self.logprobs.take().map_or(Value::Null, Value::Object);
        let choice = match route {
            Route::Completions => json!({
                "index": 0,
                "text": self.text,
                "logprobs": logprobs,
                "finish_reason": self.finish_reason,
                "stop_reason": self.stop_reason,
                "prompt_logprobs": null,
            }),
            Route::ChatCompletions | Route::Answer | Route::Job => {
                // As vLLM's non-streaming message: `content` null when the answer is only tool
                // calls (unless a call was forced: "") or only reasoning; `tool_calls` only
                // when there are some (an empty list sent back with the history breaks Llama
                // 3's tool templates).
                let calls: Vec<Value> =
                    self.tool_calls.iter().map(ToolCallDelta::to_json).collect();
                let nothing_said = self.text.is_empty()
                    && !self.forced_tool_call
                    && (!self.reasoning.is_empty() || !calls.is_empty());
                let content = if nothing_said {
                    Value::Null
                } else {
                    Value::String(std::mem::take(&mut self.text))
                };
                let role = self.role.take().unwrap_or_else(|| "assistant".to_owned());
                let mut message = json!({"role": role, "content": content});
                if !calls.is_empty() {
                    message["tool_calls"] = Value::Array(calls);
                }
                if !self.reasoning.is_empty() {
                    let field = if self.reasoning_content {
                        "reasoning_content"
                    } else {
                        "reasoning"
                    };
                    message[field] = Value::String(self.reasoning.clone());
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": self.finish_reason,
                    "stop_reason": self.stop_reason,
                })
            }
        };
        let object = match route {
            Route::Completions => "text_completion",
            Route::ChatCompletions | Route::Answer | Route::Job => "chat.completion",
        };
        let mut body = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        });
        if let Some(fields) = body.as_object_mut() {
            fields.extend(std::mem::take(&mut self.beside_usage));
        }
        if let Some(cut) = self.cut {
            body["tutor_gateway"] = json!(cut);
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// What the client must get: vLLM's object without its top-level `usage`.
    fn expected(raw: &str) -> Value {
        let mut v: Value = serde_json::from_str(raw).unwrap();
        v.as_object_mut().unwrap().remove("usage");
        v
    }

    fn cut(raw: &str) -> Value {
        let span = top_level_field(raw.as_bytes(), b"usage");
        let mut out = raw.as_bytes().to_vec();
        if let Some(span) = span {
            out.drain(span);
        }
        serde_json::from_slice(&out).expect("still JSON after the cut")
    }

    fn chunk(raw: &str) -> Chunk {
        match crate::upstream::parse_payload(bytes::Bytes::copy_from_slice(raw.as_bytes())) {
            Ok(crate::upstream::Payload::Chunk(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    /// What vLLM puts in its whole answer beside the text comes through: its final usage as it
    /// wrote it (reasoning tokens and cache details), its `system_fingerprint`, the role the
    /// first chunk gave, and `{}` for a call whose arguments streamed no piece.
    #[test]
    fn the_whole_answer_keeps_what_vllm_says_beside_the_text() {
        let mut all = Collected::default();
        for raw in [
            r#"{"id":"chatcmpl-2","model":"m","choices":[{"index":0,"delta":{"role":"user","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"now"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"id":"chatcmpl-2","choices":[],"system_fingerprint":"fp-7","usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13,"completion_tokens_details":{"reasoning_tokens":2},"prompt_tokens_details":{"cached_tokens":0}}}"#,
        ] {
            all.add(&chunk(raw));
        }
        let v = all.into_json(Route::ChatCompletions);
        let message = &v["choices"][0]["message"];
        assert_eq!(message["role"], "user", "{v}");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"], "{}",
            "{v}"
        );
        assert_eq!(
            v["usage"]["completion_tokens_details"]["reasoning_tokens"], 2,
            "{v}"
        );
        assert_eq!(v["usage"]["total_tokens"], 13);
        assert_eq!(v["system_fingerprint"], "fp-7");
    }

    #[test]
    fn parallel_tool_calls_are_joined_each_from_its_own_pieces() {
        let mut all = Collected::default();
        for raw in [
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"grade","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"student\": "}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"hint","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"7}"}}]}}]}"#,
            // A piece of an unexpected shape does not fail the stream; what reads is kept.
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":"x","function":7}]},"finish_reason":"tool_calls"}]}"#,
        ] {
            all.add(&chunk(raw));
        }
        let mut forced = all.clone();
        forced.forced_tool_call = true;
        let v = all.into_json(Route::ChatCompletions);
        let calls = &v["choices"][0]["message"]["tool_calls"];
        assert_eq!(
            *calls,
            json!([
                {"id": "call_a", "type": "function",
                 "function": {"name": "grade", "arguments": "{\"student\": 7}"}},
                {"id": "call_b", "type": "function", "function": {"name": "hint", "arguments": "{}"}},
            ]),
            "{v}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        // Tool calls alone: `content` null, as vLLM's parsers answer (a forced call: "").
        assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
        let forced = forced.into_json(Route::ChatCompletions);
        assert_eq!(forced["choices"][0]["message"]["content"], "");
        assert!(v["choices"][0]["logprobs"].is_null());
    }

    #[test]
    fn a_stop_strings_match_is_the_answers_stop_reason() {
        for (route, raw) in [
            (
                Route::ChatCompletions,
                r#"{"choices":[{"index":0,"delta":{"content":" done"},"finish_reason":"stop","stop_reason":"END"}]}"#,
            ),
            (
                Route::Completions,
                r#"{"choices":[{"index":0,"text":" done","finish_reason":"stop","stop_reason":"END"}]}"#,
            ),
        ] {
            let mut all = Collected::default();
            all.add(&chunk(
                r#"{"choices":[{"index":0,"delta":{"content":"all"},"stop_reason":null}]}"#,
            ));
            all.add(&chunk(raw));
            let v = all.into_json(route);
            assert_eq!(v["choices"][0]["stop_reason"], "END", "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
        }
        // The end-of-sequence token: no stop reason.
        let mut eos = Collected::default();
        eos.add(&chunk(
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop","stop_reason":null}]}"#,
        ));
        assert!(eos.into_json(Route::ChatCompletions)["choices"][0]["stop_reason"].is_null());
    }

    #[test]
    fn the_usage_member_is_cut_wherever_it_stands() {
        for raw in [
            r#"{"usage":{"prompt_tokens":3},"id":"x"}"#,
            r#"{"id":"x","usage":{"prompt_tokens":3}}"#,
            r#"{"id":"x","usage":{"prompt_tokens":3},"choices":[]}"#,
            r#"{"usage":null}"#,
            r#"{ "id" : "a\"usage\":1}" , "usage" : { "a" : [1, {"usage": 2}] } , "z" : true }"#,
            "{\n  \"choices\": [{\"delta\": {\"usage\": \"}{][\\\\\"}}],\n  \"usage\": 7\n}",
            r#"{"choices":[{"text":"usage"}],"model":"m"}"#,
        ] {
            assert_eq!(cut(raw), expected(raw), "{raw}");
        }
        assert_eq!(top_level_field(br#"{"id":1}"#, b"usage"), None);
        assert_eq!(top_level_field(b"[1]", b"usage"), None);
        assert_eq!(top_level_field(br#"{"usage":"#, b"usage"), None);
    }

    fn random_value(rng: &mut StdRng, depth: u32) -> Value {
        const STRINGS: [&str; 6] = ["usage", "\"usage\":", "}]{[", "a\\\"b", ",", "ü \n"];
        match rng.random_range(0..if depth > 2 { 4 } else { 6 }) {
            0 => Value::Null,
            1 => json!(rng.random_range(-5.0..5.0)),
            2 => json!(rng.random_bool(0.5)),
            3 => json!(STRINGS[rng.random_range(0..STRINGS.len())]),
            4 => Value::Array(
                (0..rng.random_range(0..4))
                    .map(|_| random_value(rng, depth + 1))
                    .collect(),
            ),
            _ => random_object(rng, depth + 1),
        }
    }

    fn random_object(rng: &mut StdRng, depth: u32) -> Value {
        const KEYS: [&str; 5] = ["usage", "id", "choices", "us\"age", "usage "];
        let mut o = serde_json::Map::new();
        for _ in 0..rng.random_range(0..5) {
            o.insert(
                KEYS[rng.random_range(0..KEYS.len())].into(),
                random_value(rng, depth),
            );
        }
        Value::Object(o)
    }

    #[test]
    fn cutting_the_bytes_equals_removing_the_member_from_the_parsed_object() {
        let mut rng = StdRng::seed_from_u64(14);
        for _ in 0..3000 {
            let v = random_object(&mut rng, 0);
            for raw in [v.to_string(), serde_json::to_string_pretty(&v).unwrap()] {
                assert_eq!(cut(&raw), expected(&raw), "{raw}");
                let present = v.get("usage").is_some();
                assert_eq!(top_level_field(raw.as_bytes(), b"usage").is_some(), present);
            }
        }
    }
}
