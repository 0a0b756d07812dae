//! Request bodies of `/v1/chat/completions` and `/v1/completions`, validated into a
//! [`Generation`]: what the engine needs plus how to answer.

use axum::http::HeaderMap;
use serde::Deserialize;

use super::error::ApiError;
use super::state::AppState;
use crate::tokenizer::{ChatMessage, PromptEnd};

/// `stream_options` (vLLM's `StreamOptions`, `vllm/entrypoints/generate/base/protocol.py`: both
/// default to false; older vLLM defaulted `include_usage` to true).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Final chunk with usage.
    #[serde(default)]
    pub include_usage: bool,
    /// Running usage on every chunk, only with `include_usage` too (vLLM's
    /// `should_include_usage`, `vllm/entrypoints/serve/utils/api_utils.py`).
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// A field that is present, `null` or not: `Some(None)` for `null` (absent stays `None` through
/// `#[serde(default)]`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Fields both endpoints share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// Model name; must be the served one when present.
    #[serde(default)]
    pub model: Option<String>,
    /// Output limit: absent (`None`), `null` (`Some(None)`) or a number. vLLM tells the two
    /// apart on completions: absent is 16, `null` is "up to the model's length".
    #[serde(default, deserialize_with = "present")]
    pub max_tokens: Option<Option<u32>>,
    /// Output limit, newer name (chat).
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Stream the answer as SSE.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Generate exactly `max_tokens`.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Seed for the output length.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Scheduling priority (lower first) under `--scheduling-policy priority`.
    #[serde(default)]
    pub priority: i64,
    /// Request id when no `X-Request-Id` header is sent.
    #[serde(default)]
    pub request_id: Option<String>,
    /// vLLM's prefix-cache salt: requests with different salts share no cached block.
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// Number of choices; only 1 is simulated.
    #[serde(default)]
    pub n: Option<u32>,
    /// Log-probabilities of the output tokens: chat `true`, completions how many alternatives.
    #[serde(default)]
    pub logprobs: Option<serde_json::Value>,
    /// Chat: how many alternatives per token (with `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// The only token ids the engine may sample. Ids from [`SPECIAL_TOKENS_FROM`] on are
    /// special tokens, which decode to no text unless `skip_special_tokens` is false: an
    /// answer of them streams chunks whose `delta.content` is empty, with their usage.
    #[serde(default)]
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Whether special tokens are left out of the decoded text (vLLM's default: true).
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    /// Keep only the prompt's last this many tokens (-1: the model's context length), as
    /// vLLM truncates a rendered prompt before it checks its length.
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    /// Sampling knobs the simulator does not use, typed and checked as vLLM does
    /// ([`Sampling::verify`]), so a wrong value gets vLLM's 400 instead of an answer.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// The sampling fields vLLM checks (`SamplingParams._verify_args` in
/// `vllm/sampling_params.py`); a wrong type fails the body's parse, a value out of range
/// [`Sampling::verify`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    /// Sampling temperature, in [0, 2].
    #[serde(default, deserialize_with = "lax_f64")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass, in (0, 1].
    #[serde(default, deserialize_with = "lax_f64")]
    pub top_p: Option<f64>,
    /// Top-k sampling: 0 or -1 off, else at least 1.
    #[serde(default, deserialize_with = "lax_i64")]
    pub top_k: Option<i64>,
    /// Minimum probability, in [0, 1].
    #[serde(default, deserialize_with = "lax_f64")]
    pub min_p: Option<f64>,
    /// Presence penalty, in [-2, 2].
    #[serde(default, deserialize_with = "lax_f64")]
    pub presence_penalty: Option<f64>,
    /// Frequency penalty, in [-2, 2].
    #[serde(default, deserialize_with = "lax_f64")]
    pub frequency_penalty: Option<f64>,
    /// Repetition penalty, above 0.
    #[serde(default, deserialize_with = "lax_f64")]
    pub repetition_penalty: Option<f64>,
}

/// A float as pydantic reads one in lax mode (vLLM's request models): a number, or a string
/// that spells one (`"0.7"`); `null` is none.
fn lax_f64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => Ok(n.as_f64()),
        Some(serde_json::Value::String(s)) => s.trim().parse::<f64>().map(Some).map_err(|_| {
            D::Error::custom(format!("invalid type: string {s:?}, expected a number"))
        }),
        Some(other) => Err(D::Error::custom(format!(
            "invalid type: {other}, expected a number"
        ))),
    }
}

/// An integer as pydantic reads one in lax mode: an integer, a float without a fraction
/// (`5.0`), or a string that spells an integer.
fn lax_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    use serde::de::Error;
    let whole = |f: f64| (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64);
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().and_then(whole))
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("invalid value: {n}, expected an integer"))),
        Some(serde_json::Value::String(s)) => s.trim().parse::<i64>().map(Some).map_err(|_| {
            D::Error::custom(format!("invalid type: string {s:?}, expected an integer"))
        }),
        Some(other) => Err(D::Error::custom(format!(
            "invalid type: {other}, expected an integer"
        ))),
    }
}

impl Sampling {
    /// vLLM's range checks, with its messages.
    pub fn verify(&self) -> Result<(), ApiError> {
        let bad =
            |message: String, param: &'static str| Err(ApiError::bad_request(message, Some(param)));
        for (value, param) in [
            (self.presence_penalty, "presence_penalty"),
            (self.frequency_penalty, "frequency_penalty"),
        ] {
            if let Some(v) = value.filter(|v| !(-2.0..=2.0).contains(v)) {
                return bad(format!("{param} must be in [-2, 2], got {v}."), param);
            }
        }
        if let Some(v) = self.repetition_penalty.filter(|v| *v <= 0.0) {
            return bad(
                format!("repetition_penalty must be greater than zero, got {v}."),
                "repetition_penalty",
            );
        }
        if let Some(v) = self.temperature {
            if v < 0.0 {
                return bad(
                    format!("temperature must be non-negative, got {v}."),
                    "temperature",
                );
            }
            if v > 2.0 {
                return bad(
                    format!("temperature must be in [0, 2], got {v}."),
                    "temperature",
                );
            }
        }
        if let Some(v) = self.top_p.filter(|v| !(*v > 0.0 && *v <= 1.0)) {
            return bad(format!("top_p must be in (0, 1], got {v}."), "top_p");
        }
        if let Some(v) = self.top_k.filter(|v| *v < -1) {
            return bad(
                format!("top_k must be 0 (disable), or at least 1, got {v}."),
                "top_k",
            );
        }
        if let Some(v) = self.min_p.filter(|v| !(0.0..=1.0).contains(v)) {
            return bad(format!("min_p must be in [0, 1], got {v}."), "min_p");
        }
        Ok(())
    }
}

/// The first special token id (Llama 3's `<|begin_of_text|>` is 128000, its reserved special
/// tokens follow): the heuristic tokenizer's ordinary ids stay below it.
pub const SPECIAL_TOKENS_FROM: u32 = 128_000;

/// The vocabulary's size (Llama 3's: 128,000 ordinary ids and 256 special ones).
pub const VOCAB_SIZE: u32 = 128_256;

/// `/v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatBody {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Tool schemas; rendered into the prompt before the messages, as sent (key order kept),
    /// the way a chat template puts them in front, so their bytes count for the prefix cache.
    #[serde(default)]
    pub tools: Option<serde_json::Value>,
    /// Values handed to the chat template; rendered into the prompt after the tools, as real
    /// templates render the ones they use (`custom_tools`, extra instructions).
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// Open the assistant's turn at the end of the prompt (vLLM's default: true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Continue the final message instead of opening a new turn (see [`prompt_end`]).
    #[serde(default)]
    pub continue_final_message: bool,
    /// `{"type": "function", "function": {"name": ...}}` makes the answer a call of that tool
    /// ([`Generation::tool_call`]); other values answer in text.
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    /// Shared fields.
    #[serde(flatten)]
    pub common: Common,
}

/// How a chat prompt ends, as vLLM validates and renders it: both `continue_final_message` and
/// an explicit `add_generation_prompt: true` is a 400 with vLLM's message (its
/// `check_generation_prompt` validator reads the fields as sent, so `continue_final_message`
/// alone is accepted); `continue_final_message` needs text in the final message to continue
/// (Hugging Face's rendering refuses a final message it cannot find in the rendered chat).
pub fn prompt_end(
    add_generation_prompt: Option<bool>,
    continue_final_message: bool,
    messages: &[ChatMessage],
) -> Result<PromptEnd, ApiError> {
    if !continue_final_message {
        return Ok(if add_generation_prompt == Some(false) {
            PromptEnd::Closed
        } else {
            PromptEnd::Generation
        });
    }
    if add_generation_prompt == Some(true) {
        return Err(ApiError::bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            None,
        ));
    }
    if messages.last().is_none_or(|m| m.text().trim().is_empty()) {
        return Err(ApiError::bad_request(
            "continue_final_message is set but the final message does not appear in the chat \
             after applying the chat template!",
            Some("messages"),
        ));
    }
    Ok(PromptEnd::ContinueFinal)
}

/// A completions prompt: text or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// `/v1/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionBody {
    /// The prompt.
    pub prompt: PromptInput,
    /// Shared fields.
    #[serde(flatten)]
    pub common: Common,
}

/// Which API shape to answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `chat.completion(.chunk)`.
    Chat,
    /// `text_completion`.
    Completion,
}

/// A validated request.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Answer shape.
    pub api: Api,
    /// A named `tool_choice`: the answer is a call of this function, its output the call's
    /// `arguments` (`{"text": "<the words>"}`), as vLLM answers a named tool choice (structured
    /// output constrains the text to the arguments; streamed as `delta.tool_calls`, the first
    /// with the call's id, type and name; `message.tool_calls` when not streaming, with
    /// `content` empty).
    pub tool_call: Option<String>,
    /// The tool call is the model's choice (`tool_choice` `"auto"`, `--call-tools`), not forced:
    /// it finishes with `tool_calls` and a whole answer's `content` is null.
    pub auto_call: bool,
    /// The answer's tokens decode to no text: `allowed_token_ids` holds special tokens only and
    /// `skip_special_tokens` is not false (vLLM then streams `delta.content: ""` for each).
    pub silent: bool,
    /// What vLLM's engine refuses only once it takes the request (its input processor, after a
    /// streaming answer began): an `allowed_token_ids` id past the vocabulary. A streaming
    /// answer then sends the error as its first event (with a 200), a whole one answers 400.
    pub late_error: Option<ApiError>,
    /// Log-probabilities asked for: how many alternatives per output token
    /// ([`crate::api::chunks::logprobs`]); `None`: not asked.
    pub logprobs: Option<u32>,
    /// External request id.
    pub request_id: String,
    /// The prefix-cache salt (`cache_salt`), if any.
    pub cache_salt: Option<String>,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Output limit after defaults.
    pub max_tokens: u32,
    /// Stream or not.
    pub stream: bool,
    /// Final usage chunk.
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous_usage: bool,
    /// Generate exactly `max_tokens`.
    pub ignore_eos: bool,
    /// Request seed.
    pub seed: Option<u64>,
    /// Scheduling priority.
    pub priority: i64,
    /// The output position the answer starts at: 0, or with `continue_final_message` the
    /// simulator's output words the final message already holds ([`crate::text::words_in`]),
    /// so that a continued answer goes on where the interrupted one stopped.
    pub first_word: u32,
    /// With `continue_final_message`: the prompt of the request it continues (the messages
    /// before the final one, with the assistant's turn opened), whose seeded draws (length,
    /// faults) it replays, so that a continued answer also stops where the uninterrupted one
    /// would have.
    pub origin: Option<Vec<u32>>,
}

/// A continued final message (`continue_final_message`): the prompt of the request it continues
/// and where its output goes on.
pub struct Continuation {
    /// The prompt of the request it continues: the messages before the final one, with the
    /// assistant's turn opened (encoded with special tokens).
    pub origin: Vec<u32>,
    /// The output position the continued answer goes on from: the output words the final
    /// message holds ([`crate::text::words_in`]), after a reasoning model's reasoning.
    pub first_word: u32,
    /// Whether the final message is exactly those words (the simulator's own output, cut; never
    /// for a reasoning model, whose prompt lacks the reasoning the engine computed first).
    pub exact: bool,
}

/// The continuation `messages` (whose final one is continued) describe.
pub async fn continuation(
    state: &AppState,
    tools: Option<&serde_json::Value>,
    kwargs: Option<&serde_json::Value>,
    messages: &[ChatMessage],
) -> Option<Continuation> {
    let (last, before) = messages.split_last()?;
    let origin = state.render(tools, kwargs, before, PromptEnd::Generation);
    let text = last.text();
    // A reasoning model's answer starts after its reasoning: the output position the continued
    // answer goes on from. Its prompt holds only the answer's words (the template drops the
    // reasoning), which the engine never computed in that order: no exact continuation.
    let reasoning = state.reasoning_tokens;
    let words = crate::text::words_in_from(&text, reasoning);
    let reasoning = if words > 0 { reasoning } else { 0 };
    Some(Continuation {
        origin: encode(state, origin, true).await,
        first_word: reasoning.saturating_add(words),
        exact: words > 0 && reasoning == 0 && crate::text::words(0, words) == text,
    })
}

/// The tokens of a continuation of the simulator's own output: its original prompt, then one
/// token per output word continued, the ids the engine generated them with
/// ([`crate::text::word_token`]). So its blocks hash as the original's prompt and output
/// blocks did, and it finds them in the prefix cache, as a vLLM continuation finds the blocks of
/// the answer it continues (vLLM caches a request's full output blocks too, and a real
/// tokenizer re-encodes the text it generated to the same ids nearly always).
pub fn continued_ids(origin: &[u32], words: u32) -> Vec<u32> {
    let mut ids = origin.to_vec();
    ids.extend((0..words).map(crate::text::word_token));
    ids
}

/// Parses a JSON body the way vLLM answers bad ones: 400 with the reason.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}"), None))
}

/// The request id: `X-Request-Id`, else the body's `request_id`, else a random uuid4 hex.
pub fn request_id(headers: &HeaderMap, body_id: Option<&str>) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .or_else(|| body_id.filter(|s| !s.is_empty()).map(str::to_owned))
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())
}

/// The id vLLM's OpenAI server gives a request with id `request_id` (above), the one its engine
/// and its abort endpoint know it by: `chatcmpl-<id>` for a chat completion, `cmpl-<id>-0` for a
/// completion (`-<n>` for its n-th prompt; the simulator takes one). vLLM's engine adds a
/// random suffix of its own to make an internal id, which its abort endpoint does not take.
pub fn engine_request_id(api: Api, request_id: &str) -> String {
    match api {
        Api::Chat => format!("chatcmpl-{request_id}"),
        Api::Completion => format!("cmpl-{request_id}-0"),
    }
}

/// Tokenizes `text` off the async workers when a real tokenizer is in use.
pub async fn encode(state: &AppState, text: String, add_special: bool) -> Vec<u32> {
    let tok = state.tokenizer.clone();
    if matches!(*tok, crate::tokenizer::PromptTokenizer::Heuristic) {
        return tok.encode(&text, add_special);
    }
    tokio::task::spawn_blocking(move || tok.encode(&text, add_special))
        .await
        .unwrap_or_default()
}

impl Generation {
    /// Validates a chat body.
    pub async fn chat(
        state: &AppState,
        headers: &HeaderMap,
        body: ChatBody,
    ) -> Result<Self, ApiError> {
        if body.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        let end = prompt_end(
            body.add_generation_prompt,
            body.continue_final_message,
            &body.messages,
        )?;
        // `--exclude-tools-when-tool-choice-none`: the template gets no tools.
        let tools = body.tools.as_ref().filter(|_| {
            !(state.exclude_tools_when_none
                && body.tool_choice.as_ref().and_then(|c| c.as_str()) == Some("none"))
        });
        let text = state.render(
            tools,
            body.chat_template_kwargs.as_ref(),
            &body.messages,
            end,
        );
        let continued = match end {
            PromptEnd::ContinueFinal => {
                continuation(
                    state,
                    tools,
                    body.chat_template_kwargs.as_ref(),
                    &body.messages,
                )
                .await
            }
            _ => None,
        };
        let prompt = match &continued {
            Some(c) if c.exact => continued_ids(&c.origin, c.first_word),
            _ => encode(state, text, true).await,
        };
        let (first_word, origin) = continued.map_or((0, None), |c| (c.first_word, Some(c.origin)));
        let max = body
            .common
            .max_completion_tokens
            .or(body.common.max_tokens.flatten());
        let mut gen = Self::build(state, headers, Api::Chat, prompt, max, body.common)?;
        gen.first_word = first_word;
        gen.origin = origin;
        gen.tool_call = body
            .tool_choice
            .as_ref()
            .filter(|c| c["type"] == "function")
            .and_then(|c| c["function"]["name"].as_str())
            .map(str::to_owned);
        let auto = body
            .tool_choice
            .as_ref()
            .is_none_or(|c| c.is_null() || c == "auto");
        if gen.tool_call.is_none() && auto && state.call_tools {
            gen.tool_call = body
                .tools
                .as_ref()
                .and_then(|t| t.get(0))
                .and_then(|t| t["function"]["name"].as_str())
                .map(str::to_owned);
            gen.auto_call = gen.tool_call.is_some();
        }
        Ok(gen)
    }

    /// Validates a completions body (vLLM's `CompletionRequest.max_tokens: int | None = 16`:
    /// 16 when absent, the model's length when `null`).
    pub async fn completion(
        state: &AppState,
        headers: &HeaderMap,
        body: CompletionBody,
    ) -> Result<Self, ApiError> {
        let prompt = match body.prompt {
            PromptInput::Text(t) => encode(state, t, true).await,
            PromptInput::Tokens(ids) => ids,
        };
        if prompt.is_empty() {
            return Err(ApiError::bad_request(
                "The prompt cannot be empty.",
                Some("prompt"),
            ));
        }
        let max = body.common.max_tokens.unwrap_or(Some(16));
        Self::build(state, headers, Api::Completion, prompt, max, body.common)
    }

    fn build(
        state: &AppState,
        headers: &HeaderMap,
        api: Api,
        prompt: Vec<u32>,
        max_tokens: Option<u32>,
        c: Common,
    ) -> Result<Self, ApiError> {
        let mut prompt = prompt;
        if let Some(k) = c.truncate_prompt_tokens {
            let keep = match k {
                -1 => state.max_model_len as usize,
                k if k >= 1 => usize::try_from(k).unwrap_or(usize::MAX),
                _ => {
                    return Err(ApiError::bad_request(
                        "truncate_prompt_tokens must be at least 1, or -1",
                        Some("truncate_prompt_tokens"),
                    ))
                }
            };
            if prompt.len() > keep {
                prompt.drain(..prompt.len() - keep);
            }
        }
        if let Some(model) = c.model.as_deref() {
            if model != state.model {
                return Err(ApiError::model_not_found(model));
            }
        }
        if c.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request(
                "vllm-sim only simulates n = 1",
                Some("n"),
            ));
        }
        // A non-zero priority under `fcfs` is accepted and has no effect: vLLM 0.33 and 0.34
        // dropped the check that refused it (only the field's description still says so).
        c.sampling.verify()?;
        if c.cache_salt.as_deref() == Some("") {
            // vLLM's own check (its request models' `check_cache_salt_support`).
            return Err(ApiError::bad_request(
                "Parameter 'cache_salt' must be a non-empty string if provided.",
                Some("cache_salt"),
            ));
        }
        let limit = state.max_model_len;
        // vLLM 0.34 refuses a limit above the whole context before it reads the prompt
        // (`TokenizeParams.__post_init__`).
        if let Some(m) = max_tokens.filter(|m| *m > limit) {
            return Err(ApiError::bad_request(
                format!(
                    "max_tokens={m} cannot be greater than max_model_len={limit}. Please \
                     request fewer output tokens."
                ),
                Some("max_tokens"),
            ));
        }
        let input = prompt.len() as u32;
        // vLLM 0.34 refuses a prompt above the context (`_token_len_check`); one of exactly the
        // context, which leaves no room to answer, is refused here too.
        if input >= limit {
            return Err(ApiError::bad_request(
                format!(
                    "This model's maximum context length is {limit} tokens. However, your prompt \
                     contains {input} input tokens, which exceeds this limit even without any \
                     output tokens. Please reduce the length of the input prompt."
                ),
                Some("input_tokens"),
            ));
        }
        state.saw_request(serde_json::json!({
            "prompt_tokens": input,
            "max_tokens": max_tokens,
            "priority": c.priority,
            "cache_salt": c.cache_salt,
        }));
        let max_tokens = match max_tokens {
            Some(0) => {
                return Err(ApiError::bad_request(
                    "max_tokens must be at least 1",
                    Some("max_tokens"),
                ))
            }
            // vLLM 0.34 lowers a limit to the room the prompt leaves (`get_max_tokens`).
            Some(m) => m.min(limit - input),
            None => limit - input,
        };
        let opts = c.stream_options.unwrap_or_default();
        let logprobs = match (api, &c.logprobs) {
            (Api::Chat, Some(serde_json::Value::Bool(true))) => Some(c.top_logprobs.unwrap_or(0)),
            (Api::Completion, Some(n)) => n.as_u64().map(|n| n.min(20) as u32),
            _ => None,
        };
        Ok(Self {
            api,
            request_id: request_id(headers, c.request_id.as_deref()),
            cache_salt: c.cache_salt.clone(),
            prompt,
            max_tokens,
            stream: c.stream,
            include_usage: c.stream && opts.include_usage,
            continuous_usage: c.stream && opts.include_usage && opts.continuous_usage_stats,
            ignore_eos: c.ignore_eos,
            seed: c.seed,
            priority: c.priority,
            first_word: 0,
            origin: None,
            tool_call: None,
            auto_call: false,
            logprobs,
            late_error: c
                .allowed_token_ids
                .as_ref()
                .is_some_and(|ids| ids.iter().any(|&id| id >= VOCAB_SIZE))
                .then(|| {
                    ApiError::bad_request("allowed_token_ids contains out-of-vocab token id!", None)
                }),
            silent: c.skip_special_tokens != Some(false)
                && c.allowed_token_ids.as_ref().is_some_and(|ids| {
                    !ids.is_empty() && ids.iter().all(|&id| id >= SPECIAL_TOKENS_FROM)
                }),
        })
    }
}
