//! The scheduler driven in virtual time, without threads or sleeps: what the simulated GPU would
//! do for a closed-loop load, planning steps as the engine loop does (one step ahead with
//! asynchronous scheduling). Deterministic, so calibration figures (`sim/README.md`) can be
//! reproduced exactly and checked in tests.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, UnboundedReceiver};

use super::scheduler::{Scheduler, SchedulerConfig, StepPlan};
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

/// The scheduler and a simulated GPU in virtual time, stepped by hand: [`Self::plan`] plans the
/// next step when the engine loop would (at once when no step runs; while one runs only with
/// asynchronous scheduling), [`Self::end_step`] moves time to the end of the running step,
/// delivers its tokens and starts the planned one.
#[derive(Debug)]
pub struct VirtualEngine {
    /// The scheduler.
    pub sched: Scheduler,
    cost: BatchedCost,
    origin: Instant,
    clock: Duration,
    /// The step on the GPU and when it ends.
    in_flight: Option<(StepPlan, Duration)>,
    /// The step planned to run next and when it ends.
    next: Option<(StepPlan, Duration)>,
}

impl VirtualEngine {
    /// An idle engine at virtual time zero.
    pub fn new(cost: BatchedCost, cfg: SchedulerConfig) -> Self {
        Self {
            sched: Scheduler::new(cfg),
            cost,
            origin: Instant::now(),
            clock: Duration::ZERO,
            in_flight: None,
            next: None,
        }
    }

    /// The current virtual time as an instant.
    pub fn now(&self) -> Instant {
        self.origin + self.clock
    }

    /// Virtual time since the start.
    pub fn clock(&self) -> Duration {
        self.clock
    }

    /// Whether no step runs and none is planned.
    pub fn is_idle(&self) -> bool {
        self.in_flight.is_none() && self.next.is_none()
    }

    /// Plans the next step if the engine loop would plan it now; returns it (`None` when none
    /// may be planned yet or nothing is left to schedule).
    pub fn plan(&mut self) -> Option<&StepPlan> {
        let may_plan = self.in_flight.is_none() || self.sched.config().async_scheduling;
        if self.next.is_some() || !may_plan {
            return None;
        }
        let plan = self.sched.schedule(self.now());
        if plan.is_empty() {
            return None;
        }
        // It begins when the running step ends, or now.
        let start = self.in_flight.as_ref().map_or(self.clock, |(_, end)| *end);
        let end = start + self.cost.step_time(plan.shape);
        self.next = Some((plan, end));
        self.next.as_ref().map(|(p, _)| p)
    }

    /// Ends the running step (time moves to its end and its tokens go out), and starts the
    /// planned one; returns the ended step (`None` when none was running).
    pub fn end_step(&mut self) -> Option<StepPlan> {
        let ended = self.in_flight.take().map(|(plan, end)| {
            self.clock = end;
            self.sched.complete(&plan, self.origin + end);
            plan
        });
        self.in_flight = self.next.take();
        ended
    }
}

/// Runs `load` on a fresh scheduler with step costs from `cost`.
pub fn run_closed_loop(cost: BatchedCost, cfg: SchedulerConfig, load: ClosedLoop) -> OfflineReport {
    let mut engine = VirtualEngine::new(cost, cfg);
    let origin = engine.now();
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
        submit(&mut engine.sched, origin, &mut receivers);
    }
    let (mut ttft_sum, mut ttft_n, mut itl_sum, mut itl_n, mut finished) =
        (0.0, 0u64, 0.0, 0u64, 0u64);
    let (mut tokens_at_warm, mut warm_clock) = (None, Duration::ZERO);
    while engine.clock() < load.duration {
        engine.plan();
        if engine.is_idle() {
            break;
        }
        if engine.end_step().is_none() {
            continue;
        }
        let clock = engine.clock();
        // Warm-up: measure throughput over the second half of the run only.
        if tokens_at_warm.is_none() && clock >= load.duration / 2 {
            tokens_at_warm = Some(engine.sched.metrics.generation_tokens);
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
        let now = engine.now();
        for _ in 0..done {
            submit(&mut engine.sched, now, &mut receivers);
        }
    }
    let clock = engine.clock();
    let measured_tokens = engine.sched.metrics.generation_tokens - tokens_at_warm.unwrap_or(0);
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
        preemptions: engine.sched.metrics.preemptions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sequence::Finished;
    use crate::profile::LLAMA_31_8B_H100;

    fn h100(max_num_seqs: u32) -> SchedulerConfig {
        SchedulerConfig::closed_loop(max_num_seqs, LLAMA_31_8B_H100.default_gpu_blocks)
    }

    fn cfg(async_scheduling: bool) -> SchedulerConfig {
        SchedulerConfig {
            async_scheduling,
            ..h100(64)
        }
    }

    fn seq(
        e: &VirtualEngine,
        no: u64,
        prompt_len: u32,
        out: u32,
        reason: FinishReason,
    ) -> (Sequence, UnboundedReceiver<EngineEvent>) {
        let prompt: Vec<u32> = (0..prompt_len).map(|i| (no as u32) * 100_000 + i).collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let s = Sequence::new(no.to_string(), no, &prompt, 16, out, reason, 0, tx, e.now());
        (s, rx)
    }

    fn ids(plan: Option<&StepPlan>) -> Option<Vec<u64>> {
        plan.map(|p| p.scheduled.iter().map(|(no, _)| *no).collect())
    }

    /// The steps planned, in order, when B arrives while step 1 (A's prefill) runs.
    fn steps_with_a_late_arrival(async_scheduling: bool) -> Vec<Vec<u64>> {
        let mut e = VirtualEngine::new(LLAMA_31_8B_H100, cfg(async_scheduling));
        let (a, _ra) = seq(&e, 1, 100, 50, FinishReason::Length);
        e.sched.add(a);
        let mut steps: Vec<Vec<u64>> = ids(e.plan()).into_iter().collect();
        assert!(e.end_step().is_none(), "step 1 starts");
        // While step 1 runs the loop plans step 2 only with asynchronous scheduling.
        steps.extend(ids(e.plan()));
        let (b, _rb) = seq(&e, 2, 100, 5, FinishReason::Length);
        e.sched.add(b);
        for _ in 0..4 {
            e.end_step();
            steps.extend(ids(e.plan()));
        }
        steps
    }

    #[test]
    fn with_async_scheduling_a_request_arriving_during_step_n_is_first_scheduled_in_n_plus_2() {
        let steps = steps_with_a_late_arrival(true);
        assert_eq!(steps[0], vec![1]);
        assert_eq!(
            steps[1],
            vec![1],
            "step 2 was planned before B arrived: A decodes"
        );
        assert_eq!(steps[2], vec![1, 2], "B first runs in step 3");
        let steps = steps_with_a_late_arrival(false);
        assert_eq!(steps[0], vec![1]);
        assert_eq!(
            steps[1],
            vec![1, 2],
            "planned after step 1 ended: B runs in step 2"
        );
    }

    /// Runs until idle; returns each request's events, checking that none came after its end.
    fn run_to_end(
        e: &mut VirtualEngine,
        rx: &mut [UnboundedReceiver<EngineEvent>],
    ) -> Vec<(u32, Finished)> {
        let mut out: Vec<(u32, Option<Finished>)> = rx.iter().map(|_| (0, None)).collect();
        let mut drain = |rx: &mut [UnboundedReceiver<EngineEvent>]| {
            for (r, o) in rx.iter_mut().zip(out.iter_mut()) {
                while let Ok(ev) = r.try_recv() {
                    assert!(o.1.is_none(), "an event after the end: {ev:?}");
                    match ev {
                        EngineEvent::Token => o.0 += 1,
                        EngineEvent::Finished(f) => o.1 = Some(f),
                    }
                }
            }
        };
        for _ in 0..100_000 {
            e.plan();
            if e.is_idle() {
                break;
            }
            e.end_step();
            drain(rx);
        }
        assert!(e.is_idle() && !e.sched.has_work());
        out.into_iter()
            .map(|(n, f)| (n, f.expect("every request ended")))
            .collect()
    }

    #[test]
    fn a_stop_gets_one_wasted_step_and_no_token_after_it_a_length_gets_none() {
        for (reason, extra) in [(FinishReason::Stop, 1), (FinishReason::Length, 0)] {
            let mut e = VirtualEngine::new(LLAMA_31_8B_H100, cfg(true));
            let (a, mut ra) = seq(&e, 1, 100, 5, reason);
            e.sched.add(a);
            let mut planned_for_a = 0;
            let (mut tokens, mut ended) = (0, None);
            while !e.is_idle() || e.sched.has_work() {
                planned_for_a += ids(e.plan()).map_or(0, |v| v.len());
                e.end_step();
                while let Ok(ev) = ra.try_recv() {
                    assert!(ended.is_none(), "an event after the end: {ev:?}");
                    match ev {
                        EngineEvent::Token => tokens += 1,
                        EngineEvent::Finished(f) => ended = Some((f.output_tokens, f.reason)),
                    }
                }
            }
            // One prefill step and four decodes give five tokens; vLLM cannot foresee a stop
            // (EOS), so it plans one more step whose token is dropped; `max_tokens` it can.
            assert_eq!(planned_for_a, 5 + extra, "{reason:?}");
            assert_eq!((tokens, ended), (4, Some((5, reason))));
        }
    }

    #[test]
    fn aborts_and_preemptions_while_a_step_runs_never_send_a_token_after_the_end() {
        for async_scheduling in [true, false] {
            // A cache of 40 blocks (640 tokens) for 8 requests of 100 + 60 tokens: preemptions.
            let mut e = VirtualEngine::new(
                LLAMA_31_8B_H100,
                SchedulerConfig {
                    num_gpu_blocks: 40,
                    ..cfg(async_scheduling)
                },
            );
            let mut rx = Vec::new();
            for no in 1..=8 {
                let (s, r) = seq(&e, no, 100, 60, FinishReason::Length);
                e.sched.add(s);
                rx.push(r);
            }
            // Abort request 3 while a step that includes it runs (and may already plan the next).
            for _ in 0..6 {
                e.plan();
                e.end_step();
            }
            e.plan();
            assert_eq!(e.sched.abort_where(e.now(), |s| s.seq_no == 3), 1);
            let ended = run_to_end(&mut e, &mut rx);
            assert!(e.sched.metrics.preemptions > 0, "async {async_scheduling}");
            for (i, (tokens, f)) in ended.iter().enumerate() {
                if i == 2 {
                    assert_eq!(f.reason, FinishReason::Abort);
                    assert_eq!(f.output_tokens, *tokens, "no token counted unsent");
                } else {
                    assert_eq!(f.reason, FinishReason::Length);
                    // Every token but the last was sent once, preempted or not.
                    assert_eq!(
                        (*tokens + 1, f.output_tokens),
                        (60, 60),
                        "request {}",
                        i + 1
                    );
                }
            }
            assert_eq!(e.sched.pool.num_free(), 40, "every block came back");
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
