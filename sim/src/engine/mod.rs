//! The simulated engine: a scheduler loop on its own thread (batched profiles) or one timer task
//! per request (`fixed` profile), behind one cloneable [`Engine`] handle.
//!
//! The loop plans a step, sleeps for the step's modelled duration (divided by `--speed`) against
//! an absolute deadline, then applies the step: tokens are sent to each request's unbounded
//! channel, so the engine never waits for a slow client, as vLLM's output queue. With
//! asynchronous scheduling (the default, as vLLM's) the next step is planned while the current
//! one runs.

pub mod kv_cache;
pub mod metrics;
pub mod offline;
pub mod offload;
pub mod scheduler;
pub mod sequence;
pub mod stats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::sync::Notify;

use crate::profile::{BatchedCost, Profile};
use metrics::{CacheInfo, Gauges};
use scheduler::{Scheduler, SchedulerConfig, StepPlan};
use sequence::{EngineEvent, FinishReason, Sequence};
use stats::{Lateness, StepRecord, StepStats};

/// A step later than this against its deadline resets the schedule instead of bursting to
/// catch up.
const MAX_CATCH_UP: Duration = Duration::from_millis(20);
/// How long an idle scheduler thread sleeps before it looks again (a new request wakes it).
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// A request as the engine takes it.
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// The id vLLM's server gives the request (`chatcmpl-<X-Request-Id>`,
    /// `cmpl-<X-Request-Id>-0`): what `/inference/v1/abort_requests` names.
    pub request_id: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Output tokens to generate.
    pub target_output: u32,
    /// Reason reported when `target_output` is reached.
    pub finish_at_target: FinishReason,
    /// Priority under `--scheduling-policy priority` (lower first).
    pub priority: i64,
    /// Its output's first word (see [`Sequence::output_from`]): its full output blocks are
    /// hashed into the prefix cache as vLLM's are; `None`: not hashed (output the simulator
    /// cannot give token ids for, such as reasoning).
    pub output_from: Option<u32>,
    /// vLLM's `cache_salt`: requests with different salts share no prefix-cache block.
    pub cache_salt: Option<String>,
}

/// The engine handle; clones share one engine.
#[derive(Clone, Debug)]
pub struct Engine {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    profile: Profile,
    speed: f64,
    next_seq_no: AtomicU64,
    shutdown: AtomicBool,
    /// When the engine started: step records' `start_us`/`end_us` count from here.
    epoch: Instant,
}

#[derive(Debug)]
struct State {
    sched: Scheduler,
    /// Fixed profile: running requests and their cancel signals.
    fixed: HashMap<u64, FixedSeq>,
    stats: StepStats,
}

#[derive(Debug)]
struct FixedSeq {
    request_id: String,
    cancel: Arc<Notify>,
}

/// Engine state for `/debug/engine` and tests.
#[derive(Debug, Clone, Serialize)]
pub struct EngineSnapshot {
    /// `batched` or `fixed`.
    pub mode: &'static str,
    /// Sequences running now.
    pub running: usize,
    /// Sequences waiting now.
    pub waiting: usize,
    /// `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: u32,
    /// KV blocks in all.
    pub num_gpu_blocks: u32,
    /// KV blocks no sequence holds.
    pub free_blocks: u32,
    /// Steps run.
    pub steps: u64,
    /// Most sequences ever running in one step.
    pub max_running_seen: u32,
    /// Most tokens ever computed in one step.
    pub max_step_tokens_seen: u32,
    /// Steps that mixed prefill chunks and decodes.
    pub mixed_steps: u64,
    /// Preemptions so far.
    pub preemptions: u64,
    /// KV offloading's CPU tier: blocks it holds at most (0: off), blocks copied into it,
    /// loaded back from it, evicted from it so far.
    pub offload_cpu_blocks: u32,
    /// See `offload_cpu_blocks`.
    pub offload_stored_blocks: u64,
    /// See `offload_cpu_blocks`.
    pub offload_loaded_blocks: u64,
    /// See `offload_cpu_blocks`.
    pub offload_evicted_blocks: u64,
    /// Tokens of full KV blocks computed again after the cache had lost them (evicted, or the
    /// sequence preempted): work done twice, the simulator's own count (vLLM has no such
    /// metric).
    pub recomputed_tokens: u64,
    /// Finished with `abort`.
    pub aborted: u64,
    /// Step (or emission) lateness.
    pub lateness: Lateness,
}

impl Engine {
    /// Starts an engine; a batched profile gets its scheduler thread.
    pub fn start(profile: Profile, speed: f64, cfg: SchedulerConfig) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                sched: Scheduler::new(cfg),
                fixed: HashMap::new(),
                stats: StepStats::default(),
            }),
            wake: Condvar::new(),
            profile,
            speed: if speed > 0.0 { speed } else { 1.0 },
            next_seq_no: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        if let Profile::Batched(cost) = profile {
            let weak = Arc::downgrade(&shared);
            std::thread::Builder::new()
                .name("vllm-sim-engine".into())
                .spawn(move || run_loop(weak, cost))
                .expect("spawn the engine thread");
        }
        Self { shared }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a request; returns its internal number and the stream of its tokens.
    pub fn submit(&self, req: NewRequest) -> (u64, UnboundedReceiver<EngineEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let seq_no = self.shared.next_seq_no.fetch_add(1, Ordering::Relaxed);
        let mut st = self.lock();
        let bs = st.sched.config().block_size as usize;
        let seq = Sequence::new(
            req.request_id,
            seq_no,
            &req.prompt,
            bs,
            req.target_output,
            req.finish_at_target,
            req.priority,
            tx,
            Instant::now(),
        )
        .salted(&req.prompt, req.cache_salt.as_deref())
        .with_output_from(req.output_from);
        match self.shared.profile {
            Profile::Batched(_) => {
                st.sched.add(seq);
                drop(st);
                self.shared.wake.notify_one();
            }
            Profile::Fixed { ttft, itl } => {
                let cancel = Arc::new(Notify::new());
                st.fixed.insert(
                    seq_no,
                    FixedSeq {
                        request_id: seq.request_id.clone(),
                        cancel: cancel.clone(),
                    },
                );
                let running = st.fixed.len() as u32;
                st.stats.observe_running(running);
                drop(st);
                let speed = self.shared.speed;
                tokio::spawn(run_fixed(
                    self.clone(),
                    seq,
                    ttft.div_f64(speed),
                    itl.div_f64(speed),
                    cancel,
                ));
            }
        }
        (seq_no, rx)
    }

    /// Aborts one request by internal number (its client went away); no-op if it has finished.
    pub fn abort_seq(&self, seq_no: u64) {
        self.abort_where(|s_no, _| s_no == seq_no);
    }

    /// Aborts every request with one of these ids (exactly as submitted); returns how many were
    /// found.
    pub fn abort_request_ids(&self, ids: &[String]) -> usize {
        self.abort_where(|_, id| ids.iter().any(|x| x == id))
    }

    fn abort_where(&self, pred: impl Fn(u64, &str) -> bool) -> usize {
        let mut st = self.lock();
        let mut n = st
            .sched
            .abort_where(Instant::now(), |s| pred(s.seq_no, &s.request_id));
        let cancels: Vec<u64> = st
            .fixed
            .iter()
            .filter(|(no, f)| pred(**no, &f.request_id))
            .map(|(no, _)| *no)
            .collect();
        for no in cancels {
            if let Some(f) = st.fixed.remove(&no) {
                f.cancel.notify_one();
                n += 1;
            }
        }
        drop(st);
        self.shared.wake.notify_one();
        n
    }

    /// A consistent view of the engine.
    pub fn snapshot(&self) -> EngineSnapshot {
        let st = self.lock();
        let cfg = *st.sched.config();
        let fixed = matches!(self.shared.profile, Profile::Fixed { .. });
        EngineSnapshot {
            mode: if fixed { "fixed" } else { "batched" },
            running: st.sched.num_running() + st.fixed.len(),
            waiting: st.sched.num_waiting(),
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            num_gpu_blocks: cfg.num_gpu_blocks,
            free_blocks: st.sched.pool.num_free(),
            steps: st.stats.steps,
            max_running_seen: st.stats.max_running_seen,
            max_step_tokens_seen: st.stats.max_step_tokens_seen,
            mixed_steps: st.stats.mixed_steps,
            preemptions: st.sched.metrics.preemptions,
            offload_cpu_blocks: cfg.num_cpu_blocks,
            offload_stored_blocks: st.sched.cpu.stored,
            offload_loaded_blocks: st.sched.cpu.loaded,
            offload_evicted_blocks: st.sched.cpu.evicted,
            recomputed_tokens: st.sched.recomputed.tokens,
            aborted: st.sched.metrics.finished_count(FinishReason::Abort),
            lateness: st.stats.lateness_ms(),
        }
    }

    /// When the engine started: the origin of step records' `start_us` and `end_us`.
    pub fn epoch(&self) -> Instant {
        self.shared.epoch
    }

    /// The most recent steps, oldest first.
    pub fn recent_steps(&self) -> Vec<StepRecord> {
        self.lock().stats.recent()
    }

    /// vLLM's `/metrics` text.
    pub fn render_metrics(&self, model: &str) -> String {
        let st = self.lock();
        let cfg = st.sched.config();
        let gauges = Gauges {
            running: st.sched.num_running() + st.fixed.len(),
            waiting: st.sched.num_waiting(),
            kv_usage: st.sched.pool.usage(),
        };
        let cache = CacheInfo {
            block_size: cfg.block_size,
            num_gpu_blocks: cfg.num_gpu_blocks,
            prefix_caching: cfg.prefix_caching,
        };
        metrics::render(model, &st.sched.metrics, gauges, &cache)
    }

    /// Stops the scheduler thread (it also stops once every handle is dropped).
    pub fn shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.wake.notify_all();
    }
}

/// A planned step on the simulated GPU: its plan, its record, when it is due to end.
struct Running {
    plan: StepPlan,
    rec: StepRecord,
    /// Modelled (speed-scaled) GPU time.
    duration: Duration,
    /// Its start on the absolute schedule plus `duration`.
    deadline: Instant,
}

/// The scheduler loop of batched profiles; ends when the engine is dropped or shut down.
///
/// With asynchronous scheduling (vLLM's `EngineCore.step_with_batch_queue`, a batch queue of
/// two) the loop plans step N+1 as soon as step N begins, then waits for N to end and delivers
/// its tokens; N+1 begins the moment N ends. A request that arrives while N runs is therefore
/// first scheduled in N+2. Without it (`EngineCore.step`) a step is planned only once the
/// previous one completed, so such a request is scheduled in N+1.
fn run_loop(weak: Weak<Shared>, cost: BatchedCost) {
    // Where the last begun step ends on the absolute schedule (`None` when idle or reset): the
    // next step begins there, so the speed holds on average even for sub-millisecond steps.
    let mut chain: Option<Instant> = None;
    let mut in_flight: Option<Running> = None;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        if shared.shutdown.load(Ordering::Relaxed) {
            return;
        }
        let mut next = None;
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        // Plan while a step runs only with asynchronous scheduling.
        if in_flight.is_none() || st.sched.config().async_scheduling {
            let planned = Instant::now();
            let plan = st.sched.schedule(planned);
            if plan.is_empty() && in_flight.is_none() {
                chain = None;
                // Idle, or only loading offloaded KV: wake when the first load is done.
                let wait = st
                    .sched
                    .next_load_done()
                    .map_or(IDLE_WAIT, |t| t.saturating_duration_since(planned))
                    .min(IDLE_WAIT);
                let _ = shared.wake.wait_timeout(st, wait);
                continue;
            }
            if !plan.is_empty() {
                let duration = cost.step_time(plan.shape).div_f64(shared.speed);
                let mut rec = begin_record(&plan, &st, duration);
                // Begins now, unless a step is in flight: then when that one ends.
                rec.start_us = micros_since(shared.epoch, planned);
                let start = chain.unwrap_or(planned);
                chain = Some(start + duration);
                next = Some(Running {
                    plan,
                    rec,
                    duration,
                    deadline: start + duration,
                });
            }
        }
        drop(st);
        if let Some(cur) = in_flight.take() {
            let late = cur.deadline;
            let now = end_step(&shared, cur);
            let behind = now.saturating_duration_since(late) > MAX_CATCH_UP;
            match next.as_mut() {
                Some(n) => {
                    // The next step begins on the GPU now that this one has ended.
                    n.rec.start_us = micros_since(shared.epoch, now);
                    if behind {
                        // Too far behind: restart the schedule instead of bursting to catch up.
                        n.deadline = now + n.duration;
                        chain = Some(n.deadline);
                    }
                }
                None if behind => chain = None,
                None => {}
            }
        }
        in_flight = next;
    }
}

/// The record of a step just planned (its times are filled in as it runs).
fn begin_record(plan: &StepPlan, st: &State, duration: Duration) -> StepRecord {
    let prefill_seqs = plan.scheduled.len() as u32 - plan.shape.decode_seqs;
    StepRecord {
        step: 0,
        prefill_tokens: plan.shape.prefill_tokens,
        prefill_seqs,
        max_chunk: if prefill_seqs > 0 {
            plan.scheduled.iter().map(|(_, n)| *n).max().unwrap_or(0)
        } else {
            0
        },
        decode_seqs: plan.shape.decode_seqs,
        running: st.sched.num_running() as u32,
        waiting: st.sched.num_waiting() as u32,
        free_blocks: st.sched.pool.num_free(),
        preempted: plan.preempted,
        duration_us: duration.as_micros() as u64,
        late_us: 0,
        start_us: 0,
        end_us: 0,
    }
}

/// Waits until the step's deadline, then delivers its tokens and records it; returns when it
/// ended.
fn end_step(shared: &Shared, cur: Running) -> Instant {
    let now = Instant::now();
    if cur.deadline > now {
        std::thread::sleep(cur.deadline - now);
    }
    let now = Instant::now();
    let mut rec = cur.rec;
    rec.late_us = now.saturating_duration_since(cur.deadline).as_micros() as u64;
    rec.end_us = micros_since(shared.epoch, now);
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    st.sched.complete(&cur.plan, now);
    let tokens = cur.plan.num_tokens();
    st.stats.record(rec, tokens);
    now
}

fn micros_since(epoch: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(epoch).as_micros() as u64
}

/// One request of the `fixed` profile: first token after `ttft`, then one every `itl`.
async fn run_fixed(
    engine: Engine,
    mut seq: Sequence,
    ttft: Duration,
    itl: Duration,
    cancel: Arc<Notify>,
) {
    let start = tokio::time::Instant::now();
    seq.timings.first_scheduled = Some(seq.timings.arrival);
    let mut reason = None;
    while reason.is_none() {
        let deadline = start + ttft + itl * seq.output_tokens;
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = cancel.notified() => { reason = Some(FinishReason::Abort); break; }
        }
        let now = Instant::now();
        let late = tokio::time::Instant::now().saturating_duration_since(deadline);
        seq.output_tokens += 1;
        let gap = seq.timings.last_token.map(|t| now - t);
        seq.timings.last_token = Some(now);
        let mut st = engine.lock();
        st.stats.observe_lateness(late);
        if seq.timings.first_token.is_none() {
            seq.timings.first_token = Some(now);
            st.sched
                .metrics
                .first_token(now - seq.timings.arrival, seq.prompt_len);
        }
        st.sched.metrics.token(gap);
        if seq.output_tokens >= seq.target_output {
            reason = Some(seq.finish_at_target);
        } else if seq.tx.send(EngineEvent::Token).is_err() {
            reason = Some(FinishReason::Abort);
            seq.output_tokens -= 1;
        }
    }
    let reason = reason.unwrap_or(FinishReason::Abort);
    let mut st = engine.lock();
    st.fixed.remove(&seq.seq_no);
    seq.timings.finished = Some(Instant::now());
    let done = seq.finished(reason, reason != FinishReason::Abort);
    st.sched.metrics.finished(&done);
    drop(st);
    let _ = seq.tx.send(EngineEvent::Finished(done));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{StepShape, TINY_TEST};

    fn request(id: &str, target_output: u32) -> NewRequest {
        NewRequest {
            request_id: id.into(),
            prompt: id.bytes().map(u32::from).cycle().take(40).collect(),
            target_output,
            finish_at_target: FinishReason::Length,
            priority: 0,
            output_from: Some(0),
            cache_salt: None,
        }
    }

    /// The speed of [`a_tokens_until_b_starts`]'s engine.
    const SPEED: f64 = 0.005;

    /// A decodes in ~1 s steps; B arrives half a step into one of them (step X). Returns A's
    /// tokens that came out from then up to B's first token, that step included.
    fn a_tokens_until_b_starts(async_scheduling: bool) -> u32 {
        let cfg = SchedulerConfig {
            async_scheduling,
            ..SchedulerConfig::small_for_tests()
        };
        // Slowed to ~1 s steps: B's arrival half a step in stays inside step X even when a
        // loaded machine wakes this thread up to half a second late.
        let engine = Engine::start(Profile::Batched(TINY_TEST), SPEED, cfg);
        let (_, mut ra) = engine.submit(request("a", 100));
        assert!(matches!(ra.blocking_recv(), Some(EngineEvent::Token)));
        // A's prefill step has ended and step X has begun: B arrives in the middle of X.
        let step = TINY_TEST.step_time(StepShape::default()).div_f64(SPEED);
        std::thread::sleep(step / 2);
        let (_, mut rb) = engine.submit(request("b", 100));
        let mut a_tokens = 0;
        let mut drain_a = |ra: &mut UnboundedReceiver<EngineEvent>| {
            while let Ok(ev) = ra.try_recv() {
                assert!(matches!(ev, EngineEvent::Token));
                a_tokens += 1;
            }
        };
        loop {
            std::thread::sleep(Duration::from_millis(1));
            // A's token of a step is sent before B's (A runs first), so draining A once B's
            // first token is seen counts that step's too.
            if let Ok(ev) = rb.try_recv() {
                assert!(matches!(ev, EngineEvent::Token));
                drain_a(&mut ra);
                break;
            }
            drain_a(&mut ra);
        }
        engine.shutdown();
        a_tokens
    }

    #[test]
    fn the_engine_loop_plans_one_step_ahead_with_async_scheduling_only() {
        // Asynchronous: step X+1 was planned when X began, so B runs first in X+2 and A gets
        // three tokens (X, X+1, X+2) by then. Synchronous: B runs in X+1, two tokens.
        assert_eq!(a_tokens_until_b_starts(true), 3);
        assert_eq!(a_tokens_until_b_starts(false), 2);
    }
}
