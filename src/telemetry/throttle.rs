//! A log line written at most once a period from one place, with how many were held back:
//! for failures that repeat once per request during an outage (a Redis that answers with
//! errors), where one line a second says as much as thousands.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One call site's allowance.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    /// Lines held back since the last written, and when the next may be written.
    state: Mutex<(u64, Option<Instant>)>,
}

impl Throttle {
    /// At most one line each `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((0, None)),
        }
    }

    /// `Some(held_back)`: write the line now, `held_back` lines were held back since the last;
    /// `None`: hold this one back.
    pub fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if state.1.is_some_and(|next| now < next) {
            state.0 = state.0.saturating_add(1);
            return None;
        }
        let held = std::mem::take(&mut state.0);
        state.1 = Some(now + self.every);
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_a_period_and_the_count_of_those_held_back() {
        let hour = Throttle::new(Duration::from_secs(3600));
        assert_eq!(hour.allow(), Some(0));
        for _ in 0..5 {
            assert_eq!(hour.allow(), None);
        }
        let short = Throttle::new(Duration::from_millis(1));
        assert_eq!(short.allow(), Some(0));
        let _ = short.allow();
        std::thread::sleep(Duration::from_millis(5));
        // The period is over: written, with the one held back (if the machine was slow enough
        // for the second call to come after the period, none was).
        assert!(matches!(short.allow(), Some(0 | 1)));
    }
}
