//! `/answer`: the tutoring frontend's stream. `GET /answer?prompt=…` for a browser
//! `EventSource`, `POST /answer` with JSON for `fetch`. The event format is in the README and in
//! [`crate::relay`].

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::openai::{link_trace, sse_response, with_id};
use super::parse::{self, AnswerQuery, AnswerRequest};
use super::pipeline::{self, Job};
use super::{AppState, GatewayError};
use crate::classify::PromptInput;
use crate::relay::Format;
use crate::telemetry::{RequestRecord, Route};
use crate::upstream::Endpoint;

/// `GET /answer?prompt=…&max_output_tokens=…`.
pub async fn get_answer(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<AnswerQuery>, QueryRejection>,
) -> Response {
    let record = state.record(Route::Answer);
    let req = query
        .map_err(Into::into)
        .and_then(|Query(q)| AnswerRequest::from_query(q));
    serve(state, headers, req, record).await
}

/// `POST /answer` with `{"messages"|"prompt", "max_output_tokens", "session_id", "course_id"}`.
pub async fn post_answer(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let record = state.record(Route::Answer);
    let req = parse::body_bytes(body, state.config().server.max_body_bytes)
        .and_then(|b| AnswerRequest::from_body(&b));
    serve(state, headers, req, record).await
}

/// A request ready to send: messages (course prefix first, if any) and the course's tools.
struct Prepared {
    messages: Vec<crate::classify::ChatMessage>,
    messages_json: Value,
    tools: Option<Value>,
    max_output_tokens: Option<u32>,
    session_id: Option<String>,
}

/// Puts the course's stable prefix before the student's material (M17); unknown course: 400.
fn with_course(state: &AppState, req: AnswerRequest) -> Result<Prepared, GatewayError> {
    let Some(id) = req.course_id.as_deref() else {
        return Ok(Prepared {
            messages: req.messages,
            messages_json: req.messages_json,
            tools: None,
            max_output_tokens: req.max_output_tokens,
            session_id: req.session_id,
        });
    };
    let Some(course) = state.config().courses.get(id) else {
        return Err(GatewayError::bad_request(
            "unknown course_id: no [courses.<id>] with this id is configured",
            Some("course_id"),
        ));
    };
    let student = match req.messages_json {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    let json = Value::Array(course.messages(&student));
    Ok(Prepared {
        messages: parse::typed(json.clone())?,
        messages_json: json,
        tools: course.tools.clone(),
        max_output_tokens: req.max_output_tokens,
        session_id: req.session_id,
    })
}

async fn serve(
    state: AppState,
    headers: HeaderMap,
    req: Result<AnswerRequest, super::GatewayError>,
    mut record: RequestRecord,
) -> Response {
    link_trace(&mut record, &headers);
    let request_id = record.request_id().to_owned();
    let req = match req.and_then(|r| with_course(&state, r)) {
        Ok(r) => r,
        Err(e) => {
            record.finish(e.outcome(), Some(e.code()), None);
            return with_id(e.into_response(), &request_id);
        }
    };
    let mut body = Map::new();
    body.insert("messages".into(), req.messages_json);
    if let Some(tools) = req.tools {
        body.insert("tools".into(), tools);
    }
    if let Some(max) = req.max_output_tokens {
        body.insert("max_tokens".into(), Value::from(max));
    }
    let job = Job {
        endpoint: Endpoint::ChatCompletions,
        input: PromptInput::Chat(req.messages),
        max_tokens: req.max_output_tokens,
        body,
        record,
        session: req.session_id,
    };
    match pipeline::start(&state, job, Format::Answer).await {
        Ok(relay) => with_id(
            sse_response(Body::from_stream(relay.into_sse())),
            &request_id,
        ),
        Err(e) => with_id(e.into_response(), &request_id),
    }
}
