//! `tutor_gateway_estimate_error_ratio{kind}`: how far the gateway's input estimate was from
//! the engine's `usage.prompt_tokens`, per kind of content (`classify::calibration`).
//! Registered once by [`super::Metrics::new`]; every kind's series exists from start-up.

use prometheus::{HistogramOpts, HistogramVec, Registry};

use super::registered::registered;
use crate::classify::ContentKind;

/// The `kind` of a request byte length alone decided (its estimate is an upper bound).
pub const BYTES: &str = "bytes";

/// Buckets of (estimate - engine) / engine: an under-count is negative.
const BUCKETS: [f64; 14] = [
    -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
];

/// The estimate's error.
#[derive(Debug, Clone)]
pub struct EstimateMetrics {
    error: HistogramVec,
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
        for kind in ContentKind::ALL.map(ContentKind::as_str).into_iter().chain([BYTES]) {
            error.with_label_values(&[kind]);
        }
        Self { error }
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
