//! The engine bound: for each question, the earliest first token any admission scheduler could
//! give it on this engine at this load, read from the simulator's step records.
//!
//! A request that arrives while a step runs cannot join that step (vLLM plans a step's batch
//! before it runs: `Scheduler.schedule` in `vllm/v1/core/sched/scheduler.py`); its prompt is
//! computed in the next step at the earliest and its first token comes at that step's end. So
//! for an arrival at `a` (the client's send instant on the engine's clock,
//! `sent - Engine::epoch()`):
//!
//! - inside step `s` (`start_s <= a < end_s`): `bound = (end_s - a) + duration_s`: the rest of
//!   the running step, then one step as long as the engine's steps were then;
//! - between steps (the engine idle, or in the instant between two steps): one step as long as
//!   the next step the engine ran (`duration_next`). An engine that was idle plans a step as
//!   soon as a request arrives, and that step carries the question's own prompt; no waiting for
//!   the gap is counted, since a scheduler could have started at once;
//! - no step after `a` in the records (the run's very end): one step of the run's median length.
//!
//! Step records carry wall-clock microseconds (after `--speed`); [`summarize`] converts to
//! simulated seconds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vllm_sim::engine::stats::StepRecord;
use vllm_sim::engine::Engine;

use crate::stats::quantile;

/// Every step of a run, each once, gathered from the simulator's window of recent steps
/// (4,096 kept) by reading it often enough; steps that fell out of the window between two
/// reads are counted as `lost`.
#[derive(Debug, Default)]
pub struct StepLog {
    steps: BTreeMap<u64, StepRecord>,
    last: u64,
    /// Steps never seen (the window moved past them between two reads).
    pub lost: u64,
}

impl StepLog {
    /// Adds `recent` (the engine's recent steps, oldest first; step numbers from 1).
    pub fn add(&mut self, recent: Vec<StepRecord>) {
        let fresh: Vec<StepRecord> = recent.into_iter().filter(|s| s.step > self.last).collect();
        if let Some(first) = fresh.first() {
            self.lost += first.step - self.last - 1;
        }
        for s in fresh {
            self.last = self.last.max(s.step);
            self.steps.insert(s.step, s);
        }
    }

    /// Reads `engine`'s recent steps.
    pub fn collect(&mut self, engine: &Engine) {
        self.add(engine.recent_steps());
    }

    /// The steps, in order.
    pub fn steps(&self) -> Vec<StepRecord> {
        self.steps.values().cloned().collect()
    }
}

/// Where an arrival fell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Inside a step.
    InStep,
    /// Between two steps or on an idle engine: the next step's length.
    Between,
    /// After the last recorded step: the median step.
    AfterLast,
}

/// The bound, in the steps' microseconds, for an arrival at `a_us` on the engine's clock.
/// `steps` in order (by start); `median_us`: the run's median step, used after the last step.
pub fn bound_us(steps: &[StepRecord], a_us: u64, median_us: u64) -> (u64, Case) {
    let i = steps.partition_point(|s| s.start_us <= a_us);
    if i > 0 {
        let s = &steps[i - 1];
        if a_us < s.end_us {
            return ((s.end_us - a_us) + s.duration_us, Case::InStep);
        }
    }
    match steps.get(i) {
        Some(next) => (next.duration_us, Case::Between),
        None => (median_us, Case::AfterLast),
    }
}

/// The engine bound over a run's questions, simulated seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoundSummary {
    /// Questions it was computed for.
    pub questions: u64,
    /// Of them, arrivals inside a step.
    pub in_step: u64,
    /// Between steps or on an idle engine.
    pub between_steps: u64,
    /// After the last recorded step.
    pub after_last: u64,
    /// Median bound.
    pub p50_s: Option<f64>,
    /// 95th percentile.
    pub p95_s: Option<f64>,
    /// 99th percentile.
    pub p99_s: Option<f64>,
}

/// The bound of every arrival in `arrivals_us` (engine clock, wall microseconds) against
/// `steps`, in simulated seconds (wall x `speed`).
pub fn summarize(steps: &[StepRecord], arrivals_us: &[u64], speed: f64) -> BoundSummary {
    let mut sorted: Vec<StepRecord> = steps.to_vec();
    sorted.sort_by_key(|s| s.start_us);
    let mut d: Vec<u64> = sorted.iter().map(|s| s.duration_us).collect();
    d.sort_unstable();
    let median = d.get(d.len().saturating_sub(1) / 2).copied().unwrap_or(0);
    let mut out = BoundSummary::default();
    let mut v = vec![];
    for &a in arrivals_us {
        let (b, case) = bound_us(&sorted, a, median);
        match case {
            Case::InStep => out.in_step += 1,
            Case::Between => out.between_steps += 1,
            Case::AfterLast => out.after_last += 1,
        }
        v.push(b as f64 / 1e6 * speed);
    }
    out.questions = v.len() as u64;
    out.p50_s = quantile(&mut v, 0.50);
    out.p95_s = quantile(&mut v, 0.95);
    out.p99_s = quantile(&mut v, 0.99);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, start_us: u64, end_us: u64, duration_us: u64) -> StepRecord {
        StepRecord {
            step,
            prefill_tokens: 0,
            prefill_seqs: 0,
            max_chunk: 0,
            decode_seqs: 1,
            running: 1,
            waiting: 0,
            free_blocks: 0,
            preempted: 0,
            duration_us,
            late_us: 0,
            start_us,
            end_us,
        }
    }

    /// Steps 1-3 back to back from 1,000 us (20 ms, 30 ms, 10 ms), an idle gap, then a 50 ms step.
    fn steps() -> Vec<StepRecord> {
        vec![
            step(1, 1_000, 21_000, 20_000),
            step(2, 21_000, 51_000, 30_000),
            step(3, 51_000, 61_000, 10_000),
            step(4, 500_000, 550_000, 50_000),
        ]
    }

    #[test]
    fn mid_step_waits_for_the_rest_then_one_step() {
        let s = steps();
        // 5 ms into the 30 ms step 2: 25 ms left + 30 ms.
        assert_eq!(bound_us(&s, 26_000, 1), (55_000, Case::InStep));
        // At a step's very start it cannot join it: the whole step + one more.
        assert_eq!(bound_us(&s, 21_000, 1), (60_000, Case::InStep));
        // The instant step 2 ends, step 3 starts: inside step 3, 10 ms + 10 ms.
        assert_eq!(bound_us(&s, 51_000, 1), (20_000, Case::InStep));
        // One microsecond before the end of step 1.
        assert_eq!(bound_us(&s, 20_999, 1), (20_001, Case::InStep));
    }

    #[test]
    fn idle_engine_and_edges() {
        let s = steps();
        // Idle between 61 ms and 500 ms: one step as long as the next (50 ms).
        assert_eq!(bound_us(&s, 100_000, 7), (50_000, Case::Between));
        // At the end of the last step before the gap: idle too.
        assert_eq!(bound_us(&s, 61_000, 7), (50_000, Case::Between));
        // Before the first step: the first step's length.
        assert_eq!(bound_us(&s, 0, 7), (20_000, Case::Between));
        // After the last step: the median.
        assert_eq!(bound_us(&s, 600_000, 7), (7, Case::AfterLast));
        assert_eq!(bound_us(&[], 5, 7), (7, Case::AfterLast));
    }

    #[test]
    fn summary_in_simulated_seconds() {
        let s = steps();
        // Wall microseconds at speed 2: simulated time is twice as long.
        let b = summarize(&s, &[26_000, 100_000, 600_000], 2.0);
        assert_eq!(
            (b.questions, b.in_step, b.between_steps, b.after_last),
            (3, 1, 1, 1)
        );
        // Bounds 55 ms, 50 ms and the median step (20 ms: of 10, 20, 30, 50 the lower middle) x 2.
        let near = |x: Option<f64>, y: f64| (x.unwrap() - y).abs() < 1e-12;
        assert!(near(b.p50_s, 0.1), "{b:?}");
        assert!(near(b.p99_s, 0.11), "{b:?}");
        assert_eq!(summarize(&s, &[], 1.0).p50_s, None);
    }

    #[test]
    fn the_log_keeps_each_step_once_and_counts_lost_ones() {
        let mut log = StepLog::default();
        let s = steps();
        log.add(s[..2].to_vec());
        log.add(s[1..3].to_vec());
        assert_eq!(log.steps().len(), 3);
        assert_eq!(log.lost, 0);
        // Step 4 never read; step 5 is.
        log.add(vec![step(5, 600_000, 610_000, 10_000)]);
        assert_eq!(log.lost, 1);
        assert_eq!(log.steps().len(), 4);
        // A first read that starts after step 1 lost the ones before it.
        let mut late = StepLog::default();
        late.add(s[2..].to_vec());
        assert_eq!(late.lost, 2);
    }
}
