//! `tutor_gateway_quota_*`: the shared quota backend (Redis, M15), registered once by
//! [`super::Metrics::new`] in the gateway's registry.
//!
//! - `tutor_gateway_quota_backend_seconds{op}`: one Redis script call (acquire, release,
//!   renew, move, prefill_done), round trip.
//! - `tutor_gateway_quota_errors_total{kind}`: failed calls (`connection`, `timeout`, `refused`:
//!   Redis took no writes, out of memory, read-only, no permission or a wrong password; `other`)
//!   and leases found gone at renewal (`lease_lost`).
//! - `tutor_gateway_quota_degraded`: 1 while the replica runs on its fallback (Redis down).
//! - `tutor_gateway_quota_fallbacks_total`: times the replica entered its fallback (a gauge
//!   sampled by a scrape misses a short outage; this counter does not).
//! - `tutor_gateway_quota_leases_reaped_total`: expired leases (a crashed or stalled replica's)
//!   this replica's script calls removed.
//! - `tutor_gateway_quota_limits_version`: the version of the shared limits record this
//!   replica last saw (replicas that agree show the same number).
//! - `tutor_gateway_quota_limits_differ`: 1 when, at its start (or after Redis lost the
//!   record, or at the beat after the record in force changed), this replica found a record in
//!   force whose limits are not its file's: a restart never replaces the record; 0 once it
//!   matched or this replica wrote its own.
//! - `tutor_gateway_tenant_service_tokens{tenant}`: each tenant's service counted fleet-wide
//!   (prompt + output tokens over its share), as this replica last read it
//!   (`auth.fleet_fairness`; tenants this replica has served or has waiting).
//! - `tutor_gateway_tenant_service_gap_tokens`: the largest difference of that counter between
//!   two tenants waiting anywhere in the fleet (0 with fewer than two).
//! - `tutor_gateway_tenant_fairness_jain`: Jain's index of the service those tenants received
//!   over the last 10 s (1: equal; 1/n: one took all; 1 with fewer than two waiting).
//! - `tutor_gateway_tenant_fleet_yields_total{lane}`: requests whose turn at the head of this
//!   replica's line waited for a tenant behind in service on another replica.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry,
};

/// Buckets for one Redis round trip, seconds.
const BACKEND_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The quota backend's metric families.
#[derive(Debug, Clone)]
pub struct QuotaMetrics {
    latency: HistogramVec,
    errors: IntCounterVec,
    degraded: IntGauge,
    fallbacks: IntCounter,
    reaped: IntCounter,
    limits_version: IntGauge,
    limits_differ: IntGauge,
    service: GaugeVec,
    service_gap: prometheus::Gauge,
    yields: IntCounterVec,
    jain: prometheus::Gauge,
    leases: HistogramVec,
    background: crate::telemetry::panic::Background,
}

impl QuotaMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry, background: crate::telemetry::panic::Background) -> Self {
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "tutor_gateway_quota_backend_seconds",
                "Round trip of one quota script call to Redis, by operation.",
            )
            .buckets(BACKEND_BUCKETS.to_vec()),
            &["op"],
        )
        .expect("valid histogram");
        let leases = HistogramVec::new(
            HistogramOpts::new(
                "tutor_gateway_quota_leases_per_call",
                "Leases one quota script call took (op acquire, calls that granted: a line's \
                 head and the waiters behind it taken with it, up to quota.batch_max) or gave \
                 back (op release).",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
            &["op"],
        )
        .expect("valid histogram");
        let errors = IntCounterVec::new(
            prometheus::Opts::new(
                "tutor_gateway_quota_errors_total",
                "Quota backend failures by kind (connection, timeout, refused, other, lease_lost).",
            ),
            &["kind"],
        )
        .expect("valid counter");
        let degraded = IntGauge::new(
            "tutor_gateway_quota_degraded",
            "1 while the shared quota is unreachable and this replica runs on its fallback.",
        )
        .expect("valid gauge");
        let fallbacks = IntCounter::new(
            "tutor_gateway_quota_fallbacks_total",
            "Times this replica found the shared quota unreachable and entered its fallback.",
        )
        .expect("valid counter");
        let reaped = IntCounter::new(
            "tutor_gateway_quota_leases_reaped_total",
            "Expired leases (of crashed or stalled replicas) removed by this replica's calls.",
        )
        .expect("valid counter");
        let limits_version = IntGauge::new(
            "tutor_gateway_quota_limits_version",
            "Version of the shared limits record (Redis) this replica last saw; 0 before any.",
        )
        .expect("valid gauge");
        let limits_differ = IntGauge::new(
            "tutor_gateway_quota_limits_differ",
            "1 when the shared limits record in force (Redis) was found, at this replica's start, \
             to differ from its file's limits (a start never replaces it: limits push does).",
        )
        .expect("valid gauge");
        let service = GaugeVec::new(
            prometheus::Opts::new(
                "tutor_gateway_tenant_service_tokens",
                "Each tenant's service counted fleet-wide (prompt + output tokens over its share), \
                 as this replica last read it (auth.fleet_fairness).",
            ),
            &["tenant"],
        )
        .expect("valid gauge");
        let service_gap = prometheus::Gauge::new(
            "tutor_gateway_tenant_service_gap_tokens",
            "Largest difference of the fleet service counter between two tenants waiting \
             anywhere in the fleet (0 with fewer than two).",
        )
        .expect("valid gauge");
        let jain = prometheus::Gauge::new(
            "tutor_gateway_tenant_fairness_jain",
            "Jain's index of the fleet service the tenants waiting anywhere in the fleet \
             received over the last 10 s (1: equal; 1/n: one took all; 1 with fewer than two).",
        )
        .expect("valid gauge");
        jain.set(1.0);
        let yields = IntCounterVec::new(
            prometheus::Opts::new(
                "tutor_gateway_tenant_fleet_yields_total",
                "Requests whose turn at the head of this replica's line waited for a tenant \
                 behind in fleet service waiting on another replica (auth.fleet_fairness).",
            ),
            &["lane"],
        )
        .expect("valid counter");
        for c in [
            Box::new(jain.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(service.clone()),
            Box::new(service_gap.clone()),
            Box::new(yields.clone()),
            Box::new(latency.clone()),
            Box::new(errors.clone()),
            Box::new(degraded.clone()),
            Box::new(fallbacks.clone()),
            Box::new(reaped.clone()),
            Box::new(limits_version.clone()),
            Box::new(limits_differ.clone()),
            Box::new(leases.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        for kind in ["connection", "timeout", "refused", "other", "lease_lost"] {
            errors.with_label_values(&[kind]);
        }
        for lane in crate::lane::Lane::ALL {
            yields.with_label_values(&[lane.as_str()]);
        }
        for op in ["acquire", "release"] {
            leases.with_label_values(&[op]);
        }
        Self {
            leases,
            latency,
            errors,
            degraded,
            fallbacks,
            reaped,
            limits_version,
            limits_differ,
            service,
            service_gap,
            yields,
            jain,
            background,
        }
    }

    /// The watch over the gateway's background tasks (the quota's own among them).
    pub fn background(&self) -> &crate::telemetry::panic::Background {
        &self.background
    }

    /// A head of `lane`'s line yielded its turn to another replica's tenant.
    pub fn yielded(&self, lane: crate::lane::Lane) {
        self.yields.with_label_values(&[lane.as_str()]).inc();
    }

    /// Jain's index over the waiting tenants (`None`: fewer than two, or no service: 1).
    pub fn fairness(&self, jain: Option<f64>) {
        self.jain.set(jain.unwrap_or(1.0));
    }

    /// `tenant`'s fleet service counter as read.
    pub fn tenant_service(&self, tenant: &str, tokens: f64) {
        self.service.with_label_values(&[tenant]).set(tokens);
    }

    /// The largest gap between waiting tenants' counters.
    pub fn service_gap(&self, tokens: f64) {
        self.service_gap.set(tokens);
    }

    /// The shared limits record's version this replica saw last.
    pub fn set_limits_version(&self, version: u64) {
        self.limits_version
            .set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// Whether the record in force differs from this replica's file's limits.
    pub fn set_limits_differ(&self, differ: bool) {
        self.limits_differ.set(i64::from(differ));
    }

    /// The value [`QuotaMetrics::set_limits_differ`] set.
    pub fn limits_differ(&self) -> bool {
        self.limits_differ.get() == 1
    }

    /// The version [`QuotaMetrics::set_limits_version`] set.
    pub fn limits_version(&self) -> u64 {
        u64::try_from(self.limits_version.get()).unwrap_or(0)
    }

    /// Records one call of `op` that took `seconds`.
    pub fn observe(&self, op: &str, seconds: f64) {
        self.latency.with_label_values(&[op]).observe(seconds);
    }

    /// One call took (`op` acquire) or gave back (`op` release) `n` leases.
    pub fn leases(&self, op: &str, n: usize) {
        self.leases.with_label_values(&[op]).observe(n as f64);
    }

    /// Counts one error of `kind`.
    pub fn error(&self, kind: &str) {
        self.errors.with_label_values(&[kind]).inc();
    }

    /// Errors of `kind` so far.
    pub fn errors(&self, kind: &str) -> u64 {
        self.errors.with_label_values(&[kind]).get()
    }

    /// Sets the degraded gauge.
    pub fn set_degraded(&self, degraded: bool) {
        self.degraded.set(i64::from(degraded));
    }

    /// The degraded gauge.
    pub fn degraded(&self) -> bool {
        self.degraded.get() == 1
    }

    /// Counts one entry into the fallback.
    pub fn fell_back(&self) {
        self.fallbacks.inc();
    }

    /// Entries into the fallback so far.
    pub fn fallbacks_total(&self) -> u64 {
        self.fallbacks.get()
    }

    /// Counts `n` reaped leases.
    pub fn reaped(&self, n: u64) {
        self.reaped.inc_by(n);
    }

    /// Leases reaped so far.
    pub fn reaped_total(&self) -> u64 {
        self.reaped.get()
    }
}
