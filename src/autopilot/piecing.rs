//! The autopilot's piece size: whether, and in pieces of how many tokens, the gateway prefills
//! long prompts (`crate::pipeline::pieces`) on an engine that does not cut them itself.
//!
//! The signal is the engine's steps as the streams saw them (`crate::telemetry::step_window`):
//! a step that carries a long prompt's prefill is long for every stream in it. Steps are
//! **long** when the streams' longest gaps between tokens (90th percentile) pass
//! `autopilot.long_step_percent` of their typical gap (the median of their mean gaps): the
//! engine's own decode step, whatever the model, the GPU or the batch, is the yardstick, so no
//! step time is configured.
//!
//! - Long steps with pieces off: pieces go on at `max_piece_tokens`. They stay on at the
//!   smallest size even where the steps stay long (the engine chunks prompts itself,
//!   `--long-prefill-token-threshold`, and a step still carries many prompts' chunks): a rule
//!   that took them off there when the long steps had not got 20% shorter was measured worse
//!   for questions (seed's engine with the threshold: TTFT p99 5.0x the floor with pieces off
//!   in two seeds of three, against 3.1x with them on; `docs/results/autopilot/matrix/`), so
//!   the long-step signal does not judge the pieces' effect on questions.
//! - Long steps with pieces on: the size halves (to a multiple of 16), never below
//!   `min_piece_tokens` (then `at_floor`).
//! - Steps short with headroom (the longest gaps below `headroom_percent` of the long mark): the
//!   size grows by `min_piece_tokens`; past `max_piece_tokens` pieces go off again.
//! - Otherwise nothing changes.
//!
//! Each judgement reads only streams whose first token came after the last change, and needs
//! `autopilot.min_samples` of them: a size is judged on the steps it made, never on older ones,
//! so no hold is needed. Halving converges in a few changes (2,048 to 512 in two); growth is
//! additive, so the size settles just under where the steps turn long (AIMD, as the budget's).
//!
//! Every replica paces its own pieces (a piece size is not a shared limit: each replica pieces
//! the prompts it sends); with Redis a follower does too.

use tokio::time::Instant;

use crate::config::{AutopilotConfig, PREFILL_PIECE_ALIGN};
use crate::telemetry::step_window::StepReading;

/// What one look decided about the pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceStep {
    /// Long steps: pieces went on.
    On,
    /// Long steps: the pieces got smaller.
    Smaller,
    /// Long steps with the pieces at their smallest.
    AtFloor,
    /// Short steps with headroom: the pieces got larger.
    Larger,
    /// Short steps with headroom at the largest size: pieces went off.
    Off,
    /// Nothing changed (no reading, or between headroom and the mark).
    Hold,
}

impl PieceStep {
    /// The metric label of a look that changed something, or was stopped by the floor.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            PieceStep::On => Some("pieces_on"),
            PieceStep::Smaller => Some("pieces_smaller"),
            PieceStep::AtFloor => Some("pieces_at_floor"),
            PieceStep::Larger => Some("pieces_larger"),
            PieceStep::Off => Some("pieces_off"),
            PieceStep::Hold => None,
        }
    }
}

/// The piece size in force and since when.
#[derive(Debug, Clone)]
pub struct PieceController {
    /// Tokens; 0: off.
    size: u32,
    since: Instant,
}

impl PieceController {
    /// Off, judging streams from `now` on.
    pub fn new(now: Instant) -> Self {
        Self {
            size: 0,
            since: now,
        }
    }

    /// The size in force (0: off).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Streams that started before this were made under another size: not judged.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// Whether the steps are long and the pieces could still get smaller: the budget and the
    /// seats wait for the pieces, which cost reviews nothing.
    /// Judged on `min_samples` streams at least, as [`PieceController::step`] is: a handful
    /// of streams with one long gap does not hold the budget and the seats back.
    pub fn may_shorten(&self, reading: Option<StepReading>, ap: &AutopilotConfig) -> bool {
        reading.is_some_and(|r| r.samples >= ap.min_samples as usize && long(r, ap))
            && (self.size == 0 || self.size > ap.min_piece_tokens)
    }

    /// One look at `now` with `reading` (the streams since [`PieceController::since`]).
    pub fn step(
        &mut self,
        now: Instant,
        reading: Option<StepReading>,
        ap: &AutopilotConfig,
    ) -> PieceStep {
        let min = ap.min_piece_tokens;
        let max = ap.max_piece_tokens.max(min);
        if self.size != 0 {
            // A reload may have moved the bounds.
            self.size = self.size.clamp(min, max);
        }
        let Some(r) = reading.filter(|r| r.samples >= ap.min_samples as usize) else {
            return PieceStep::Hold;
        };
        let (next, step) = if long(r, ap) {
            match self.size {
                0 => (max, PieceStep::On),
                s if s <= min => return PieceStep::AtFloor,
                s => (align(s / 2).max(min), PieceStep::Smaller),
            }
        } else if r.longest_p90 * 100.0 < mark(r, ap) * f64::from(ap.headroom_percent) {
            match self.size {
                0 => return PieceStep::Hold,
                s if s >= max => (0, PieceStep::Off),
                s => (s.saturating_add(min).min(max), PieceStep::Larger),
            }
        } else {
            return PieceStep::Hold;
        };
        self.size = next;
        self.since = now;
        step
    }
}

/// The longest gap above which a step is long, seconds.
fn mark(r: StepReading, ap: &AutopilotConfig) -> f64 {
    r.typical * f64::from(ap.long_step_percent) / 100.0
}

/// Whether `r` shows long steps.
fn long(r: StepReading, ap: &AutopilotConfig) -> bool {
    r.longest_p90 > mark(r, ap)
}

/// `tokens` down to a whole number of KV blocks.
fn align(tokens: u32) -> u32 {
    tokens / PREFILL_PIECE_ALIGN * PREFILL_PIECE_ALIGN
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn reading(longest_ms: f64, typical_ms: f64) -> Option<StepReading> {
        Some(StepReading {
            samples: 50,
            longest_p90: longest_ms / 1000.0,
            typical: typical_ms / 1000.0,
        })
    }

    fn ap() -> AutopilotConfig {
        AutopilotConfig {
            min_piece_tokens: 512,
            max_piece_tokens: 2_048,
            long_step_percent: 200,
            headroom_percent: 80,
            min_samples: 20,
            ..AutopilotConfig::default()
        }
    }

    #[test]
    fn long_steps_turn_pieces_on_then_halve_them_down_to_the_floor() {
        let mut now = Instant::now();
        let mut c = PieceController::new(now);
        let mut sizes = Vec::new();
        // 200 ms steps among 20 ms ones (a review's prefill filling whole steps), shorter with
        // each smaller piece but still long.
        for longest in [200.0, 120.0, 70.0, 50.0] {
            now += Duration::from_secs(1);
            let step = c.step(now, reading(longest, 20.0), &ap());
            sizes.push((step, c.size()));
        }
        assert_eq!(
            sizes,
            [
                (PieceStep::On, 2_048),
                (PieceStep::Smaller, 1_024),
                (PieceStep::Smaller, 512),
                (PieceStep::AtFloor, 512),
            ]
        );
        // Each change starts a new judgement: only streams after it count.
        assert!(c.since() < now);
    }

    #[test]
    fn short_steps_leave_pieces_off_and_a_reading_without_enough_streams_changes_nothing() {
        let mut c = PieceController::new(Instant::now());
        // The engine's own threshold: every step within twice the typical one.
        assert_eq!(
            c.step(Instant::now(), reading(35.0, 20.0), &ap()),
            PieceStep::Hold
        );
        let few = reading(500.0, 20.0).map(|r| StepReading { samples: 19, ..r });
        assert_eq!(c.step(Instant::now(), few, &ap()), PieceStep::Hold);
        // Nor does it hold the budget and the seats back for pieces that would not change.
        assert!(!c.may_shorten(few, &ap()));
        assert!(c.may_shorten(reading(500.0, 20.0), &ap()));
        assert_eq!(c.step(Instant::now(), None, &ap()), PieceStep::Hold);
        assert_eq!(c.size(), 0);
    }

    #[test]
    fn short_steps_with_headroom_grow_the_pieces_and_past_the_ceiling_turn_them_off() {
        let mut c = PieceController::new(Instant::now());
        for longest in [200.0, 120.0, 70.0] {
            c.step(Instant::now(), reading(longest, 20.0), &ap());
        }
        assert_eq!(c.size(), 512);
        // Between headroom (32 ms) and the mark (40 ms): held.
        assert_eq!(
            c.step(Instant::now(), reading(36.0, 20.0), &ap()),
            PieceStep::Hold
        );
        let mut seen = Vec::new();
        for _ in 0..4 {
            let step = c.step(Instant::now(), reading(25.0, 20.0), &ap());
            seen.push((step, c.size()));
        }
        assert_eq!(
            seen,
            [
                (PieceStep::Larger, 1_024),
                (PieceStep::Larger, 1_536),
                (PieceStep::Larger, 2_048),
                (PieceStep::Off, 0),
            ]
        );
    }

    #[test]
    fn the_pieces_wait_for_nothing_but_the_budget_waits_for_the_pieces() {
        let mut c = PieceController::new(Instant::now());
        assert!(c.may_shorten(reading(200.0, 20.0), &ap()));
        assert!(!c.may_shorten(reading(30.0, 20.0), &ap()));
        for longest in [200.0, 120.0, 70.0] {
            c.step(Instant::now(), reading(longest, 20.0), &ap());
        }
        // At the floor: the budget and seats may tighten.
        assert!(!c.may_shorten(reading(200.0, 20.0), &ap()));
    }

    #[test]
    fn pieces_stay_at_their_smallest_while_the_steps_stay_long() {
        let mut now = Instant::now();
        let mut c = PieceController::new(now);
        // An engine that chunks itself: steps stay about 100 ms among 20 ms ones whatever the
        // pieces, down to the smallest; the pieces stay (measured better for questions there).
        assert_eq!(c.step(now, reading(100.0, 20.0), &ap()), PieceStep::On);
        now += Duration::from_secs(1);
        assert_eq!(c.step(now, reading(95.0, 20.0), &ap()), PieceStep::Smaller);
        assert_eq!(c.step(now, reading(98.0, 20.0), &ap()), PieceStep::Smaller);
        for _ in 0..20 {
            now += Duration::from_secs(1);
            assert_eq!(c.step(now, reading(96.0, 20.0), &ap()), PieceStep::AtFloor);
        }
        assert_eq!(c.size(), 512);
    }

    #[test]
    fn sizes_stay_whole_kv_blocks() {
        let cfg = AutopilotConfig {
            min_piece_tokens: 256,
            max_piece_tokens: 1_200,
            ..ap()
        };
        let mut c = PieceController::new(Instant::now());
        c.step(Instant::now(), reading(200.0, 20.0), &cfg);
        c.step(Instant::now(), reading(120.0, 20.0), &cfg);
        assert_eq!(c.size(), 592);
        assert!(c.size().is_multiple_of(PREFILL_PIECE_ALIGN));
    }
}
