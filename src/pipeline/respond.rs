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

/// A request that failed before its stream began: records the failure, answers with its
/// status and body.
pub fn rejected(mut record: RequestRecord, e: GatewayError) -> Response {
    let request_id = record.request_id().to_owned();
    record.finish(e.outcome(), Some(e.code()), None);
    with_id(e.into_response(), &request_id)
}

/// Writes a failure before the stream began to `record`, and passes it on.
pub fn refused(mut record: RequestRecord, e: GatewayError) -> GatewayError {
    tracing::info!(request_id = %record.request_id(), code = e.code(), error = %e.log_summary(), "request rejected");
    record.finish(e.outcome(), Some(e.code()), None);
    e
}
