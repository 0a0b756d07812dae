//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI-compatible, through the same
//! lanes as `/answer`; the work is [`pipeline::openai`].

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use crate::pipeline::{self, AppState};
use crate::telemetry::Route;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    pipeline::openai(state, headers, body, Route::ChatCompletions).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    pipeline::openai(state, headers, body, Route::Completions).await
}
