//! The HTTP surface: vLLM's OpenAI-compatible routes plus `/debug/*` for tests.

pub mod chunks;
pub mod error;
pub mod generate;
pub mod request;
pub mod stream;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use crate::engine::Engine;
use crate::text::FaultRates;
use crate::tokenizer::{render_chat, ChatMessage, PromptTokenizer};
use error::ApiError;
use request::{encode, parse_json};

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The engine.
    pub engine: Engine,
    /// Prompt tokenizer.
    pub tokenizer: Arc<PromptTokenizer>,
    /// Served model name.
    pub model: String,
    /// Longest prompt + output.
    pub max_model_len: u32,
    /// Mean seeded output length.
    pub mean_output_tokens: u32,
    /// Server seed.
    pub seed: u64,
    /// Fault injection.
    pub faults: FaultRates,
    /// `--enable-prompt-tokens-details`.
    pub prompt_tokens_details: bool,
    /// `--enable-per-request-metrics`.
    pub per_request_metrics: bool,
    /// `--enable-request-id-headers`.
    pub request_id_headers: bool,
    /// `--api-key`: required as a bearer token on `/v1/*`.
    pub api_key: Option<Arc<str>>,
    /// Unix seconds at start, for `/v1/models`.
    pub started: u64,
    /// The last `traceparent` headers received (`GET /debug/traceparents`), newest last.
    pub traceparents: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    /// `--scheduling-policy priority`: a non-zero `priority` is accepted (vLLM refuses one
    /// otherwise).
    pub priority_policy: bool,
    /// The last requests accepted (`GET /debug/requests`), newest last: prompt tokens,
    /// `max_tokens` as sent (null when none) and `priority`. Never the prompt itself.
    pub recent: Arc<std::sync::Mutex<std::collections::VecDeque<serde_json::Value>>>,
}

impl AppState {
    /// Remembers an accepted request's limits (the last 1,000).
    pub fn saw_request(&self, summary: serde_json::Value) {
        let mut q = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == 1000 {
            q.pop_front();
        }
        q.push_back(summary);
    }

    /// Remembers a request's `traceparent` (the last 1,000), as vLLM would parent its span on it.
    pub fn saw_traceparent(&self, headers: &HeaderMap) {
        if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
            let mut q = self.traceparents.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() == 1000 {
                q.pop_front();
            }
            q.push_back(tp.to_owned());
        }
    }
}

/// All routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/tokenize", post(tokenize))
        .route("/metrics", get(metrics))
        .route("/abort_requests", post(abort_requests))
        .route("/debug/engine", get(debug_engine))
        .route("/debug/steps", get(debug_steps))
        .route("/debug/traceparents", get(debug_traceparents))
        .route("/debug/requests", get(debug_requests))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .with_state(state)
}

/// vLLM's `--api-key`: `/v1/*` needs `Authorization: Bearer <key>` (401 otherwise); other
/// routes (`/health`, `/metrics`, ...) are open, as in vLLM.
async fn require_api_key(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(key) = s.api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !req.uri().path().starts_with("/v1") || given == Some(key) {
        return next.run(req).await;
    }
    (
        axum::http::StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({"error": "Unauthorized"})),
    )
        .into_response()
}

async fn models(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": s.model,
            "object": "model",
            "created": s.started,
            "owned_by": "vllm",
            "root": s.model,
            "parent": null,
            "max_model_len": s.max_model_len,
            "permission": [{
                "id": format!("modelperm-{}", uuid::Uuid::new_v4().simple()),
                "object": "model_permission",
                "created": s.started,
                "allow_create_engine": false,
                "allow_sampling": true,
                "allow_logprobs": true,
                "allow_search_indices": false,
                "allow_view": true,
                "allow_fine_tuning": false,
                "organization": "*",
                "group": null,
                "is_blocking": false
            }]
        }]
    }))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn version() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "version": crate::VLLM_VERSION }))
}

#[derive(Deserialize)]
struct TokenizeBody {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default = "yes")]
    add_special_tokens: bool,
    #[serde(default)]
    model: Option<String>,
}

fn yes() -> bool {
    true
}

async fn tokenize(State(s): State<AppState>, body: Bytes) -> Response {
    let result = async {
        let b: TokenizeBody = parse_json(&body)?;
        if let Some(m) = b.model.as_deref() {
            if m != s.model {
                return Err(ApiError::model_not_found(m));
            }
        }
        let text = match (b.prompt, b.messages) {
            (Some(p), None) => p,
            (None, Some(m)) => render_chat(&m),
            _ => {
                return Err(ApiError::bad_request(
                    "send exactly one of `prompt` or `messages`",
                    None,
                ))
            }
        };
        let tokens = encode(&s, text, b.add_special_tokens).await;
        Ok(Json(serde_json::json!({
            "count": tokens.len(),
            "max_model_len": s.max_model_len,
            "tokens": tokens,
        })))
    }
    .await;
    match result {
        Ok(j) => j.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.engine.render_metrics(&s.model),
    )
        .into_response()
}

#[derive(Deserialize)]
struct AbortBody {
    request_ids: Vec<String>,
}

async fn abort_requests(State(s): State<AppState>, _h: HeaderMap, body: Bytes) -> Response {
    match parse_json::<AbortBody>(&body) {
        Ok(b) => {
            let n = s.engine.abort_request_ids(&b.request_ids);
            tracing::debug!(found = n, "abort_requests");
            StatusCode::OK.into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn debug_engine(State(s): State<AppState>) -> Json<crate::engine::EngineSnapshot> {
    Json(s.engine.snapshot())
}

async fn debug_requests(State(s): State<AppState>) -> Json<Vec<serde_json::Value>> {
    Json(
        s.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect(),
    )
}

async fn debug_traceparents(State(s): State<AppState>) -> Json<Vec<String>> {
    Json(
        s.traceparents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect(),
    )
}

async fn debug_steps(State(s): State<AppState>) -> Json<Vec<crate::engine::stats::StepRecord>> {
    Json(s.engine.recent_steps())
}
