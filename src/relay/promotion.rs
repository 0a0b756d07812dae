//! Mid-stream lane limits (M14): a request whose counted output passes its lane's
//! `mid_stream_limit` moves to the next lane, growing its reservation to that lane's work bound;
//! when the next lane has no room it is cut (or, with `when_full = "wait"`, paused up to
//! `wait_ms` for room first).

use std::time::Duration;

use crate::classify::Lane;
use crate::config::{Config, WhenFull};

/// The promotion rules, from config.
#[derive(Debug, Clone, Copy)]
pub struct Promotion {
    limits: [Option<u32>; 3],
    bounds: [u32; 3],
    /// Policy when the next lane is full.
    pub when_full: WhenFull,
    /// Longest pause with [`WhenFull::Wait`].
    pub wait: Duration,
}

impl Promotion {
    /// The rules of `config`.
    pub fn from_config(config: &Config) -> Self {
        let max_len = config.upstream.max_model_len.get();
        let limit = |l: Lane| config.lanes.get(l).mid_stream_limit.map(|n| n.get());
        Self {
            limits: [limit(Lane::Small), limit(Lane::Medium), limit(Lane::Large)],
            bounds: [
                config.classify.small_max_work.get().min(max_len),
                config.classify.medium_max_work.get().min(max_len),
                max_len,
            ],
            when_full: config.promotion.when_full,
            wait: config.promotion.wait,
        }
    }

    /// Output tokens `lane` allows before a request must move on; `None`: no limit.
    pub fn limit(&self, lane: Lane) -> Option<u32> {
        self.limits[lane.index()]
    }

    /// The reservation a request gets when promoted into `lane`: the lane's work bound.
    pub fn reservation(&self, lane: Lane) -> u32 {
        self.bounds[lane.index()]
    }

    /// The lane after `lane`, if any.
    pub fn next(lane: Lane) -> Option<Lane> {
        match lane {
            Lane::Small => Some(Lane::Medium),
            Lane::Medium => Some(Lane::Large),
            Lane::Large => None,
        }
    }

    /// Whether `produced` output tokens have outgrown `lane`.
    pub fn outgrown(&self, lane: Lane, produced: u32) -> bool {
        self.limit(lane).is_some_and(|l| produced > l) && Self::next(lane).is_some()
    }

    /// The first lane at or after `lane` whose limit is above `session_output` (continuations:
    /// a session's earlier output counts toward where its next request belongs).
    pub fn lane_for_session(&self, lane: Lane, session_output: u64) -> Lane {
        let mut lane = lane;
        while let Some(limit) = self.limit(lane) {
            if session_output < u64::from(limit) {
                break;
            }
            match Self::next(lane) {
                Some(next) => lane = next,
                None => break,
            }
        }
        lane
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_limits_promote_small_at_256_and_medium_at_2048() {
        let p = Promotion::from_config(&Config::default());
        assert!(!p.outgrown(Lane::Small, 256));
        assert!(p.outgrown(Lane::Small, 257));
        assert!(p.outgrown(Lane::Medium, 2049));
        assert!(!p.outgrown(Lane::Large, 100_000));
        assert_eq!(p.reservation(Lane::Medium), 5000);
        assert_eq!(p.reservation(Lane::Large), 16384);
    }

    #[test]
    fn a_continue_chain_moves_up_once_its_output_passes_the_limit() {
        let p = Promotion::from_config(&Config::default());
        // Ten 100-token answers in one session: requests 1-3 see 0, 100, 200 tokens before them.
        let lanes: Vec<Lane> = (0..10)
            .map(|i| p.lane_for_session(Lane::Small, i * 100))
            .collect();
        assert_eq!(&lanes[..3], &[Lane::Small; 3]);
        assert_eq!(
            lanes[3],
            Lane::Medium,
            "the fourth request: 300 tokens already > 256"
        );
        assert_eq!(p.lane_for_session(Lane::Small, 5000), Lane::Large);
        assert_eq!(p.lane_for_session(Lane::Large, 0), Lane::Large);
    }
}
