//! The prompt step: a parsed request becomes a [`Prepared`] with the body vLLM will see.
//!
//! - `/answer` with a `course_id`: the course's stable prefix first (instructions, rubric,
//!   safety, tools as canonical JSON), then the student's material (M17); unknown course: 400.
//!   The code is focused on the stack trace first (M11, [`crate::prompt::focus`]), on the
//!   classifier's blocking pool, so classification counts what is sent.
//! - `/v1/chat/completions`: the client's tools canonicalized (same schemas, same tokens), when
//!   `prefix_cache.canonicalize_tools` is on.
//! - `/answer` and jobs: media URLs in the messages only as `data:` or from
//!   `fields.media_hosts` ([`parse::media`]), as on `/v1`.
//! - Every request: vLLM asked for running usage, so the relay counts output exactly; with
//!   `admission.engine_priority` the lane goes along as vLLM's `priority`.

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use super::parse::{self, AnswerRequest, OpenAiRequest};
use super::state::AppState;
use super::Prepared;
use crate::classify::{PromptInput, TokenCounter};
use crate::error::GatewayError;
use crate::lane::Lane;
use crate::prompt::focus::{self, Focus, FocusMode, FocusSettings};
use crate::prompt::{canonical_value, student_messages, StudentMaterial};
use crate::telemetry::Route;
use crate::upstream::Endpoint;

/// The `/answer` job: course prefix (if any), then the student's messages, the code in them
/// focused on the stack trace when the course says so (M11).
pub async fn answer_request(
    state: &AppState,
    req: AnswerRequest,
) -> Result<Prepared, GatewayError> {
    let AnswerRequest {
        messages: _,
        mut messages_json,
        max_output_tokens,
        session_id,
        course_id,
        material,
    } = req;
    // vLLM fetches media URLs itself: only data: or listed hosts, as on /v1.
    parse::media::check(Some(&messages_json), &state.config().fields.media_hosts)?;
    let mut focused = None;
    let (messages_json, tools) = match course_id.as_deref() {
        None => (messages_json, None),
        Some(id) => {
            let settings = state.config().courses.get(id).map(|c| c.focus.clone());
            let with_code = material.filter(|m| !m.sources().is_empty());
            if let (Some(settings), Some(mut material)) = (settings, with_code) {
                let f = focus_code(state, settings, &material).await;
                if let Some(text) = &f.text {
                    material.focused = Some(text.clone());
                    messages_json = Value::Array(student_messages(&material));
                }
                focused = Some(f);
            }
            with_course(state, id, messages_json)?
        }
    };
    // What is sent is what is counted: every message checked as the template will render it.
    let messages =
        parse::template::chat_messages(&messages_json, &state.config().classify.extra_roles)?;
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
        input: PromptInput::chat(messages, body.get("tools")),
        max_tokens: max_output_tokens,
        body,
        session: session_id,
        size: 0,
        background: false,
        tenant: None,
        focus: focused,
    })
}

/// Focuses the student's code on its stack trace with the gateway's token counter, on the
/// classifier's blocking pool (parsing is CPU work). A failure there sends the whole code.
async fn focus_code(state: &AppState, settings: FocusSettings, m: &StudentMaterial) -> Focus {
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
    match state.classifier().run_blocking(run).await {
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
fn with_course(
    state: &AppState,
    id: &str,
    student: Value,
) -> Result<(Value, Option<Value>), GatewayError> {
    let config = state.config();
    let Some(course) = config.courses.get(id) else {
        return Err(GatewayError::bad_request(
            "unknown course_id: no [courses.<id>] with this id is configured",
            Some("course_id"),
        ));
    };
    let student = match student {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    Ok((
        Value::Array(course.messages(&student)),
        course.tools.clone(),
    ))
}

/// The `/v1` job: the client's body as it came, tools canonicalized; the session from
/// `x-session-id`.
pub fn openai_request(
    state: &AppState,
    route: Route,
    headers: &HeaderMap,
    mut req: OpenAiRequest,
) -> Result<Prepared, GatewayError> {
    if route == Route::ChatCompletions && state.config().prefix_cache.canonicalize_tools {
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
        background: false,
        tenant: None,
        focus: None,
    })
}

/// The last touches before the body goes to vLLM: running usage always (the relay counts
/// output tokens exactly mid-stream, even when vLLM packs several tokens into one chunk, and
/// strips it again for clients that did not ask), the lane as `priority` when configured, and
/// `max_tokens` = `output_cap` when the client sent no limit
/// ([`crate::classify::LaneRules::output_cap`]: the reservation must cover what the engine may
/// generate; requests that can still be promoted get the bound of the lane where promotions
/// stop, or none when that is large, whose reservation is `max_model_len`).
pub fn for_engine(
    body: &mut Map<String, Value>,
    lane: Lane,
    engine_priority: bool,
    output_cap: Option<u32>,
) {
    if let Some(cap) = output_cap {
        body.insert("max_tokens".into(), Value::from(cap));
    }
    let opts = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !opts.is_object() {
        *opts = Value::Object(Map::new());
    }
    if let Some(o) = opts.as_object_mut() {
        o.insert("continuous_usage_stats".into(), Value::Bool(true));
    }
    if engine_priority {
        // Short work first in the engine too (vLLM `--scheduling-policy priority`).
        body.insert("priority".into(), Value::from(lane.index()));
    }
}
