//! The lanes' recent times to first token, for the autopilot (`crate::autopilot`): a bounded
//! ring of `(when, seconds)` per lane, read as a quantile over a sliding window. A request
//! refused for waiting too long (`queue_timeout`, `queue_full`) counts as a first token that
//! never came (infinitely late), so an objective is never met by refusing requests.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::lane::Lane;

/// Samples kept per lane: the window's quantile reads at most these (a busy small lane at a
/// few hundred requests a second over a 30 s window).
pub const MAX_SAMPLES: usize = 16_384;

/// A lane's quantile over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowQuantile {
    /// Seconds (infinite when a refused request is at or past the quantile).
    pub seconds: f64,
    /// Samples in the window.
    pub samples: usize,
}

/// The per-lane rings.
#[derive(Debug, Default)]
pub struct TtftWindow {
    lanes: [Mutex<VecDeque<(Instant, f64)>>; 3],
}

impl TtftWindow {
    /// One first token of `lane`, `seconds` after arrival.
    pub fn observe(&self, lane: Lane, seconds: f64) {
        let mut ring = self.ring(lane);
        if ring.len() == MAX_SAMPLES {
            ring.pop_front();
        }
        ring.push_back((Instant::now(), seconds));
    }

    /// A request of `lane` refused for its wait: a first token that never came.
    pub fn missed(&self, lane: Lane) {
        self.observe(lane, f64::INFINITY);
    }

    /// The nearest-rank `q` quantile of `lane`'s samples of the last `window`; `None` without
    /// samples. Drops older samples.
    pub fn quantile(&self, lane: Lane, q: f64, window: Duration) -> Option<WindowQuantile> {
        let mut ring = self.ring(lane);
        let now = Instant::now();
        while ring
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > window)
        {
            ring.pop_front();
        }
        if ring.is_empty() {
            return None;
        }
        let mut values: Vec<f64> = ring.iter().map(|(_, v)| *v).collect();
        drop(ring);
        values.sort_by(f64::total_cmp);
        let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
        Some(WindowQuantile {
            seconds: values[rank - 1],
            samples: values.len(),
        })
    }

    fn ring(&self, lane: Lane) -> std::sync::MutexGuard<'_, VecDeque<(Instant, f64)>> {
        self.lanes[lane.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_quantile_reads_only_the_window_and_counts_refusals_as_late() {
        let w = TtftWindow::default();
        for i in 1..=100 {
            w.observe(Lane::Small, f64::from(i) / 100.0);
        }
        let q = w
            .quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert_eq!((q.seconds, q.samples), (0.99, 100));
        assert_eq!(w.quantile(Lane::Large, 0.99, Duration::from_secs(30)), None);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(w.quantile(Lane::Small, 0.5, Duration::from_secs(30)), None);
        for _ in 0..98 {
            w.observe(Lane::Small, 0.1);
        }
        w.missed(Lane::Small);
        w.missed(Lane::Small);
        let q = w
            .quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert!(q.seconds.is_infinite(), "{q:?}");
    }

    #[test]
    fn the_ring_is_bounded() {
        let w = TtftWindow::default();
        for _ in 0..MAX_SAMPLES + 10 {
            w.observe(Lane::Medium, 0.2);
        }
        let q = w
            .quantile(Lane::Medium, 0.5, Duration::from_secs(60))
            .unwrap();
        assert_eq!(q.samples, MAX_SAMPLES);
    }
}
