//! Operator endpoints: liveness, readiness, the upstream's model list, Prometheus.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::json;

use crate::admission::AdmissionHealth;
use crate::error::GatewayError;
use crate::pipeline::{self, AppState, RequestCtx, Tenant};
use crate::relay::Drain;
use crate::upstream::{RawResponse, UpstreamError};

/// `GET /healthz`: the process is up, and every background task it needs runs: after one
/// panicked (a bug; `crate::telemetry::panic::Background`) it answers 503 `failed`, naming the
/// task, so that an orchestrator restarts the replica.
pub async fn healthz(State(state): State<AppState>) -> Response {
    match state.metrics().background().failed() {
        None => axum::Json(json!({"status": "ok"})).into_response(),
        Some(task) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "failed", "reason": failed(task)})),
        )
            .into_response(),
    }
}

/// Why a replica whose background `task` panicked must be restarted.
fn failed(task: &str) -> String {
    format!("the background task '{task}' stopped (a panic): restart this replica")
}

/// What `/readyz` weighs, each as its source reports it.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// The gateway is shutting down ([`Drain::begin`]).
    pub draining: bool,
    /// Whether admission works as configured (the Redis quota reachable).
    pub admission: AdmissionHealth,
    /// vLLM's health probe (cached per `upstream.health_cache_ms`): `Err` with the reason.
    pub upstream: Result<(), String>,
    /// The background task that panicked, if one did (`/healthz` fails too).
    pub failed_task: Option<&'static str>,
}

impl Readiness {
    /// The one verdict over every input: 503 `draining` while shutting down (so the load
    /// balancer stops sending first); 503 `failed` once a background task panicked (as
    /// `/healthz`); 503 `not_ready` when the Redis quota is down under
    /// `fail_closed` or vLLM does not answer; 200 `degraded` when the Redis quota is down
    /// under `fail_open` (the replica still serves, on its local share of the limits); else
    /// 200 `ready`.
    pub fn verdict(&self) -> (StatusCode, serde_json::Value) {
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        if self.draining {
            let reason = "shutting down: finishing open streams";
            return (unavailable, json!({"status": "draining", "reason": reason}));
        }
        if let Some(task) = self.failed_task {
            return (
                unavailable,
                json!({"status": "failed", "reason": failed(task)}),
            );
        }
        if self.admission == AdmissionHealth::Unavailable {
            let reason = "shared quota unreachable";
            return (
                unavailable,
                json!({"status": "not_ready", "reason": reason}),
            );
        }
        if let Err(reason) = &self.upstream {
            return (
                unavailable,
                json!({"status": "not_ready", "reason": reason}),
            );
        }
        if self.admission == AdmissionHealth::Degraded {
            let reason = "shared quota unreachable; local fallback limits";
            return (
                StatusCode::OK,
                json!({"status": "degraded", "reason": reason}),
            );
        }
        (StatusCode::OK, json!({"status": "ready"}))
    }
}

/// `GET /readyz`: [`Readiness::verdict`] over the gateway's drain (the server puts it in the
/// request's extensions), admission's health and vLLM's probe.
pub async fn readyz(State(state): State<AppState>, drain: Option<Extension<Drain>>) -> Response {
    let draining = drain.is_some_and(|Extension(d)| d.is_draining());
    let readiness = Readiness {
        draining,
        admission: state.admission().health(),
        failed_task: state.metrics().background().failed(),
        // Not asked while draining: the answer is 503 whatever vLLM says.
        upstream: if draining {
            Ok(())
        } else {
            state.upstream().readiness().await
        },
    };
    let (status, body) = readiness.verdict();
    (status, axum::Json(body)).into_response()
}

/// `GET /v1/models`: vLLM's list, relayed.
pub async fn models(State(state): State<AppState>) -> Response {
    relayed(state.upstream().models().await)
}

/// `GET /version`: vLLM's version, relayed (benchmark clients read it).
pub async fn version(State(state): State<AppState>) -> Response {
    relayed(state.upstream().version().await)
}

/// `POST /tokenize`: vLLM's tokenizer, relayed (benchmark clients count tokens with it), the
/// body checked as `/v1` bodies are and the call holding a small-lane seat
/// ([`pipeline::tokenize`]), under the snapshot of the configuration taken here.
pub async fn tokenize(
    State(state): State<AppState>,
    tenant: Option<Extension<Tenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = tenant.map(|t| t.0);
    match pipeline::tokenize::tokenize(RequestCtx::snapshot(&state), body, tenant).await {
        Ok(raw) => relayed(Ok(raw)),
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
    state
        .metrics()
        .request_log_dropped(state.request_log().dropped());
    state
        .metrics()
        .log_dropped(crate::telemetry::otel::diagnostic_log_dropped());
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

/// `GET /v1/usage`: the caller's own tenant's budgets (`[auth.tenants.<name>]`: limit, used,
/// remaining; the minute is the last 60 s, the day resets at the next UTC midnight) and its
/// requests in flight. Never another tenant's. With `[auth]` off there is no tenant: `tenant` is
/// null and nothing is bounded per tenant.
pub async fn usage(State(state): State<AppState>, tenant: Option<Extension<Tenant>>) -> Response {
    let config = state.config();
    let Some(Extension(Tenant(tenant))) = tenant else {
        return axum::Json(serde_json::json!({
            "object": "tenant.usage",
            "tenant": null,
            "budgets": {},
        }))
        .into_response();
    };
    let (requests, tokens, day) = state.tenant_budgets().used(&tenant).await;
    let budget = config
        .auth
        .tenants
        .get(&tenant)
        .copied()
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let midnight = (now / 86_400).saturating_add(1).saturating_mul(86_400);
    let mut budgets = serde_json::Map::new();
    for (name, limit, used) in [
        ("requests_per_minute", budget.requests_per_minute, requests),
        ("tokens_per_minute", budget.tokens_per_minute, tokens),
        ("tokens_per_day", budget.tokens_per_day, day),
    ] {
        let Some(limit) = limit else { continue };
        let mut b = serde_json::json!({
            "limit": limit,
            "used": used,
            "remaining": limit.saturating_sub(used),
        });
        if name == "tokens_per_day" {
            b["resets_at"] = serde_json::json!(midnight);
        } else {
            b["window_s"] = serde_json::json!(60);
        }
        budgets.insert(name.into(), b);
    }
    axum::Json(serde_json::json!({
        "object": "tenant.usage",
        "tenant": tenant,
        "budgets": budgets,
        "requests_in_flight": {
            "used": state.tenant_requests_held(&tenant),
            "limit": config.server.max_requests_in_flight_per_tenant,
        },
    }))
    .into_response()
}
