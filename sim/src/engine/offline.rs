//! The scheduler driven in virtual time, without threads or sleeps: what the simulated GPU would
//! do for a closed-loop load. Deterministic, so calibration figures (`sim/README.md`) can be
//! reproduced exactly and checked in tests.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, UnboundedReceiver};

use super::scheduler::{Scheduler, SchedulerConfig};
use super::sequence::{EngineEvent, FinishReason, Sequence};
use crate::profile::BatchedCost;

/// A closed-loop load: `concurrency` clients, each sending the next request when one ends.
#[derive(Debug, Clone, Copy)]
pub struct ClosedLoop {
    /// Clients.
    pub concurrency: usize,
    /// Prompt tokens of every request (all distinct, so no prefix-cache hits).
    pub prompt_tokens: u32,
    /// Output tokens of every request.
    pub output_tokens: u32,
    /// Virtual time to run.
    pub duration: Duration,
}

/// What the virtual run measured.
#[derive(Debug, Clone, Copy)]
pub struct OfflineReport {
    /// Output tokens per second of virtual time.
    pub output_tokens_per_s: f64,
    /// Mean time to first token, milliseconds.
    pub mean_ttft_ms: f64,
    /// Mean time between tokens of one request, milliseconds.
    pub mean_itl_ms: f64,
    /// Requests finished.
    pub finished: u64,
    /// Preemptions.
    pub preemptions: u64,
}

/// Runs `load` on a fresh scheduler with step costs from `cost`.
pub fn run_closed_loop(cost: BatchedCost, cfg: SchedulerConfig, load: ClosedLoop) -> OfflineReport {
    let origin = Instant::now();
    let mut clock = Duration::ZERO;
    let mut sched = Scheduler::new(cfg);
    let mut receivers: Vec<UnboundedReceiver<EngineEvent>> = Vec::new();
    let mut next_no = 0u64;
    let mut submit = |sched: &mut Scheduler, now: Instant, receivers: &mut Vec<_>| {
        next_no += 1;
        // Distinct prompts: token ids from the request number.
        let prompt: Vec<u32> = (0..load.prompt_tokens)
            .map(|i| 1000 + (next_no as u32).wrapping_mul(7919).wrapping_add(i) % 100_000)
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        receivers.push(rx);
        sched.add(Sequence::new(
            next_no.to_string(),
            next_no,
            &prompt,
            cfg.block_size as usize,
            load.output_tokens,
            FinishReason::Length,
            0,
            tx,
            now,
        ));
    };
    for _ in 0..load.concurrency {
        submit(&mut sched, origin, &mut receivers);
    }
    let (mut ttft_sum, mut ttft_n, mut itl_sum, mut itl_n, mut finished) =
        (0.0, 0u64, 0.0, 0u64, 0u64);
    let (mut tokens_at_warm, mut warm_clock) = (None, Duration::ZERO);
    while clock < load.duration {
        let now = origin + clock;
        let plan = sched.schedule(now);
        if plan.is_empty() {
            break;
        }
        clock += cost.step_time(plan.shape);
        sched.complete(&plan, origin + clock);
        // Warm-up: measure throughput over the second half of the run only.
        if tokens_at_warm.is_none() && clock >= load.duration / 2 {
            tokens_at_warm = Some(sched.metrics.generation_tokens);
            warm_clock = clock;
        }
        let mut done = 0;
        receivers.retain_mut(|rx| {
            let mut open = true;
            while let Ok(ev) = rx.try_recv() {
                if let EngineEvent::Finished(f) = ev {
                    let t = f.timings;
                    if let Some(d) = t.ttft() {
                        ttft_sum += d.as_secs_f64() * 1000.0;
                        ttft_n += 1;
                    }
                    if let Some(d) = t.decode().filter(|_| f.output_tokens > 1) {
                        itl_sum += d.as_secs_f64() * 1000.0;
                        itl_n += u64::from(f.output_tokens - 1);
                    }
                    done += 1;
                    open = false;
                }
            }
            open
        });
        finished += done;
        for _ in 0..done {
            submit(&mut sched, origin + clock, &mut receivers);
        }
    }
    let measured_tokens = sched.metrics.generation_tokens - tokens_at_warm.unwrap_or(0);
    let measured_time = (clock - warm_clock).as_secs_f64();
    OfflineReport {
        output_tokens_per_s: if measured_time > 0.0 {
            measured_tokens as f64 / measured_time
        } else {
            0.0
        },
        mean_ttft_ms: if ttft_n > 0 {
            ttft_sum / ttft_n as f64
        } else {
            0.0
        },
        mean_itl_ms: if itl_n > 0 {
            itl_sum / itl_n as f64
        } else {
            0.0
        },
        finished,
        preemptions: sched.metrics.preemptions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::LLAMA_31_8B_H100;

    fn h100(max_num_seqs: u32) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 8192,
            block_size: 16,
            num_gpu_blocks: LLAMA_31_8B_H100.default_gpu_blocks,
            prefix_caching: true,
            priority_policy: false,
            long_prefill_token_threshold: 0,
        }
    }

    #[test]
    fn llama_8b_h100_reaches_the_published_throughput_at_high_concurrency() {
        let r = run_closed_loop(
            LLAMA_31_8B_H100,
            h100(1024),
            ClosedLoop {
                concurrency: 1024,
                prompt_tokens: 200,
                output_tokens: 200,
                duration: Duration::from_secs(120),
            },
        );
        // Published: about 12,500 output tokens/s (docs/vllm-interface.md); allow 15%.
        assert!(
            (10_600.0..14_400.0).contains(&r.output_tokens_per_s),
            "{r:?}"
        );
    }

    #[test]
    fn llama_8b_h100_low_load_latency_is_interactive() {
        let r = run_closed_loop(
            LLAMA_31_8B_H100,
            h100(1024),
            ClosedLoop {
                concurrency: 1,
                prompt_tokens: 1000,
                output_tokens: 100,
                duration: Duration::from_secs(10),
            },
        );
        assert!((20.0..40.0).contains(&r.mean_ttft_ms), "{r:?}");
        assert!((5.5..8.0).contains(&r.mean_itl_ms), "{r:?}");
    }
}
