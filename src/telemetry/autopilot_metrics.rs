//! `tutor_gateway_autopilot_*`: what the autopilot (`crate::autopilot`) measured and set.
//! Registered once by [`super::Metrics::new`]; every series exists from start-up.

use prometheus::{Gauge, GaugeVec, IntCounterVec, IntGauge, Opts, Registry};

use super::registered::{counter_vec, registered};
use crate::lane::Lane;

/// Reasons an adjustment is counted under.
pub const REASONS: [&str; 12] = [
    "tighten",
    "loosen",
    "at_floor",
    "rescue",
    "reserve_up",
    "reserve_down",
    "reserve_at_ceiling",
    "pieces_on",
    "pieces_smaller",
    "pieces_at_floor",
    "pieces_larger",
    "pieces_off",
];

/// The limits the autopilot moves, as in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    /// The prefill budget, tokens.
    pub prefill_budget: u64,
    /// The large lane's seats (its ceiling).
    pub large_seats: u32,
    /// The small lane's reserved seats (its `max_concurrency`).
    pub small_seats: u32,
}

/// The autopilot's families.
#[derive(Debug, Clone)]
pub struct AutopilotMetrics {
    enabled: IntGauge,
    leader: IntGauge,
    prefill_budget: IntGauge,
    large_seats: IntGauge,
    small_seats: IntGauge,
    quantile: GaugeVec,
    ratio: GaugeVec,
    adjustments: IntCounterVec,
    piece_tokens: IntGauge,
    longest_step: Gauge,
    typical_step: Gauge,
}

impl AutopilotMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let gauge = |name: &str, help: &str| registered(registry, IntGauge::new(name, help));
        let gauge_vec = |name: &str, help: &str| {
            registered(registry, GaugeVec::new(Opts::new(name, help), &["lane"]))
        };
        let m = Self {
            enabled: gauge(
                "tutor_gateway_autopilot_enabled",
                "1 while the autopilot paces the large lane and the prefill budget (autopilot.enabled).",
            ),
            leader: gauge(
                "tutor_gateway_autopilot_leader",
                "1 on the replica whose autopilot paces (always, with the in-process quota; with \
                 Redis, the lease holder); 0 on followers and while off.",
            ),
            prefill_budget: gauge(
                "tutor_gateway_autopilot_prefill_budget_tokens",
                "The prefill budget in force, as the autopilot set it (the configured value when off).",
            ),
            large_seats: gauge(
                "tutor_gateway_autopilot_large_seats",
                "The large lane's seats in force, as the autopilot set them (the configured value when off).",
            ),
            small_seats: gauge(
                "tutor_gateway_autopilot_small_seats",
                "The small lane's reserved seats in force (its max_concurrency), as the autopilot \
                 set them (the configured value when off).",
            ),
            quantile: gauge_vec(
                "tutor_gateway_autopilot_ttft_quantile_seconds",
                "Per lane with an objective: the objective's quantile of time to first token over the \
                 autopilot's window (refusals for waiting count as infinitely late; absent samples: 0).",
            ),
            ratio: gauge_vec(
                "tutor_gateway_autopilot_objective_ratio",
                "Per lane with an objective: the measured quantile over the target (above 1: missed).",
            ),
            adjustments: counter_vec(
                registry,
                "tutor_gateway_autopilot_adjustments_total",
                "Autopilot decisions by reason: tighten (an objective missed), loosen (every objective \
                 held with headroom), at_floor (missed with the knobs at their floors), rescue (the \
                 large lane starving: knobs raised whatever the objectives), for the small lane's \
                 reservation reserve_up (its objective at risk while waiting for seats), reserve_down \
                 (held with headroom), reserve_at_ceiling, and for the piece size pieces_on, pieces_smaller, pieces_at_floor (long engine steps), \
                 pieces_larger, pieces_off (short steps with headroom).",
                &["reason"],
            ),
            piece_tokens: gauge(
                "tutor_gateway_autopilot_piece_tokens",
                "The size the autopilot prefills long prompts in pieces of, tokens (0: not pieced; \
                 a configured admission.prefill_piece_tokens is used instead and this stays 0).",
            ),
            longest_step: registered(
                registry,
                Gauge::new(
                    "tutor_gateway_autopilot_longest_step_seconds",
                    "The 90th percentile of streams' longest gap between tokens since the last change \
                     of piece size (the engine's long steps).",
                ),
            ),
            typical_step: registered(
                registry,
                Gauge::new(
                    "tutor_gateway_autopilot_typical_step_seconds",
                    "The median of streams' mean gap between tokens since the last change of piece \
                     size (the engine's typical step).",
                ),
            ),
        };
        for r in REASONS {
            m.adjustments.with_label_values(&[r]);
        }
        m
    }

    /// Whether the autopilot runs, and the knobs in force.
    pub fn set(&self, enabled: bool, knobs: Knobs) {
        self.enabled.set(i64::from(enabled));
        self.prefill_budget
            .set(i64::try_from(knobs.prefill_budget).unwrap_or(i64::MAX));
        self.large_seats.set(i64::from(knobs.large_seats));
        self.small_seats.set(i64::from(knobs.small_seats));
    }

    /// Whether this replica's autopilot leads.
    pub fn leads(&self, leads: bool) {
        self.leader.set(i64::from(leads));
    }

    /// `lane`'s measured quantile (seconds; infinite as a very large number) and its ratio to
    /// the objective.
    pub fn measured(&self, lane: Lane, seconds: f64, ratio: f64) {
        let finite = |v: f64| if v.is_finite() { v } else { f64::MAX };
        let l = [lane.as_str()];
        let set = |g: &GaugeVec, v: f64| {
            let g: Gauge = g.with_label_values(&l);
            g.set(finite(v));
        };
        set(&self.quantile, seconds);
        set(&self.ratio, ratio);
    }

    /// The autopilot's piece size (0: none).
    pub fn piece_tokens(&self, tokens: u32) {
        self.piece_tokens.set(i64::from(tokens));
    }

    /// The steps read: the longest gaps' 90th percentile and the typical gap, seconds.
    pub fn steps(&self, longest: f64, typical: f64) {
        self.longest_step.set(longest);
        self.typical_step.set(typical);
    }

    /// One decision of `reason` (see [`REASONS`]).
    pub fn adjusted(&self, reason: &str) {
        self.adjustments.with_label_values(&[reason]).inc();
    }
}
