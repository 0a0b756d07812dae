//! The HTTP surface: vLLM's OpenAI-compatible routes plus `/debug/*` for tests.
//!
//! Aborts are as in vLLM 0.33's server: a request whose client disconnects is aborted (the
//! body or handler future is dropped: [`stream::AbortGuard`]); `POST
//! /inference/v1/abort_requests` exists only with `--enable-scale-out` (403 otherwise, as vLLM's
//! stand-in route) and takes the ids vLLM gives requests (`chatcmpl-<X-Request-Id>`,
//! `cmpl-<X-Request-Id>-0`, see [`request::engine_request_id`]); `/abort_requests` is 404, as
//! on a default `vllm serve`. Every call to either path is recorded for `GET /debug/aborts`.

pub mod chunks;
pub mod error;
pub mod generate;
pub mod request;
mod state;
pub mod stream;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use crate::tokenizer::{ChatMessage, PromptEnd};
use error::ApiError;
use request::{encode, parse_json, prompt_end};
pub use state::AppState;

/// The vLLM version the simulator reports at `/version`: the release whose scheduler and server
/// rules it was last checked against (`docs/vllm-interface.md`).
pub const VLLM_VERSION: &str = "0.34.0+sim";

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
        .route("/inference/v1/abort_requests", post(abort_requests))
        .route("/abort_requests", post(no_abort_requests))
        .route("/debug/engine", get(debug_engine))
        .route("/debug/aborts", get(debug_aborts))
        .route("/debug/steps", get(debug_steps))
        .route("/debug/traceparents", get(debug_traceparents))
        .route("/debug/requests", get(debug_requests))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .with_state(state)
}

/// FastAPI's answer for a path no route serves.
async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({"detail": "Not Found"})),
    )
        .into_response()
}

/// vLLM's `--api-key`: `/v1/*` and `/inference/*` need `Authorization: Bearer <key>` (401
/// otherwise); other routes (`/health`, `/metrics`, `/abort_requests`, ...) are open, as in vLLM.
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
    let path = req.uri().path();
    let guarded = path.starts_with("/v1") || path.starts_with("/inference");
    if !guarded || given == Some(key) {
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
    Json(serde_json::json!({ "version": VLLM_VERSION }))
}

#[derive(Deserialize)]
struct TokenizeBody {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    /// Rendered before the messages, as for a chat completion.
    #[serde(default)]
    tools: Option<serde_json::Value>,
    /// Rendered before the messages, as for a chat completion.
    #[serde(default)]
    chat_template_kwargs: Option<serde_json::Value>,
    /// As for a chat completion (`request::prompt_end`).
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: bool,
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
        let (text, continued) = match (b.prompt, b.messages) {
            (Some(p), None) => (p, None),
            (None, Some(m)) => {
                let end = prompt_end(b.add_generation_prompt, b.continue_final_message, &m)?;
                let (tools, kwargs) = (b.tools.as_ref(), b.chat_template_kwargs.as_ref());
                // A continuation of the simulator's own output counts as generation sees it.
                let continued = match end {
                    PromptEnd::ContinueFinal if b.add_special_tokens => {
                        request::continuation(&s, tools, kwargs, &m)
                            .await
                            .filter(|c| c.exact)
                    }
                    _ => None,
                };
                (s.render(tools, kwargs, &m, end), continued)
            }
            _ => {
                return Err(ApiError::bad_request(
                    "send exactly one of `prompt` or `messages`",
                    None,
                ))
            }
        };
        let tokens = match continued {
            Some(c) if c.exact => request::continued_ids(&c.origin, c.first_word),
            _ => encode(&s, text, b.add_special_tokens).await,
        };
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

/// The message of vLLM's stand-in for its scale-out routes while they are off.
const SCALE_OUT_DISABLED: &str =
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.";

/// `request_ids` as vLLM reads it: a list of ids, or one id as a string.
#[derive(Deserialize)]
#[serde(untagged)]
enum AbortIds {
    One(String),
    Many(Vec<String>),
}

/// FastAPI's answer to an `HTTPException`: `{"detail": "..."}`.
fn detail(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "detail": message }))).into_response()
}

/// The ids in an abort body's `request_ids`, as vLLM reads them: `Err` with the `detail` of
/// the 400 vLLM answers for a body that is not JSON or has no `request_ids`.
fn abort_ids(body: &[u8]) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("JSON decode error: {e}"))?;
    match value.get("request_ids").filter(|v| !v.is_null()).cloned() {
        Some(v) => match serde_json::from_value::<AbortIds>(v) {
            Ok(AbortIds::One(id)) => Ok(vec![id]),
            Ok(AbortIds::Many(ids)) => Ok(ids),
            Err(_) => Err("'request_ids' must be a string or a list of strings".into()),
        },
        None => Err("Missing 'request_ids' in request body".into()),
    }
}

/// `POST /inference/v1/abort_requests {"request_ids": [...]}`: with `--enable-scale-out`,
/// aborts the requests with those ids (vLLM's external ids: `chatcmpl-<X-Request-Id>`,
/// `cmpl-<X-Request-Id>-0`; any other id matches nothing and is ignored, as in vLLM) and
/// answers 200 with an empty body; a body that is not JSON, or has no `request_ids`, is a 400.
/// Without the flag, 403 as vLLM's stand-in route.
async fn abort_requests(State(s): State<AppState>, body: Bytes) -> Response {
    const PATH: &str = "/inference/v1/abort_requests";
    let ids = abort_ids(&body);
    if !s.scale_out {
        let named = ids.unwrap_or_default();
        s.saw_abort(PATH, StatusCode::FORBIDDEN, &named, 0);
        return ApiError::permission_denied(SCALE_OUT_DISABLED).into_response();
    }
    match ids {
        Ok(ids) => {
            let n = s.engine.abort_request_ids(&ids);
            tracing::debug!(found = n, "abort_requests");
            s.saw_abort(PATH, StatusCode::OK, &ids, n);
            StatusCode::OK.into_response()
        }
        Err(message) => {
            s.saw_abort(PATH, StatusCode::BAD_REQUEST, &[], 0);
            detail(StatusCode::BAD_REQUEST, message)
        }
    }
}

/// `POST /abort_requests`: not a route of a default `vllm serve` (only of its tokens-only and
/// development modes, which the simulator does not model): FastAPI's 404, recorded.
async fn no_abort_requests(State(s): State<AppState>, body: Bytes) -> Response {
    let named = abort_ids(&body).unwrap_or_default();
    s.saw_abort("/abort_requests", StatusCode::NOT_FOUND, &named, 0);
    not_found().await
}

async fn debug_aborts(State(s): State<AppState>) -> Json<Vec<serde_json::Value>> {
    Json(
        s.aborts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect(),
    )
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
