//! How long the engine's steps are, as the streams saw them, for the autopilot's piecing
//! (`crate::autopilot::piecing`). vLLM sends each running request one chunk per scheduler step,
//! so the gaps between a stream's tokens are the steps it lived through: its mean gap is a
//! typical step, its longest gap the longest step (a step that carried a long prompt's prefill
//! is longer for every stream in it). Each stream that ended with at least [`MIN_CHUNKS`]
//! content chunks leaves one sample: when its first token came, its longest gap and its mean
//! gap. A bounded ring, read from a given moment on (the samples of streams that started after
//! the last change of piece size).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Samples kept: the newest ones (a few minutes of a busy gateway's streams).
pub const MAX_SAMPLES: usize = crate::config::MAX_MIN_SAMPLES as usize;

/// Content chunks a stream needs to leave a sample (fewer gaps say little about the steps).
pub const MIN_CHUNKS: u32 = 8;

/// One stream's steps.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    started: Instant,
    longest: f64,
    mean: f64,
}

/// The steps streams saw since a moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReading {
    /// Streams read.
    pub samples: usize,
    /// The 90th percentile of their longest gaps, seconds.
    pub longest_p90: f64,
    /// The median of their mean gaps, seconds.
    pub typical: f64,
}

/// The ring.
#[derive(Debug, Default)]
pub struct StepWindow {
    ring: Mutex<VecDeque<Sample>>,
}

impl StepWindow {
    /// A stream whose first token came at `started`, `chunks` content chunks over `decode`
    /// (first to last), the longest gap between two of them `longest`.
    pub fn observe(&self, started: Instant, chunks: u32, decode: Duration, longest: Duration) {
        if chunks < MIN_CHUNKS {
            return;
        }
        let sample = Sample {
            started,
            longest: longest.as_secs_f64(),
            mean: decode.as_secs_f64() / f64::from(chunks - 1),
        };
        let mut ring = self.ring();
        if ring.len() == MAX_SAMPLES {
            ring.pop_front();
        }
        ring.push_back(sample);
    }

    /// The streams that started at or after `since` and no longer ago than `window`; `None`
    /// without any.
    pub fn since(&self, since: Instant, window: Duration) -> Option<StepReading> {
        let oldest = Instant::now()
            .checked_sub(window)
            .unwrap_or(since)
            .max(since);
        let (mut longest, mut mean): (Vec<f64>, Vec<f64>) = self
            .ring()
            .iter()
            .filter(|s| s.started >= oldest)
            .map(|s| (s.longest, s.mean))
            .unzip();
        if longest.is_empty() {
            return None;
        }
        longest.sort_by(f64::total_cmp);
        mean.sort_by(f64::total_cmp);
        let rank = |n: usize, q: f64| ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        Some(StepReading {
            samples: longest.len(),
            longest_p90: longest[rank(longest.len(), 0.9)],
            typical: mean[rank(mean.len(), 0.5)],
        })
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn a_reading_holds_only_streams_started_since_the_moment() {
        let w = StepWindow::default();
        let before = Instant::now();
        // Ten streams of 11 chunks over 200 ms (20 ms a step), one gap of 180 ms each.
        for _ in 0..10 {
            w.observe(Instant::now(), 11, 200 * MS, 180 * MS);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        let change = Instant::now();
        for _ in 0..10 {
            w.observe(Instant::now(), 11, 200 * MS, 40 * MS);
        }
        let all = w.since(before, Duration::from_secs(60)).unwrap();
        assert_eq!(all.samples, 20);
        assert!((all.longest_p90 - 0.18).abs() < 1e-9, "{all:?}");
        assert!((all.typical - 0.02).abs() < 1e-9, "{all:?}");
        let after = w.since(change, Duration::from_secs(60)).unwrap();
        assert_eq!(after.samples, 10);
        assert!((after.longest_p90 - 0.04).abs() < 1e-9, "{after:?}");
        // Older than the window: not read.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(w.since(before, Duration::from_secs(60)), None);
    }

    #[test]
    fn short_streams_leave_no_sample_and_the_ring_is_bounded() {
        let w = StepWindow::default();
        let start = Instant::now();
        w.observe(start, MIN_CHUNKS - 1, 100 * MS, 50 * MS);
        assert_eq!(w.since(start, Duration::from_secs(60)), None);
        for _ in 0..MAX_SAMPLES + 5 {
            w.observe(start, MIN_CHUNKS, 70 * MS, 10 * MS);
        }
        assert_eq!(
            w.since(start, Duration::from_secs(60)).unwrap().samples,
            MAX_SAMPLES
        );
    }
}
