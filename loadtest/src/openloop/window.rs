//! A run's phases in simulated seconds (warm-up, window, drain) and the speed factor that maps
//! them onto the wall clock: a leaf, shared by the drive and the backlog.

use std::time::Duration;

/// The run's phases, simulated seconds, and the speed factor that maps them onto the wall clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// The simulator's speed factor F: a simulated second lasts 1/F s of wall clock.
    pub speed: f64,
    /// Arrivals before this are not counted.
    pub warmup_s: f64,
    /// Arrivals in `[warmup_s, warmup_s + window_s)` are counted.
    pub window_s: f64,
    /// After the window, how long counted requests still in flight get before they are cut.
    pub drain_s: f64,
}

impl Window {
    /// Whether an arrival at `at_s` counts.
    pub fn counts(&self, at_s: f64) -> bool {
        at_s >= self.warmup_s && at_s < self.warmup_s + self.window_s
    }

    /// Wall-clock length of `sim_s` simulated seconds.
    pub fn wall(&self, sim_s: f64) -> Duration {
        Duration::from_secs_f64((sim_s / self.speed).max(0.0))
    }

    /// Where arrivals stop being generated: the window's end plus the drain.
    pub fn horizon_s(&self) -> f64 {
        self.warmup_s + self.window_s + self.drain_s
    }
}
