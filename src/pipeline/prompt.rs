//! The prepare step: a parsed request becomes a [`Prepared`] with the messages vLLM will see.
//!
//! - `/answer` with a `course_id`: the course's stable prefix first (instructions, rubric,
//!   safety, tools as canonical JSON), then the student's material (M17); unknown course: 400.
//!   The code is focused on the stack trace first (M11, [`crate::prompt::focus`]), with the
//!   token counter and on the blocking pool of the request's classifier (the one its
//!   classification then uses), so classification counts what is sent.
//! - `/v1/chat/completions`: the client's tools canonicalized (same schemas, same tokens), when
//!   `prefix_cache.canonicalize_tools` is on.
//! - `/answer` and jobs: media URLs in the messages only as `data:` or from
//!   `fields.media_hosts` ([`parse::media`]), as on `/v1`.
//!
//! What only the engine needs (running usage, `priority`, the output cap) is added after
//! classification, in one place ([`super::classify()`]).

use std::time::Duration;

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use super::ctx::RequestCtx;
use super::parse::{self, AnswerRequest, OpenAiRequest};
use super::state::BytesHold;
use super::tenant::Tenant;
use crate::admission::session::SessionId;
use crate::classify::{PromptInput, TokenCounter};
use crate::error::GatewayError;
use crate::prompt::focus::{self, Focus, FocusMode, FocusSettings};
use crate::prompt::{canonical_value, student_messages, StudentMaterial};
use crate::telemetry::Route;
use crate::upstream::Endpoint;

/// A validated request, ready for classification.
#[derive(Debug)]
pub struct Prepared {
    /// Which vLLM endpoint serves it.
    pub endpoint: Endpoint,
    /// What gets counted for classification.
    pub input: PromptInput,
    /// The output limit the client declared, if any.
    pub max_tokens: Option<u32>,
    /// The JSON body to send upstream (shaped for the engine after classification).
    pub body: Map<String, Value>,
    /// The session this request continues (`/answer` `session_id`, `/v1` `x-session-id`).
    pub session: Option<SessionId>,
    /// What the request keeps in memory: its bytes as received (body or query) and, for a JSON
    /// body, its parsed form's ([`crate::pipeline::parse::held_bytes`]), and what its course
    /// added (its system message and tools; [`answer_request`] sets that part alone): what a
    /// job of it keeps.
    pub size: usize,
    /// Its body's bytes and its parsed form's ([`crate::pipeline::parse::held_bytes`]), held in
    /// `server.max_queued_bytes` from the moment the body was read (while it waits to be parsed
    /// and counted, then for its seat); `None`: admission holds `size`.
    pub queued: Option<BytesHold>,
    /// Background work (a job): runs in the large lane, out of idle capacity.
    pub background: bool,
    /// Whose request it is: its turn in a lane's queue is fair between tenants.
    pub tenant: Option<Tenant>,
    /// What focusing did to a course request's code (M11); `None` without code.
    pub focus: Option<Focus>,
    /// How long after arrival its first token is still useful (`x-tutor-deadline-ms`): a
    /// request whose predicted wait already misses it is refused at once.
    pub deadline: Option<Duration>,
    /// A large `/answer` that may borrow an idle seat and give it back mid-stream
    /// (`jobs.preempt_answers`).
    pub preemptible: bool,
}

/// Longest `x-tutor-deadline-ms`: an hour.
pub const MAX_DEADLINE_MS: u64 = 3_600_000;

/// The request's `x-tutor-deadline-ms`: milliseconds after arrival, 1 to [`MAX_DEADLINE_MS`]
/// ASCII digits; `None` when absent. Anything else is a 400 naming the header.
pub fn deadline_from(headers: &HeaderMap) -> Result<Option<Duration>, GatewayError> {
    let Some(v) = headers.get("x-tutor-deadline-ms") else {
        return Ok(None);
    };
    let bad = || {
        GatewayError::bad_request(
            format!("x-tutor-deadline-ms must be whole milliseconds from 1 to {MAX_DEADLINE_MS}"),
            Some("x-tutor-deadline-ms"),
        )
    };
    let text = v.to_str().map_err(|_| bad())?;
    if text.is_empty() || text.len() > 7 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u64>() {
        Ok(ms @ 1..=MAX_DEADLINE_MS) => Ok(Some(Duration::from_millis(ms))),
        _ => Err(bad()),
    }
}

/// The request's `x-tutor-preemptible`: `true` or `false` (absent: `false`); anything else is
/// a 400 naming the header.
pub fn preemptible_from(headers: &HeaderMap) -> Result<bool, GatewayError> {
    match headers.get("x-tutor-preemptible").map(|v| v.as_bytes()) {
        None | Some(b"false") => Ok(false),
        Some(b"true") => Ok(true),
        Some(_) => Err(GatewayError::bad_request(
            "x-tutor-preemptible must be true or false",
            Some("x-tutor-preemptible"),
        )),
    }
}

/// The `/answer` job: course prefix (if any), then the student's messages, the code in them
/// focused on the stack trace when the course says so (M11).
pub async fn answer_request(
    ctx: &RequestCtx,
    req: AnswerRequest,
    tenant: Option<&Tenant>,
) -> Result<Prepared, GatewayError> {
    let tenant = tenant.map(|t| t.0.as_str());
    let config = ctx.config();
    let AnswerRequest {
        messages: _,
        mut messages_json,
        max_output_tokens,
        session_id,
        course_id,
        material,
    } = req;
    // vLLM fetches media URLs itself: only data: or listed hosts, as on /v1.
    parse::media::check(Some(&messages_json), &config.fields.media_hosts)?;
    let mut focused = None;
    let (messages_json, tools, added) = match course_id.as_deref() {
        None => (messages_json, None, 0),
        Some(id) => {
            let settings = ctx.course(id, tenant).map(|c| c.focus.clone());
            let with_code = material.filter(|m| !m.sources().is_empty());
            if let (Some(settings), Some(mut material)) = (settings, with_code) {
                let f = focus_code(ctx, settings, &material).await;
                if let Some(text) = &f.text {
                    material.focused = Some(text.clone());
                    messages_json = Value::Array(student_messages(&material));
                }
                focused = Some(f);
            }
            with_course(ctx, id, tenant, messages_json)?
        }
    };
    // What is sent is what is counted: every message checked as the template will render it.
    let messages = parse::template::chat_messages(&messages_json, &config.classify.extra_roles)?;
    let mut body = Map::new();
    body.insert("messages".into(), messages_json);
    if let Some(tools) = tools {
        body.insert("tools".into(), tools);
    }
    if let Some(max) = max_output_tokens {
        body.insert("max_tokens".into(), Value::from(max));
    }
    Ok(Prepared {
        endpoint: Endpoint::ChatCompletions,
        input: PromptInput::chat(
            messages,
            body.get("tools"),
            config.upstream.max_model_len.get(),
        ),
        max_tokens: max_output_tokens,
        body,
        session: session_id,
        // What the course added to the client's body (its system message and tools): a
        // queued job keeps it, as much as the client's own bytes.
        size: added,
        queued: None,
        background: false,
        preemptible: false,
        tenant: None,
        focus: focused,
        deadline: None,
    })
}

/// Focuses the student's code on its stack trace with the request's token counter, on its
/// classifier's blocking pool (parsing is CPU work). A failure there sends the whole code.
async fn focus_code(ctx: &RequestCtx, settings: FocusSettings, m: &StudentMaterial) -> Focus {
    let files = m.sources();
    let language = m.language;
    let trace = m.stack_trace.clone();
    let question = m.question.clone();
    if settings.mode == FocusMode::Off {
        return focus::focus(&files, language, None, None, &settings, &|_| 0);
    }
    let run = move |counter: &TokenCounter| {
        focus::focus(
            &files,
            language,
            trace.as_deref(),
            question.as_deref(),
            &settings,
            &|t| counter.count_text(t),
        )
    };
    match ctx.classifier().run_blocking(run).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "focusing failed; the whole code is sent");
            Focus {
                outcome: focus::Outcome::FallbackParse,
                original_tokens: None,
                sent_tokens: None,
                functions: Vec::new(),
                text: None,
                elapsed: std::time::Duration::ZERO,
                parsed_bytes: 0,
            }
        }
    }
}

/// Course `id`'s messages (stable prefix first, then `student`) and its tools.
/// The messages and tools of course `id` around the student's messages, and the bytes the
/// course added (its system message and tools, as [`parse::held_bytes`] counts a body).
fn with_course(
    ctx: &RequestCtx,
    id: &str,
    tenant: Option<&str>,
    student: Value,
) -> Result<(Value, Option<Value>, usize), GatewayError> {
    // Another tenant's course answers as an unknown one: its id tells nothing either.
    let Some(course) = ctx.course(id, tenant) else {
        return Err(GatewayError::bad_request(
            "unknown course_id: no [courses.<id>] with this id is configured",
            Some("course_id"),
        ));
    };
    let student = match student {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    let held = |bytes: usize, values: usize| {
        bytes.saturating_add(values.saturating_mul(parse::PARSED_VALUE_BYTES))
    };
    // The system message: an object of two entries.
    let mut added = held(course.system_prompt.len(), 5);
    if let Some(tools) = &course.tools {
        let text = serde_json::to_vec(tools).unwrap_or_default();
        added = added.saturating_add(held(text.len(), parse::json_values(&text)));
    }
    Ok((
        Value::Array(course.messages(&student)),
        course.tools.clone(),
        added,
    ))
}

/// The `/v1` job: the client's body as it came, tools canonicalized; the session from
/// `x-session-id`.
pub fn openai_request(
    ctx: &RequestCtx,
    route: Route,
    headers: &HeaderMap,
    mut req: OpenAiRequest,
) -> Result<Prepared, GatewayError> {
    if route == Route::ChatCompletions && ctx.config().prefix_cache.canonicalize_tools {
        // Same schemas, same tokens: key order must not break vLLM's prefix cache (M17).
        if let Some(tools) = req.body.get_mut("tools") {
            *tools = canonical_value(tools);
        }
    }
    let endpoint = match route {
        Route::Completions => Endpoint::Completions,
        Route::ChatCompletions | Route::Answer | Route::Job => Endpoint::ChatCompletions,
    };
    let session = match headers.get("x-session-id") {
        None => None,
        Some(v) => {
            let raw = v.to_str().map_err(|_| {
                GatewayError::bad_request(
                    "x-session-id must be visible ASCII",
                    Some("x-session-id"),
                )
            })?;
            parse::session_id_from(raw, "x-session-id")?
        }
    };
    Ok(Prepared {
        endpoint,
        input: req.input,
        max_tokens: req.max_tokens,
        body: req.body,
        session,
        size: 0,
        queued: None,
        background: false,
        preemptible: false,
        tenant: None,
        focus: None,
        deadline: None,
    })
}
