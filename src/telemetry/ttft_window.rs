//! The lanes' recent times to first token, for the autopilot (`crate::autopilot`): a bounded
//! ring of `(when, seconds, seconds waited for admission)` per lane, read as a quantile over a
//! sliding window. A request refused for waiting too long (`queue_timeout`, `queue_full`,
//! `deadline_unmet`), or admitted and given no first token before the engine timed out
//! (`upstream_timeout`), counts as a first token that never came (infinitely late, and an
//! endless wait), so an objective is never met by refusing requests or by a stalled engine.

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

/// One first token: when, seconds after arrival, seconds of that spent waiting for admission.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    ttft: f64,
    waited: f64,
}

/// The per-lane rings.
#[derive(Debug, Default)]
pub struct TtftWindow {
    lanes: [Mutex<VecDeque<Sample>>; 3],
}

impl TtftWindow {
    /// One first token of `lane`, `seconds` after arrival, of which `waited` in the gateway's
    /// queue (a seat, tokens or prefill room), that came `ago` before now. The sample is filed
    /// at its first token, not at the end of its request: a stream that ends long after its
    /// first token (a 20 s answer) is judged with the first tokens of its time, so the
    /// autopilot's "first tokens since the last change" holds no answer that began before it.
    pub fn observe(&self, lane: Lane, seconds: f64, waited: f64, ago: Duration) {
        let now = Instant::now();
        self.push(
            lane,
            Sample {
                at: now.checked_sub(ago).unwrap_or(now),
                ttft: seconds,
                waited,
            },
        );
    }

    /// A request of `lane` refused for its wait: a first token that never came (filed now).
    pub fn missed(&self, lane: Lane) {
        self.observe(lane, f64::INFINITY, f64::INFINITY, Duration::ZERO);
    }

    fn push(&self, lane: Lane, sample: Sample) {
        let mut ring = self.ring(lane);
        if ring.len() == MAX_SAMPLES {
            ring.pop_front();
        }
        ring.push_back(sample);
    }

    /// The nearest-rank `q` quantile of `lane`'s times to first token of the last `window`;
    /// `None` without samples. Reading never drops a sample: a shorter span read (since the
    /// autopilot's last change) used to drop the samples older than it that the longer window
    /// still holds, so the window's quantile saw only what came after each change (the ring is
    /// bounded by [`MAX_SAMPLES`] instead).
    pub fn quantile(&self, lane: Lane, q: f64, window: Duration) -> Option<WindowQuantile> {
        self.quantile_of(lane, q, window, |s| s.ttft)
    }

    /// The same quantile of the waits for admission of those first tokens: how much of the
    /// time to first token the gateway's queue took.
    pub fn wait_quantile(&self, lane: Lane, q: f64, window: Duration) -> Option<WindowQuantile> {
        self.quantile_of(lane, q, window, |s| s.waited)
    }

    fn quantile_of(
        &self,
        lane: Lane,
        q: f64,
        window: Duration,
        pick: fn(&Sample) -> f64,
    ) -> Option<WindowQuantile> {
        let ring = self.ring(lane);
        let now = Instant::now();
        let mut values: Vec<f64> = ring
            .iter()
            .filter(|s| now.saturating_duration_since(s.at) <= window)
            .map(pick)
            .collect();
        drop(ring);
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
        Some(WindowQuantile {
            seconds: values[rank - 1],
            samples: values.len(),
        })
    }

    fn ring(&self, lane: Lane) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.lanes[lane.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long answer's first token came 20 s before its end: read since a change 5 s ago it is
    /// not there (it was made under the old setting), and the 30 s window has it.
    #[tokio::test(start_paused = true)]
    async fn a_sample_is_filed_at_its_first_token_not_at_its_end() {
        let w = TtftWindow::default();
        tokio::time::advance(Duration::from_secs(60)).await;
        w.observe(Lane::Small, 3.0, 0.0, Duration::from_secs(20));
        w.observe(Lane::Small, 0.2, 0.0, Duration::from_secs(1));
        let since = w
            .quantile(Lane::Small, 0.99, Duration::from_secs(5))
            .unwrap();
        assert_eq!((since.seconds, since.samples), (0.2, 1));
        let window = w
            .quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert_eq!((window.seconds, window.samples), (3.0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn reading_a_shorter_span_leaves_the_window_whole() {
        let w = TtftWindow::default();
        for _ in 0..10 {
            w.observe(Lane::Small, 2.0, 0.0, Duration::ZERO);
        }
        tokio::time::advance(Duration::from_secs(20)).await;
        w.observe(Lane::Small, 0.1, 0.0, Duration::ZERO);
        // Since a change 5 s ago: only the last.
        let since = w
            .quantile(Lane::Small, 0.5, Duration::from_secs(5))
            .unwrap();
        assert_eq!((since.seconds, since.samples), (0.1, 1));
        // The 30 s window still has all eleven.
        let window = w
            .quantile(Lane::Small, 0.5, Duration::from_secs(30))
            .unwrap();
        assert_eq!((window.seconds, window.samples), (2.0, 11));
    }

    #[tokio::test(start_paused = true)]
    async fn the_quantile_reads_only_the_window_and_counts_refusals_as_late() {
        let w = TtftWindow::default();
        for i in 1..=100 {
            w.observe(Lane::Small, f64::from(i) / 100.0, 0.0, Duration::ZERO);
        }
        let q = w
            .quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert_eq!((q.seconds, q.samples), (0.99, 100));
        assert_eq!(w.quantile(Lane::Large, 0.99, Duration::from_secs(30)), None);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(w.quantile(Lane::Small, 0.5, Duration::from_secs(30)), None);
        for _ in 0..98 {
            w.observe(Lane::Small, 0.1, 0.0, Duration::ZERO);
        }
        w.missed(Lane::Small);
        w.missed(Lane::Small);
        let q = w
            .quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert!(q.seconds.is_infinite(), "{q:?}");
        let waited = w
            .wait_quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert!(
            waited.seconds.is_infinite(),
            "a refusal is an endless wait: {waited:?}"
        );
        assert_eq!(
            w.wait_quantile(Lane::Small, 0.5, Duration::from_secs(30))
                .map(|q| q.seconds),
            Some(0.0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_quantile_reads_the_waits_of_the_same_first_tokens() {
        let w = TtftWindow::default();
        for i in 1..=100 {
            // The slow first tokens are the ones that waited.
            let ttft = f64::from(i) / 100.0;
            w.observe(
                Lane::Small,
                ttft,
                if i > 90 { ttft - 0.05 } else { 0.0 },
                Duration::ZERO,
            );
        }
        let window = Duration::from_secs(30);
        assert_eq!(
            w.wait_quantile(Lane::Small, 0.99, window)
                .map(|q| q.seconds),
            Some(0.99 - 0.05)
        );
        assert_eq!(
            w.wait_quantile(Lane::Small, 0.9, window).map(|q| q.seconds),
            Some(0.0)
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(w.wait_quantile(Lane::Small, 0.99, window), None);
    }

    #[test]
    fn the_ring_is_bounded() {
        let w = TtftWindow::default();
        for _ in 0..MAX_SAMPLES + 10 {
            w.observe(Lane::Medium, 0.2, 0.0, Duration::ZERO);
        }
        let q = w
            .quantile(Lane::Medium, 0.5, Duration::from_secs(60))
            .unwrap();
        assert_eq!(q.samples, MAX_SAMPLES);
    }
}
