//! The HTTP side of a request's journey: its trace context in, and the response headers out
//! (`x-request-id`, an SSE body that proxies do not buffer).

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::error::GatewayError;
use crate::telemetry::RequestRecord;

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
    // Never stored, by any cache: a stream is one client's answer (a ?token= stream has no
    // Authorization header that would keep a shared cache off it).
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
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

/// A request that failed before its stream began: records the failure, answers with its
/// status and body.
pub fn rejected(mut record: RequestRecord, e: GatewayError) -> Response {
    let request_id = record.request_id().to_owned();
    record.finish(e.outcome(), Some(e.code()), None);
    with_id(e.into_response(), &request_id)
}

/// Writes a failure before the stream began to `record`, and passes it on. Logged at `info`
/// when the gateway or the engine failed it; a client's bad request or a refusal for capacity
/// is at `debug` (counted in `tutor_gateway_requests_total{outcome}` and the request log): a
/// client sending thousands of bad requests a second must not write as many log lines.
pub fn refused(mut record: RequestRecord, e: GatewayError) -> GatewayError {
    if e.outcome().is_fault() {
        tracing::info!(request_id = %record.request_id(), code = e.code(), error = %e.log_summary(), "request rejected");
    } else {
        tracing::debug!(request_id = %record.request_id(), code = e.code(), error = %e.log_summary(), "request rejected");
    }
    record.finish(e.outcome(), Some(e.code()), None);
    e
}

/// `e` as `/answer`'s JSON error: the output limit is its `max_output_tokens` there (the
/// shared error names `/v1`'s `max_tokens`).
fn answer_error(e: GatewayError) -> Response {
    let mut body = e.body();
    if body["error"]["param"] == "max_tokens" {
        body["error"]["param"] = "max_output_tokens".into();
    }
    let mut resp = (e.status(), axum::Json(body)).into_response();
    if let Some(v) = e
        .retry_after_secs()
        .and_then(|s| HeaderValue::from_str(&s.to_string()).ok())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// An `/answer` refused before its stream began. A refusal with a wait estimate (an early
/// "no", `deadline_unmet`) to a client that reads event streams (`Accept: text/event-stream`)
/// keeps its status and `Retry-After` and carries the error as the stream's one `error` event,
/// with `predicted_wait_ms`, `deadline_ms` and `retry_after_s`; anything else is the JSON error.
pub fn answer_refused(e: GatewayError, headers: &HeaderMap) -> Response {
    let reads_events = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    let Some((predicted, deadline)) = e.wait_estimate().filter(|_| reads_events) else {
        return answer_error(e);
    };
    let data = serde_json::json!({
        "code": e.code(),
        "message": e.message(),
        "predicted_wait_ms": predicted.as_millis(),
        "deadline_ms": deadline.as_millis(),
        "tenant_over_share": e.over_share(),
        "status": e.status().as_u16(),
        "retry_after_s": e.retry_after_secs(),
    });
    let mut resp = sse_response(Body::from(crate::relay::error_event_with(&data)));
    *resp.status_mut() = e.status();
    if let Some(v) = e
        .retry_after_secs()
        .and_then(|s| HeaderValue::from_str(&s.to_string()).ok())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}
