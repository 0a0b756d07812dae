//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI-compatible, through the same
//! lanes as `/answer`. Streaming answers relay vLLM's chunks as they are; non-streaming answers
//! are assembled from the stream in vLLM's response shape.

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::parse::{self, OpenAiRequest};
use super::pipeline::{self, Job};
use super::{AppState, GatewayError};
use crate::prompt::canonical_value;
use crate::relay::Format;
use crate::telemetry::{RequestRecord, Route};
use crate::upstream::Endpoint;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, headers, body, Route::ChatCompletions).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, headers, body, Route::Completions).await
}

async fn serve(
    state: AppState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    route: Route,
) -> Response {
    let mut record = state.record(route);
    link_trace(&mut record, &headers);
    let request_id = record.request_id().to_owned();
    let parsed =
        parse::body_bytes(body, state.config().server.max_body_bytes).and_then(|b| match route {
            Route::Completions => parse::completion(&b),
            Route::ChatCompletions | Route::Answer => parse::chat(&b),
        });
    let mut req: OpenAiRequest = match parsed {
        Ok(r) => r,
        Err(e) => {
            record.finish(e.outcome(), Some(e.code()), None);
            return with_id(e.into_response(), &request_id);
        }
    };
    if route == Route::ChatCompletions && state.config().prefix_cache.canonicalize_tools {
        // Same schemas, same tokens: key order must not break vLLM's prefix cache (M17).
        if let Some(tools) = req.body.get_mut("tools") {
            *tools = canonical_value(tools);
        }
    }
    let endpoint = match route {
        Route::Completions => Endpoint::Completions,
        Route::ChatCompletions | Route::Answer => Endpoint::ChatCompletions,
    };
    let job = Job {
        endpoint,
        input: req.input,
        max_tokens: req.max_tokens,
        body: req.body,
        record,
        session: headers
            .get("x-session-id")
            .and_then(|v| v.to_str().ok())
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    };
    let format = Format::OpenAi {
        include_usage: req.include_usage,
        continuous_usage: req.continuous_usage,
    };
    let relay = match pipeline::start(&state, job, format).await {
        Ok(r) => r,
        Err(e) => return with_id(e.into_response(), &request_id),
    };
    let resp = if req.stream {
        sse_response(Body::from_stream(relay.into_sse()))
    } else {
        match relay.collect().await {
            Ok(all) => axum::Json(all.into_json(route)).into_response(),
            Err(e) => e.into_response(),
        }
    };
    with_id(resp, &request_id)
}

/// Joins the client's trace (`traceparent`, `tracestate` headers) when it sent one.
pub fn link_trace(record: &mut RequestRecord, headers: &HeaderMap) {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    record.link(get("traceparent"), get("tracestate"));
}

/// A `text/event-stream` response that proxies do not buffer.
pub fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// Adds `x-request-id`.
pub fn with_id(mut resp: Response, request_id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

impl From<axum::extract::rejection::QueryRejection> for GatewayError {
    fn from(e: axum::extract::rejection::QueryRejection) -> Self {
        GatewayError::bad_request(e.body_text(), None)
    }
}
