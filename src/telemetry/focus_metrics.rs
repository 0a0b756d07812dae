//! `tutor_gateway_focus_tokens_saved_total`, `tutor_gateway_focus_outcome_total{outcome}` and
//! `tutor_gateway_focus_seconds`: what focusing course code on its stack trace did (M11).
//! Registered once by [`super::Metrics::new`]; every outcome's series exists from start-up.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use crate::prompt::focus::{Focus, Outcome};

/// Buckets from 100 µs to 1 s (seconds).
const BUCKETS: [f64; 10] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// The focusing families.
#[derive(Debug, Clone)]
pub struct FocusMetrics {
    saved: IntCounter,
    outcomes: IntCounterVec,
    seconds: Histogram,
}

impl FocusMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let saved = IntCounter::new(
            "tutor_gateway_focus_tokens_saved_total",
            "Tokens of course code not sent because it was focused on the stack trace \
             (whole code's tokens minus the focused code's, gateway counter).",
        )
        .expect("valid counter");
        let outcomes = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_focus_outcome_total",
                "Course requests with code, by what focusing did: focused, fallback_parse, \
                 fallback_nomatch, fallback_whole, off.",
            ),
            &["outcome"],
        )
        .expect("valid counter");
        let seconds = Histogram::with_opts(
            HistogramOpts::new(
                "tutor_gateway_focus_seconds",
                "Time to focus one request's code (parse, select, render, count), on the \
                 blocking pool.",
            )
            .buckets(BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        for c in [
            Box::new(saved.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(outcomes.clone()),
            Box::new(seconds.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        for o in Outcome::ALL {
            outcomes.with_label_values(&[o.as_str()]);
        }
        Self {
            saved,
            outcomes,
            seconds,
        }
    }

    /// Counts one request's focusing.
    pub fn observe(&self, f: &Focus) {
        self.outcomes.with_label_values(&[f.outcome.as_str()]).inc();
        self.saved.inc_by(u64::from(f.saved()));
        if f.outcome != Outcome::Off {
            self.seconds.observe(f.elapsed.as_secs_f64());
        }
    }
}
