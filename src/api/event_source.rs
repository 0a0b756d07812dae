//! Refusals a browser's `EventSource` can read. An `EventSource` drops the body of any answer
//! but a 200 and fires a bare `error`: a student whose question was refused before its stream
//! began (a full queue, a prompt too long, an expired `?token=`, a draining gateway) saw
//! nothing, and the page could not tell why nor when to try again.
//!
//! So an `EventSource`'s `GET` of an event stream (`/answer`, `/jobs/{id}/events`), told by
//! what every browser's `EventSource` sends and other clients mostly do not (`Accept:
//! text/event-stream`; `Cache-Control: no-cache`, which the Fetch standard adds for its
//! `no-store` cache mode; no `Authorization`, which it cannot set), refused before its stream
//! begins, gets
//! 200 and the refusal as the stream's one `error` event: the error's fields (`code`,
//! `message`, `param`, and an early refusal's estimate) plus `status` (the HTTP status it
//! stands for) and `retry_after_s` (also the `Retry-After` header, kept). The event's id is
//! `end`, so an `EventSource` that reconnects sends `Last-Event-ID: end` and is told to stop
//! (204 on `/answer`). A request that carries `Last-Event-ID` (a reconnection) gets the
//! refusal as it is: a refusal at every reconnection would never end. `POST /answer`, a
//! `fetch()`-based SSE client (it reads any status, and status-based proxies' retries and
//! metrics see it) and every other route keep the HTTP status.
//! The metrics and the request log count the refusal as what it is.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

/// The most of a refusal's body read to make its event (an error JSON is far smaller).
const MAX_REFUSAL_BYTES: usize = 64 * 1024;

/// The layer: see the module's doc.
pub async fn readable_refusals(req: Request, next: Next) -> Response {
    let headers = req.headers();
    let applies = req.method() == Method::GET
        && reads_events(headers)
        && no_cache(headers)
        && !headers.contains_key(header::AUTHORIZATION)
        && !headers.contains_key("last-event-id")
        && is_event_stream(req.uri().path());
    let resp = next.run(req).await;
    if !applies || resp.status().is_success() || resp.status().is_informational() {
        return resp;
    }
    let status = resp.status();
    let (mut parts, body) = resp.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if sse {
        // Already the refusal as an event (an early "no" with its estimate): only its status.
        parts.status = StatusCode::OK;
        return Response::from_parts(parts, body);
    }
    let bytes = axum::body::to_bytes(body, MAX_REFUSAL_BYTES)
        .await
        .unwrap_or_default();
    let retry_after = parts
        .headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let data = event_data(&bytes, status, retry_after);
    parts.status = StatusCode::OK;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    parts
        .headers
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Response::from_parts(parts, Body::from(crate::relay::error_event_with(&data)))
}

/// Whether the client reads event streams.
fn reads_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|a| a.contains("text/event-stream"))
}

/// `Cache-Control: no-cache`: what a browser adds to an `EventSource`'s request.
fn no_cache(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.split(',')
                .any(|d| d.trim().eq_ignore_ascii_case("no-cache"))
        })
}

/// `/answer` and `/jobs/{id}/events`: the routes an `EventSource` opens.
fn is_event_stream(path: &str) -> bool {
    path == "/answer"
        || path
            .strip_prefix("/jobs/")
            .and_then(|rest| rest.strip_suffix("/events"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// The `error` event's data for a refusal with `status` whose body was `body` (the gateway's
/// `{"error": {...}}`; anything else is told by its status).
fn event_data(body: &Bytes, status: StatusCode, retry_after: Option<u64>) -> Value {
    let error = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|mut v| v.get_mut("error").map(Value::take))
        .filter(Value::is_object);
    let mut data = error.unwrap_or_else(|| {
        json!({
            "code": format!("http_{}", status.as_u16()),
            "message": status.canonical_reason().unwrap_or("refused"),
        })
    });
    data["status"] = json!(status.as_u16());
    data["retry_after_s"] = json!(retry_after);
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_an_event_source_opens_are_the_streams() {
        assert!(is_event_stream("/answer"));
        assert!(is_event_stream("/jobs/5e0c/events"));
        assert!(!is_event_stream("/jobs//events"));
        assert!(!is_event_stream("/jobs/5e0c"));
        assert!(!is_event_stream("/v1/chat/completions"));
    }

    #[test]
    fn the_event_keeps_the_errors_fields_and_adds_its_status() {
        let body = Bytes::from_static(
            br#"{"error":{"message":"full","type":"rate_limit_error","param":null,"code":"queue_full"}}"#,
        );
        let data = event_data(&body, StatusCode::TOO_MANY_REQUESTS, Some(2));
        assert_eq!(data["code"], "queue_full");
        assert_eq!(data["message"], "full");
        assert_eq!(data["status"], 429);
        assert_eq!(data["retry_after_s"], 2);
        let data = event_data(
            &Bytes::from_static(b"<html>"),
            StatusCode::BAD_GATEWAY,
            None,
        );
        assert_eq!(data["code"], "http_502");
        assert_eq!(data["status"], 502);
    }
}
