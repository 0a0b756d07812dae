//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI-compatible, through the same
//! lanes as `/answer`; the work is [`pipeline::openai`], under the snapshot of the configuration
//! taken here, at the request's arrival ([`RequestCtx::snapshot`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;

use crate::pipeline::{self, AppState, RequestCtx, Tenant};
use crate::telemetry::Route;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = tenant.map(|t| t.0);
    pipeline::openai(
        RequestCtx::snapshot(&state),
        headers,
        body,
        Route::ChatCompletions,
        tenant,
    )
    .await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = tenant.map(|t| t.0);
    pipeline::openai(
        RequestCtx::snapshot(&state),
        headers,
        body,
        Route::Completions,
        tenant,
    )
    .await
}
