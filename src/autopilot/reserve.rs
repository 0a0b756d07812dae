//! The small lane's reservation, paced to its objective (`autopilot.reserve_small_seats`).
//!
//! Under `admission.policy = "lanes"` the other lanes borrow the seats nobody uses, so when the
//! engine is full every seat is taken and a question waits for one to be given back. A seat
//! that is given back goes to the small lane first, but at the engine's full load seats come
//! back at about the rate questions arrive: their queue then behaves as a busy server's, and its
//! tail is the question's (measured at 1.2 of capacity: the small lane's queue waits, not the
//! engine's steps, made the misses; the large lane's seats and the prefill budget cannot help,
//! and the rescue keeps them up while reviews starve). The small lane's reservation is the
//! seats no other lane may borrow: raising it keeps seats free for the questions' bursts.
//!
//! - **Raise** when the small lane's objective is at risk (its measured quantile over the
//!   window above `headroom_percent` of its target) **and** its requests waited for admission
//!   at that quantile for more than the rest of the target (`100 - headroom_percent` percent):
//!   the seats are what is short, not the engine's steps. At risk, not missed: a quantile held
//!   just under its target leaves the share of first tokens within it a coin toss around the
//!   quantile (measured at 1.2 of capacity: the window's p99 at 0.8-0.98 of 500 ms for two
//!   minutes, 98.95% within 500 ms over the run), and a reservation costs the other lanes
//!   only their borrowing. The seats between the reservation and its ceiling are
//!   cut by `tighten_percent` (default: halved), then nothing changes for `hold`.
//! - **Lower** by `loosen_large_seats` while the objective holds with headroom over the window
//!   and on the first tokens since the last change (`min_samples` of them), then hold for
//!   `hold`: one step per hold at most, slower than the other knobs loosen (one per look). The
//!   bursts the reservation is for come every few seconds, not every look: given back a seat a
//!   look, it was back at the configured value within a minute of each raise and the next
//!   burst waited again (measured at 1.2 of capacity: 5 raises, 53 lowerings in 300 s).
//! - The floor is the configured reservation; the ceiling is the small lane's ceiling and the
//!   seats left by the other lanes' configured reservations (nobody's reservation is taken).
//!   The large lane's starving does not move it: the large lane never borrows, and what the
//!   reservation takes is the medium lane's borrowing.

use std::time::Duration;

use tokio::time::Instant;

/// What a look measured of the small lane's objective.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SmallReading {
    /// The objective's quantile over its target, over the window (`None`: too few samples).
    pub window: Option<f64>,
    /// The same since the reservation last moved.
    pub since_change: Option<f64>,
    /// The objective's quantile of the waits for admission over the target, over the window.
    pub waited: Option<f64>,
}

/// Where the reservation may go: the configured one up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReserveBounds {
    /// The configured reservation.
    pub min: u32,
    /// The most it may become.
    pub max: u32,
}

/// The reservation's gains (the autopilot's).
#[derive(Debug, Clone, Copy)]
pub struct ReserveGains {
    /// Percent of the seats between the reservation and its ceiling reserved on a miss.
    pub tighten_percent: u32,
    /// Seats given back per look while the objective holds with headroom.
    pub loosen_seats: u32,
    /// Percent of the target under which the objective holds with headroom; the waits must
    /// pass the rest of it for a miss to raise the reservation.
    pub headroom_percent: u32,
    /// No change for this long after a raise.
    pub hold: Duration,
}

/// What one look decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveStep {
    /// At risk, waiting for seats: the reservation went up.
    Raise,
    /// At risk, waiting for seats, with the reservation at its ceiling.
    AtCeiling,
    /// Held with headroom: the reservation went down.
    Lower,
    /// Nothing changed.
    Hold,
}

impl ReserveStep {
    /// The metric label of a step that changed something, or was stopped by the ceiling.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            ReserveStep::Raise => Some("reserve_up"),
            ReserveStep::AtCeiling => Some("reserve_at_ceiling"),
            ReserveStep::Lower => Some("reserve_down"),
            ReserveStep::Hold => None,
        }
    }
}

/// The reservation in force and its hold.
#[derive(Debug, Clone)]
pub struct Reserve {
    seats: u32,
    held_until: Option<Instant>,
    changed_at: Option<Instant>,
}

impl Reserve {
    /// Starts at the configured reservation (`bounds.min`).
    pub fn new(bounds: ReserveBounds) -> Self {
        Self {
            seats: bounds.min,
            held_until: None,
            changed_at: None,
        }
    }

    /// The reservation in force.
    pub fn seats(&self) -> u32 {
        self.seats
    }

    /// When it last moved (`None`: never).
    pub fn changed_at(&self) -> Option<Instant> {
        self.changed_at
    }

    /// One look at `now` (see the module doc). `bounds` may have moved (a reload): the
    /// reservation is brought within them first.
    pub fn step(
        &mut self,
        now: Instant,
        reading: SmallReading,
        bounds: ReserveBounds,
        gains: ReserveGains,
    ) -> ReserveStep {
        self.seats = self.seats.clamp(bounds.min, bounds.max.max(bounds.min));
        let step = self.decide(now, reading, bounds, gains);
        if matches!(step, ReserveStep::Raise | ReserveStep::Lower) {
            self.changed_at = Some(now);
        }
        step
    }

    fn decide(
        &mut self,
        now: Instant,
        reading: SmallReading,
        bounds: ReserveBounds,
        gains: ReserveGains,
    ) -> ReserveStep {
        let Some(window) = reading.window else {
            return ReserveStep::Hold;
        };
        let held = self.held_until.is_some_and(|until| now < until);
        let share = |ratio: f64| ratio * 100.0;
        let waited_for_seats = reading
            .waited
            .is_some_and(|w| share(w) > f64::from(100 - gains.headroom_percent.min(100)));
        let headroom = |r: f64| share(r) < f64::from(gains.headroom_percent);
        if !headroom(window) && waited_for_seats {
            if held {
                return ReserveStep::Hold;
            }
            self.held_until = Some(now + gains.hold);
            let free = bounds.max.saturating_sub(self.seats);
            if free == 0 {
                return ReserveStep::AtCeiling;
            }
            let cut = (u64::from(free) * u64::from(gains.tighten_percent.min(99))).div_ceil(100);
            self.seats += u32::try_from(cut).unwrap_or(free).clamp(1, free);
            return ReserveStep::Raise;
        }
        if held
            || self.seats == bounds.min
            || !headroom(window)
            || !reading.since_change.is_some_and(headroom)
        {
            return ReserveStep::Hold;
        }
        self.seats = self
            .seats
            .saturating_sub(gains.loosen_seats.max(1))
            .max(bounds.min);
        // A seat given back is judged for a whole hold before the next: the bursts the
        // reservation is for are rarer than a look.
        self.held_until = Some(now + gains.hold);
        ReserveStep::Lower
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: ReserveBounds = ReserveBounds { min: 32, max: 66 };

    fn gains() -> ReserveGains {
        ReserveGains {
            tighten_percent: 50,
            loosen_seats: 1,
            headroom_percent: 80,
            hold: Duration::from_secs(5),
        }
    }

    fn missed(waited: f64) -> SmallReading {
        SmallReading {
            window: Some(1.3),
            since_change: Some(1.3),
            waited: Some(waited),
        }
    }

    const HELD: SmallReading = SmallReading {
        window: Some(0.5),
        since_change: Some(0.5),
        waited: Some(0.0),
    };

    #[test]
    fn a_miss_spent_waiting_for_seats_halves_the_seats_others_may_borrow_then_holds() {
        let now = Instant::now();
        let mut r = Reserve::new(BOUNDS);
        assert_eq!(r.seats(), 32);
        // 34 seats between the reservation and its ceiling: half of them reserved.
        assert_eq!(
            r.step(now, missed(0.6), BOUNDS, gains()),
            ReserveStep::Raise
        );
        assert_eq!(r.seats(), 49);
        // The window still holds the samples that caused it.
        let soon = now + Duration::from_secs(1);
        assert_eq!(
            r.step(soon, missed(0.6), BOUNDS, gains()),
            ReserveStep::Hold
        );
        assert_eq!(r.seats(), 49);
        let later = now + Duration::from_secs(6);
        assert_eq!(
            r.step(later, missed(0.6), BOUNDS, gains()),
            ReserveStep::Raise
        );
        assert_eq!(r.seats(), 58);
        // Never above the ceiling.
        let mut at = later;
        for _ in 0..10 {
            at += Duration::from_secs(6);
            r.step(at, missed(0.6), BOUNDS, gains());
            assert!(r.seats() <= BOUNDS.max);
        }
        assert_eq!(r.seats(), BOUNDS.max);
        at += Duration::from_secs(6);
        assert_eq!(
            r.step(at, missed(0.6), BOUNDS, gains()),
            ReserveStep::AtCeiling
        );
    }

    #[test]
    fn an_objective_at_risk_raises_it_too_and_one_with_headroom_does_not() {
        let now = Instant::now();
        let mut r = Reserve::new(BOUNDS);
        let at_risk = SmallReading {
            window: Some(0.9),
            since_change: Some(0.9),
            waited: Some(0.5),
        };
        assert_eq!(r.step(now, at_risk, BOUNDS, gains()), ReserveStep::Raise);
        let mut r = Reserve::new(BOUNDS);
        let with_headroom = SmallReading {
            window: Some(0.7),
            since_change: Some(0.7),
            waited: Some(0.5),
        };
        assert_eq!(
            r.step(now, with_headroom, BOUNDS, gains()),
            ReserveStep::Hold
        );
        assert_eq!(r.seats(), BOUNDS.min);
    }

    #[test]
    fn a_miss_that_did_not_wait_for_seats_leaves_the_seats_to_the_others() {
        let now = Instant::now();
        let mut r = Reserve::new(BOUNDS);
        // Waits of at most a fifth of the target (the headroom's share): the engine's steps
        // made the miss, and reserved seats would only stand idle.
        assert_eq!(r.step(now, missed(0.2), BOUNDS, gains()), ReserveStep::Hold);
        assert_eq!(
            r.step(
                now,
                SmallReading {
                    waited: None,
                    ..missed(0.0)
                },
                BOUNDS,
                gains()
            ),
            ReserveStep::Hold
        );
        assert_eq!(r.seats(), BOUNDS.min);
    }

    #[test]
    fn the_reservation_comes_back_down_a_seat_a_hold_while_the_objective_holds_with_headroom() {
        let mut now = Instant::now();
        let mut r = Reserve::new(BOUNDS);
        r.step(now, missed(0.9), BOUNDS, gains());
        let raised = r.seats();
        // In the hold: nothing.
        now += Duration::from_secs(1);
        assert_eq!(r.step(now, HELD, BOUNDS, gains()), ReserveStep::Hold);
        now += Duration::from_secs(5);
        // Not measured since the change, or close to the target: nothing.
        let unmeasured = SmallReading {
            since_change: None,
            ..HELD
        };
        assert_eq!(r.step(now, unmeasured, BOUNDS, gains()), ReserveStep::Hold);
        let close = SmallReading {
            window: Some(0.9),
            since_change: Some(0.9),
            waited: Some(0.0),
        };
        assert_eq!(r.step(now, close, BOUNDS, gains()), ReserveStep::Hold);
        assert_eq!(r.seats(), raised);
        assert_eq!(r.step(now, HELD, BOUNDS, gains()), ReserveStep::Lower);
        assert_eq!(r.seats(), raised - 1);
        assert_eq!(r.changed_at(), Some(now));
        // The next seat a hold later, not at the next look.
        let soon = now + Duration::from_secs(1);
        assert_eq!(r.step(soon, HELD, BOUNDS, gains()), ReserveStep::Hold);
        now += Duration::from_secs(5);
        assert_eq!(r.step(now, HELD, BOUNDS, gains()), ReserveStep::Lower);
        assert_eq!(r.seats(), raised - 2);
        for _ in 0..100 {
            now += Duration::from_secs(5);
            r.step(now, HELD, BOUNDS, gains());
            assert!(r.seats() >= BOUNDS.min);
        }
        assert_eq!(r.seats(), BOUNDS.min);
        assert_eq!(r.step(now, HELD, BOUNDS, gains()), ReserveStep::Hold);
    }

    #[test]
    fn a_reload_brings_the_reservation_within_its_new_bounds() {
        let now = Instant::now();
        let mut r = Reserve::new(BOUNDS);
        r.step(now, missed(0.9), BOUNDS, gains());
        let narrower = ReserveBounds { min: 32, max: 40 };
        r.step(now, SmallReading::default(), narrower, gains());
        assert_eq!(r.seats(), 40);
        let wider_floor = ReserveBounds { min: 45, max: 66 };
        r.step(now, SmallReading::default(), wider_floor, gains());
        assert_eq!(r.seats(), 45);
    }
}
