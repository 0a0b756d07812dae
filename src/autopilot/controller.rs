//! The pacing rule, apart from any clock or gateway so each rule has its own test: additive
//! increase, multiplicative decrease (AIMD) on the two knobs that shape how much long work the
//! engine takes at once, the prefill budget and the large lane's seats.
//!
//! - **Tighten** when any lane with an objective misses it (its measured quantile over the
//!   window above its target; the autopilot's window here is the first tokens since any knob
//!   last moved, `judged_span` in `mod.rs`): both knobs are multiplied by
//!   `(100 - tighten_percent) / 100` (default: halved), never below their floors, then held
//!   for `hold` (first tokens admitted before the change still arrive; without the hold it
//!   would tighten again on old news).
//! - **Loosen** when every judged objective holds with headroom (measured below
//!   `headroom_percent` of the target) **on the first tokens since the last change** (at least
//!   `min_samples` of them) and no hold is running: the budget grows by
//!   `loosen_prefill_tokens`, the seats by `loosen_large_seats`, never above the configured
//!   values. Each size is judged on what it did, never on the window's older samples: a
//!   window still full of the tight period's good first tokens once loosened every look, all
//!   the way back to the configured values in ten seconds, and the objective was missed again
//!   twenty seconds later (a sawtooth of 30-60 s, measured with a 100 ms objective). So
//!   loosening is slow (one step per `min_samples` new first tokens at most) and stops where
//!   the first tokens lose their headroom.
//! - **Rescue** reviews first: when the large lane is starving (the last request in its queue
//!   is predicted to wait more than `max_large_wait_ms` at its recent admission rate, or
//!   nothing was admitted lately while requests wait), both knobs grow by one loosening step, whatever the
//!   objectives say, and no tightening happens. Reviews are never refused for a question's
//!   objective; the objective may then be missed, and the metrics say so.
//! - Otherwise (between headroom and the target, or no lane with `min_samples` in the
//!   window) nothing changes.
//!
//! Why it is stable: a decrease is proportional and an increase constant, so from any
//! start the knobs settle into a sawtooth just below the value where the objective is missed
//! (the classic AIMD argument: multiplicative decrease converges, additive increase probes);
//! the hold keeps the loop from reacting twice to one measurement; the headroom band keeps it
//! from probing while the objective is close. The floors (`min_large_seats` at least 1, a
//! prefill budget of at least one long prompt) mean reviews always progress.

use std::time::Duration;

use tokio::time::Instant;

/// The two knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// The prefill budget, tokens (0: the budget is off and stays off).
    pub prefill_budget: u64,
    /// The large lane's seats (its reservation and ceiling).
    pub large_seats: u32,
}

/// Where the knobs may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The floors.
    pub min: Pace,
    /// The configured values: the ceiling.
    pub max: Pace,
}

impl Bounds {
    /// `p` moved inside the bounds.
    pub fn clamp(&self, p: Pace) -> Pace {
        Pace {
            prefill_budget: p
                .prefill_budget
                .clamp(self.min.prefill_budget, self.max.prefill_budget),
            large_seats: p
                .large_seats
                .clamp(self.min.large_seats, self.max.large_seats),
        }
    }
}

/// The gains.
#[derive(Debug, Clone, Copy)]
pub struct Gains {
    /// Percent taken off on a miss.
    pub tighten_percent: u32,
    /// Budget added per look while the objectives hold with headroom.
    pub loosen_prefill_tokens: u64,
    /// Seats added per look while the objectives hold with headroom.
    pub loosen_large_seats: u32,
    /// Percent of the target under which an objective holds with headroom.
    pub headroom_percent: u32,
    /// No change for this long after a tightening.
    pub hold: Duration,
}

/// What a look measured: the largest measured-quantile-to-target ratio over the lanes judged,
/// over the whole window (`window`; what a tightening reacts to) and over the first tokens
/// since the last change (`since_change`; what a loosening needs). `None`: no lane had
/// `min_samples` there.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Reading {
    /// Over the window.
    pub window: Option<f64>,
    /// Over the first tokens since the last change.
    pub since_change: Option<f64>,
}

impl From<Option<f64>> for Reading {
    /// The same ratio over the window and since the last change.
    fn from(worst: Option<f64>) -> Self {
        Self {
            window: worst,
            since_change: worst,
        }
    }
}

/// What one look decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// An objective was missed: the knobs went down.
    Tighten,
    /// An objective was missed with the knobs already at their floors.
    AtFloor,
    /// Every objective held with headroom: the knobs went up.
    Loosen,
    /// The large lane was starving: the knobs went up whatever the objectives.
    Rescue,
    /// Nothing changed.
    Hold,
}

impl Step {
    /// The metric label of a step that changed something, or was stopped by a floor.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Step::Tighten => Some("tighten"),
            Step::AtFloor => Some("at_floor"),
            Step::Loosen => Some("loosen"),
            Step::Rescue => Some("rescue"),
            Step::Hold => None,
        }
    }
}

/// The controller's state: the knobs in force and the hold.
#[derive(Debug, Clone)]
pub struct Controller {
    pace: Pace,
    held_until: Option<Instant>,
    changed_at: Option<Instant>,
}

impl Controller {
    /// Starts at the configured values (`bounds.max`): with objectives met, nothing changes.
    pub fn new(bounds: Bounds) -> Self {
        Self {
            pace: bounds.max,
            held_until: None,
            changed_at: None,
        }
    }

    /// When the knobs last moved (`None`: never).
    pub fn changed_at(&self) -> Option<Instant> {
        self.changed_at
    }

    /// The knobs in force.
    pub fn pace(&self) -> Pace {
        self.pace
    }

    /// One look at `now`: `reading` is what the objectives measured ([`Reading`]; a plain
    /// `Option<f64>` is the same ratio over the window and since the last change); `starving` whether the large lane's
    /// queue is not draining (see the module doc). `bounds` may have moved (a reload): the
    /// knobs are brought within them first.
    pub fn step(
        &mut self,
        now: Instant,
        reading: impl Into<Reading>,
        starving: bool,
        bounds: Bounds,
        gains: Gains,
    ) -> Step {
        let step = self.decide(now, reading.into(), starving, bounds, gains);
        if matches!(step, Step::Tighten | Step::Loosen | Step::Rescue) {
            self.changed_at = Some(now);
        }
        step
    }

    fn decide(
        &mut self,
        now: Instant,
        reading: Reading,
        starving: bool,
        bounds: Bounds,
        gains: Gains,
    ) -> Step {
        self.pace = bounds.clamp(self.pace);
        if starving {
            let next = self.loosened(bounds, gains);
            if next == self.pace {
                return Step::Hold;
            }
            self.pace = next;
            return Step::Rescue;
        }
        let Some(worst) = reading.window else {
            return Step::Hold;
        };
        let held = self.held_until.is_some_and(|until| now < until);
        if worst > 1.0 {
            if held {
                return Step::Hold;
            }
            // Without overflow for any budget (`prefill_budget_tokens` has no upper bound).
            let keep = |v: u64| {
                let k = u64::from(100 - gains.tighten_percent.min(99));
                v / 100 * k + v % 100 * k / 100
            };
            let next = bounds.clamp(Pace {
                prefill_budget: keep(self.pace.prefill_budget),
                large_seats: u32::try_from(keep(u64::from(self.pace.large_seats)))
                    .unwrap_or(u32::MAX),
            });
            self.held_until = Some(now + gains.hold);
            if next == self.pace {
                return Step::AtFloor;
            }
            self.pace = next;
            return Step::Tighten;
        }
        let headroom = |w: f64| w * 100.0 < f64::from(gains.headroom_percent);
        if held || !headroom(worst) || !reading.since_change.is_some_and(headroom) {
            return Step::Hold;
        }
        let next = self.loosened(bounds, gains);
        if next == self.pace {
            return Step::Hold;
        }
        self.pace = next;
        Step::Loosen
    }

    /// The knobs one loosening step up, within `bounds`.
    fn loosened(&self, bounds: Bounds, gains: Gains) -> Pace {
        bounds.clamp(Pace {
            prefill_budget: self
                .pace
                .prefill_budget
                .saturating_add(gains.loosen_prefill_tokens),
            large_seats: self
                .pace
                .large_seats
                .saturating_add(gains.loosen_large_seats),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        min: Pace {
            prefill_budget: 2_048,
            large_seats: 1,
        },
        max: Pace {
            prefill_budget: 12_288,
            large_seats: 10,
        },
    };

    fn gains() -> Gains {
        Gains {
            tighten_percent: 50,
            loosen_prefill_tokens: 1_024,
            loosen_large_seats: 1,
            headroom_percent: 80,
            hold: Duration::from_secs(5),
        }
    }

    /// `admission.prefill_budget_tokens` has no upper bound: a budget near `u64::MAX` is
    /// halved, not overflowed (a panic, or a wrap to the floor).
    #[test]
    fn a_huge_budget_is_tightened_without_overflow() {
        let huge = Bounds {
            min: BOUNDS.min,
            max: Pace {
                prefill_budget: u64::MAX / 2,
                large_seats: 10,
            },
        };
        let mut c = Controller::new(huge);
        assert_eq!(
            c.step(Instant::now(), Some(1.4), false, huge, gains()),
            Step::Tighten
        );
        assert_eq!(c.pace().prefill_budget, u64::MAX / 4);
    }

    #[test]
    fn a_missed_objective_halves_both_knobs_then_holds() {
        let now = Instant::now();
        let mut c = Controller::new(BOUNDS);
        assert_eq!(
            c.step(now, Some(1.4), false, BOUNDS, gains()),
            Step::Tighten
        );
        assert_eq!(
            c.pace(),
            Pace {
                prefill_budget: 6_144,
                large_seats: 5
            }
        );
        // Still missed a second later: the window still holds the old samples.
        let later = now + Duration::from_secs(1);
        assert_eq!(c.step(later, Some(1.4), false, BOUNDS, gains()), Step::Hold);
        // After the hold, a miss tightens again.
        let after = now + Duration::from_secs(6);
        assert_eq!(
            c.step(after, Some(1.1), false, BOUNDS, gains()),
            Step::Tighten
        );
        assert_eq!(c.pace().large_seats, 2);
    }

    #[test]
    fn a_loosening_waits_for_first_tokens_since_the_last_change_and_their_headroom() {
        let mut now = Instant::now();
        let mut c = Controller::new(BOUNDS);
        c.step(now, Some(2.0), false, BOUNDS, gains());
        now += Duration::from_secs(10);
        let tight = c.pace();
        // The window (still the tight period's good first tokens) has headroom, but nothing
        // was measured since the change: no loosening.
        let not_yet = Reading {
            window: Some(0.5),
            since_change: None,
        };
        assert_eq!(c.step(now, not_yet, false, BOUNDS, gains()), Step::Hold);
        // Measured since the change without headroom: no loosening either.
        let close = Reading {
            window: Some(0.5),
            since_change: Some(0.9),
        };
        assert_eq!(c.step(now, close, false, BOUNDS, gains()), Step::Hold);
        assert_eq!(c.pace(), tight);
        // With headroom since the change: one step, and the change is dated.
        let good = Reading {
            window: Some(0.5),
            since_change: Some(0.5),
        };
        assert_eq!(c.step(now, good, false, BOUNDS, gains()), Step::Loosen);
        assert_eq!(c.changed_at(), Some(now));
        assert_eq!(c.pace().prefill_budget, tight.prefill_budget + 1_024);
    }

    #[test]
    fn the_knobs_never_go_below_their_floors() {
        let mut now = Instant::now();
        let mut c = Controller::new(BOUNDS);
        let mut steps = Vec::new();
        for _ in 0..20 {
            steps.push(c.step(now, Some(10.0), false, BOUNDS, gains()));
            now += Duration::from_secs(10);
            assert!(c.pace().large_seats >= 1 && c.pace().prefill_budget >= 2_048);
        }
        assert_eq!(c.pace(), BOUNDS.min);
        assert_eq!(steps.last(), Some(&Step::AtFloor));
    }

    #[test]
    fn objectives_met_with_headroom_loosen_step_by_step_up_to_the_configured_values() {
        let mut now = Instant::now();
        let mut c = Controller::new(BOUNDS);
        c.step(now, Some(2.0), false, BOUNDS, gains());
        now += Duration::from_secs(10);
        let before = c.pace();
        assert_eq!(c.step(now, Some(0.5), false, BOUNDS, gains()), Step::Loosen);
        assert_eq!(c.pace().large_seats, before.large_seats + 1);
        assert_eq!(c.pace().prefill_budget, before.prefill_budget + 1_024);
        for _ in 0..30 {
            now += Duration::from_secs(1);
            c.step(now, Some(0.5), false, BOUNDS, gains());
        }
        assert_eq!(c.pace(), BOUNDS.max);
        assert_eq!(c.step(now, Some(0.5), false, BOUNDS, gains()), Step::Hold);
    }

    #[test]
    fn close_to_the_objective_or_without_samples_nothing_moves() {
        let now = Instant::now();
        let mut c = Controller::new(BOUNDS);
        c.step(now, Some(3.0), false, BOUNDS, gains());
        let p = c.pace();
        let later = now + Duration::from_secs(10);
        assert_eq!(c.step(later, Some(0.9), false, BOUNDS, gains()), Step::Hold);
        assert_eq!(c.step(later, None, false, BOUNDS, gains()), Step::Hold);
        assert_eq!(c.pace(), p);
    }

    #[test]
    fn a_starving_large_lane_is_rescued_whatever_the_objectives() {
        let mut now = Instant::now();
        let mut c = Controller::new(BOUNDS);
        for _ in 0..10 {
            c.step(now, Some(5.0), false, BOUNDS, gains());
            now += Duration::from_secs(10);
        }
        assert_eq!(c.pace(), BOUNDS.min);
        // Reviews wait too long: the knobs go up though the objective is still missed.
        assert_eq!(c.step(now, Some(5.0), true, BOUNDS, gains()), Step::Rescue);
        assert_eq!(c.pace().large_seats, 2);
        assert_eq!(c.step(now, Some(5.0), true, BOUNDS, gains()), Step::Rescue);
        assert_eq!(c.pace().large_seats, 3);
        // Drained: the miss tightens again.
        now += Duration::from_secs(10);
        assert_eq!(
            c.step(now, Some(5.0), false, BOUNDS, gains()),
            Step::Tighten
        );
    }

    #[test]
    fn a_reload_that_lowers_the_ceiling_brings_the_knobs_within_it() {
        let mut c = Controller::new(BOUNDS);
        let lower = Bounds {
            max: Pace {
                prefill_budget: 4_096,
                large_seats: 3,
            },
            ..BOUNDS
        };
        c.step(Instant::now(), None, false, lower, gains());
        assert_eq!(c.pace(), lower.max);
    }
}
