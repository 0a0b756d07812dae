//! Where small TTFT goes, from the simulator's own step records (`GET /debug/steps`, read in
//! process): how long the engine's steps were, how many carried a long prompt chunk, and how
//! often requests waited in the engine's queue. A request arriving at a random instant waits
//! for the step in progress to end (on average E[d^2] / 2E[d] for steps of length d, longer
//! steps being likelier to be hit) and then for its own step, so the step-length tail is the
//! TTFT tail's floor; requests left waiting in the engine add whole steps.
//!
//! The simulator keeps its last 4,096 steps; [`StepSampler`] reads them every few seconds
//! during the measured window and keeps each step once.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use vllm_sim::engine::stats::StepRecord;
use vllm_sim::engine::Engine;

/// Steps with more prompt tokens than this count as carrying a long prompt chunk.
pub const LONG_CHUNK_TOKENS: u32 = 2_048;

/// Step records gathered over a run, each step once.
#[derive(Debug, Default)]
pub struct StepSampler {
    steps: BTreeMap<u64, StepRecord>,
}

impl StepSampler {
    /// Adds the engine's recent steps.
    pub fn collect(&mut self, engine: &Engine) {
        for s in engine.recent_steps() {
            self.steps.insert(s.step, s);
        }
    }

    /// Reads `engine`'s steps every `every` for `window`, after `warmup`: only the steps that
    /// began after the warm-up are kept.
    pub async fn sample(
        engine: &Engine,
        (warmup, window): (Duration, Duration),
        every: Duration,
    ) -> Self {
        let mut sampler = Self::default();
        tokio::time::sleep(warmup).await;
        sampler.collect(engine);
        let warm = sampler.steps.keys().next_back().copied();
        sampler.steps.clear();
        let until = tokio::time::Instant::now() + window;
        while tokio::time::Instant::now() < until {
            tokio::time::sleep(every.min(until - tokio::time::Instant::now())).await;
            sampler.collect(engine);
        }
        if let Some(last) = warm {
            sampler.steps.retain(|&step, _| step > last);
        }
        sampler
    }

    /// The summary (`summary.json`'s `steps`).
    pub fn summary(&self) -> Value {
        summarize(self.steps.values())
    }
}

use tutor_wire::stats::nearest_rank as quantile;

/// Step-length quantiles, the share of long-chunk steps and of steps with requests waiting,
/// and the mean residual step a random arrival waits for.
pub fn summarize<'a>(steps: impl Iterator<Item = &'a StepRecord>) -> Value {
    let steps: Vec<&StepRecord> = steps.collect();
    if steps.is_empty() {
        return Value::Null;
    }
    let n = steps.len() as f64;
    let mut ms: Vec<f64> = steps.iter().map(|s| s.duration_us as f64 / 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let total: f64 = ms.iter().sum();
    let squares: f64 = ms.iter().map(|d| d * d).sum();
    let long = steps
        .iter()
        .filter(|s| s.prefill_tokens > LONG_CHUNK_TOKENS)
        .count() as f64;
    let long_ms: f64 = steps
        .iter()
        .filter(|s| s.prefill_tokens > LONG_CHUNK_TOKENS)
        .map(|s| s.duration_us as f64 / 1e3)
        .sum();
    let waiting = steps.iter().filter(|s| s.waiting > 0).count() as f64;
    let mut late: Vec<f64> = steps.iter().map(|s| s.late_us as f64 / 1e3).collect();
    late.sort_by(f64::total_cmp);
    json!({
        "steps": steps.len(),
        "step_ms_p50": quantile(&ms, 0.5),
        "step_ms_p95": quantile(&ms, 0.95),
        "step_ms_p99": quantile(&ms, 0.99),
        "residual_step_ms_mean": (total > 0.0).then(|| squares / (2.0 * total)),
        "long_chunk_steps_share": long / n,
        "long_chunk_time_share": if total > 0.0 { long_ms / total } else { 0.0 },
        "waiting_steps_share": waiting / n,
        "waiting_max": steps.iter().map(|s| s.waiting).max(),
        "max_chunk_max": steps.iter().map(|s| s.max_chunk).max(),
        "late_ms_p99": quantile(&late, 0.99),
    })
}

/// One Markdown row: `| preset | steps | step ms p50 / p95 / p99 | residual ms | long-chunk
/// steps (time) | steps with waiting | late p99 ms |`.
pub fn row(preset: &str, v: &Value) -> String {
    let f = |k: &str| v[k].as_f64();
    // `+ 0.0` writes a negative zero as 0.
    let pct = |k: &str| f(k).map_or("-".into(), |x| format!("{:.0}%", x * 100.0 + 0.0));
    format!(
        "| {preset} | {} | {} / {} / {} | {} | {} ({}) | {} | {} |",
        v["steps"].as_u64().unwrap_or(0),
        ms(f("step_ms_p50")),
        ms(f("step_ms_p95")),
        ms(f("step_ms_p99")),
        ms(f("residual_step_ms_mean")),
        pct("long_chunk_steps_share"),
        pct("long_chunk_time_share"),
        pct("waiting_steps_share"),
        ms(f("late_ms_p99")),
    )
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.0}"))
}

/// The table's header.
pub const HEADER: &str = "| preset | engine steps | step ms p50 / p95 / p99 | mean residual \
    step ms | steps with > 2,048 prompt tokens (share of time) | steps with requests waiting \
    | sim late p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, prefill: u32, waiting: u32, ms: u64) -> StepRecord {
        StepRecord {
            step,
            prefill_tokens: prefill,
            prefill_seqs: u32::from(prefill > 0),
            max_chunk: prefill,
            decode_seqs: 10,
            running: 10,
            waiting,
            free_blocks: 100,
            preempted: 0,
            duration_us: ms * 1_000,
            late_us: 0,
            start_us: 0,
            end_us: 0,
        }
    }

    #[test]
    fn long_steps_weigh_in_the_residual_and_are_counted() {
        // Nine 20 ms steps and one 200 ms step carrying a long chunk.
        let mut steps: Vec<StepRecord> = (1..=9).map(|i| step(i, 300, 0, 20)).collect();
        steps.push(step(10, 8_000, 3, 200));
        let v = summarize(steps.iter());
        assert_eq!(v["steps"], 10);
        assert_eq!(v["long_chunk_steps_share"], 0.1);
        // 200 of 380 ms carried the long chunk.
        assert!((v["long_chunk_time_share"].as_f64().unwrap() - 200.0 / 380.0).abs() < 1e-9);
        // E[d^2] / 2E[d] = (9 * 400 + 40000) / (2 * 380) = 57.4 ms: far above the 20 ms median.
        let r = v["residual_step_ms_mean"].as_f64().unwrap();
        assert!((r - 43_600.0 / 760.0).abs() < 1e-9, "{r}");
        assert_eq!(v["step_ms_p50"], 20.0);
        assert_eq!(v["waiting_steps_share"], 0.1);
        assert!(row("lanes", &v).starts_with("| lanes | 10 | 20 / 200 / 200 | 57 |"));
        assert_eq!(summarize([].iter()), Value::Null);
    }
}
