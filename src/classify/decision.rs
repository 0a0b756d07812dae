//! The lane decision, in one place (M12, M14):
//!
//! - the **first choice**: estimated work (input tokens + output budget) `<= small_max_work` is
//!   small, `<= medium_max_work` medium, anything more large ([`LaneRules::first`]);
//! - the **continuation choice**: a "continue" chain is one piece of work, so a session's
//!   earlier output moves its next request to the first lane whose mid-stream limit is above it
//!   ([`LaneRules::for_continuation`]);
//! - the **mid-stream rules**: a request whose counted output passes its lane's
//!   `mid_stream_limit`, or whose prompt and output pass the lane's work bound, moves to the
//!   next lane, growing its reservation to that lane's work bound; before that, one whose
//!   output passes what it reserved grows its reservation in its lane to what it may hold
//!   there ([`LaneRules::bound_move`]); when the lane has no room for it it is cut (or, with
//!   `when_full = "wait"`, paused up to `wait_ms` first).
//!
//! The classifier applies the first choice, the pipeline the continuation choice, the relay the
//! mid-stream rules; all three read them from here.

use std::time::Duration;

use crate::config::{Config, WhenFull};
use crate::lane::Lane;

/// Where a request belongs and when it must move on, from config.
#[derive(Debug, Clone, Copy)]
pub struct LaneRules {
    small_max_work: u32,
    medium_max_work: u32,
    limits: [Option<u32>; 3],
    bounds: [u32; 3],
    /// Policy when the next lane is full.
    pub when_full: WhenFull,
    /// Longest pause with [`WhenFull::Wait`].
    pub wait: Duration,
}

impl LaneRules {
    /// The rules of `config`.
    pub fn from_config(config: &Config) -> Self {
        let max_len = config.upstream.max_model_len.get();
        let limit = |l: Lane| config.lanes.get(l).mid_stream_limit.map(|n| n.get());
        Self {
            small_max_work: config.classify.small_max_work.get(),
            medium_max_work: config.classify.medium_max_work.get(),
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

    /// The first choice for `work` estimated tokens: `<= small_max_work` small,
    /// `<= medium_max_work` medium, else large.
    pub fn first(&self, work: u32) -> Lane {
        if work <= self.small_max_work {
            Lane::Small
        } else if work <= self.medium_max_work {
            Lane::Medium
        } else {
            Lane::Large
        }
    }

    /// `upstream.max_model_len`: the most tokens one request's prompt and output hold.
    pub fn max_model_len(&self) -> u32 {
        self.bounds[2]
    }

    /// Largest work that is still small (`classify.small_max_work`).
    pub fn small_max_work(&self) -> u32 {
        self.small_max_work
    }

    /// Largest work that is still medium (`classify.medium_max_work`).
    pub fn medium_max_work(&self) -> u32 {
        self.medium_max_work
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

    /// What a request must do mid-stream so that its reservation covers what it holds in the
    /// engine: in `lane`, with `input` estimated prompt tokens, `produced` output tokens so far
    /// and `reserved` tokens reserved. `None`: nothing (covered; or a lane it cannot outgrow,
    /// whose output the engine caps at what was reserved, [`LaneRules::output_cap`]). Else the
    /// lane and the reservation to move to:
    /// - the next lane and its work bound, once the output passed `lane`'s mid-stream limit or
    ///   prompt and output passed `lane`'s work bound (the lane after it when they passed the
    ///   next lane's too);
    /// - `lane` itself with the most the request may hold there (its prompt plus the lane's
    ///   limit, at most the work bound), once prompt and output passed what it reserved (a
    ///   client that sent no max tokens is reserved `default_output_tokens`, which may be less
    ///   than the limit).
    pub fn bound_move(
        &self,
        lane: Lane,
        input: u32,
        produced: u32,
        reserved: u32,
    ) -> Option<(Lane, u32)> {
        let next = Self::next(lane)?;
        let limit = self.limit(lane)?;
        let holds = input.saturating_add(produced);
        let bound = self.bounds[lane.index()];
        if self.outgrown(lane, produced) || holds > bound {
            // Straight to the first lane that holds it: one it has outgrown already (a prompt
            // counted far past its estimate) is no stop on the way, where a full lane would
            // cut it though the one it needs has room.
            let mut to = next;
            while holds > self.bounds[to.index()] || self.outgrown(to, produced) {
                match Self::next(to) {
                    Some(further) => to = further,
                    None => break,
                }
            }
            return Some((to, self.bounds[to.index()]));
        }
        (holds > reserved).then(|| (lane, input.saturating_add(limit).min(bound).max(reserved)))
    }

    /// What a request in a lane it cannot outgrow (no mid-stream limit, or the last lane) must
    /// grow its reservation to once the engine counted its prompt: `counted` tokens against the
    /// `estimate` it was admitted by, `output_budget` reserved for its output (the engine's cap
    /// there, [`LaneRules::output_cap`]) and `reserved` now. `None` while the count is within
    /// [`prompt_slack`] of the estimate (an estimate is a fitted line, about as often a little
    /// under as over), or the reservation already holds it. Else `lane` and the prompt as
    /// counted plus the output budget, at most `max_model_len`; or, when that passes the lane's
    /// work bound and a lane follows, the next lane and its bound.
    pub fn prompt_growth(
        &self,
        lane: Lane,
        estimate: u32,
        counted: u32,
        output_budget: u32,
        reserved: u32,
    ) -> Option<(Lane, u32)> {
        let next = Self::next(lane);
        if (next.is_some() && self.limit(lane).is_some())
            || counted <= estimate.saturating_add(prompt_slack(estimate))
        {
            return None;
        }
        let holds = counted
            .saturating_add(output_budget)
            .min(self.max_model_len());
        match next {
            // Past the lane's work bound (a lane without a mid-stream limit): the next lane, as
            // a request that outgrew it by its output.
            Some(next) if holds > self.bounds[lane.index()] => {
                Some((next, self.bounds[next.index()]))
            }
            _ => (holds > reserved).then_some((lane, holds)),
        }
    }

    /// The output limit to send vLLM for a request the client gave none, placed in `lane` with
    /// `input` tokens and `output_budget` reserved, so that its reservation always covers what
    /// the engine may generate:
    /// - a lane it cannot outgrow (no mid-stream limit, or the last lane) keeps the reservation
    ///   it was admitted with: the cap is `output_budget`;
    /// - otherwise it is promoted as it grows, and the reservation becomes each next lane's work
    ///   bound; the cap is the bound of the lane where promotions stop, less the input (`None`
    ///   for the large lane, whose bound is `max_model_len`: vLLM's own limit).
    pub fn output_cap(&self, lane: Lane, input: u32, output_budget: u32) -> Option<u32> {
        let mut last = lane;
        while self.limit(last).is_some() {
            match Self::next(last) {
                Some(next) => last = next,
                None => break,
            }
        }
        if last == lane {
            Some(output_budget)
        } else if last == Lane::Large {
            None
        } else {
            Some(self.bounds[last.index()].saturating_sub(input).max(1))
        }
    }

    /// The first lane at or after `lane` whose limit is above `session_output` (continuations:
    /// a session's earlier output counts toward where its next request belongs).
    pub fn for_continuation(&self, lane: Lane, session_output: u64) -> Lane {
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

/// How far the engine's count of a prompt may pass its estimate before a request in a lane it
/// cannot outgrow grows its reservation: a quarter, and 64 tokens (a request counted four times
/// short is grown, or cut when there is no room; one an honest estimate missed by a few
/// percent is not cut for it).
pub fn prompt_slack(estimate: u32) -> u32 {
    (estimate / 4).saturating_add(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt the engine counted well past its estimate grows the reservation of a request in
    /// the large lane to what it holds; within the slack, or already held, nothing.
    #[test]
    fn a_prompt_counted_far_past_its_estimate_grows_a_large_reservation() {
        let r = LaneRules::from_config(&Config::default());
        // Estimated 975, reserved 975 + 200; the engine counted 3,950.
        assert_eq!(
            r.prompt_growth(Lane::Large, 975, 3_950, 200, 1_175),
            Some((Lane::Large, 4_150))
        );
        assert_eq!(r.prompt_growth(Lane::Large, 975, 3_950, 200, 4_150), None);
        // Within a quarter and 64 tokens: an honest estimate's miss.
        assert_eq!(
            r.prompt_growth(Lane::Large, 8_000, 10_064, 500, 8_500),
            None
        );
        assert!(r
            .prompt_growth(Lane::Large, 8_000, 10_065, 500, 8_500)
            .is_some());
        // A lane without a mid-stream limit that the count outgrows: the next lane.
        let mut c = Config::default();
        c.lanes.small.mid_stream_limit = None;
        let unlimited = LaneRules::from_config(&c);
        assert_eq!(
            unlimited.prompt_growth(Lane::Small, 975, 3_950, 200, 1_175),
            Some((Lane::Medium, 5_000))
        );
        assert_eq!(
            unlimited.prompt_growth(Lane::Small, 300, 800, 200, 500),
            Some((Lane::Small, 1_000))
        );
        // A lane it can outgrow moves it instead (`bound_move`, by the count).
        assert_eq!(r.prompt_growth(Lane::Small, 300, 900, 200, 500), None);
        assert_eq!(
            r.bound_move(Lane::Small, 1_300, 1, 500),
            Some((Lane::Medium, 5_000))
        );
        // Counted past medium's bound too: straight to large, not through medium.
        assert_eq!(
            r.bound_move(Lane::Small, 6_000, 1, 500),
            Some((Lane::Large, 16_384))
        );
        // Never past the model's length.
        assert_eq!(
            r.prompt_growth(Lane::Large, 1_000, 16_000, 4_000, 5_000),
            Some((Lane::Large, 16_384))
        );
    }

    #[test]
    fn work_thresholds_pick_the_first_lane() {
        let r = LaneRules::from_config(&Config::default());
        assert_eq!(r.first(1200), Lane::Small);
        assert_eq!(r.first(1201), Lane::Medium);
        assert_eq!(r.first(5000), Lane::Medium);
        assert_eq!(r.first(5001), Lane::Large);
    }

    #[test]
    fn shipped_limits_promote_small_at_256_and_medium_at_2048() {
        let p = LaneRules::from_config(&Config::default());
        assert!(!p.outgrown(Lane::Small, 256));
        assert!(p.outgrown(Lane::Small, 257));
        assert!(p.outgrown(Lane::Medium, 2049));
        assert!(!p.outgrown(Lane::Large, 100_000));
        assert_eq!(p.reservation(Lane::Medium), 5000);
        assert_eq!(p.reservation(Lane::Large), 16384);
    }

    /// A medium request without max tokens, reserved its prompt and `default_output_tokens`
    /// (512), may produce up to medium's limit (2,048) in medium: past 512 its reservation grows
    /// to what it may hold there, its prompt and the limit (at most medium's work bound); past
    /// the limit, or past the work bound, it moves to large with large's bound.
    #[test]
    fn a_reservation_grows_in_its_lane_before_the_request_outgrows_it() {
        let p = LaneRules::from_config(&Config::default());
        let (input, reserved) = (2_000, 2_000 + 512);
        assert_eq!(p.bound_move(Lane::Medium, input, 512, reserved), None);
        assert_eq!(
            p.bound_move(Lane::Medium, input, 513, reserved),
            Some((Lane::Medium, 2_000 + 2_048))
        );
        assert_eq!(p.bound_move(Lane::Medium, input, 2_048, 4_048), None);
        assert_eq!(
            p.bound_move(Lane::Medium, input, 2_049, 4_048),
            Some((Lane::Large, 16_384))
        );
        // A long prompt reaches medium's work bound (5,000) before the limit.
        assert_eq!(
            p.bound_move(Lane::Medium, 4_000, 600, 4_512),
            Some((Lane::Medium, 5_000))
        );
        assert_eq!(
            p.bound_move(Lane::Medium, 4_000, 1_001, 5_000),
            Some((Lane::Large, 16_384))
        );
        // Large cannot be outgrown: the engine caps it at what it reserved.
        assert_eq!(p.bound_move(Lane::Large, 9_000, 7_000, 9_512), None);
    }

    #[test]
    fn every_lane_has_an_output_bound_its_reservation_covers() {
        let mut config = Config::default();
        let p = LaneRules::from_config(&config);
        // Small and medium are promoted up to large, whose reservation is max_model_len.
        assert_eq!(p.output_cap(Lane::Small, 300, 512), None);
        assert_eq!(p.output_cap(Lane::Medium, 3000, 512), None);
        // Large cannot grow: what it reserved is what it may generate.
        assert_eq!(p.output_cap(Lane::Large, 9000, 512), Some(512));
        // Medium without a mid-stream limit keeps its reservation; small is promoted into it
        // and may use medium's whole work bound.
        config.lanes.medium.mid_stream_limit = None;
        let p = LaneRules::from_config(&config);
        assert_eq!(p.output_cap(Lane::Medium, 3000, 512), Some(512));
        assert_eq!(p.output_cap(Lane::Small, 300, 512), Some(5000 - 300));
    }

    #[test]
    fn a_continue_chain_moves_up_once_its_output_passes_the_limit() {
        let p = LaneRules::from_config(&Config::default());
        // Ten 100-token answers in one session: requests 1-3 see 0, 100, 200 tokens before them.
        let lanes: Vec<Lane> = (0..10)
            .map(|i| p.for_continuation(Lane::Small, i * 100))
            .collect();
        assert_eq!(&lanes[..3], &[Lane::Small; 3]);
        assert_eq!(
            lanes[3],
            Lane::Medium,
            "the fourth request: 300 tokens already > 256"
        );
        assert_eq!(p.for_continuation(Lane::Small, 5000), Lane::Large);
        assert_eq!(p.for_continuation(Lane::Large, 0), Lane::Large);
    }
}
