//! `/admin/*` on the admin listener (`server.admin_listen`, never the public one): operators'
//! actions. `POST /admin/reload` re-reads the config file (as `SIGHUP` does; see
//! [`crate::pipeline::reload`]) and answers what it did: 200 with `{"status":"applied",
//! "changed":[…],"left_alone":[…],"sha256":…}`, or 400 (`invalid`: every problem of the file
//! listed) / 500 (`failed`) with the reason, the old configuration staying in force.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::pipeline::reload::{self, ReloadError};
use crate::pipeline::AppState;

/// `POST /admin/reload`.
pub async fn reload(State(state): State<AppState>) -> Response {
    // Reading and checking the file, and loading a tokenizer, block: off the async workers.
    let done = tokio::task::spawn_blocking(move || reload::reload(&state)).await;
    match done {
        Ok(Ok(r)) => axum::Json(json!({
            "status": "applied",
            "changed": r.changed,
            "left_alone": r.left_alone,
            "sha256": r.sha256,
        }))
        .into_response(),
        Ok(Err(e)) => {
            let status = match e {
                ReloadError::Invalid(_) | ReloadError::NoFile => StatusCode::BAD_REQUEST,
                ReloadError::Build(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            let problems: Vec<String> = match &e {
                ReloadError::Invalid(c) => c.issues().iter().map(ToString::to_string).collect(),
                _ => Vec::new(),
            };
            (
                status,
                axum::Json(json!({
                    "status": e.outcome(),
                    "error": e.to_string(),
                    "problems": problems,
                })),
            )
                .into_response()
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
