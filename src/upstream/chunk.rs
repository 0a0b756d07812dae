//! One `data:` payload of vLLM's stream, read into a typed view that keeps the raw bytes, so the
//! relay can forward exactly what vLLM sent while the gateway counts tokens and spots the end.
//!
//! - `[DONE]` -> [`Payload::Done`].
//! - `{"error":{...}}` or the flat pre-0.10.1 `{"object":"error",...}` -> [`Payload::Error`].
//! - Any other JSON object -> [`Payload::Chunk`]: chat (`choices[0].delta.content`) and
//!   completions (`choices[0].text`) alike.
//! - Not JSON, or JSON of the wrong shape -> [`UpstreamError::Protocol`].
//!
//! Reasoning is output. A reasoning model's thinking arrives as `delta.reasoning` (current
//! vLLM: `DeltaMessage.reasoning: str | None` in `vllm/entrypoints/openai/engine/protocol.py`,
//! serialized only when set) or `delta.reasoning_content` (its name before, still sent by older
//! vLLM and other engines). vLLM counts those tokens in `usage.completion_tokens` like any
//! other output, and so does the gateway: a chunk carrying reasoning [`Chunk::has_content`],
//! so it is the first token (TTFT, the prefill hold's end), counts toward the lane's mid-stream
//! limit, promotion and cuts, and toward the output in usage and the request log.
//! [`Chunk::has_answer`] tells the answer proper (content, tool calls) apart, for the
//! time to the first answer token.
//!
//! The gateway sends `n = 1`, so only `choices[0]` carries text; a finish reason is read from
//! any choice.

use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::Deserialize;

use super::error::{EngineError, UpstreamError};

/// What one `data:` payload says.
// Parsed and matched once per event: boxing the chunk would allocate once more per token.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// `data: [DONE]`: vLLM has nothing more to send.
    Done,
    /// An error reported inside the stream; vLLM sends `[DONE]` after it.
    Error(Box<EngineError>),
    /// A completion chunk (chat or completions), including the final usage-only chunk.
    Chunk(Chunk),
}

/// A parsed completion chunk plus the bytes it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// The payload exactly as received (without `data: ` and the blank line).
    pub raw: Bytes,
    /// Text added by this chunk: chat `choices[0].delta.content` or completions
    /// `choices[0].text`; empty when there is none.
    pub text: String,
    /// Reasoning text added by this chunk (`choices[0].delta.reasoning`, or
    /// `reasoning_content`); empty when there is none.
    pub reasoning: String,
    /// Whether the reasoning came under the older name, `reasoning_content`.
    pub reasoning_content: bool,
    /// Tool-call pieces added by this chunk (`choices[0].delta.tool_calls`).
    pub tool_calls: Vec<ToolCallDelta>,
    /// The log-probabilities of this chunk's tokens (`choices[0].logprobs`, when asked for).
    pub logprobs: Option<serde_json::Map<String, serde_json::Value>>,
    /// `stop`, `length`, `abort`, `tool_calls`... on the chunk with the last token.
    pub finish_reason: Option<String>,
    /// vLLM's `stop_reason` beside a `stop` finish: the stop string or token id that matched
    /// (`None` when absent or `null`: the end-of-sequence token).
    pub stop_reason: Option<serde_json::Value>,
    /// Token usage: on the final chunk (`stream_options.include_usage`), or on every chunk with
    /// `continuous_usage_stats` (running totals).
    pub usage: Option<Usage>,
    /// vLLM's per-request timings (`--enable-per-request-metrics`, vLLM 0.25+), on the usage
    /// chunk.
    pub metrics: Option<EngineMetrics>,
    /// Whether this chunk carries generated output (text, reasoning text or tool-call deltas).
    /// The role-only first chat chunk (`"content":""`) and the usage chunk do not: they are not
    /// tokens.
    pub has_content: bool,
    /// Whether it carries at least one generated token, also one that decodes to no text: a
    /// special token, which vLLM's detokenizer skips (`skip_special_tokens`) and still streams
    /// as a chunk with `delta.content` `""` (chat) or `text` `""` (completions). Every chunk
    /// with content has one; the role-only first chat chunk (it has `delta.role`), a chunk
    /// that only carries the finish reason and the usage chunk do not.
    pub has_token: bool,
    /// Whether it carries answer output: text or tool-call deltas, not only reasoning
    /// (`delta.reasoning` / `delta.reasoning_content`).
    pub has_answer: bool,
    /// The final usage-only chunk: `usage` and no choices (`"choices": []`).
    pub usage_only: bool,
}

/// A piece of a streamed tool call (`delta.tool_calls[]`): the first piece of a call carries
/// its `id`, `type` and function `name`; the `arguments` come in pieces to be joined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// Which call of the answer it belongs to (0 when not said).
    pub index: u32,
    /// The call's id (first piece).
    pub id: Option<String>,
    /// `function` (first piece).
    pub kind: Option<String>,
    /// The function's name (first piece).
    pub name: Option<String>,
    /// This piece of the arguments (a JSON text in pieces).
    pub arguments: String,
}

impl ToolCallDelta {
    /// Adds `piece`, a later piece of the same call: its id, type and name when it has them,
    /// its arguments after the ones so far.
    pub fn join(&mut self, piece: &ToolCallDelta) {
        if piece.id.is_some() {
            self.id.clone_from(&piece.id);
        }
        if piece.kind.is_some() {
            self.kind.clone_from(&piece.kind);
        }
        if let Some(name) = &piece.name {
            self.name.get_or_insert_with(String::new).push_str(name);
        }
        self.arguments.push_str(&piece.arguments);
    }

    /// Adds `piece` to the calls of an answer so far: to the call with its index, or as a new
    /// call.
    pub fn join_into(calls: &mut Vec<ToolCallDelta>, piece: &ToolCallDelta) {
        match calls.iter_mut().find(|c| c.index == piece.index) {
            Some(call) => call.join(piece),
            None => calls.push(piece.clone()),
        }
    }

    /// The call as a non-streaming message lists it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "type": self.kind.as_deref().unwrap_or("function"),
            // A call without arguments may stream no piece of them: vLLM's whole answer says
            // `{}` (an empty string is no JSON for the client to parse).
            "function": {
                "name": self.name.as_deref().unwrap_or_default(),
                "arguments": if self.arguments.is_empty() { "{}" } else { self.arguments.as_str() },
            },
        })
    }

    fn read(v: &serde_json::Value) -> Self {
        let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
        ToolCallDelta {
            index: v["index"]
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .unwrap_or(0),
            id: text(&v["id"]),
            kind: text(&v["type"]),
            name: text(&v["function"]["name"]),
            arguments: text(&v["function"]["arguments"]).unwrap_or_default(),
        }
    }
}

/// Token usage as vLLM reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens (exact).
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache (`prompt_tokens_details.cached_tokens`);
    /// `None` when vLLM does not report it (it needs `--enable-prompt-tokens-details` and is
    /// left out when zero).
    pub cached_tokens: Option<u32>,
}

/// vLLM's per-request `metrics` object. Every field may be null or missing.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
pub struct EngineMetrics {
    /// Engine arrival to first token, milliseconds.
    #[serde(default)]
    pub time_to_first_token_ms: Option<f64>,
    /// First token to last token, milliseconds.
    #[serde(default)]
    pub generation_time_ms: Option<f64>,
    /// Engine arrival to first scheduling (the engine's own queue), milliseconds.
    #[serde(default)]
    pub queue_time_ms: Option<f64>,
    /// Mean inter-token latency, milliseconds.
    #[serde(default)]
    pub mean_itl_ms: Option<f64>,
    /// Output tokens per second of generation.
    #[serde(default)]
    pub tokens_per_second: Option<f64>,
}

impl EngineMetrics {
    /// The same, each figure kept only when an engine could have measured it: finite, not
    /// negative, a time under a day (a lying engine's `-1e308` ms would otherwise reach the
    /// request log, the spans and the histograms).
    fn plausible(self) -> Self {
        const DAY_MS: f64 = 86_400_000.0;
        let time = |v: Option<f64>| v.filter(|x| x.is_finite() && (0.0..DAY_MS).contains(x));
        let rate = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0);
        Self {
            time_to_first_token_ms: time(self.time_to_first_token_ms),
            generation_time_ms: time(self.generation_time_ms),
            queue_time_ms: time(self.queue_time_ms),
            mean_itl_ms: time(self.mean_itl_ms),
            tokens_per_second: rate(self.tokens_per_second),
        }
    }
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    object: Option<String>,
    #[serde(default)]
    choices: Vec<WireChoice>,
    /// Its counts are read as any JSON number: one that is no token count (negative,
    /// fractional, past u32) leaves the usage out, never a reason to fail an answer that may
    /// have finished. (Numbers, not a `Value`: this is on every chunk.)
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    metrics: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    delta: Option<WireDelta>,
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    stop_reason: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireDelta {
    /// On the first chat chunk only: it opens the message, no token.
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<String>,
    /// Current vLLM's name for reasoning text.
    #[serde(default)]
    reasoning: Option<String>,
    /// The older name (vLLM before the rename, other engines).
    #[serde(default)]
    reasoning_content: Option<String>,
    /// Read leniently ([`ToolCallDelta::read`]): a piece of an unexpected shape is kept as far
    /// as it reads, never a reason to fail the stream.
    #[serde(default)]
    tool_calls: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<serde_json::Number>,
    #[serde(default)]
    completion_tokens: Option<serde_json::Number>,
    #[serde(default)]
    prompt_tokens_details: Option<WireDetails>,
}

#[derive(Deserialize)]
struct WireDetails {
    #[serde(default)]
    cached_tokens: Option<serde_json::Number>,
}

/// A token count: a whole number that fits a u32.
fn count(n: Option<serde_json::Number>) -> Option<u32> {
    n.and_then(|n| n.as_u64())
        .and_then(|n| u32::try_from(n).ok())
}

fn non_empty(s: Option<&str>) -> bool {
    s.is_some_and(|t| !t.is_empty())
}

impl WireChoice {
    /// Any generated output: answer or reasoning.
    fn has_content(&self) -> bool {
        self.has_answer()
            || self.delta.as_ref().is_some_and(|d| {
                non_empty(d.reasoning.as_deref()) || non_empty(d.reasoning_content.as_deref())
            })
    }

    /// A generated token, with text or without ([`Chunk::has_token`]).
    fn has_token(&self) -> bool {
        if self.has_content() {
            return true;
        }
        if self.finish_reason.is_some() {
            return false;
        }
        match &self.delta {
            Some(d) => {
                d.role.is_none()
                    && (d.content.is_some()
                        || d.reasoning.is_some()
                        || d.reasoning_content.is_some())
            }
            None => self.text.is_some(),
        }
    }

    /// Answer output: completions text, chat content or tool-call deltas.
    fn has_answer(&self) -> bool {
        non_empty(self.text.as_deref())
            || self.delta.as_ref().is_some_and(|d| {
                non_empty(d.content.as_deref())
                    || d.tool_calls.as_ref().is_some_and(|t| !t.is_empty())
            })
    }
}

impl Chunk {
    /// Whether it can move the output count: it carries a token (with text or without) or a
    /// usage. The lane's limit is checked on every such chunk, so that tokens that decode to
    /// no text are counted against it too.
    pub fn counts_output(&self) -> bool {
        self.has_token || self.usage.is_some()
    }

    /// In the continuation of an answer (`continue_final_message` on an assistant message with
    /// text), everything generated is answer: the reasoning text becomes the answer's. vLLM's
    /// reasoning parsers take a continuation's tokens for reasoning when the chat template
    /// leaves no closing think tag in the prompt (DeepSeek-R1's template; its parser streams
    /// every token before `</think>` as reasoning, `vllm/reasoning/deepseek_r1_reasoning_parser.py`),
    /// and the answer would otherwise end where it was cut.
    pub fn reasoning_as_answer(&mut self) {
        if !self.reasoning.is_empty() {
            let reasoning = std::mem::take(&mut self.reasoning);
            self.text = reasoning + &self.text;
            self.has_answer = true;
        }
    }
}

/// Reads one `data:` payload.
///
/// An event of several `data:` lines (which SSE allows; vLLM writes one) comes joined with
/// `\n`, which valid JSON holds only between its tokens (never raw inside a string): it is kept
/// as a space, so the payload relayed as one `data:` line is still the whole JSON.
pub fn parse_payload(raw: Bytes) -> Result<Payload, UpstreamError> {
    if raw.as_ref() == b"[DONE]" {
        return Ok(Payload::Done);
    }
    let raw = if raw.contains(&b'\n') {
        Bytes::from(
            raw.iter()
                .map(|&b| if b == b'\n' { b' ' } else { b })
                .collect::<Vec<u8>>(),
        )
    } else {
        raw
    };
    let wire: WireChunk = serde_json::from_slice(&raw).map_err(|e| {
        // Only the error class and position: serde's full message can quote the payload's text.
        UpstreamError::Protocol(format!(
            "a stream event is not a vLLM chunk ({:?} error at line {} column {})",
            e.classify(),
            e.line(),
            e.column()
        ))
    })?;
    if wire.error.is_some() || wire.object.as_deref() == Some("error") {
        return EngineError::parse(&raw)
            .map(|e| Payload::Error(Box::new(e)))
            .ok_or_else(|| UpstreamError::Protocol("an error event without a message".into()));
    }
    let has_content = wire.choices.iter().any(WireChoice::has_content);
    let has_token = wire.choices.iter().any(WireChoice::has_token);
    let has_answer = wire.choices.iter().any(WireChoice::has_answer);
    let no_choices = wire.choices.is_empty();
    let finish_reason = wire.choices.iter().find_map(|c| c.finish_reason.clone());
    let stop_reason = wire
        .choices
        .iter()
        .find_map(|c| c.stop_reason.clone().filter(|r| !r.is_null()));
    let mut first = wire.choices.into_iter().next();
    let logprobs = first
        .as_mut()
        .and_then(|c| c.logprobs.take())
        .and_then(|lp| match lp {
            serde_json::Value::Object(map) => Some(map),
            _ => None,
        });
    let (text, reasoning, reasoning_content, tool_calls) = first
        .map(|c| match c.delta {
            Some(d) => {
                let legacy = d.reasoning.is_none() && d.reasoning_content.is_some();
                (
                    d.content.unwrap_or_default(),
                    d.reasoning.or(d.reasoning_content).unwrap_or_default(),
                    legacy,
                    d.tool_calls
                        .unwrap_or_default()
                        .iter()
                        .map(ToolCallDelta::read)
                        .collect(),
                )
            }
            None => (c.text.unwrap_or_default(), String::new(), false, Vec::new()),
        })
        .unwrap_or_default();
    let usage = wire.usage.and_then(|u| {
        Some(Usage {
            prompt_tokens: count(u.prompt_tokens)?,
            completion_tokens: count(u.completion_tokens)?,
            cached_tokens: u.prompt_tokens_details.and_then(|d| count(d.cached_tokens)),
        })
    });
    Ok(Payload::Chunk(Chunk {
        raw,
        text,
        reasoning,
        reasoning_content,
        tool_calls,
        logprobs,
        finish_reason,
        stop_reason,
        usage,
        metrics: wire
            .metrics
            .and_then(|m| serde_json::from_value::<EngineMetrics>(m).ok())
            .map(EngineMetrics::plausible),
        has_content,
        has_token,
        has_answer,
        usage_only: no_choices && usage.is_some(),
    }))
}

#[cfg(test)]
#[path = "chunk_tests.rs"]
mod tests;
