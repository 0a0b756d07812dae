//! The lanes' recent admissions, for predicting a new arrival's wait (an honest early "no":
//! `crate::pipeline::admit`): a bounded ring of admission times per lane, and the prediction
//! error (`tutor_gateway_wait_prediction_error_seconds{lane}`, and as a ratio
//! `tutor_gateway_wait_prediction_ratio{lane}`).
//!
//! The prediction: with `ahead` requests waiting in the lane, `ahead / rate`, where `rate` is
//! the lane's admissions per second over the last [`WINDOW`]. No admissions in the window
//! while requests wait: no prediction (the gateway does not refuse on a guess). Nobody ahead:
//! 0.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, Registry};
use tokio::time::Instant;

use super::registered::registered;
use crate::lane::Lane;

/// The window the admission rate is measured over.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Admissions kept per lane.
const MAX_SAMPLES: usize = 8_192;
/// Buckets of predicted - actual wait, seconds.
const BUCKETS: [f64; 13] = [
    -10.0, -3.0, -1.0, -0.3, -0.1, -0.03, 0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0,
];

/// Buckets of actual / predicted wait.
const RATIO_BUCKETS: [f64; 13] = [
    0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0, 10.0, 100.0,
];

/// Per-lane admission times and the prediction's error.
#[derive(Debug)]
pub struct AdmissionRate {
    lanes: [Mutex<VecDeque<Instant>>; 3],
    error: HistogramVec,
    ratio: HistogramVec,
}

impl AdmissionRate {
    /// Registers the error histogram in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let error = registered(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "tutor_gateway_wait_prediction_error_seconds",
                    "Per admitted request that waited with a prediction: predicted queue wait \
                     minus the actual one (positive: predicted longer), by lane.",
                )
                .buckets(BUCKETS.to_vec()),
                &["lane"],
            ),
        );
        let ratio = registered(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "tutor_gateway_wait_prediction_ratio",
                    "Per admitted request that waited with a non-zero prediction: its actual queue \
                     wait over the predicted one (1: exact; within 0.8 to 1.25: within 25%), by lane.",
                )
                .buckets(RATIO_BUCKETS.to_vec()),
                &["lane"],
            ),
        );
        for lane in Lane::ALL {
            error.with_label_values(&[lane.as_str()]);
            ratio.with_label_values(&[lane.as_str()]);
        }
        Self {
            lanes: Default::default(),
            error,
            ratio,
        }
    }

    /// One admission in `lane`, now.
    pub fn admitted(&self, lane: Lane) {
        let mut ring = self.ring(lane);
        if ring.len() == MAX_SAMPLES {
            ring.pop_front();
        }
        ring.push_back(Instant::now());
    }

    /// The predicted wait of an arrival with `ahead` requests waiting before it in `lane`;
    /// `None` when requests wait and none was admitted in the last [`WINDOW`].
    pub fn predict(&self, lane: Lane, ahead: u32) -> Option<Duration> {
        if ahead == 0 {
            return Some(Duration::ZERO);
        }
        let mut ring = self.ring(lane);
        let now = Instant::now();
        while ring
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) > WINDOW)
        {
            ring.pop_front();
        }
        if ring.is_empty() {
            return None;
        }
        let per_second = ring.len() as f64 / WINDOW.as_secs_f64();
        Some(Duration::from_secs_f64(f64::from(ahead) / per_second))
    }

    /// An admitted request predicted to wait `predicted` waited `actual`.
    pub fn observed(&self, lane: Lane, predicted: Duration, actual: Duration) {
        self.error
            .with_label_values(&[lane.as_str()])
            .observe(predicted.as_secs_f64() - actual.as_secs_f64());
        if !predicted.is_zero() {
            self.ratio
                .with_label_values(&[lane.as_str()])
                .observe(actual.as_secs_f64() / predicted.as_secs_f64());
        }
    }

    fn ring(&self, lane: Lane) -> std::sync::MutexGuard<'_, VecDeque<Instant>> {
        self.lanes[lane.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_wait_is_the_requests_ahead_over_the_recent_admission_rate() {
        let r = AdmissionRate::register(&Registry::new());
        assert_eq!(r.predict(Lane::Large, 0), Some(Duration::ZERO));
        assert_eq!(r.predict(Lane::Large, 3), None, "no admissions: no guess");
        // 20 admissions in the window: 2 a second; 6 ahead wait 3 s.
        for _ in 0..20 {
            r.admitted(Lane::Large);
        }
        assert_eq!(r.predict(Lane::Large, 6), Some(Duration::from_secs(3)));
        // The window moves on: old admissions no longer count.
        tokio::time::advance(WINDOW + Duration::from_secs(1)).await;
        assert_eq!(r.predict(Lane::Large, 6), None);
    }
}
