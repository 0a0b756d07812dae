//! Request bodies: JSON shape and values checked before anything else, each problem named by
//! its field path (`messages[0].content: invalid type: integer, expected …`).
//!
//! `/v1` bodies are forwarded to vLLM as they came (plus the gateway's stream settings), so only
//! the fields the gateway reads are checked here; vLLM validates the rest and its 400 reaches
//! the client unchanged.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::admission::session::SessionId;
use crate::classify::{ChatMessage, PromptInput};
use crate::error::GatewayError;
use crate::prompt::StudentMaterial;

pub mod bounds;
mod course;
pub mod fields;
pub mod lax;
pub mod media;
pub mod template;

pub use fields::FieldRules;

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

/// Deserializes `T` from `value`, naming the failing field by its path.
pub fn typed<T: DeserializeOwned>(value: Value) -> Result<T, GatewayError> {
    typed_ref(&value)
}

/// [`typed`] without taking (or copying) the value.
pub fn typed_ref<T: DeserializeOwned>(value: &Value) -> Result<T, GatewayError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let message = if path == "." || path.is_empty() {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        };
        GatewayError::bad_request(message, None)
    })
}

/// The body as a JSON object.
pub fn json_object(bytes: &[u8]) -> Result<Value, GatewayError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(GatewayError::bad_request(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(GatewayError::bad_request(
            format!("the request body is not valid JSON: {e}"),
            None,
        )),
    }
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
    /// The client asked for the final usage chunk (`include_usage` defaults to true once
    /// `stream_options` is present, as in vLLM).
    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage.unwrap_or(true))
    }

    /// The client asked for running usage on every chunk.
    fn continuous_usage(&self) -> bool {
        self.stream_options
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
    chat_body(json_object(bytes)?, rules)
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
    template::template_kwargs(kwargs)?;
    if messages.is_empty() {
        return Err(GatewayError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    Ok(OpenAiRequest {
        input: PromptInput::chat(messages, body.get("tools")).with_template_kwargs(kwargs),
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

/// [`completion`] on a body already read as a JSON object.
fn completion_body(mut value: Value, rules: FieldRules<'_>) -> Result<OpenAiRequest, GatewayError> {
    fields::read_as_vllm(&mut value, false)?;
    let f = common(&value, false)?;
    let mut body = into_map(value);
    let max_tokens = f.max_tokens.unwrap_or(16);
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

/// `POST /answer` body. Exactly one of `messages` and `prompt`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    /// The conversation so far (chat format).
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    /// A single question, as a user message.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Most output tokens wanted; the classifier's default budget when absent.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// The student's session, for continuation tracking (checked and hashed by
    /// [`AnswerRequest::checked`]).
    #[serde(default)]
    pub session_id: Option<String>,
    /// The course whose stable prefix (`[courses.<id>]`) goes first; unknown ids are a 400.
    #[serde(default)]
    pub course_id: Option<String>,
    /// With `course_id`: the student's code.
    #[serde(default)]
    pub code: Option<String>,
    /// With `course_id`: a stack trace.
    #[serde(default)]
    pub stack_trace: Option<String>,
    /// With `course_id`: recent turns (user/assistant messages, oldest first); `messages` is
    /// accepted for the same, but not both.
    #[serde(default)]
    pub turns: Option<Vec<ChatMessage>>,
    /// With `course_id` and `code` or `files`: the code's language (else from the paths).
    #[serde(default)]
    pub language: Option<String>,
    /// With `course_id` and `code`: the file's path, as the stack trace names it.
    #[serde(default)]
    pub path: Option<String>,
    /// With `course_id`: several files instead of `code`.
    #[serde(default)]
    pub files: Option<Vec<CodeFile>>,
}

/// One of `files`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeFile {
    /// Its path, as the stack trace names it.
    pub path: String,
    /// Its text.
    pub code: String,
}

/// `GET /answer` query (browser `EventSource`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerQuery {
    /// The question.
    pub prompt: String,
    /// Most output tokens wanted.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// The student's session.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The course.
    #[serde(default)]
    pub course_id: Option<String>,
}

/// A validated `/answer` request: the messages to send and the declared output limit.
#[derive(Debug)]
pub struct AnswerRequest {
    /// Chat messages.
    pub messages: Vec<ChatMessage>,
    /// The raw messages JSON to forward.
    pub messages_json: Value,
    /// Declared output limit.
    pub max_output_tokens: Option<u32>,
    /// The student's session, for continuation tracking (checked, hashed).
    pub session_id: Option<SessionId>,
    /// The course whose stable prefix goes before `messages`; `messages` is then only the
    /// student's material.
    pub course_id: Option<String>,
    /// With a course: the student's material `messages` was built from, for the prompt step
    /// to focus the code on the stack trace (M11) and build them again.
    pub material: Option<StudentMaterial>,
}

/// A session id from field or header `name`, checked and hashed; `None` when empty.
pub fn session_id_from(raw: &str, name: &'static str) -> Result<Option<SessionId>, GatewayError> {
    SessionId::parse(raw)
        .map_err(|why| GatewayError::bad_request(format!("{name} {why}"), Some(name)))
}

/// A request body read as JSON; 400 naming the syntax error's place when it is not.
pub fn json_body(bytes: &[u8]) -> Result<Value, GatewayError> {
    serde_json::from_slice(bytes).map_err(|e| {
        GatewayError::bad_request(format!("the request body is not valid JSON: {e}"), None)
    })
}

fn session(raw: &str) -> Result<Option<SessionId>, GatewayError> {
    session_id_from(raw, "session_id")
}

fn user_message(prompt: &str) -> Value {
    serde_json::json!([{ "role": "user", "content": prompt }])
}

impl AnswerRequest {
    /// From a `POST /answer` body.
    pub fn from_body(bytes: &[u8]) -> Result<Self, GatewayError> {
        Self::from_value(json_body(bytes)?)
    }

    /// From a `POST /answer` body already read as JSON (a job's body, less its own fields).
    pub fn from_value(value: Value) -> Result<Self, GatewayError> {
        let raw_messages = value.get("messages").cloned();
        let raw_turns = value.get("turns").cloned();
        let body: AnswerBody = typed(value)?;
        if let Some(course_id) = body.course_id.clone().filter(|c| !c.is_empty()) {
            return Self::for_course(body, course_id, raw_messages.or(raw_turns));
        }
        if body.code.is_some()
            || body.stack_trace.is_some()
            || body.turns.is_some()
            || body.files.is_some()
            || body.language.is_some()
            || body.path.is_some()
        {
            return Err(GatewayError::bad_request(
                "`code`, `files`, `language`, `path`, `stack_trace` and `turns` need a `course_id`",
                Some("course_id"),
            ));
        }
        let (messages, messages_json) = match (body.messages, body.prompt) {
            (Some(m), None) => (m, raw_messages.unwrap_or(Value::Null)),
            (None, Some(p)) => (typed(user_message(&p))?, user_message(&p)),
            _ => {
                return Err(GatewayError::bad_request(
                    "send exactly one of `messages` and `prompt`",
                    None,
                ))
            }
        };
        Self::checked(
            messages,
            messages_json,
            body.max_output_tokens,
            body.session_id,
        )
    }

    /// From a `GET /answer` query.
    pub fn from_query(q: AnswerQuery) -> Result<Self, GatewayError> {
        let json = user_message(&q.prompt);
        let mut req = Self::checked(
            typed(json.clone())?,
            json,
            q.max_output_tokens,
            q.session_id,
        )?;
        req.course_id = q.course_id.filter(|c| !c.is_empty());
        Ok(req)
    }

    pub(super) fn checked(
        messages: Vec<ChatMessage>,
        messages_json: Value,
        max: Option<u32>,
        session_id: Option<String>,
    ) -> Result<Self, GatewayError> {
        if messages.is_empty() || messages.iter().all(|m| m.text().trim().is_empty()) {
            return Err(GatewayError::bad_request(
                "the question must not be empty",
                Some("prompt"),
            ));
        }
        if max == Some(0) {
            return Err(GatewayError::bad_request(
                "max_output_tokens must be at least 1",
                Some("max_output_tokens"),
            ));
        }
        Ok(Self {
            messages,
            messages_json,
            max_output_tokens: max,
            session_id: session_id.as_deref().map(session).transpose()?.flatten(),
            course_id: None,
            material: None,
        })
    }
}
