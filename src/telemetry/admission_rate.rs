//! The lanes' recent admissions, for predicting a new arrival's wait (an honest early "no":
//! `crate::pipeline::admit`): a bounded ring of admission times per [`Line`], and the
//! prediction error (`tutor_gateway_wait_prediction_error_seconds{lane,line}`, and as a ratio
//! `tutor_gateway_wait_prediction_ratio{lane,line}`).
//!
//! A lane has two lines, served at different rates: long prompts (above
//! `admission.long_prompt_tokens` under a prefill budget) wait for prefill room as well as a
//! seat, in order among themselves; the rest wait for a seat only and are not held back by the
//! long prompts waiting for room. One rate for both mispredicted both (measured: the medium
//! lane's actual / predicted median was 0.2 at 0.9 load and 0.45-0.65 at 1.2, where half of its
//! prompts are long), so each line has its own ring, its own `ahead` and its own rate.
//!
//! An early refusal cannot be checked against the wait it was spared by waiting, so it leaves a
//! **ghost** in its line: the refused request as if it had queued, admitted at the `ahead + 1`-th
//! admission from its line after the refusal (in order within the line; a later arrival with a
//! nearer deadline or of a tenant behind in service may pass it, which makes the ghost's wait
//! shorter than the real one would have been). Its wait over the prediction that refused it is
//! `tutor_gateway_refusal_wait_ratio{lane,line}`. A ghost whose line admits no one for
//! [`GHOST_TTL`] is dropped unmeasured; at most [`MAX_GHOSTS`] per line.
//!
//! The prediction, with `ahead` requests waiting in the line: `residual + ahead x mean`. The
//! arrival is admitted at the `ahead + 1`-th admission from now; the first of those is the rest of
//! the gap the arrival lands in, the others whole gaps. The gaps are the line's **backlogged** gaps
//! over the last [`WINDOW`]: between consecutive admissions where the later request was already
//! waiting when the earlier one was admitted (so the line was never empty in between). A window
//! with fewer than [`MIN_GAPS`] of them is read with the line's most recent gaps before it, up to
//! [`HISTORY`] back: a line of long prompts admits a few a window, and a mean of four gaps is
//! mostly noise, which is what an early refusal selects (it follows a high prediction). `mean` is
//! their mean; `residual` is the mean rest of a gap seen by an arrival at a random moment,
//! `sum(g^2) / (2 sum(g))` (renewal theory: an arrival lands in long gaps more often than in short
//! ones): half a gap when admissions are regular, a whole one when they come as a Poisson stream,
//! more when they come in bursts. Admissions of long prompts do come in bursts (several fit the
//! room one first token frees, then none until the next), and half a gap predicted their waits 2.4x
//! too short at 0.9 load (measured: `docs/results/autopilot/lines/`). A rate over the whole window
//! would count the line's idle seconds as slow service and predict bursty lines' waits about twice
//! too long (measured at 1.2x load: the medium lane's actual / predicted median was 0.36-0.64).
//! Without one backlogged gap in the history: `(ahead + 1/2)` times the whole window over its
//! admissions (an upper bound on the wait). No admissions in the window while requests wait: no
//! prediction (the gateway does not refuse on a guess). Nobody ahead: 0.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, Registry};
use tokio::time::Instant;

use super::registered::registered;
use crate::lane::Lane;

/// The window the admission rate is measured over.
pub const WINDOW: Duration = Duration::from_secs(10);
/// How long admissions are kept: a line with fewer than [`MIN_GAPS`] backlogged gaps in the
/// [`WINDOW`] takes its most recent ones from up to this far back.
pub const HISTORY: Duration = Duration::from_secs(60);
/// The fewest backlogged gaps a line's service is estimated from when its [`HISTORY`] has
/// them: a mean of four gaps is mostly noise, and the noise is what an early refusal selects
/// (a refusal follows a high prediction).
pub const MIN_GAPS: u32 = 16;
/// Admissions kept per lane.
const MAX_SAMPLES: usize = 8_192;
/// How long a refusal's ghost waits for its line's admissions before it is dropped unmeasured.
pub const GHOST_TTL: Duration = Duration::from_secs(600);
/// Ghosts kept per line (the oldest goes first).
const MAX_GHOSTS: usize = 1_024;
/// Buckets of predicted - actual wait, seconds.
const BUCKETS: [f64; 13] = [
    -10.0, -3.0, -1.0, -0.3, -0.1, -0.03, 0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0,
];

/// Buckets of actual / predicted wait.
const RATIO_BUCKETS: [f64; 13] = [
    0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0, 10.0, 100.0,
];

/// Where a queued request waits: its lane, and in it the line for a seat or the line of long
/// prompts that also wait for prefill room ([`Line::long`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// The lane.
    pub lane: Lane,
    /// A long prompt under a prefill budget: it waits for prefill room too.
    pub long: bool,
}

impl Line {
    /// The line of `lane`'s long prompts (`long`) or of its other requests.
    pub const fn new(lane: Lane, long: bool) -> Self {
        Self { lane, long }
    }

    /// The `line` label: `prefill` for long prompts, `seat` for the rest.
    pub fn as_str(self) -> &'static str {
        if self.long {
            "prefill"
        } else {
            "seat"
        }
    }

    fn index(self) -> usize {
        self.lane.index() * 2 + usize::from(self.long)
    }

    /// Every line, lane by lane.
    pub const ALL: [Line; 6] = [
        Line::new(Lane::Small, false),
        Line::new(Lane::Small, true),
        Line::new(Lane::Medium, false),
        Line::new(Lane::Medium, true),
        Line::new(Lane::Large, false),
        Line::new(Lane::Large, true),
    ];
}

/// One admission: when the request was admitted and when it began waiting for its seat.
#[derive(Debug, Clone, Copy)]
struct Admission {
    at: Instant,
    queued_at: Instant,
}

/// A refused request as if it had queued: admitted when `to_go` more of its line's requests
/// have been.
#[derive(Debug, Clone, Copy)]
struct Ghost {
    refused_at: Instant,
    to_go: u32,
    predicted: Duration,
}

/// Per-line admission times and the prediction's error.
#[derive(Debug)]
pub struct AdmissionRate {
    lines: [Mutex<VecDeque<Admission>>; 6],
    ghosts: [Mutex<VecDeque<Ghost>>; 6],
    error: HistogramVec,
    ratio: HistogramVec,
    refusal_ratio: HistogramVec,
}

/// A histogram by lane and line, registered in `registry`.
fn line_histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> HistogramVec {
    registered(
        registry,
        HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            &["lane", "line"],
        ),
    )
}

impl AdmissionRate {
    /// Registers the prediction's histograms in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let error = line_histogram(
            registry,
            "tutor_gateway_wait_prediction_error_seconds",
            "Per admitted request that waited with a prediction: predicted queue wait \
             minus the actual one (positive: predicted longer), by lane and line (seat: waited \
             for a seat; prefill: a long prompt, waited for prefill room too).",
            &BUCKETS,
        );
        let ratio = line_histogram(
            registry,
            "tutor_gateway_wait_prediction_ratio",
            "Per admitted request that waited with a non-zero prediction: its actual queue \
             wait over the predicted one (1: exact; within 0.8 to 1.25: within 25%), by lane \
             and line.",
            &RATIO_BUCKETS,
        );
        let refusal_ratio = line_histogram(
            registry,
            "tutor_gateway_refusal_wait_ratio",
            "Per early refusal (deadline_unmet) whose ghost was admitted: the wait it would \
             have had (until as many of its line's requests as were ahead of it, plus one, \
             were admitted) over the predicted wait that refused it, by lane and line.",
            &RATIO_BUCKETS,
        );
        for line in Line::ALL {
            let labels = [line.lane.as_str(), line.as_str()];
            error.with_label_values(&labels);
            ratio.with_label_values(&labels);
            refusal_ratio.with_label_values(&labels);
        }
        Self {
            lines: Default::default(),
            ghosts: Default::default(),
            error,
            ratio,
            refusal_ratio,
        }
    }

    /// One admission from `line`, now, of a request that waited `queue_wait` for its seat.
    pub fn admitted(&self, line: Line, queue_wait: Duration) {
        let at = Instant::now();
        let queued_at = at.checked_sub(queue_wait).unwrap_or(at);
        let mut ring = self.ring(line);
        if ring.len() == MAX_SAMPLES {
            ring.pop_front();
        }
        ring.push_back(Admission { at, queued_at });
        drop(ring);
        // The line moved on by one: ghosts whose turn this was are measured.
        let mut ghosts = self.ghosts_of(line);
        ghosts.retain_mut(|g| {
            if at.saturating_duration_since(g.refused_at) > GHOST_TTL {
                return false;
            }
            g.to_go -= 1;
            if g.to_go > 0 {
                return true;
            }
            if !g.predicted.is_zero() {
                let waited = at.saturating_duration_since(g.refused_at);
                self.refusal_ratio
                    .with_label_values(&[line.lane.as_str(), line.as_str()])
                    .observe(waited.as_secs_f64() / g.predicted.as_secs_f64());
            }
            false
        });
    }

    /// A request of `line` was refused early, `ahead` requests waiting before it, its wait
    /// predicted at `predicted`: its ghost is admitted at the `ahead + 1`-th admission from now.
    pub fn refused(&self, line: Line, ahead: u32, predicted: Duration) {
        let mut ghosts = self.ghosts_of(line);
        if ghosts.len() == MAX_GHOSTS {
            ghosts.pop_front();
        }
        ghosts.push_back(Ghost {
            refused_at: Instant::now(),
            to_go: ahead.saturating_add(1),
            predicted,
        });
    }

    /// The predicted wait of an arrival with `ahead` requests waiting before it in `line`;
    /// `None` when requests wait and none was admitted from it in the last [`WINDOW`].
    pub fn predict(&self, line: Line, ahead: u32) -> Option<Duration> {
        if ahead == 0 {
            return Some(Duration::ZERO);
        }
        let mut ring = self.ring(line);
        let now = Instant::now();
        while ring
            .front()
            .is_some_and(|a| now.saturating_duration_since(a.at) > HISTORY)
        {
            ring.pop_front();
        }
        let recent = ring
            .iter()
            .rev()
            .take_while(|a| now.saturating_duration_since(a.at) <= WINDOW)
            .count();
        if recent == 0 {
            return None;
        }
        // The backlogged gaps (the later request was waiting when the earlier was admitted),
        // newest first: every one in the window, and older ones until there are MIN_GAPS.
        let (mut gaps, mut sum, mut squares) = (0u32, 0.0f64, 0.0f64);
        for (later, earlier) in ring.iter().rev().zip(ring.iter().rev().skip(1)) {
            if gaps >= MIN_GAPS && now.saturating_duration_since(later.at) > WINDOW {
                break;
            }
            if later.queued_at < earlier.at {
                let g = later.at.saturating_duration_since(earlier.at).as_secs_f64();
                gaps += 1;
                sum += g;
                squares += g * g;
            }
        }
        let ahead = f64::from(ahead);
        let secs = if gaps > 0 && sum > 0.0 {
            squares / (2.0 * sum) + ahead * sum / f64::from(gaps)
        } else {
            let per_admission = WINDOW.as_secs_f64() / recent as f64;
            (ahead + 0.5) * per_admission
        };
        // Bounded: at most MAX_SAMPLES gaps of at most the window each, times ahead (u32); and
        // capped at a day, so a prediction's milliseconds always fit the JSON and the
        // Retry-After that carry them (a Duration::MAX would not).
        let day = Duration::from_secs(86_400);
        Some(Duration::try_from_secs_f64(secs).map_or(day, |d| d.min(day)))
    }

    /// An admitted request of `line` predicted to wait `predicted` waited `actual`.
    pub fn observed(&self, line: Line, predicted: Duration, actual: Duration) {
        let labels = [line.lane.as_str(), line.as_str()];
        self.error
            .with_label_values(&labels)
            .observe(predicted.as_secs_f64() - actual.as_secs_f64());
        if !predicted.is_zero() {
            self.ratio
                .with_label_values(&labels)
                .observe(actual.as_secs_f64() / predicted.as_secs_f64());
        }
    }

    fn ghosts_of(&self, line: Line) -> std::sync::MutexGuard<'_, VecDeque<Ghost>> {
        self.ghosts[line.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn ring(&self, line: Line) -> std::sync::MutexGuard<'_, VecDeque<Admission>> {
        self.lines[line.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LARGE: Line = Line::new(Lane::Large, true);
    const MEDIUM: Line = Line::new(Lane::Medium, false);

    #[tokio::test(start_paused = true)]
    async fn without_a_backlog_the_wait_is_the_requests_ahead_over_the_window_rate() {
        let r = AdmissionRate::register(&Registry::new());
        assert_eq!(r.predict(LARGE, 0), Some(Duration::ZERO));
        assert_eq!(r.predict(LARGE, 3), None, "no admissions: no guess");
        // 20 admissions in the window, none of which waited: 2 a second; 6 ahead: the 7th
        // admission from now, the first half a gap away, 3.25 s.
        for _ in 0..20 {
            r.admitted(LARGE, Duration::ZERO);
        }
        assert_eq!(r.predict(LARGE, 6), Some(Duration::from_millis(3_250)));
        // The window moves on: old admissions no longer count.
        tokio::time::advance(WINDOW + Duration::from_secs(1)).await;
        assert_eq!(r.predict(LARGE, 6), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_prediction_is_at_most_a_day_and_its_milliseconds_fit_json() {
        let r = AdmissionRate::register(&Registry::new());
        r.admitted(LARGE, Duration::ZERO);
        let predicted = r.predict(LARGE, u32::MAX).unwrap();
        assert_eq!(predicted, Duration::from_secs(86_400));
        let millis = u64::try_from(predicted.as_millis()).expect("fits a JSON integer");
        assert_eq!(serde_json::json!(millis).to_string(), "86400000");
    }

    #[tokio::test(start_paused = true)]
    async fn a_bursty_lane_is_predicted_from_its_backlogged_gaps_not_its_idle_seconds() {
        let r = AdmissionRate::register(&Registry::new());
        // Idle for 8 s, then a burst: 5 requests queued at once, admitted 200 ms apart.
        tokio::time::advance(Duration::from_secs(8)).await;
        for i in 1..=5u32 {
            tokio::time::advance(Duration::from_millis(200)).await;
            r.admitted(MEDIUM, Duration::from_millis(200) * i);
        }
        // Served at 5 a second while backlogged: 10 ahead wait 10.5 gaps, 2.1 s (the window's
        // rate, 5 in 10 s, would say 21 s).
        assert_eq!(r.predict(MEDIUM, 10), Some(Duration::from_millis(2_100)));
        // An admission after an idle gap (it did not wait) is not a service gap.
        tokio::time::advance(Duration::from_secs(1)).await;
        r.admitted(MEDIUM, Duration::ZERO);
        assert_eq!(r.predict(MEDIUM, 10), Some(Duration::from_millis(2_100)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lanes_two_lines_are_predicted_each_from_its_own_admissions() {
        let r = AdmissionRate::register(&Registry::new());
        let (seat, prefill) = (
            Line::new(Lane::Medium, false),
            Line::new(Lane::Medium, true),
        );
        // Both lines backlogged from the start: the seat line admits every 100 ms, the long
        // prompts' line every 1 s (they wait for prefill room).
        for i in 1..=20u32 {
            tokio::time::advance(Duration::from_millis(100)).await;
            r.admitted(seat, Duration::from_millis(100) * i);
            if i % 10 == 0 {
                r.admitted(prefill, Duration::from_millis(100) * i);
            }
        }
        // 4 ahead in each: 4.5 gaps of its own line's service.
        assert_eq!(r.predict(seat, 4), Some(Duration::from_millis(450)));
        assert_eq!(r.predict(prefill, 4), Some(Duration::from_millis(4_500)));
        // A line with no admissions of its own gets no guess from the other.
        assert_eq!(r.predict(Line::new(Lane::Large, false), 1), None);
    }

    fn refusal_ratio(r: &AdmissionRate, line: Line) -> (u64, f64) {
        let h = r
            .refusal_ratio
            .with_label_values(&[line.lane.as_str(), line.as_str()]);
        (h.get_sample_count(), h.get_sample_sum())
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusals_ghost_is_measured_when_its_line_has_admitted_those_ahead_and_it() {
        let r = AdmissionRate::register(&Registry::new());
        let (line, other) = (Line::new(Lane::Large, true), Line::new(Lane::Large, false));
        // Refused with 2 ahead, predicted 4 s: its ghost goes at the 3rd admission of its line.
        r.refused(line, 2, Duration::from_secs(4));
        for _ in 0..2 {
            tokio::time::advance(Duration::from_secs(1)).await;
            r.admitted(line, Duration::ZERO);
            // The other line's admissions do not move it.
            r.admitted(other, Duration::ZERO);
        }
        assert_eq!(refusal_ratio(&r, line).0, 0, "two ahead still: not yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        r.admitted(line, Duration::ZERO);
        // Waited 3 s of the 4 predicted.
        assert_eq!(refusal_ratio(&r, line), (1, 0.75));
        r.admitted(line, Duration::ZERO);
        assert_eq!(refusal_ratio(&r, line).0, 1, "measured once");
        assert_eq!(refusal_ratio(&r, other).0, 0);
        // A ghost whose line stalls past the TTL is dropped unmeasured.
        r.refused(line, 0, Duration::from_secs(1));
        tokio::time::advance(GHOST_TTL + Duration::from_secs(1)).await;
        r.admitted(line, Duration::ZERO);
        assert_eq!(refusal_ratio(&r, line).0, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_few_gaps_in_the_window_are_read_with_the_lines_recent_history() {
        let r = AdmissionRate::register(&Registry::new());
        let line = Line::new(Lane::Medium, true);
        // Backlogged all along (each waited 5 s): one admission a second for 40 s, then three
        // 100 ms apart, then nothing for 7.75 s.
        let waited = Duration::from_secs(5);
        for _ in 0..40 {
            tokio::time::advance(Duration::from_secs(1)).await;
            r.admitted(line, waited);
        }
        for _ in 0..3 {
            tokio::time::advance(Duration::from_millis(100)).await;
            r.admitted(line, waited);
        }
        tokio::time::advance(Duration::from_millis(7_750)).await;
        // The window holds five gaps (two of 1 s, three of 100 ms): alone they would say 0.90 s
        // for one ahead. With the eleven 1 s gaps before them (sixteen in all: sum 13.3 s,
        // squares 13.03): the rest of a gap 13.03 / 26.6 = 0.49 s, plus a mean gap 0.83 s.
        let predicted = r.predict(line, 1).unwrap();
        assert!(
            predicted.abs_diff(Duration::from_millis(1_321)) < Duration::from_millis(1),
            "{predicted:?}"
        );
        // A window with sixteen gaps of its own is read alone: twenty 100 ms apart now.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(100)).await;
            r.admitted(line, waited);
        }
        let predicted = r.predict(line, 1).unwrap();
        assert!(
            predicted.abs_diff(Duration::from_millis(150)) < Duration::from_millis(1),
            "{predicted:?}"
        );
        // Nothing admitted for a window: no guess, however long the history.
        tokio::time::advance(WINDOW + Duration::from_millis(1)).await;
        assert_eq!(r.predict(line, 1), None);
    }

    #[tokio::test(start_paused = true)]
    async fn admissions_in_bursts_are_predicted_from_the_gap_an_arrival_lands_in() {
        let r = AdmissionRate::register(&Registry::new());
        let line = Line::new(Lane::Medium, true);
        // Backlogged all along, admitted in bursts: three 100 ms gaps, then one of 1.7 s (a
        // mean gap of 0.5 s), twice over.
        let mut waited = Duration::from_millis(1);
        tokio::time::advance(waited).await;
        r.admitted(line, waited);
        for gap in [100u64, 100, 100, 1_700, 100, 100, 100, 1_700] {
            let gap = Duration::from_millis(gap);
            tokio::time::advance(gap).await;
            waited += gap;
            r.admitted(line, waited);
        }
        // An arrival at a random moment lands in a 1.7 s gap 85% of the time: the rest of its
        // gap is sum(g^2) / (2 sum(g)) = 5.84 / 8 = 0.73 s on average, not half the mean gap
        // (0.25 s); one ahead adds one mean gap.
        let predicted = r.predict(line, 1).unwrap();
        assert!(
            predicted.abs_diff(Duration::from_millis(1_230)) < Duration::from_millis(1),
            "{predicted:?}"
        );
    }
}
