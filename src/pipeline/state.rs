//! [`AppState`]: the services one request's journey uses, built at start-up; the configuration
//! and what is built from it (courses' prompts, classifier, upstream client, admission limits) change together on
//! a reload ([`AppState::swap`], see `crate::pipeline::reload`). A request does not read them
//! here: its entry takes one snapshot of them (`RequestCtx::snapshot`, in `ctx.rs`) and every
//! stage reads that.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::tenant::{Tenant, TenantSlot, TenantSlots};
use crate::admission::tenant_budget::TenantBudgets;
use crate::admission::{Admission, LimitsChange, SessionLedger};
use crate::classify::{Calibration, Classifier};
use crate::config::Config;
use crate::error::GatewayError;
use crate::prompt::Course;
use crate::telemetry::{Metrics, RequestLog, RequestRecord, Route};
use crate::upstream::UpstreamClient;

/// The engine's exact counts (`classify.exact_count`) out at once per gateway: each is asked
/// before admission, so no seat or queue bounds them.
pub const MAX_EXACT_COUNTS_OUT: usize = 16;

/// Everything the pipeline shares between requests. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    /// The configuration in force and what is built from it, swapped whole by a reload.
    live: RwLock<Arc<Live>>,
    admission: Admission,
    metrics: Metrics,
    request_log: RequestLog,
    sessions: SessionLedger,
    queued_bytes: Arc<QueuedBytes>,
    /// The piece size the autopilot picked (0: none), used while
    /// `admission.prefill_piece_tokens` is 0 (`crate::pipeline::pieces`).
    paced_piece_tokens: AtomicU32,
    /// `/answer` and `/v1` requests each tenant has in flight
    /// (`server.max_requests_in_flight_per_tenant`).
    tenant_requests: Arc<TenantSlots>,
    /// Tenants' budgets (`[auth.tenants.<name>]`).
    tenant_budgets: Arc<TenantBudgets>,
    /// The file the configuration was read from, re-read by a reload, and what the command
    /// line changed after reading it (applied again to each reloaded file).
    config_source: RwLock<Option<ConfigSource>>,
    /// Held by a reload from reading its file to its swap: one at a time, so a reload that
    /// read an older file never swaps in over a newer one (`crate::pipeline::reload`).
    reloading: std::sync::Mutex<()>,
    /// The autopilot's pace, while it paces: a reload puts it in force over the new file's
    /// limits at once ([`AppState::swap`]).
    paced_limits: PacedSlot,
    /// The engine's exact counts out at once (`classify.exact_count`), at most
    /// [`MAX_EXACT_COUNTS_OUT`].
    exact_counts: Arc<tokio::sync::Semaphore>,
    /// Bytes of prompts kept to be counted if the engine never reports them
    /// (`crate::relay::late_count`), at most its `KEPT_BYTES`.
    kept_for_counts: Arc<tokio::sync::Semaphore>,
    /// Late counts out at once (`crate::relay::late_count::MAX_OUT`).
    late_counts: Arc<tokio::sync::Semaphore>,
}

/// The limits the autopilot paces, as a function of a configuration: that configuration's
/// limits with the autopilot's knobs, moved inside its bounds.
pub type PacedLimits = Arc<dyn Fn(&Config) -> Config + Send + Sync>;

#[derive(Default)]
struct PacedSlot(std::sync::Mutex<Option<PacedLimits>>);

impl std::fmt::Debug for PacedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_tuple("PacedSlot").field(&set).finish()
    }
}

/// What the command line changed in a configuration after reading its file.
pub type Overrides = Arc<dyn Fn(&mut Config) + Send + Sync>;

/// Where a reload reads the configuration: the file, and the command line's overrides.
#[derive(Clone)]
pub struct ConfigSource {
    /// The file (`serve --config`).
    pub path: std::path::PathBuf,
    /// Applied to each configuration read from it.
    pub overrides: Overrides,
    /// `serve --tokenizer`: put in the file's place before it is checked (the file's own
    /// tokenizer path need not exist).
    pub tokenizer: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSource")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// What a reload replaces together: a request sees one consistent set (the one in force at its
/// entry, held by its `RequestCtx`).
#[derive(Debug)]
pub(super) struct Live {
    pub(super) config: Arc<Config>,
    /// Each course's prompt (stable prefix and focusing), built from `config` once.
    pub(super) courses: BTreeMap<String, Course>,
    pub(super) classifier: Classifier,
    pub(super) upstream: UpstreamClient,
}

/// Bytes of request bodies held by requests waiting for admission, bounded by
/// `server.max_queued_bytes`, and each tenant's (`[auth]`) by
/// `server.max_queued_bytes_per_tenant`: one tenant's queued prompts cannot take every other
/// tenant's room. A body larger than a limit (both may be set below `server.max_body_bytes`,
/// which bounds every body) passes it while nothing else is held under it: it waits alone
/// instead of being refused forever.
#[derive(Debug)]
pub struct QueuedBytes {
    held: AtomicU64,
    max: AtomicU64,
    per_tenant_max: AtomicU64,
    /// Bytes per tenant (only tenants holding some).
    tenants: std::sync::Mutex<HashMap<String, u64>>,
}

/// `bytes` counted in [`QueuedBytes`] (and its tenant's) until dropped.
#[derive(Debug)]
pub struct BytesHold {
    queue: Arc<QueuedBytes>,
    bytes: u64,
    tenant: Option<String>,
}

impl QueuedBytes {
    fn new(max: u64, per_tenant_max: u64) -> Self {
        Self {
            held: AtomicU64::new(0),
            max: AtomicU64::new(max),
            per_tenant_max: AtomicU64::new(per_tenant_max),
            tenants: std::sync::Mutex::default(),
        }
    }

    /// New bounds (a reload); what is held stays held.
    fn set_max(&self, max: u64, per_tenant_max: u64) {
        self.max.store(max, Ordering::Release);
        self.per_tenant_max.store(per_tenant_max, Ordering::Release);
    }

    fn tenants(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `bytes` of `tenant`'s request while it waits: 429
    /// ([`GatewayError::TenantQueuedBytes`]) when that would pass the tenant's limit,
    /// ([`GatewayError::QueuedBytes`]) when it would pass the limit of all.
    pub fn hold(
        self: &Arc<Self>,
        tenant: Option<&str>,
        bytes: usize,
    ) -> Result<BytesHold, GatewayError> {
        let bytes = bytes as u64;
        // The tenant's share first (under its lock, so two of its requests cannot both pass).
        let mut tenants = tenant.map(|_| self.tenants());
        if let (Some(t), Some(map)) = (tenant, tenants.as_mut()) {
            let held = map.get(t).copied().unwrap_or(0);
            let max = self.per_tenant_max.load(Ordering::Acquire);
            if held > 0 && held.saturating_add(bytes) > max {
                return Err(GatewayError::TenantQueuedBytes {
                    tenant: t.to_owned(),
                    held,
                    asked: bytes,
                    max,
                });
            }
        }
        let max = self.max.load(Ordering::Acquire);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(bytes) <= max)
                    .then_some(held.saturating_add(bytes))
            })
            .map_err(|_| GatewayError::QueuedBytes)?;
        if let (Some(t), Some(map)) = (tenant, tenants.as_mut()) {
            let held = map.entry(t.to_owned()).or_default();
            *held = held.saturating_add(bytes);
        }
        Ok(BytesHold {
            queue: Arc::clone(self),
            bytes,
            tenant: tenant.map(str::to_owned),
        })
    }

    /// Bytes held now, all holds together.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Bytes `tenant`'s waiting requests hold now.
    pub fn held_by(&self, tenant: &str) -> u64 {
        self.tenants().get(tenant).copied().unwrap_or(0)
    }
}

impl BytesHold {
    /// The bytes this hold counts.
    pub fn bytes(&self) -> usize {
        usize::try_from(self.bytes).unwrap_or(usize::MAX)
    }
}

impl Drop for BytesHold {
    fn drop(&mut self) {
        if let Some(t) = &self.tenant {
            let mut map = self.queue.tenants();
            if let Some(held) = map.get_mut(t) {
                *held = held.saturating_sub(self.bytes);
                if *held == 0 {
                    map.remove(t);
                }
            }
        }
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
        let (sessions, tenant_budgets) = match &admission {
            Admission::Redis(redis) => (
                SessionLedger::shared(window, capacity, counted, redis.clone()),
                TenantBudgets::shared(redis.clone()),
            ),
            Admission::Local(_) => (
                SessionLedger::new(window, capacity, counted),
                TenantBudgets::default(),
            ),
        };
        metrics.config().in_force(&config.fingerprint());
        Self(Arc::new(Shared {
            sessions,
            queued_bytes: Arc::new(QueuedBytes::new(
                config.server.max_queued_bytes,
                config.server.max_queued_bytes_per_tenant,
            )),
            live: RwLock::new(Arc::new(Live {
                courses: Course::all(&config),
                config: Arc::new(config),
                classifier,
                upstream,
            })),
            admission,
            metrics,
            request_log,
            config_source: RwLock::new(None),
            reloading: std::sync::Mutex::new(()),
            paced_limits: PacedSlot::default(),
            paced_piece_tokens: AtomicU32::new(0),
            tenant_requests: Arc::default(),
            tenant_budgets: Arc::new(tenant_budgets),
            exact_counts: Arc::new(tokio::sync::Semaphore::new(MAX_EXACT_COUNTS_OUT)),
            kept_for_counts: Arc::new(tokio::sync::Semaphore::new(
                crate::relay::late_count::KEPT_BYTES,
            )),
            late_counts: Arc::new(tokio::sync::Semaphore::new(
                crate::relay::late_count::MAX_OUT,
            )),
        }))
    }

    /// The reload turn (see [`Self::reload_lock`]) if free now; `None` while a reload runs.
    pub fn try_reload_lock(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        match self.0.reloading.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Keeps every reload out while held (each reload holds it from reading its file to its
    /// swap, so reloads run one at a time, each from the file as it was when its turn came).
    pub fn reload_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.0
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Names the file the configuration came from (`serve --config`), which a reload re-reads.
    pub fn set_config_path(&self, path: std::path::PathBuf) {
        self.set_config_source(path, Arc::new(|_: &mut Config| {}), None);
    }

    /// [`AppState::set_config_path`] with the command line's `overrides` (`--listen`,
    /// `--with-sim`'s upstream) and `tokenizer` (`--tokenizer`), applied again to every
    /// reloaded file.
    pub fn set_config_source(
        &self,
        path: std::path::PathBuf,
        overrides: Overrides,
        tokenizer: Option<std::path::PathBuf>,
    ) {
        *self
            .0
            .config_source
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(ConfigSource {
            path,
            overrides,
            tokenizer,
        });
    }

    /// The file a reload re-reads and the overrides to apply, if the gateway was started from
    /// one.
    pub fn config_source(&self) -> Option<ConfigSource> {
        self.0
            .config_source
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The set in force now: a request's snapshot of it is taken once, at its entry.
    pub(super) fn live(&self) -> Arc<Live> {
        self.0
            .live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `config` and what was built from it in force, and the limits it sets (admission,
    /// queued bytes, the prefix-cache watch): requests that arrive from now on see them all;
    /// running ones keep what they had. Called by [`crate::config::reload`] once the new
    /// config is checked and built.
    /// `force`: the admission limits replace a shared record written by `limits push` too.
    /// While the autopilot paces, its pace stays in force over the new limits (moved inside
    /// the new bounds): a reload, even one that changes nothing, would otherwise put the
    /// configured values in force until its next look and let a paced lane's waiters in.
    pub(crate) fn swap(
        &self,
        config: Config,
        classifier: Classifier,
        upstream: UpstreamClient,
        force: bool,
    ) -> LimitsChange {
        let paced = self
            .0
            .paced_limits
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .map(|pace| pace(&config));
        let limits = self
            .0
            .admission
            .set_limits(paced.as_ref().unwrap_or(&config), force);
        self.0.queued_bytes.set_max(
            config.server.max_queued_bytes,
            config.server.max_queued_bytes_per_tenant,
        );
        let courses = Course::all(&config);
        let fingerprints = courses.values().map(|c| c.fingerprint.clone());
        self.0
            .metrics
            .prefix()
            .configure(&config.prefix_cache, fingerprints);
        let live = Arc::new(Live {
            courses,
            config: Arc::new(config),
            classifier,
            upstream,
        });
        *self.0.live.write().unwrap_or_else(PoisonError::into_inner) = live;
        limits
    }

    /// A fresh record for a request that arrived now on `route`.
    pub fn record(&self, route: Route) -> RequestRecord {
        let id = new_request_id();
        let _ = ISSUED.try_with(|slot| slot.set(id.clone()));
        let mut record = RequestRecord::new(
            self.0.metrics.clone(),
            self.0.request_log.clone(),
            route,
            id,
            tokio::time::Instant::now(),
        );
        // Served under the gateway's drain: dropped once its grace is over, the request was
        // ended by the shutdown (503 `shutdown`), not by its client.
        if let Some(drain) = crate::relay::Drain::current() {
            record.ended_by_shutdown_after(drain.end_token());
        }
        // Served for an API key (`[auth]`): dropped once the key was revoked, the request was
        // ended by the revocation, not by its client.
        if let Some(key) = super::tenant::caller() {
            record.ended_by_revocation(move || !key.in_force());
        }
        record
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

    /// What the engine's counts taught the estimate (`classify::calibration`): for a job run
    /// whose classification was stored.
    pub fn calibration(&self) -> Arc<Calibration> {
        Arc::clone(self.live().classifier.calibration())
    }

    /// The validated configuration in force (a reload replaces it; hold the `Arc` for one
    /// consistent view). For what is not a request (start-up, reloads, operators' routes, the
    /// job service's bounds): a request reads the snapshot its entry took.
    pub fn config(&self) -> Arc<Config> {
        self.live().config.clone()
    }

    /// Admission (lanes or FIFO).
    pub fn admission(&self) -> &Admission {
        &self.0.admission
    }
    /// The vLLM client in force (outside a request, as [`AppState::config`]).
    pub fn upstream(&self) -> UpstreamClient {
        self.live().upstream.clone()
    }
    /// The engine's exact counts out at once (`classify.exact_count`).
    pub fn exact_counts(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.0.exact_counts
    }
    /// Bytes of prompts kept for late counts (`crate::relay::late_count`).
    pub fn kept_for_counts(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.0.kept_for_counts
    }
    /// Late counts out at once (`crate::relay::late_count`).
    pub fn late_counts(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.0.late_counts
    }
    /// Request bytes held by requests waiting for admission.
    pub fn queued_bytes(&self) -> &Arc<QueuedBytes> {
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

    /// The request log.
    pub fn request_log(&self) -> &RequestLog {
        &self.0.request_log
    }

    /// The size long prompts are prefilled in pieces of, tokens (0: not pieced):
    /// `admission.prefill_piece_tokens` when set, else what the autopilot picked.
    pub fn piece_tokens(&self, config: &Config) -> u32 {
        match config.admission.prefill_piece_tokens {
            0 => self.0.paced_piece_tokens.load(Ordering::Relaxed),
            n => n,
        }
    }

    /// A slot among `tenant`'s requests in flight, held by the caller until its response ends;
    /// `Ok(None)` without a tenant; 429 `tenant_overloaded` when it has
    /// `server.max_requests_in_flight_per_tenant` already.
    pub fn tenant_request(
        &self,
        config: &Config,
        tenant: Option<&Tenant>,
    ) -> Result<Option<TenantSlot>, GatewayError> {
        let Some(t) = tenant else {
            return Ok(None);
        };
        let max = config.server.max_requests_in_flight_per_tenant;
        match self.0.tenant_requests.take(Some(t), max) {
            Some(slot) => Ok(Some(slot)),
            None => Err(GatewayError::TenantOverloaded {
                tenant: t.0.clone(),
                held: max,
            }),
        }
    }

    /// `tenant`'s `/answer` and `/v1` requests in flight now.
    pub fn tenant_requests_held(&self, tenant: &str) -> usize {
        self.0.tenant_requests.held(Some(tenant))
    }

    /// Tenants' budgets (`[auth.tenants.<name>]`).
    pub fn tenant_budgets(&self) -> &Arc<TenantBudgets> {
        &self.0.tenant_budgets
    }

    /// The autopilot's piece size (0: none).
    pub fn set_paced_piece_tokens(&self, tokens: u32) {
        self.0.paced_piece_tokens.store(tokens, Ordering::Relaxed);
    }

    /// The autopilot's pace, while it paces this replica's limits (`None`: it does not, the
    /// configured values hold). A reload puts the pace in force over the new file's limits.
    pub fn set_paced_limits(&self, paced: Option<PacedLimits>) {
        *self
            .0
            .paced_limits
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = paced;
    }
}

#[cfg(test)]
impl AppState {
    /// The state of `config` as the server builds it (admission, classifier, upstream client
    /// tracked by `tasks`), its request log off: for tests of the parts below the server.
    pub(crate) fn for_tests(config: Config, tasks: tokio_util::task::TaskTracker) -> Self {
        let metrics = Metrics::new();
        let classifier = Classifier::from_config(&config).unwrap();
        let admission = Admission::build(&config, metrics.quota().clone()).unwrap();
        let upstream = UpstreamClient::with_metrics(
            config.upstream.clone(),
            tasks,
            metrics.replicas().clone(),
        )
        .unwrap();
        Self::new(
            config,
            classifier,
            admission,
            upstream,
            metrics,
            RequestLog::Off,
        )
    }
}

tokio::task_local! {
    /// Where a request's handler keeps the id its record got ([`issuing_request_ids`]).
    static ISSUED: Arc<std::sync::OnceLock<String>>;
}

/// Runs a request's handler `fut` keeping the request id its first record gets in `slot`: a
/// layer that answers for the handler (a panic's 500) quotes the id of the request log's line.
pub fn issuing_request_ids<F: std::future::Future>(
    slot: Arc<std::sync::OnceLock<String>>,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    ISSUED.scope(slot, fut)
}

/// A new gateway request id: 32 hex characters, safe as a header value and in URLs: the time
/// it was made (Unix milliseconds, 12 digits), then 80 random bits. Ids sort by when they were
/// made (the shared job queue orders jobs of equal turns by id: oldest first), and cannot be
/// guessed (a job's id is what reads it while `[auth]` is off).
pub fn new_request_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
        & 0xffff_ffff_ffff;
    // A version-4 UUID's 122 random bits (its version and variant bits are fixed): 80 of them.
    let r = uuid::Uuid::new_v4().as_u128();
    let random = (r & ((1 << 62) - 1)) | (((r >> 80) & ((1 << 18) - 1)) << 62);
    format!("{ms:012x}{random:020x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Request ids: 32 lower-case hex digits, distinct, and one made later sorts after (the
    /// shared job queue's ties go oldest first by them).
    #[test]
    fn request_ids_are_hex_distinct_and_sort_by_when_they_were_made() {
        let ids: Vec<String> = (0..1000).map(|_| new_request_id()).collect();
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{id}"
            );
        }
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        std::thread::sleep(std::time::Duration::from_millis(2));
        let later = new_request_id();
        assert!(ids.iter().all(|id| *id < later), "{later}");
    }

    /// Both limits hold against requests that find something held; a body larger than a limit
    /// (set below `server.max_body_bytes`) waits alone, and every byte comes back.
    #[test]
    fn queued_bytes_hold_their_limits_and_a_body_larger_than_one_waits_alone() {
        let q = Arc::new(QueuedBytes::new(1_000, 400));
        let a = q.hold(Some("a"), 300).unwrap();
        assert!(matches!(
            q.hold(Some("a"), 200),
            Err(GatewayError::TenantQueuedBytes { held: 300, .. })
        ));
        let b = q.hold(Some("b"), 400).unwrap();
        let c = q.hold(None, 300).unwrap();
        assert!(matches!(q.hold(None, 1), Err(GatewayError::QueuedBytes)));
        drop((a, b, c));
        assert_eq!(q.held(), 0);
        // Larger than the tenant's limit and the limit of all: alone, it waits.
        let big = q.hold(Some("a"), 5_000).unwrap();
        assert!(matches!(
            q.hold(Some("b"), 1),
            Err(GatewayError::QueuedBytes)
        ));
        assert!(matches!(
            q.hold(Some("a"), 1),
            Err(GatewayError::TenantQueuedBytes { .. })
        ));
        drop(big);
        assert_eq!((q.held(), q.held_by("a")), (0, 0));
    }
}
