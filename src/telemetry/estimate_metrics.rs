//! `tutor_gateway_estimate_error_ratio{kind}`: how far the gateway's input estimate was from
//! the engine's `usage.prompt_tokens`, per kind of content (`classify::calibration`), and
//! `tutor_gateway_exact_counts_total{outcome}`: the engine's exact counts asked for
//! (`classify.exact_count`), and `tutor_gateway_unreported_prompt_counts_total{outcome}`: the
//! counts of prompts the engine never reported (`classify.count_unreported_prompts`).
//! Registered once by [`super::Metrics::new`]; every series exists
//! from start-up.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Registry};

use super::registered::{counter_vec, registered};
use crate::classify::ContentKind;

/// The `kind` of a request byte length alone decided (its estimate is an upper bound).
pub const BYTES: &str = "bytes";

/// Buckets of (estimate - engine) / engine: an under-count is negative.
const BUCKETS: [f64; 14] = [
    -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
];

/// What asking the engine for an exact count gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactOutcome {
    /// The engine's count, used.
    Counted,
    /// An error or an answer without a count: the estimate stood.
    Failed,
    /// No answer within `classify.exact_count_timeout_ms`: the estimate stood.
    Timeout,
    /// Not asked: `MAX_EXACT_COUNTS_OUT` (16) were out; the estimate stood.
    Busy,
}

impl ExactOutcome {
    /// Every outcome.
    pub const ALL: [ExactOutcome; 4] = [
        ExactOutcome::Counted,
        ExactOutcome::Failed,
        ExactOutcome::Timeout,
        ExactOutcome::Busy,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ExactOutcome::Counted => "counted",
            ExactOutcome::Failed => "failed",
            ExactOutcome::Timeout => "timeout",
            ExactOutcome::Busy => "busy",
        }
    }
}

/// The estimate's error, and the exact counts asked for.
#[derive(Debug, Clone)]
pub struct EstimateMetrics {
    error: HistogramVec,
    exact: IntCounterVec,
    unreported: IntCounterVec,
}

impl EstimateMetrics {
    /// Registers the family in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let error = registered(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "tutor_gateway_estimate_error_ratio",
                    "(input estimate - the engine's usage.prompt_tokens) / usage.prompt_tokens \
                     per response, by the request's main kind of content (code, prose, tools, \
                     media; bytes: decided by byte length, an upper bound). Negative: the \
                     gateway reserved too few tokens.",
                )
                .buckets(BUCKETS.to_vec()),
                &["kind"],
            ),
        );
        for kind in ContentKind::ALL
            .map(ContentKind::as_str)
            .into_iter()
            .chain([BYTES])
        {
            error.with_label_values(&[kind]);
        }
        let exact = counter_vec(
            registry,
            "tutor_gateway_exact_counts_total",
            "Requests whose estimate came near a lane boundary or max_model_len and were \
             counted by vLLM's /tokenize (classify.exact_count = \"near_limits\"), by outcome: \
             counted, failed, timeout, busy (16 already out; the estimate stood).",
            &["outcome"],
        );
        let unreported = counter_vec(
            registry,
            "tutor_gateway_unreported_prompt_counts_total",
            "Requests that reached the engine and ended before it reported their prompt's \
             tokens (client gone before the first token, a timeout, an engine error), counted \
             by vLLM's /tokenize afterwards (classify.count_unreported_prompts), by outcome: \
             counted, failed, timeout, busy (16 late counts already out; the estimate stood).",
            &["outcome"],
        );
        for o in ExactOutcome::ALL {
            exact.with_label_values(&[o.as_str()]);
            unreported.with_label_values(&[o.as_str()]);
        }
        Self {
            error,
            exact,
            unreported,
        }
    }

    /// One count of a prompt the engine never reported.
    pub fn unreported_count(&self, outcome: ExactOutcome) {
        self.unreported.with_label_values(&[outcome.as_str()]).inc();
    }

    /// One exact count asked for.
    pub fn exact_count(&self, outcome: ExactOutcome) {
        self.exact.with_label_values(&[outcome.as_str()]).inc();
    }

    /// One response: `estimate` against the engine's `actual`, for a request mostly of `kind`
    /// (`None`: decided by byte length).
    pub fn observe(&self, kind: Option<ContentKind>, estimate: u32, actual: u32) {
        if actual == 0 {
            return;
        }
        let label = kind.map_or(BYTES, ContentKind::as_str);
        let error = (f64::from(estimate) - f64::from(actual)) / f64::from(actual);
        self.error.with_label_values(&[label]).observe(error);
    }
}
