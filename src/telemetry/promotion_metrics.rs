//! `tutor_gateway_lane_promotions_total`, `tutor_gateway_stream_cuts_total`,
//! `tutor_gateway_continuations_reclassified_total`: requests that outgrew their lane (M14);
//! `tutor_gateway_promotions_waiting{to}`: streams paused at their lane's limit for room in
//! lane `to`;
//! `tutor_gateway_sessions_tracked`, `tutor_gateway_sessions_evicted_total`: the continuation
//! ledger's bounded map. Registered once by [`super::Metrics::new`].

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::registered::counter_vec;

use crate::lane::Lane;

/// Promotion and continuation metric families.
#[derive(Debug, Clone)]
pub struct PromotionMetrics {
    promotions: IntCounterVec,
    cuts: IntCounterVec,
    reclassified: IntCounterVec,
    sessions_tracked: IntGauge,
    sessions_evicted: IntCounter,
    waiting: IntGaugeVec,
}

/// A stream paused at its lane's limit for room (in the next lane, or its own for a larger
/// reservation): counted in `tutor_gateway_promotions_waiting` until dropped (however the wait
/// ends: room found, cut, the grace's end, the client gone).
#[derive(Debug)]
pub struct Waiting(IntGauge);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl PromotionMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let counter =
            |name: &str, help: &str, labels: &[&str]| counter_vec(registry, name, help, labels);
        let promotions = counter(
            "tutor_gateway_lane_promotions_total",
            "Requests moved mid-stream to a bigger lane after passing their lane's output limit.",
            &["from", "to"],
        );
        let cuts = counter(
            "tutor_gateway_stream_cuts_total",
            "Streams cut at their lane's output limit because the next lane had no room.",
            &["lane"],
        );
        let reclassified = counter(
            "tutor_gateway_continuations_reclassified_total",
            "Requests put in a bigger lane because their session's earlier output counts.",
            &["from", "to"],
        );
        let sessions_tracked = IntGauge::new(
            "tutor_gateway_sessions_tracked",
            "Session ids this replica keeps a continuation count for (at most promotion.max_sessions).",
        )
        .expect("valid gauge");
        let sessions_evicted = IntCounter::new(
            "tutor_gateway_sessions_evicted_total",
            "Sessions forgotten before their window ended because promotion.max_sessions was reached.",
        )
        .expect("valid counter");
        let waiting = IntGaugeVec::new(
            prometheus::Opts::new(
                "tutor_gateway_promotions_waiting",
                "Streams paused at their lane's output limit, waiting for room in the lane `to` \
                 (promotion.when_full = \"wait\", or a job leaving the seat they need).",
            ),
            &["to"],
        )
        .expect("valid gauge");
        for c in [
            Box::new(sessions_tracked.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(sessions_evicted.clone()),
            Box::new(waiting.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        for (from, to) in [
            (Lane::Small, Lane::Medium),
            (Lane::Medium, Lane::Large),
            (Lane::Small, Lane::Large),
        ] {
            promotions.with_label_values(&[from.as_str(), to.as_str()]);
            reclassified.with_label_values(&[from.as_str(), to.as_str()]);
        }
        for lane in Lane::ALL {
            cuts.with_label_values(&[lane.as_str()]);
            waiting.with_label_values(&[lane.as_str()]);
        }
        Self {
            promotions,
            cuts,
            reclassified,
            sessions_tracked,
            sessions_evicted,
            waiting,
        }
    }

    /// A stream starts waiting for room in `to`; counted until the guard drops.
    pub fn waiting(&self, to: Lane) -> Waiting {
        let gauge = self.waiting.with_label_values(&[to.as_str()]);
        gauge.inc();
        Waiting(gauge)
    }

    /// Sets the number of sessions tracked.
    pub fn sessions_tracked(&self, n: usize) {
        self.sessions_tracked
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts sessions evicted to make room.
    pub fn sessions_evicted(&self, n: u64) {
        self.sessions_evicted.inc_by(n);
    }

    /// Counts a promotion.
    pub fn promoted(&self, from: Lane, to: Lane) {
        self.promotions
            .with_label_values(&[from.as_str(), to.as_str()])
            .inc();
    }

    /// Counts a cut stream.
    pub fn cut(&self, lane: Lane) {
        self.cuts.with_label_values(&[lane.as_str()]).inc();
    }

    /// Counts a continuation put in a bigger lane.
    pub fn reclassified(&self, from: Lane, to: Lane) {
        self.reclassified
            .with_label_values(&[from.as_str(), to.as_str()])
            .inc();
    }
}
