//! Operator endpoints: liveness, readiness, the upstream's model list, Prometheus.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::admission::AdmissionHealth;
use crate::error::GatewayError;
use crate::pipeline::parse::body_bytes;
use crate::pipeline::AppState;
use crate::upstream::{RawResponse, UpstreamError};

/// `GET /healthz`: the process is up.
pub async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// `GET /readyz`: 200 when vLLM answers its health probe, else 503. With the Redis quota down:
/// 200 `{"status":"degraded"}` under `fail_open` (the replica still serves, on its local share
/// of the limits), 503 under `fail_closed` (it refuses new requests).
pub async fn readyz(State(state): State<AppState>) -> Response {
    match state.admission().health() {
        AdmissionHealth::Ok => {}
        AdmissionHealth::Degraded => {
            let reason = "shared quota unreachable; local fallback limits";
            return axum::Json(json!({"status": "degraded", "reason": reason})).into_response();
        }
        AdmissionHealth::Unavailable => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({"status": "not_ready", "reason": "shared quota unreachable"})),
            )
                .into_response()
        }
    }
    match state.upstream().readiness().await {
        Ok(()) => axum::Json(json!({"status": "ready"})).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "not_ready", "reason": reason})),
        )
            .into_response(),
    }
}

/// `GET /v1/models`: vLLM's list, relayed.
pub async fn models(State(state): State<AppState>) -> Response {
    relayed(state.upstream().models().await)
}

/// `GET /version`: vLLM's version, relayed (benchmark clients read it).
pub async fn version(State(state): State<AppState>) -> Response {
    relayed(state.upstream().version().await)
}

/// `POST /tokenize`: vLLM's tokenizer, relayed (benchmark clients count tokens with it). Not
/// admitted through the lanes: it costs the engine no GPU time.
pub async fn tokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let limit = state.config().server.max_body_bytes;
    match body_bytes(body, limit) {
        Ok(body) => relayed(state.upstream().tokenize(body).await),
        Err(e) => e.into_response(),
    }
}

/// A small upstream answer as the client's response; failures in the OpenAI error shape.
fn relayed(raw: Result<RawResponse, UpstreamError>) -> Response {
    match raw {
        Ok(raw) => {
            let mut resp = (raw.status, raw.body).into_response();
            if let Some(ct) = raw.content_type {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            resp
        }
        Err(e) => GatewayError::from(e).into_response(),
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics().render(&state.admission().snapshot());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
