//! HTTP routes (axum). Handlers are thin: parse and validate ([`parse`]), then hand the request
//! to [`pipeline::start`]; [`error`] maps every failure to HTTP in one place.
//!
//! - `GET /answer?prompt=…`, `POST /answer`: the tutoring frontend's SSE stream ([`answer`]).
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI-compatible ([`openai`]).
//! - `GET /healthz`, `GET /readyz`, `GET /v1/models`, `GET /metrics` ([`ops`]).

pub mod answer;
pub mod error;
pub mod openai;
pub mod ops;
pub mod parse;
pub mod pipeline;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

pub use error::GatewayError;

use crate::admission::Admission;
use crate::classify::Classifier;
use crate::config::Config;
use crate::relay::{Promotion, SessionLedger};
use crate::telemetry::{Metrics, RequestLog, RequestRecord, Route};
use crate::upstream::UpstreamClient;

/// Everything the handlers share. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    config: Config,
    classifier: Classifier,
    admission: Admission,
    upstream: UpstreamClient,
    metrics: Metrics,
    request_log: RequestLog,
    promotion: Promotion,
    sessions: SessionLedger,
}

impl AppState {
    /// State from its parts.
    pub fn new(
        config: Config,
        classifier: Classifier,
        admission: Admission,
        upstream: UpstreamClient,
        metrics: Metrics,
        request_log: RequestLog,
    ) -> Self {
        let promotion = Promotion::from_config(&config);
        let window = config.promotion.continuation_window;
        let sessions = match &admission {
            Admission::Redis(redis) => SessionLedger::shared(window, redis.clone()),
            Admission::Local(_) => SessionLedger::new(window),
        };
        Self(Arc::new(Shared {
            promotion,
            sessions,
            config,
            classifier,
            admission,
            upstream,
            metrics,
            request_log,
        }))
    }

    /// A fresh record for a request that arrived now on `route`.
    pub fn record(&self, route: Route) -> RequestRecord {
        RequestRecord::new(
            self.0.metrics.clone(),
            self.0.request_log.clone(),
            route,
            pipeline::new_request_id(),
            tokio::time::Instant::now(),
        )
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.0.config
    }
    /// The lane classifier.
    pub fn classifier(&self) -> &Classifier {
        &self.0.classifier
    }
    /// Admission (lanes or FIFO).
    pub fn admission(&self) -> &Admission {
        &self.0.admission
    }
    /// The vLLM client.
    pub fn upstream(&self) -> &UpstreamClient {
        &self.0.upstream
    }
    /// Mid-stream lane limits.
    pub fn promotion(&self) -> &Promotion {
        &self.0.promotion
    }
    /// Output per session, for continuations.
    pub fn sessions(&self) -> &SessionLedger {
        &self.0.sessions
    }
    /// Prometheus families.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }
}

/// The gateway's routes over `state`.
pub fn app(state: AppState) -> Router {
    let limit = state.config().server.max_body_bytes;
    Router::new()
        .route("/answer", get(answer::get_answer).post(answer::post_answer))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(ops::models))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}
