//! [`AppState`]: the services one request's journey uses, built once at start-up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::admission::{Admission, SessionLedger};
use crate::classify::{Classifier, LaneRules};
use crate::config::Config;
use crate::error::GatewayError;
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
    queued_bytes: QueuedBytes,
}

/// Bytes of request bodies held by requests waiting for admission, bounded by
/// `server.max_queued_bytes`.
#[derive(Debug)]
pub struct QueuedBytes {
    held: AtomicU64,
    max: u64,
}

/// `bytes` counted in [`QueuedBytes`] until dropped.
#[derive(Debug)]
pub struct BytesHold<'a> {
    queue: &'a QueuedBytes,
    bytes: u64,
}

impl QueuedBytes {
    fn new(max: u64) -> Self {
        Self {
            held: AtomicU64::new(0),
            max,
        }
    }

    /// Holds `bytes` while a request waits; 429 ([`GatewayError::QueuedBytes`]) when that
    /// would pass the limit.
    pub fn hold(&self, bytes: usize) -> Result<BytesHold<'_>, GatewayError> {
        let bytes = bytes as u64;
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held.saturating_add(bytes) <= self.max).then_some(held + bytes)
            })
            .map_err(|_| GatewayError::QueuedBytes)?;
        Ok(BytesHold { queue: self, bytes })
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }
}

impl Drop for BytesHold<'_> {
    fn drop(&mut self) {
        self.queue.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
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
            queued_bytes: QueuedBytes::new(config.server.max_queued_bytes),
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

    /// [`AppState::record`] under a given request id (a job run by another replica than the
    /// one that took it keeps the job's id as its request id).
    pub fn record_as(&self, route: Route, request_id: String) -> RequestRecord {
        RequestRecord::new(
            self.0.metrics.clone(),
            self.0.request_log.clone(),
            route,
            request_id,
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
    /// Request bytes held by requests waiting for admission.
    pub fn queued_bytes(&self) -> &QueuedBytes {
        &self.0.queued_bytes
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
