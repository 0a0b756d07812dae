//! `/jobs`: background jobs (see [`crate::jobs`] for the API and the scheduling). Errors are the
//! gateway's JSON error body with their status; `GET /jobs/{id}/events` is SSE.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::stream::BoxStream;
use std::convert::Infallible;

use crate::error::GatewayError;
use crate::jobs::Jobs;
use crate::pipeline::parse::body_bytes;
use crate::pipeline::respond::{answer_refused, sse_response, with_id};
use crate::pipeline::Tenant;
use crate::relay::Drain;

/// `POST /jobs`: 202 with `{"id","status","status_url","events_url"}`.
pub async fn submit(
    State(jobs): State<Jobs>,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body_bytes(body, jobs.max_body_bytes()) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    // As `/answer`'s: the output limit is named `max_output_tokens`, and `x-request-id` is
    // the request's (the job's id, in its log line and spans).
    let (id, submitted) = jobs.submit(&headers, body, tenant.map(|t| t.0)).await;
    let resp = match submitted {
        Ok(v) => (StatusCode::ACCEPTED, axum::Json(v)).into_response(),
        Err(e) => answer_refused(e, &headers),
    };
    match id {
        Some(id) => with_id(resp, &id),
        None => resp,
    }
}

/// `GET /jobs/{id}`.
pub async fn status(
    State(jobs): State<Jobs>,
    tenant: Option<Extension<Tenant>>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        // An id that is no text (`%FF`) names no job.
        return GatewayError::JobNotFound.into_response();
    };
    match jobs.status(&id, tenant.as_ref().map(|t| &t.0)).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /jobs/{id}`.
pub async fn cancel(
    State(jobs): State<Jobs>,
    tenant: Option<Extension<Tenant>>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        // An id that is no text (`%FF`) names no job.
        return GatewayError::JobNotFound.into_response();
    };
    match jobs.cancel(&id, tenant.as_ref().map(|t| &t.0)).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The event that ends the event stream of a job kept in Redis when the gateway starts shutting
/// down. No `id:`, so an `EventSource` reconnects (after `retry:`) with the last piece it got,
/// to a replica still serving; the job itself goes on.
const SHUTDOWN_EVENT: &[u8] = b"retry: 1000\nevent: error\ndata: {\"code\":\"shutdown\",\"message\":\"this gateway is shutting down; reconnect to follow the job (Last-Event-ID resumes after the last piece received)\"}\n\n";

/// `stream` until the gateway whose handler runs this starts shutting down, then
/// [`SHUTDOWN_EVENT`] and the end. A follower holds no seat; it must not hold the shutdown's
/// grace period either (the grace is for answers still being generated), nor end in a cut
/// connection without a word.
fn until_shutdown(
    stream: BoxStream<'static, Result<Bytes, Infallible>>,
) -> BoxStream<'static, Result<Bytes, Infallible>> {
    let Some(drain) = Drain::current() else {
        return stream;
    };
    super::ending::until(
        stream,
        drain.draining_owned(),
        Some(Ok(Bytes::from_static(SHUTDOWN_EVENT))),
    )
}

/// `GET /jobs/{id}/events`, honouring `Last-Event-ID` (204 after the last event), or the
/// query's `last_event_id` when the header is absent: a page that opens a new `EventSource`
/// (a new `?token=`, its last one expired) cannot set the header, and resumes so.
pub async fn events(
    State(jobs): State<Jobs>,
    tenant: Option<Extension<Tenant>>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let Ok(Path(id)) = id else {
        // An id that is no text (`%FF`) names no job.
        return GatewayError::JobNotFound.into_response();
    };
    let from_query = query.as_deref().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "last_event_id")
            .map(|(_, v)| v.into_owned())
    });
    let last = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => from_query.as_deref(),
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => {
            return GatewayError::bad_request(
                "Last-Event-ID must be plain ASCII: the id of an event of this job",
                Some("last-event-id"),
            )
            .into_response()
        }
    };
    match jobs.events(&id, tenant.as_ref().map(|t| &t.0), last).await {
        // A job kept in this process ends with it (cancelled at shutdown: the stream says so
        // itself); one kept in Redis goes on elsewhere.
        Ok(Some(stream)) if jobs.shared() => {
            sse_response(Body::from_stream(until_shutdown(stream)))
        }
        Ok(Some(stream)) => sse_response(Body::from_stream(stream)),
        Ok(None) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}
