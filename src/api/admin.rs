//! `/admin/*` on the admin listener (`server.admin_listen`, never the public one): operators'
//! actions. `POST /admin/reload` re-reads the config file (as `SIGHUP` does; see
//! [`crate::pipeline::reload`]) and answers what it did: 200 with `{"status":"applied",
//! "changed":[…],"left_alone":[…],"sha256":…,"limits":…,"limits_written":…}`, or 400 (`invalid`: every problem of the file
//! listed) / 500 (`failed`) with the reason, the old configuration staying in force.
//!
//! Every request to the admin listener passes [`guard`] first: no browser can drive it (a
//! request with an `Origin` header gets 403 `origin_not_allowed`, a POST that is not
//! `application/json` 415 `unsupported_media_type`, so a page cannot send a "simple" request
//! to it), and with `server.admin_token` set every `/admin/*` action needs `Authorization:
//! Bearer <token>` (401 `invalid_api_key` without it; `/metrics`, `/readyz` and `/healthz`
//! stay open to scrapers and probes).

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use axum::extract::{RawQuery, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::cors::is_json;
use super::denied::{self, Denial};
use crate::admission::LimitsChange;
use crate::error::GatewayError;
use crate::pipeline::reload::{self, ReloadError};
use crate::pipeline::AppState;
use crate::sign::{same, sha256_hex};

/// The admin listener's gate: no `Origin`, JSON POSTs only, and on `/admin/*` the admin
/// token when one is set.
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.headers().contains_key(header::ORIGIN) {
        return denied::mark(GatewayError::OriginNotAllowed, Denial::Origin);
    }
    if req.method() == Method::POST && !is_json(req.headers()) {
        return GatewayError::UnsupportedMediaType.into_response();
    }
    let action = req.uri().path().starts_with("/admin/");
    if let Some(token) = state
        .config()
        .server
        .admin_token
        .as_ref()
        .filter(|_| action)
    {
        // The scheme in any case, as HTTP has it (and as the API keys take it).
        let given = super::auth::bearer(req.headers()).ok().flatten();
        // Compared as hashes, in constant time: the lengths compared say nothing of the token.
        let ok = given.is_some_and(|g| {
            same(
                &sha256_hex(g.as_bytes()),
                &sha256_hex(token.expose().as_bytes()),
            )
        });
        if !ok {
            return denied::mark(
                GatewayError::Unauthorized(
                    "the admin listener needs Authorization: Bearer <server.admin_token>",
                ),
                Denial::Auth,
            );
        }
    }
    next.run(req).await
}

/// `POST /admin/reload` (`?force=true`: the file's limits replace a shared record that
/// `tutor-gateway limits push` wrote).
pub async fn reload(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let force = match query.as_deref().map(force_param) {
        None => false,
        Some(Ok(force)) => force,
        Some(Err(e)) => return e.into_response(),
    };
    // Reading and checking the file, and loading a tokenizer, block: off the async workers.
    let done = tokio::task::spawn_blocking(move || reload::reload(&state, force)).await;
    match done {
        Ok(Ok(r)) => axum::Json(json!({
            "status": "applied",
            "changed": r.changed,
            "left_alone": r.left_alone,
            "sha256": r.sha256,
            "limits": r.limits.describe(),
            "limits_written": matches!(r.limits, LimitsChange::Pushing | LimitsChange::InForce),
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

/// `force=true|false` (`1`/`0`), the reload's only parameter.
fn force_param(query: &str) -> Result<bool, GatewayError> {
    let mut force = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        force = match pair {
            "force=true" | "force=1" | "force" => true,
            "force=false" | "force=0" => false,
            _ => {
                return Err(GatewayError::bad_request(
                    "POST /admin/reload takes one parameter: force=true or force=false",
                    Some("force"),
                ))
            }
        };
    }
    Ok(force)
}
