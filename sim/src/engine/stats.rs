//! What the engine did, step by step: enough to assert the scheduler's limits from outside
//! (`GET /debug/engine`, `GET /debug/steps`) and to see whether the loop runs on time.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

const RECENT_STEPS: usize = 4096;
const LATENESS_SAMPLES: usize = 100_000;

/// One engine step.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StepRecord {
    /// Step number, from 1.
    pub step: u64,
    /// Prompt tokens computed.
    pub prefill_tokens: u32,
    /// Sequences that computed prompt tokens.
    pub prefill_seqs: u32,
    /// Largest prompt chunk of one sequence.
    pub max_chunk: u32,
    /// Sequences that decoded a token.
    pub decode_seqs: u32,
    /// Sequences running after planning.
    pub running: u32,
    /// Sequences waiting after planning.
    pub waiting: u32,
    /// Free KV blocks after planning.
    pub free_blocks: u32,
    /// Preemptions while planning.
    pub preempted: u32,
    /// Modelled GPU time of the step, microseconds of wall clock (after `--speed`).
    pub duration_us: u64,
    /// How late the step ended against its deadline, microseconds.
    pub late_us: u64,
    /// When the step began on the simulated GPU (with asynchronous scheduling, when the previous
    /// step ended; otherwise when it was planned), microseconds of wall clock since the engine
    /// started ([`crate::engine::Engine::epoch`]).
    pub start_us: u64,
    /// When the step's tokens were sent, microseconds since the engine started.
    pub end_us: u64,
}

/// Running totals and a window of recent steps.
#[derive(Debug, Default)]
pub struct StepStats {
    /// Steps run.
    pub steps: u64,
    /// Most sequences ever running in one step.
    pub max_running_seen: u32,
    /// Most tokens ever computed in one step.
    pub max_step_tokens_seen: u32,
    /// Steps that computed prompt chunks and decoded tokens together.
    pub mixed_steps: u64,
    /// Preemptions.
    pub preemptions: u64,
    recent: VecDeque<StepRecord>,
    lateness_us: VecDeque<u64>,
}

impl StepStats {
    /// Records one step.
    pub fn record(&mut self, mut rec: StepRecord, tokens: u32) {
        self.steps += 1;
        rec.step = self.steps;
        self.max_running_seen = self.max_running_seen.max(rec.running);
        self.max_step_tokens_seen = self.max_step_tokens_seen.max(tokens);
        if rec.prefill_tokens > 0 && rec.decode_seqs > 0 {
            self.mixed_steps += 1;
        }
        self.preemptions += u64::from(rec.preempted);
        if self.recent.len() == RECENT_STEPS {
            self.recent.pop_front();
        }
        self.recent.push_back(rec);
        if self.lateness_us.len() == LATENESS_SAMPLES {
            self.lateness_us.pop_front();
        }
        self.lateness_us.push_back(rec.late_us);
    }

    /// Records the largest number of sequences running (fixed profile: no steps).
    pub fn observe_running(&mut self, running: u32) {
        self.max_running_seen = self.max_running_seen.max(running);
    }

    /// Records an emission's lateness (fixed profile).
    pub fn observe_lateness(&mut self, late: Duration) {
        if self.lateness_us.len() == LATENESS_SAMPLES {
            self.lateness_us.pop_front();
        }
        self.lateness_us.push_back(late.as_micros() as u64);
    }

    /// The recent steps, oldest first.
    pub fn recent(&self) -> Vec<StepRecord> {
        self.recent.iter().copied().collect()
    }

    /// Lateness quantiles over the last samples, in milliseconds: (p50, p99, max, samples).
    pub fn lateness_ms(&self) -> Lateness {
        let mut v: Vec<u64> = self.lateness_us.iter().copied().collect();
        v.sort_unstable();
        let q = |p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let i = ((v.len() - 1) as f64 * p).round() as usize;
            v[i] as f64 / 1000.0
        };
        Lateness {
            p50_ms: q(0.5),
            p99_ms: q(0.99),
            max_ms: v.last().map_or(0.0, |m| *m as f64 / 1000.0),
            samples: v.len(),
        }
    }
}

/// How late steps (or, in the fixed profile, token emissions) ran.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Lateness {
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Worst, milliseconds.
    pub max_ms: f64,
    /// Samples behind the figures.
    pub samples: usize,
}
