//! `/answer`: the tutoring frontend's stream. `GET /answer?prompt=…` for a browser
//! `EventSource`, `POST /answer` with JSON for `fetch`. The event format is in the README and in
//! [`crate::relay`]; the work is [`pipeline::answer`], under the snapshot of the configuration
//! taken here, at the request's arrival ([`RequestCtx::snapshot`]).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use crate::jobs::Jobs;
use crate::pipeline::parse::AnswerQuery;
use crate::pipeline::{self, AnswerInput, RequestCtx, Tenant};
use crate::relay::ConnectionCloser;

/// `GET /answer?prompt=…&max_output_tokens=…`.
pub async fn get_answer(
    State(jobs): State<Jobs>,
    tenant: Option<Extension<Tenant>>,
    connection: Option<Extension<ConnectionCloser>>,
    headers: HeaderMap,
    query: Result<Query<AnswerQuery>, QueryRejection>,
) -> Response {
    let ctx = RequestCtx::snapshot(jobs.state()).on_connection(connection.map(|c| c.0));
    let (input, tenant) = (AnswerInput::Query(query), tenant.map(|t| t.0));
    pipeline::answer(ctx, headers, input, Some(&jobs), tenant).await
}

/// `POST /answer` with `{"messages"|"prompt", "max_output_tokens", "session_id", "course_id"}`.
pub async fn post_answer(
    State(jobs): State<Jobs>,
    tenant: Option<Extension<Tenant>>,
    connection: Option<Extension<ConnectionCloser>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let ctx = RequestCtx::snapshot(jobs.state()).on_connection(connection.map(|c| c.0));
    let (input, tenant) = (AnswerInput::Body(body), tenant.map(|t| t.0));
    pipeline::answer(ctx, headers, input, Some(&jobs), tenant).await
}

/// `HEAD /answer`: 405 (`Allow: GET, POST`). A `GET /answer` starts an answer in the engine;
/// handed a HEAD (as the router does by default, dropping the body), it started and aborted one
/// per request, a few thousand a second on one connection, and an aborted HEAD is no reset.
pub async fn head_answer() -> Response {
    let mut resp = crate::error::GatewayError::MethodNotAllowed.into_response();
    resp.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static("GET, POST"),
    );
    resp
}
