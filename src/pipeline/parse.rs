//! Request bodies: JSON shape and values checked before anything else, each problem named by
//! its field path (`messages[0].content: invalid type: integer, expected …`).
//!
//! `/v1` bodies are forwarded to vLLM as they came (plus the gateway's stream settings), so only
//! the fields the gateway reads are checked here; vLLM validates the rest and its 400 reaches
//! the client unchanged.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::classify::PromptInput;
use crate::error::GatewayError;

mod answer;
pub mod bounds;
pub mod fields;
mod json;
pub mod lax;
pub mod media;
mod repeats;
pub mod template;

pub use answer::{session_id_from, AnswerBody, AnswerQuery, AnswerRequest, CodeFile};
pub use fields::FieldRules;
pub use json::{json_body, json_object, json_values, typed, typed_ref};

/// Bytes a request's parsed form is taken to hold per JSON value or key ([`json_values`]): a
/// `serde_json::Value` is 32 bytes, an array's spare capacity and a map entry's key and links
/// add as much again (measured: 4 MiB of `0,` held about 150 MB parsed, 76 bytes a value).
pub const PARSED_VALUE_BYTES: usize = 80;

/// The most JSON values and keys one body may hold: a prompt of token ids as long as
/// `upstream.max_model_len` four times over, and 16,384 more (messages, tools, `logit_bias`).
/// No request the engine can take needs more; a body of tiny values beyond it would hold many
/// times its size in memory once parsed.
pub fn max_json_values(config: &crate::config::Config) -> usize {
    (config.upstream.max_model_len.get() as usize)
        .saturating_mul(4)
        .saturating_add(16_384)
}

/// What the body `b` holds in memory until its request is admitted: its bytes and its parsed
/// form ([`PARSED_VALUE_BYTES`] a value); 413 `body_too_large` when it holds more JSON values
/// than [`max_json_values`] (before anything parses it).
pub fn held_bytes(b: &[u8], config: &crate::config::Config) -> Result<usize, GatewayError> {
    let values = json_values(b);
    let max = max_json_values(config);
    if values > max {
        return Err(GatewayError::TooManyValues { max });
    }
    Ok(b.len()
        .saturating_add(values.saturating_mul(PARSED_VALUE_BYTES)))
}

/// The body bytes, or 413 / 400 for a body that could not be read.
pub fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, GatewayError> {
    match body {
        Ok(b) => Ok(b),
        Err(BytesRejection::FailedToBufferBody(e))
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE =>
        {
            Err(GatewayError::BodyTooLarge { limit })
        }
        Err(BytesRejection::FailedToBufferBody(e)) if receiving_full(&e) => {
            Err(GatewayError::ReceivingBytes)
        }
        Err(BytesRejection::FailedToBufferBody(e)) if body_deadline(&e).is_some() => {
            Err(GatewayError::BodyTimeout {
                after: body_deadline(&e).unwrap_or_default(),
            })
        }
        Err(e) => Err(GatewayError::bad_request(
            format!("cannot read the request body: {e}"),
            None,
        )),
    }
}

/// Whether `e`'s sources hold the receiving bound's error.
fn receiving_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<crate::error::ReceivingFull>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The timeout of the body deadline error in `e`'s sources, if it is there.
fn body_deadline(e: &(dyn std::error::Error + 'static)) -> Option<std::time::Duration> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<crate::error::BodyTimedOut>() {
            return Some(t.0);
        }
        cur = err.source();
    }
    None
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
    #[serde(default)]
    continuous_usage_stats: Option<bool>,
}

/// The fields of an OpenAI body the gateway reads.
#[derive(Debug, Deserialize)]
struct OpenAiFields {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<u32>,
}

impl OpenAiFields {
    /// The client asked for the final usage chunk (`include_usage: true`; it defaults to false,
    /// as in vLLM 0.33 and later, whose `StreamOptions` say so; older vLLM defaulted it to
    /// true once `stream_options` was present).
    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage.unwrap_or(false))
    }

    /// The client asked for running usage on every chunk (only with `include_usage` too, as
    /// vLLM's `should_include_usage`).
    fn continuous_usage(&self) -> bool {
        self.include_usage()
            && self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.continuous_usage_stats.unwrap_or(false))
    }
}

/// A validated `/v1` request.
#[derive(Debug)]
pub struct OpenAiRequest {
    /// What classification counts.
    pub input: PromptInput,
    /// Declared output limit.
    pub max_tokens: Option<u32>,
    /// Stream back as SSE.
    pub stream: bool,
    /// The client asked for the final usage chunk.
    pub include_usage: bool,
    /// The client asked for running usage on every chunk.
    pub continuous_usage: bool,
    /// The body to forward.
    pub body: Map<String, Value>,
}

fn common(body: &Value, chat: bool) -> Result<OpenAiFields, GatewayError> {
    let f: OpenAiFields = typed_ref(body)?;
    if let Some(0) = f.max_tokens {
        return Err(GatewayError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    if let Some(0) = f.max_completion_tokens {
        return Err(GatewayError::bad_request(
            "max_completion_tokens must be at least 1",
            Some("max_completion_tokens"),
        ));
    }
    if f.n.is_some_and(|n| n != 1) {
        return Err(GatewayError::bad_request(
            "only n = 1 is supported: each choice would need its own lane reservation",
            Some("n"),
        ));
    }
    if !chat && f.max_completion_tokens.is_some() && f.max_tokens.is_none() {
        return Err(GatewayError::bad_request(
            "/v1/completions takes max_tokens, not max_completion_tokens",
            Some("max_completion_tokens"),
        ));
    }
    let _ = &f.model;
    Ok(f)
}

/// The object inside a value [`json_object`] returned.
fn into_map(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// `POST /v1/chat/completions`.
pub fn chat(bytes: &[u8], rules: FieldRules<'_>) -> Result<OpenAiRequest, GatewayError> {
    let req = chat_body(json_object(bytes)?, rules)?;
    // Not for `/tokenize`, which vLLM counts at any length (it does not check a tokenize
    // request against the model's length).
    certainly_fits(&req.input, req.max_tokens, rules.max_model_len)?;
    Ok(req)
}

/// [`chat`] on a body already read as a JSON object.
fn chat_body(mut value: Value, rules: FieldRules<'_>) -> Result<OpenAiRequest, GatewayError> {
    fields::read_as_vllm(&mut value, true)?;
    let f = common(&value, true)?;
    let mut body = into_map(value);
    let max_tokens = f.max_completion_tokens.or(f.max_tokens);
    fields::check(&mut body, true, max_tokens, rules)?;
    let Some(messages) = body.get("messages") else {
        return Err(GatewayError::bad_request(
            "messages is required",
            Some("messages"),
        ));
    };
    let messages = template::chat_messages(messages, rules.extra_roles)?;
    let kwargs = body.get("chat_template_kwargs");
    template::template_kwargs(kwargs, &rules.bounds.template_kwargs)?;
    if messages.is_empty() {
        return Err(GatewayError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    Ok(OpenAiRequest {
        input: PromptInput::chat(messages, body.get("tools"), rules.max_model_len)
            .with_template_kwargs(kwargs, rules.max_model_len),
        max_tokens,
        stream: f.stream.unwrap_or(false),
        include_usage: f.include_usage(),
        continuous_usage: f.continuous_usage(),
        body,
    })
}

/// `POST /v1/completions`. vLLM's default `max_tokens` for completions is 16, so the gateway
/// classifies with 16 when none is sent (and vLLM will stop there).
pub fn completion(bytes: &[u8], rules: FieldRules<'_>) -> Result<OpenAiRequest, GatewayError> {
    completion_body(json_object(bytes)?, rules)
}

/// Refuses a chat whose text alone is more bytes than `max_model_len` tokens could be at the
/// densest (`classify::bounds::MAX_BYTES_PER_TOKEN`), as classification would, but before its
/// tools are canonicalized, fingerprinted and keyed: 4 MB of `tools` took 340 ms of copies on
/// their way to that refusal.
fn certainly_fits(
    input: &PromptInput,
    max_tokens: Option<u32>,
    max_model_len: u32,
) -> Result<(), GatewayError> {
    let (bytes, _) = input.text_bytes_and_pieces();
    let lower = bytes.div_ceil(crate::classify::bounds::MAX_BYTES_PER_TOKEN);
    if lower <= u64::from(max_model_len) {
        return Ok(());
    }
    Err(GatewayError::Classify(
        crate::classify::ClassifyError::ExceedsModelLen {
            input_tokens: u32::try_from(lower).unwrap_or(u32::MAX),
            output_tokens: max_tokens.unwrap_or(0),
            max_model_len,
        },
    ))
}

/// [`completion`] on a body already read as a JSON object.
fn completion_body(mut value: Value, rules: FieldRules<'_>) -> Result<OpenAiRequest, GatewayError> {
    fields::read_as_vllm(&mut value, false)?;
    let f = common(&value, false)?;
    let mut body = into_map(value);
    let max_tokens = f.max_tokens.unwrap_or(16);
    // The limit counted is the limit sent: vLLM reads an explicit `"max_tokens": null` as "up
    // to the model's length", not as its default of 16 (OpenAI's reading, and ours).
    body.insert("max_tokens".to_owned(), Value::from(max_tokens));
    fields::check(&mut body, false, Some(max_tokens), rules)?;
    let prompt = match body.get("prompt") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => {
            return Err(GatewayError::bad_request(
                "prompt must not be empty",
                Some("prompt"),
            ))
        }
        None => {
            return Err(GatewayError::bad_request(
                "prompt is required",
                Some("prompt"),
            ))
        }
        Some(_) => {
            return Err(GatewayError::bad_request(
                "prompt must be a string (token-id and batched prompts are not supported)",
                Some("prompt"),
            ))
        }
    };
    Ok(OpenAiRequest {
        input: PromptInput::Prompt(prompt),
        max_tokens: Some(max_tokens),
        stream: f.stream.unwrap_or(false),
        include_usage: f.include_usage(),
        continuous_usage: f.continuous_usage(),
        body,
    })
}

/// Fields of vLLM's `/tokenize` that no `/v1` endpoint has.
const TOKENIZE_ONLY: &[&str] = &["return_token_strs"];

/// `POST /tokenize`: vLLM's tokenizer request, a chat's `messages` or a `prompt`, checked as
/// [`chat`] or [`completion`] check the same body (`chat_template` refused, messages and media
/// URLs checked, fields read as vLLM reads them). The body to forward.
pub fn tokenize(bytes: &[u8], rules: FieldRules<'_>) -> Result<Map<String, Value>, GatewayError> {
    let mut value = json_object(bytes)?;
    let own: Vec<(String, Value)> = match &mut value {
        Value::Object(map) => TOKENIZE_ONLY
            .iter()
            .filter_map(|f| map.remove_entry(*f))
            .collect(),
        _ => Vec::new(),
    };
    let chat = value.get("messages").is_some();
    let mut req = if chat {
        chat_body(value, rules)?
    } else {
        completion_body(value, rules)?
    };
    req.body.extend(own);
    Ok(req.body)
}
