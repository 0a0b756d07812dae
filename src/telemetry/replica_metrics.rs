//! The `tutor_gateway_replica_*` family: each vLLM replica's share of the work, as the
//! gateway routes it. The `replica` label takes the names of `[[upstream.replicas]]` (at most
//! 64), `reason` one of a fixed list. Registered once by [`super::Metrics::new`]; the upstream
//! client reports into it with plain values.

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

/// Replica metric families.
#[derive(Debug, Clone)]
pub struct ReplicaMetrics {
    in_flight: IntGaugeVec,
    healthy: IntGaugeVec,
    routed: IntCounterVec,
    ejections: IntCounterVec,
    prompt_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
}

impl Default for ReplicaMetrics {
    /// Families in a registry of their own (an upstream client built without the gateway's
    /// metrics, as in tests).
    fn default() -> Self {
        Self::register(&Registry::new())
    }
}

impl ReplicaMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
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
        }
    }

    /// `replica` has `n` requests open.
    pub fn set_in_flight(&self, replica: &str, n: u32) {
        self.in_flight
            .with_label_values(&[replica])
            .set(i64::from(n));
    }

    /// `replica` takes traffic, or not.
    pub fn set_healthy(&self, replica: &str, healthy: bool) {
        self.healthy
            .with_label_values(&[replica])
            .set(i64::from(healthy));
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
