//! [`AppState`]: the services one request's journey uses, built once at start-up.

use std::sync::Arc;

use crate::admission::{Admission, SessionLedger};
use crate::classify::{Classifier, LaneRules};
use crate::config::Config;
use crate::telemetry::{Metrics, RequestLog, RequestRecord, Route};
use crate::upstream::UpstreamClient;

/// Everything the pipeline shares between requests. Cheap to clone.
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
        let window = config.promotion.continuation_window;
        let (capacity, counted) = (config.promotion.max_sessions, metrics.promotion().clone());
        let sessions = match &admission {
            Admission::Redis(redis) => {
                SessionLedger::shared(window, capacity, counted, redis.clone())
            }
            Admission::Local(_) => SessionLedger::new(window, capacity, counted),
        };
        Self(Arc::new(Shared {
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
            new_request_id(),
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
    /// The lane rules: first choice, continuations, mid-stream limits.
    pub fn rules(&self) -> &LaneRules {
        self.0.classifier.rules()
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

/// A new gateway request id: 32 hex characters, safe as a header value and in URLs.
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
