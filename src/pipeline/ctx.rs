//! [`RequestCtx`]: one request's view of the gateway, taken once at its entry
//! ([`RequestCtx::snapshot`]) and passed down every stage.
//!
//! A reload ([`super::reload`]) swaps the configuration and what is built from it (classifier
//! and lane rules, upstream client) as one set. A request holds the set that was in force when
//! it arrived: it is parsed, prepared, classified, shaped, admitted, sent and relayed under that
//! one set, whatever a reload does meanwhile; a request that arrives after the reload sees the
//! new set. Admission's own limits are the exception: they belong to the seats, shared by every
//! request, and a reload changes them for whoever waits (see [`super::reload`]).
//!
//! Who takes it: the route handlers of `/answer`, `/v1/chat/completions`, `/v1/completions`
//! and `/tokenize` (in `crate::api`), a job's submission (`POST /jobs`, classified under it)
//! and each run of a job (sent and relayed under the set in force when the run starts: a job
//! may wait long after its submission, on another replica).

use std::sync::Arc;

use super::state::{AppState, Live, QueuedBytes};
use crate::admission::{Admission, SessionLedger};
use crate::classify::{Classifier, LaneRules};
use crate::config::Config;
use crate::prompt::Course;
use crate::relay::ConnectionCloser;
use crate::telemetry::{Metrics, RequestRecord, Route};
use crate::upstream::UpstreamClient;

/// The set in force at a request's entry, with the services every request shares. Cheap to
/// clone (a few `Arc`s).
#[derive(Debug, Clone)]
pub struct RequestCtx {
    live: Arc<Live>,
    shared: AppState,
    /// The client's connection, when the gateway's accept loop serves it: a stream cut for not
    /// reading closes it if the server cannot take the stream down ([`ConnectionCloser`]).
    connection: Option<ConnectionCloser>,
}

/// Bodies up to this size are parsed where they arrive, on the async worker; larger ones on
/// the blocking pool, under the tokenizing bound (`classify.max_concurrent_tokenizations`):
/// parsing is linear, but 4 MB of tiny JSON values (a hundred thousand messages or tool calls)
/// took 150-360 ms, during which the worker served no one else.
pub const PARSE_INLINE_BYTES: usize = 64 * 1024;

impl RequestCtx {
    /// `parse` of the body `b` under this request's set: on the blocking pool when `b` is over
    /// [`PARSE_INLINE_BYTES`], else at once.
    pub async fn off_workers<R: Send + 'static>(
        &self,
        b: bytes::Bytes,
        parse: impl FnOnce(&RequestCtx, &[u8]) -> Result<R, crate::error::GatewayError> + Send + 'static,
    ) -> Result<R, crate::error::GatewayError> {
        if b.len() <= PARSE_INLINE_BYTES {
            return parse(self, &b);
        }
        let on_pool = self.clone();
        self.classifier()
            .run_blocking(move |_| parse(&on_pool, &b))
            .await?
    }

    /// The snapshot a request's entry takes: the only read of the live set in a request's
    /// journey.
    pub fn snapshot(state: &AppState) -> Self {
        Self {
            live: state.live(),
            shared: state.clone(),
            connection: None,
        }
    }

    /// The same, on the client connection `connection` (from the request's extensions).
    pub fn on_connection(mut self, connection: Option<ConnectionCloser>) -> Self {
        self.connection = connection;
        self
    }

    /// The client's connection, if known.
    pub fn connection(&self) -> Option<ConnectionCloser> {
        self.connection.clone()
    }

    /// The configuration in force at the request's entry.
    pub fn config(&self) -> &Config {
        &self.live.config
    }

    /// The size its long prompt is prefilled in pieces of, tokens (0: not pieced): the
    /// configured one, else the autopilot's, read now.
    pub fn piece_tokens(&self) -> u32 {
        self.shared.piece_tokens(self.config())
    }

    /// A slot among `tenant`'s requests in flight; see [`AppState::tenant_request`].
    pub fn tenant_request(
        &self,
        tenant: Option<&super::tenant::Tenant>,
    ) -> Result<Option<super::tenant::TenantSlot>, crate::error::GatewayError> {
        self.shared.tenant_request(self.config(), tenant)
    }

    /// Tenants' budgets (`[auth.tenants.<name>]`).
    pub fn tenant_budgets(&self) -> &Arc<crate::admission::tenant_budget::TenantBudgets> {
        self.shared.tenant_budgets()
    }

    /// Course `id`'s prompt under that configuration, if there is such a course and a request
    /// of `tenant` may name it ([`Course::open_to`]).
    pub fn course(&self, id: &str, tenant: Option<&str>) -> Option<&Course> {
        self.live.courses.get(id).filter(|c| c.open_to(tenant))
    }

    /// The lane classifier of that configuration (its token counter and blocking pool too).
    pub fn classifier(&self) -> &Classifier {
        &self.live.classifier
    }

    /// Its lane rules: first choice, continuations, mid-stream limits.
    pub fn rules(&self) -> LaneRules {
        *self.live.classifier.rules()
    }

    /// Its vLLM client.
    pub fn upstream(&self) -> &UpstreamClient {
        &self.live.upstream
    }

    /// Admission (lanes or FIFO), shared by every request.
    pub fn admission(&self) -> &Admission {
        self.shared.admission()
    }

    /// Output per session, for continuations.
    pub fn sessions(&self) -> &SessionLedger {
        self.shared.sessions()
    }

    /// Prometheus families.
    pub fn metrics(&self) -> &Metrics {
        self.shared.metrics()
    }

    /// The engine's exact counts out at once (`classify.exact_count`).
    pub fn exact_counts(&self) -> &std::sync::Arc<tokio::sync::Semaphore> {
        self.shared.exact_counts()
    }

    /// Bytes of prompts kept for late counts (`crate::relay::late_count`).
    pub fn kept_for_counts(&self) -> &std::sync::Arc<tokio::sync::Semaphore> {
        self.shared.kept_for_counts()
    }

    /// Late counts out at once (`crate::relay::late_count`).
    pub fn late_counts(&self) -> &std::sync::Arc<tokio::sync::Semaphore> {
        self.shared.late_counts()
    }

    /// Request bytes held by requests waiting for admission.
    pub fn queued_bytes(&self) -> &std::sync::Arc<QueuedBytes> {
        self.shared.queued_bytes()
    }

    /// A fresh record for a request that arrived now on `route`.
    pub fn record(&self, route: Route) -> RequestRecord {
        self.shared.record(route)
    }
}
