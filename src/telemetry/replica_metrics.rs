//! The `tutor_gateway_replica_*` family: each vLLM replica's share of the work, as the
//! gateway routes it. The `replica` label takes the names of `[[upstream.replicas]]` (at most
//! 64), `reason` one of a fixed list. Registered once by [`super::Metrics::new`]; the upstream
//! client reports into it with plain values.

use std::sync::{Arc, PoisonError, RwLock};

use prometheus::{IntCounterVec, IntGaugeVec, Registry};

use super::registered::{counter_vec, gauge_vec};

/// Why a request went to the replica it went to (the `reason` label).
pub const ROUTE_REASONS: [&str; 7] = [
    "affinity",
    "load",
    "least_loaded",
    "round_robin",
    "no_healthy",
    "retry",
    "pinned",
];

/// A replica that reports its gauges, and the label it reports under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reporter {
    /// Its name where it was configured.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// The `replica` label its gauges are under: its name, or the name the replica set in
    /// force gives its URL.
    pub label: String,
    /// The health state in force at its URL (an id the upstream client gives each): only
    /// that one sets `healthy`. A replaced set's own health, which a reload that turned the
    /// checks off did not carry over, must not set the gauge to 0 as its last requests fail:
    /// nothing would set it back.
    pub health: u64,
}

/// Replica metric families.
#[derive(Debug, Clone)]
pub struct ReplicaMetrics {
    in_flight: IntGaugeVec,
    healthy: IntGaugeVec,
    routed: IntCounterVec,
    ejections: IntCounterVec,
    prompt_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
    /// Which replicas (name, URL) still report a gauge, and under which label: the set in
    /// force under its own names, a replica of a replaced set at a URL of the new one under the
    /// new name there. Any other (a replica a reload removed or moved, whose last requests
    /// still end) reports nothing, and its gauges are gone: a removed replica must not stay
    /// `healthy 0` (an alert firing forever) nor a renamed one keep its last in-flight count.
    labels: Arc<RwLock<Vec<Reporter>>>,
    /// The watch over the gateway's background tasks (the health checks among them).
    background: crate::telemetry::panic::Background,
}

impl Default for ReplicaMetrics {
    /// Families in a registry of their own (an upstream client built without the gateway's
    /// metrics, as in tests).
    fn default() -> Self {
        Self::register(&Registry::new())
    }
}

impl ReplicaMetrics {
    /// Registers the families in `registry`, with a watch of their own.
    pub fn register(registry: &Registry) -> Self {
        Self::register_watched(registry, crate::telemetry::panic::Background::detached())
    }

    /// The watch over the gateway's background tasks (the health checks among them).
    pub fn background(&self) -> &crate::telemetry::panic::Background {
        &self.background
    }

    /// Registers the families in `registry`; the health checks are watched by `background`.
    pub fn register_watched(
        registry: &Registry,
        background: crate::telemetry::panic::Background,
    ) -> Self {
        let counter =
            |name: &str, help: &str, labels: &[&str]| counter_vec(registry, name, help, labels);
        let gauge = |name: &str, help: &str| gauge_vec(registry, name, help, &["replica"]);
        Self {
            in_flight: gauge(
                "tutor_gateway_replica_in_flight",
                "Requests this gateway has open on the replica (sent, not yet ended).",
            ),
            healthy: gauge(
                "tutor_gateway_replica_healthy",
                "1 while the replica takes traffic, 0 while it is ejected (failed health checks, connection errors or 5xx).",
            ),
            routed: counter(
                "tutor_gateway_replica_routed_total",
                "Requests sent to the replica, by why it was chosen (affinity, load, least_loaded, round_robin, no_healthy, retry, pinned).",
                &["replica", "reason"],
            ),
            ejections: counter(
                "tutor_gateway_replica_ejections_total",
                "Times the replica was taken out of routing after upstream.routing.unhealthy_after failures in a row.",
                &["replica"],
            ),
            prompt_tokens: counter(
                "tutor_gateway_replica_prompt_tokens_total",
                "Prompt tokens of requests the replica finished (vLLM's usage).",
                &["replica"],
            ),
            cached_tokens: counter(
                "tutor_gateway_replica_cached_tokens_total",
                "Of those, prompt tokens the replica served from its prefix cache (prefix hits).",
                &["replica"],
            ),
            labels: Arc::default(),
            background,
        }
    }

    /// From now on the replicas of `reporters` report, each under its label; the gauges of
    /// every label no longer among them go, and any other replica reports nothing.
    pub fn in_force(&self, reporters: Vec<Reporter>) {
        let mut current = self.labels.write().unwrap_or_else(PoisonError::into_inner);
        for gone in current
            .iter()
            .filter(|r| !reporters.iter().any(|n| n.label == r.label))
        {
            // An error only says the series was never set.
            let _ = self.in_flight.remove_label_values(&[&gone.label]);
            let _ = self.healthy.remove_label_values(&[&gone.label]);
        }
        *current = reporters;
    }

    /// Calls `set` with the label the replica `name` at `url` reports under, if it still
    /// reports, the label list held (so a removal cannot slip between the look-up and the set).
    fn report(&self, (name, url): (&str, &str), set: impl FnOnce(&str)) {
        let labels = self.labels.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = labels.iter().find(|r| r.name == name && r.url == url) {
            set(&r.label);
        }
    }

    /// The replica (name, URL) has `n` requests open.
    pub fn set_in_flight(&self, replica: (&str, &str), n: u32) {
        self.report(replica, |label| {
            self.in_flight.with_label_values(&[label]).set(i64::from(n));
        });
    }

    /// The replica (name, URL) takes traffic, or not, by its health state `health` (a
    /// state no longer in force at its URL reports nothing).
    pub fn set_healthy(&self, replica: (&str, &str), health: u64, healthy: bool) {
        let labels = self.labels.read().unwrap_or_else(PoisonError::into_inner);
        let (name, url) = replica;
        let reporter = labels
            .iter()
            .find(|r| r.name == name && r.url == url && r.health == health);
        if let Some(r) = reporter {
            self.healthy
                .with_label_values(&[&r.label])
                .set(i64::from(healthy));
        }
    }

    /// One request sent to `replica` for `reason` (one of [`ROUTE_REASONS`]).
    pub fn routed(&self, replica: &str, reason: &'static str) {
        self.routed.with_label_values(&[replica, reason]).inc();
    }

    /// Requests sent to `replica` for `reason` so far.
    pub fn routed_count(&self, replica: &str, reason: &'static str) -> u64 {
        self.routed.with_label_values(&[replica, reason]).get()
    }

    /// `replica` was ejected.
    pub fn ejected(&self, replica: &str) {
        self.ejections.with_label_values(&[replica]).inc();
    }

    /// A request on `replica` ended with vLLM's usage: `prompt` tokens, `cached` of them hits.
    pub fn prompt_tokens(&self, replica: &str, prompt: u32, cached: u32) {
        self.prompt_tokens
            .with_label_values(&[replica])
            .inc_by(u64::from(prompt));
        self.cached_tokens
            .with_label_values(&[replica])
            .inc_by(u64::from(cached));
    }
}
