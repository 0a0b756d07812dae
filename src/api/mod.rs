//! HTTP routes (axum). Handlers are thin: they take what axum extracts and call one function of
//! [`crate::pipeline`], which runs the request's whole journey; [`crate::error`] maps every
//! failure to HTTP in one place. Nothing below this module imports from it.
//!
//! - `GET /answer?prompt=…`, `POST /answer`: the tutoring frontend's SSE stream ([`answer`]).
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI-compatible ([`openai`]).
//! - `GET /healthz`, `GET /readyz`, `GET /v1/models`, `GET /metrics` ([`ops`]; `/readyz` and
//!   `/metrics` move to `server.admin_listen` when it is set, see [`admin`]); and vLLM's
//!   own probe routes, so clients written for vLLM accept the gateway: `GET /health` and
//!   `/ping` (liveness, as `/healthz`), `GET /version` and `POST /tokenize` (relayed).
//! - `POST /auth/token`: a short-lived token for a browser `EventSource` ([`auth`], which also
//!   holds the key check every request route goes through when `[auth]` is on).
//! - `POST /jobs`, `GET|DELETE /jobs/{id}`, `GET /jobs/{id}/events`: background jobs
//!   ([`jobs`], served by [`crate::jobs`]).
//! - `GET /demo`: a page for trying `/answer` in a browser, when `server.demo` is on ([`demo`]).

// Numbers from clients reach these modules (ids, offsets, lengths): no cast may wrap or drop a
// sign; checked or saturating arithmetic instead.
#![deny(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

pub mod admin;
pub mod answer;
pub mod auth;
pub mod cors;
pub mod demo;
pub mod denied;
mod ending;
mod event_source;
pub mod hosts;
pub mod jobs;
pub mod limits;
pub mod openai;
pub mod ops;
pub mod request_id;

use std::net::SocketAddr;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

pub use crate::jobs::Jobs;
pub use crate::pipeline::AppState;
use crate::relay::Drain;
use crate::telemetry::Route;

/// The gateway's routes over `state`, with background jobs served by `jobs` and API keys
/// checked by `auth`, for a listener on `listen` (which names it answers to: [`hosts`]).
pub fn app(
    state: AppState,
    jobs: Jobs,
    auth: auth::Auth,
    listen: SocketAddr,
    drain: &Drain,
) -> Router {
    let server = state.config().server.clone();
    let hosts = hosts::Hosts::new(&server.allowed_hosts, listen);
    let limit = server.max_body_bytes;
    // The routes that use the job service: jobs, and /answer (which may divert to one).
    let job_routes = Router::new()
        .route(
            "/answer",
            get(answer::get_answer)
                .post(answer::post_answer)
                .head(answer::head_answer),
        )
        .route("/jobs", post(jobs::submit))
        .route("/jobs/{id}", get(jobs::status).delete(jobs::cancel))
        .route("/jobs/{id}/events", get(jobs::events))
        .with_state(jobs);
    let token_route = Router::new()
        .route("/auth/token", post(auth::token))
        .with_state(auth.clone());
    Router::new()
        .route(
            "/v1/chat/completions",
            openai::post_route(Route::ChatCompletions),
        )
        .route("/v1/completions", openai::post_route(Route::Completions))
        .route("/v1/models", get(ops::models))
        .route("/v1/usage", get(ops::usage))
        .route("/healthz", get(ops::healthz))
        // vLLM's own probe routes, for clients that expect vLLM here.
        .route("/health", get(ops::healthz))
        .route("/ping", get(ops::healthz).post(ops::healthz))
        .route("/version", get(ops::version))
        .route("/tokenize", post(ops::tokenize))
        .route("/demo", get(demo::page))
        .merge(match server.admin_listen {
            // Operators' routes live on the admin listener then ([`admin`]).
            Some(_) => Router::new(),
            None => operator_routes(),
        })
        .with_state(state.clone())
        .merge(job_routes)
        .merge(token_route)
        // Anything else gets an error in the OpenAI shape, not an empty body.
        .fallback(|| async { crate::error::GatewayError::NotFound })
        .method_not_allowed_fallback(|| async { crate::error::GatewayError::MethodNotAllowed })
        // Innermost: a handler's panic answers 500 `internal`, marked by every layer below.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ending::caught,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            limits::RequestLimits::new(
                server.max_requests_in_flight,
                server.body_read_timeout,
                state.clone(),
            ),
            limits::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(auth, auth::require))
        // Every handler under the gateway's drain; one still waiting when the grace ends gets
        // 503 `shutdown`, which the layers below mark as any answer (request id, CORS).
        .layer(axum::middleware::from_fn_with_state(
            drain.clone(),
            ending::in_drain,
        ))
        // A refusal before an event stream began, to a GET that reads events: told as the
        // stream's one `error` event, which a browser's `EventSource` can read.
        .layer(axum::middleware::from_fn(event_source::readable_refusals))
        // Outermost: a browser request from a foreign origin is refused before anything else.
        .layer(axum::middleware::from_fn_with_state(
            cors::Cors::new(server.cors_allow_origins.clone(), server.cors_max_age),
            cors::cors,
        ))
        // Before everything else: a page on a rebound DNS name is refused.
        .layer(axum::middleware::from_fn_with_state(hosts, hosts::check))
        // Counts what the layers above denied (`tutor_gateway_denied_total`).
        .layer(axum::middleware::from_fn_with_state(state, denied::count))
        // Around everything: every answer carries an `x-request-id`.
        .layer(axum::middleware::from_fn(request_id::ensure))
}

/// `/readyz` and `/metrics`: on the public listener, or on `server.admin_listen` when set.
fn operator_routes() -> Router<AppState> {
    Router::new()
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
}

/// The admin listener's routes (`server.admin_listen`): `/metrics`, `/readyz`, `/healthz`,
/// and `POST /admin/reload` ([`admin::reload`]), behind [`admin::guard`].
pub fn admin(state: AppState, listen: SocketAddr, drain: &Drain) -> Router {
    let hosts = hosts::Hosts::new(&state.config().server.allowed_hosts, listen);
    operator_routes()
        .route("/healthz", get(ops::healthz))
        .route("/admin/reload", post(admin::reload))
        .fallback(|| async { crate::error::GatewayError::NotFound })
        .method_not_allowed_fallback(|| async { crate::error::GatewayError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ending::caught,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            drain.clone(),
            ending::in_drain,
        ))
        .layer(axum::middleware::from_fn_with_state(hosts, hosts::check))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            denied::count,
        ))
        .layer(axum::middleware::from_fn(request_id::ensure))
        .with_state(state)
}
