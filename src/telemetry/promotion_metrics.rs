//! `tutor_gateway_lane_promotions_total`, `tutor_gateway_stream_cuts_total`,
//! `tutor_gateway_continuations_reclassified_total`: requests that outgrew their lane (M14),
//! registered once by [`super::Metrics::new`].

use prometheus::{IntCounterVec, Opts, Registry};

use crate::lane::Lane;

/// Promotion and continuation metric families.
#[derive(Debug, Clone)]
pub struct PromotionMetrics {
    promotions: IntCounterVec,
    cuts: IntCounterVec,
    reclassified: IntCounterVec,
}

impl PromotionMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
            c
        };
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
        }
        Self {
            promotions,
            cuts,
            reclassified,
        }
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
