//! `/answer`: the tutoring frontend's stream. `GET /answer?prompt=…` for a browser
//! `EventSource`, `POST /answer` with JSON for `fetch`. The event format is in the README and in
//! [`crate::relay`].

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::openai::{sse_response, traceparent, with_id};
use super::parse::{self, AnswerQuery, AnswerRequest};
use super::pipeline::{self, new_request_id, Job};
use super::AppState;
use crate::classify::PromptInput;
use crate::relay::Format;
use crate::telemetry::Route;
use crate::upstream::Endpoint;

/// `GET /answer?prompt=…&max_output_tokens=…`.
pub async fn get_answer(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<AnswerQuery>, QueryRejection>,
) -> Response {
    let arrival = Instant::now();
    let req = query
        .map_err(Into::into)
        .and_then(|Query(q)| AnswerRequest::from_query(q));
    serve(state, headers, req, arrival).await
}

/// `POST /answer` with `{"messages"|"prompt", "max_output_tokens", "session_id", "course_id"}`.
pub async fn post_answer(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    let req = parse::body_bytes(body, state.config().server.max_body_bytes)
        .and_then(|b| AnswerRequest::from_body(&b));
    serve(state, headers, req, arrival).await
}

async fn serve(
    state: AppState,
    headers: HeaderMap,
    req: Result<AnswerRequest, super::GatewayError>,
    arrival: Instant,
) -> Response {
    let request_id = new_request_id();
    let req = match req {
        Ok(r) => r,
        Err(e) => {
            state
                .metrics()
                .request_done(None, Route::Answer, e.outcome());
            return with_id(e.into_response(), &request_id);
        }
    };
    let mut body = Map::new();
    body.insert("messages".into(), req.messages_json);
    if let Some(max) = req.max_output_tokens {
        body.insert("max_tokens".into(), Value::from(max));
    }
    let job = Job {
        route: Route::Answer,
        endpoint: Endpoint::ChatCompletions,
        input: PromptInput::Chat(req.messages),
        max_tokens: req.max_output_tokens,
        body,
        traceparent: traceparent(&headers),
        arrival,
        request_id: request_id.clone(),
    };
    match pipeline::start(&state, job, Format::Answer).await {
        Ok(relay) => with_id(
            sse_response(Body::from_stream(relay.into_sse())),
            &request_id,
        ),
        Err(e) => with_id(e.into_response(), &request_id),
    }
}
