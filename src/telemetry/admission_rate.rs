//! The lanes' recent admissions, for predicting a new arrival's wait (an honest early "no":
//! `crate::pipeline::admit`): a bounded ring of admission times per lane, and the prediction
//! error (`tutor_gateway_wait_prediction_error_seconds{lane}`, and as a ratio
//! `tutor_gateway_wait_prediction_ratio{lane}`).
//!
//! The prediction: with `ahead` requests waiting in the lane, `(ahead + 1/2) / rate`: the
//! arrival is admitted at the `ahead + 1`-th admission from now, and the first of those is on
//! average half a gap away (a whole one if admissions were a Poisson stream, none if they were
//! due now; half is the middle, an estimate: measured at 1.2x load, `ahead / rate` alone
//! predicted the small lane's short queues' waits 1.4-1.5x too short). `rate` is the lane's
//! service rate **while it was backlogged** over the last [`WINDOW`]: the gaps
//! between consecutive admissions where the later request was already waiting when the earlier
//! one was admitted (so the queue was never empty in between), counted over their summed
//! length. A rate over the whole window would count the lane's idle seconds as slow service
//! and predict bursty lanes' waits about twice too long (measured at 1.2x load: the medium
//! lane's actual / predicted median was 0.36-0.64). Without one such gap in the window, the
//! admissions over the whole window (an upper bound on the wait). No admissions in the window
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

/// One admission: when the request was admitted and when it began waiting for its seat.
#[derive(Debug, Clone, Copy)]
struct Admission {
    at: Instant,
    queued_at: Instant,
}

/// Per-lane admission times and the prediction's error.
#[derive(Debug)]
pub struct AdmissionRate {
    lanes: [Mutex<VecDeque<Admission>>; 3],
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

    /// One admission in `lane`, now, of a request that waited `queue_wait` for its seat.
    pub fn admitted(&self, lane: Lane, queue_wait: Duration) {
        let at = Instant::now();
        let queued_at = at.checked_sub(queue_wait).unwrap_or(at);
        let mut ring = self.ring(lane);
        if ring.len() == MAX_SAMPLES {
            ring.pop_front();
        }
        ring.push_back(Admission { at, queued_at });
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
            .is_some_and(|a| now.saturating_duration_since(a.at) > WINDOW)
        {
            ring.pop_front();
        }
        if ring.is_empty() {
            return None;
        }
        // The backlogged gaps: the later request was waiting when the earlier was admitted.
        let (mut gaps, mut busy) = (0u32, Duration::ZERO);
        for (earlier, later) in ring.iter().zip(ring.iter().skip(1)) {
            if later.queued_at < earlier.at {
                gaps += 1;
                busy += later.at.saturating_duration_since(earlier.at);
            }
        }
        let per_admission = if gaps > 0 {
            busy / gaps
        } else {
            WINDOW / u32::try_from(ring.len()).unwrap_or(u32::MAX)
        };
        // (ahead + 1/2) gaps, in half gaps.
        Some((per_admission / 2).saturating_mul(ahead.saturating_mul(2).saturating_add(1)))
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

    fn ring(&self, lane: Lane) -> std::sync::MutexGuard<'_, VecDeque<Admission>> {
        self.lanes[lane.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn without_a_backlog_the_wait_is_the_requests_ahead_over_the_window_rate() {
        let r = AdmissionRate::register(&Registry::new());
        assert_eq!(r.predict(Lane::Large, 0), Some(Duration::ZERO));
        assert_eq!(r.predict(Lane::Large, 3), None, "no admissions: no guess");
        // 20 admissions in the window, none of which waited: 2 a second; 6 ahead: the 7th
        // admission from now, the first half a gap away, 3.25 s.
        for _ in 0..20 {
            r.admitted(Lane::Large, Duration::ZERO);
        }
        assert_eq!(
            r.predict(Lane::Large, 6),
            Some(Duration::from_millis(3_250))
        );
        // The window moves on: old admissions no longer count.
        tokio::time::advance(WINDOW + Duration::from_secs(1)).await;
        assert_eq!(r.predict(Lane::Large, 6), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bursty_lane_is_predicted_from_its_backlogged_gaps_not_its_idle_seconds() {
        let r = AdmissionRate::register(&Registry::new());
        // Idle for 8 s, then a burst: 5 requests queued at once, admitted 200 ms apart.
        tokio::time::advance(Duration::from_secs(8)).await;
        for i in 1..=5u32 {
            tokio::time::advance(Duration::from_millis(200)).await;
            r.admitted(Lane::Medium, Duration::from_millis(200) * i);
        }
        // Served at 5 a second while backlogged: 10 ahead wait 10.5 gaps, 2.1 s (the window's
        // rate, 5 in 10 s, would say 21 s).
        assert_eq!(
            r.predict(Lane::Medium, 10),
            Some(Duration::from_millis(2_100))
        );
        // An admission after an idle gap (it did not wait) is not a service gap.
        tokio::time::advance(Duration::from_secs(1)).await;
        r.admitted(Lane::Medium, Duration::ZERO);
        assert_eq!(
            r.predict(Lane::Medium, 10),
            Some(Duration::from_millis(2_100))
        );
    }
}
