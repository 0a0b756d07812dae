//! vLLM V1's scheduler, one step at a time, with no clock of its own.
//!
//! Each step has a token budget (`max_num_batched_tokens`) and at most `max_num_seqs` running
//! sequences. Running sequences are served first, in admission order: a decode takes one token,
//! an unfinished prefill takes a chunk of what is left of the budget (chunked prefill). When a
//! sequence needs a KV block and none is free, the most recently admitted running sequence is
//! preempted (its blocks freed, its tokens recomputed later). Then, if nothing was preempted,
//! waiting sequences are admitted in arrival order (or by `priority`) while seats, budget and
//! blocks last, each first taking the prefix-cache hit of its prompt, and each only if blocks
//! for its whole sequence fit (vLLM's `scheduler_reserve_full_isl`).
//!
//! As vLLM (`Scheduler._update_after_schedule`), planning a step advances the scheduled
//! sequences' computed tokens at once, and a step that will sample a token leaves a placeholder
//! for it (`AsyncScheduler`'s `num_output_placeholders`): so the next step can be planned
//! while this one runs (asynchronous scheduling), decoding from the token still being sampled.
//! [`Scheduler::complete`] then delivers the sampled tokens.
//!
//! With KV offloading on (`num_cpu_blocks > 0`, see [`super::offload`]) every block a step
//! computes is copied to the CPU tier, and a waiting sequence whose next blocks after its GPU
//! hit are there loads them first: it holds GPU blocks for them and waits outside the running
//! set until the load is done (vLLM's `WAITING_FOR_REMOTE_KVS`), then is admitted as any other
//! waiting sequence with those tokens computed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::kv_cache::BlockPool;
use super::metrics::EngineMetrics;
use super::offload::CpuTier;
use super::sequence::{EngineEvent, FinishReason, Sequence};
use crate::profile::StepShape;

/// Limits of the scheduler, from the command line.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Most running sequences.
    pub max_num_seqs: u32,
    /// Token budget per step.
    pub max_num_batched_tokens: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV blocks in all.
    pub num_gpu_blocks: u32,
    /// Prefix caching on.
    pub prefix_caching: bool,
    /// Serve lower `priority` first instead of arrival order.
    pub priority_policy: bool,
    /// Most tokens one sequence may compute in a step (vLLM's `--long-prefill-token-threshold`)
    /// while more than one request is running or waiting (a lone request takes the whole step
    /// budget); 0: no cap beyond the step budget.
    pub long_prefill_token_threshold: u32,
    /// Admit a waiting sequence only if blocks for its whole sequence fit, not only for its
    /// first chunk (vLLM's `SchedulerConfig.scheduler_reserve_full_isl`, on by default).
    pub reserve_full_isl: bool,
    /// Plan step N+1 while step N runs (vLLM's `--async-scheduling`, on by default). The
    /// scheduler behaves the same either way; the engine loop and the offline runner read this.
    pub async_scheduling: bool,
    /// Blocks of the CPU tier (vLLM's `--kv-offloading-size` over the bytes of a block); 0:
    /// no KV offloading.
    pub num_cpu_blocks: u32,
    /// Wall time to load one block from the CPU tier into the GPU (the profile's, over
    /// `--speed`).
    pub cpu_load_per_block: Duration,
}

impl SchedulerConfig {
    /// The closed-loop calibration's configuration (`engine::offline`, the self-test bench):
    /// 8,192 tokens a step, 16-token blocks, prefix caching on, arrival order, no long-prefill
    /// cap, whole-sequence reservation and async scheduling on.
    pub fn closed_loop(max_num_seqs: u32, num_gpu_blocks: u32) -> Self {
        Self {
            max_num_seqs,
            max_num_batched_tokens: 8192,
            block_size: 16,
            num_gpu_blocks,
            prefix_caching: true,
            priority_policy: false,
            long_prefill_token_threshold: 0,
            reserve_full_isl: true,
            async_scheduling: true,
            num_cpu_blocks: 0,
            cpu_load_per_block: Duration::ZERO,
        }
    }

    /// A small engine for unit tests: 8 sequences, 2,048 tokens a step, 1,000 blocks of 16,
    /// no prefix caching, arrival order, no long-prefill cap, whole-sequence reservation,
    /// synchronous scheduling.
    #[cfg(test)]
    pub(crate) fn small_for_tests() -> Self {
        Self {
            max_num_seqs: 8,
            max_num_batched_tokens: 2048,
            num_gpu_blocks: 1000,
            prefix_caching: false,
            async_scheduling: false,
            ..Self::closed_loop(8, 1000)
        }
    }

    /// The long-prefill threshold in force for a step that starts with `requests` requests
    /// running, waiting or loading: none for a lone request, which has nobody to starve (vLLM's
    /// `Scheduler.schedule()` in `vllm/v1/core/sched/scheduler.py` sets it to 0 unless
    /// `num_running + num_waiting > 1`, counted once at the step's start; since vLLM 0.33,
    /// PR #57951, and the field's own docstring in `vllm/config/scheduler.py` says so).
    fn threshold_for(&self, requests: usize) -> u32 {
        if requests > 1 {
            self.long_prefill_token_threshold
        } else {
            0
        }
    }

    /// The tokens of one sequence in this step: `remaining` capped by the long-prefill
    /// `threshold` in force ([`Self::threshold_for`]; as vLLM's `schedule()`:
    /// `if 0 < threshold < num_new_tokens`, for running and waiting requests alike), then by the
    /// `budget` left.
    fn chunk(threshold: u32, remaining: u32, budget: u32) -> u32 {
        let n = if 0 < threshold && threshold < remaining {
            threshold
        } else {
            remaining
        };
        n.min(budget)
    }
}

/// Work done twice: full blocks a sequence computed whose hash an earlier computation had
/// produced already (the same request before a preemption, or another request with the same
/// prefix) and the cache had lost meanwhile. Not one of vLLM's metrics: the simulator's truth
/// for experiments (`/debug/engine`'s `recomputed_tokens`). A partial last block is not
/// counted. The hashes seen are kept in two generations of at most `GENERATION` each, so the
/// memory is bounded and a block computed again after about that many newer blocks is not
/// counted.
#[derive(Debug, Default)]
pub struct Recomputed {
    current: HashSet<u64>,
    previous: HashSet<u64>,
    /// Tokens of blocks computed again.
    pub tokens: u64,
}

impl Recomputed {
    const GENERATION: usize = 1 << 21;

    /// A full block `hash` of `block_size` tokens was computed.
    fn computed(&mut self, hash: u64, block_size: u32) {
        let fresh = self.current.insert(hash);
        if !fresh || self.previous.contains(&hash) {
            self.tokens += u64::from(block_size);
        }
        if self.current.len() >= Self::GENERATION {
            self.previous = std::mem::take(&mut self.current);
        }
    }
}

/// What one step computes: tokens per sequence, and its shape for the cost model.
#[derive(Debug, Default, Clone)]
pub struct StepPlan {
    /// `(seq_no, new tokens)` for each scheduled sequence.
    pub scheduled: Vec<(u64, u32)>,
    /// Totals for the cost model.
    pub shape: StepShape,
    /// Sequences whose whole sequence is computed by this step: it samples a token for each.
    pub sampling: Vec<u64>,
    /// Sequences preempted while planning this step.
    pub preempted: u32,
}

impl StepPlan {
    /// Whether the step does nothing.
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }

    /// Tokens the step computes.
    pub fn num_tokens(&self) -> u32 {
        self.scheduled.iter().map(|(_, n)| n).sum()
    }
}

/// The scheduler's state: queues, KV blocks and counters.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    /// KV blocks.
    pub pool: BlockPool,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Sequences loading blocks from the CPU tier (vLLM's `WAITING_FOR_REMOTE_KVS`), each
    /// until its `kv_ready_at`.
    loading: Vec<Sequence>,
    /// The CPU tier of KV offloading (empty and off without it).
    pub cpu: CpuTier,
    /// Every block hash computed so far, to count work done twice (see [`Recomputed`]).
    pub recomputed: Recomputed,
    /// vLLM's Prometheus counters and histograms.
    pub metrics: EngineMetrics,
}

impl Scheduler {
    /// An idle scheduler.
    pub fn new(cfg: SchedulerConfig) -> Self {
        Self {
            cfg,
            pool: BlockPool::new(cfg.num_gpu_blocks, cfg.prefix_caching),
            waiting: VecDeque::new(),
            running: Vec::new(),
            loading: Vec::new(),
            cpu: CpuTier::new(cfg.num_cpu_blocks),
            recomputed: Recomputed::default(),
            metrics: EngineMetrics::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Queues a new sequence.
    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Sequences waiting (new, preempted, or loading offloaded blocks, as vLLM counts them).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.loading.len()
    }

    /// Whether any sequence is running or waiting.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.loading.is_empty()
    }

    /// When the earliest load from the CPU tier ends (the engine loop wakes then).
    pub fn next_load_done(&self) -> Option<Instant> {
        self.loading.iter().filter_map(|s| s.kv_ready_at).min()
    }

    /// Sequences whose load has ended go back to the head of the waiting queue, in the order
    /// they started loading (vLLM: a finished load makes the request `WAITING` again, where it
    /// was skipped, at the queue's head).
    fn finish_loads(&mut self, now: Instant) {
        let mut i = self.loading.len();
        while i > 0 {
            i -= 1;
            if self.loading[i].kv_ready_at.is_some_and(|t| t <= now) {
                let mut seq = self.loading.remove(i);
                seq.kv_ready_at = None;
                self.waiting.push_front(seq);
            }
        }
    }

    /// Aborts sequences matching `pred`, freeing their blocks; returns how many.
    pub fn abort_where(&mut self, now: Instant, pred: impl Fn(&Sequence) -> bool) -> usize {
        let mut aborted = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if pred(&self.running[i]) {
                aborted.push(self.running.remove(i));
            } else {
                i += 1;
            }
        }
        let (gone, keep): (Vec<_>, Vec<_>) = self.waiting.drain(..).partition(|s| pred(s));
        self.waiting = keep.into();
        aborted.extend(gone);
        let (gone, keep): (Vec<_>, Vec<_>) = self.loading.drain(..).partition(|s| pred(s));
        self.loading = keep;
        aborted.extend(gone);
        let n = aborted.len();
        for seq in aborted {
            self.finish(seq, FinishReason::Abort, false, now);
        }
        n
    }

    /// Plans the next step (and preempts if blocks run out). The scheduled sequences' computed
    /// tokens advance now, as in vLLM, so the next step can be planned before this one completes.
    pub fn schedule(&mut self, now: Instant) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let bs = self.cfg.block_size;
        let threshold = self
            .cfg
            .threshold_for(self.running.len() + self.waiting.len() + self.loading.len());

        // 1. Running sequences, in admission order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            if seq.placeholders > 0
                && seq.finish_at_target == FinishReason::Length
                && seq.output_tokens + seq.placeholders >= seq.target_output
            {
                // Asynchronous scheduling: the step in flight samples its last token (vLLM
                // knows `max_tokens`, so it plans no extra step; a stop it cannot foresee).
                i += 1;
                continue;
            }
            let new = SchedulerConfig::chunk(threshold, seq.total_tokens() - seq.computed, budget);
            if new == 0 {
                i += 1;
                continue;
            }
            let need = (seq.computed + new)
                .div_ceil(bs)
                .saturating_sub(seq.blocks.len() as u32);
            let mut scheduled_self = true;
            loop {
                if let Some(blocks) = self.pool.allocate(need) {
                    self.running[i].blocks.extend(blocks);
                    break;
                }
                // Out of blocks: preempt the most recently admitted running sequence (under
                // the priority policy: the lowest priority, then the latest arrival).
                let v = self.victim_index();
                let victim = self.running.remove(v);
                plan.preempted += 1;
                if v == i {
                    self.preempt(victim);
                    scheduled_self = false;
                    break;
                }
                if v < i {
                    // Already scheduled in this step: give its tokens back to the budget.
                    if let Some(pos) = plan
                        .scheduled
                        .iter()
                        .position(|(no, _)| *no == victim.seq_no)
                    {
                        budget += plan.scheduled.remove(pos).1;
                    }
                    i -= 1;
                }
                self.preempt(victim);
            }
            if !scheduled_self {
                // It preempted itself (it was the victim), freeing its blocks: the requests after
                // it may still fit, as in vLLM's `schedule()` (under the priority policy they
                // have higher priority; under FCFS the victim is the last, so the loop ends).
                continue;
            }
            let seq = &self.running[i];
            plan.scheduled.push((seq.seq_no, new));
            budget -= new;
            i += 1;
        }

        // 2. Waiting sequences, only if nothing was preempted.
        self.finish_loads(now);
        while plan.preempted == 0
            && budget > 0
            && (self.running.len() as u32) < self.cfg.max_num_seqs
            && !self.waiting.is_empty()
        {
            let idx = self.next_waiting();
            let seq = &self.waiting[idx];
            let total = seq.total_tokens();
            // A hit never covers the last token: it must be computed to sample from it.
            let max_hit_blocks = ((total - 1) / bs) as usize;
            // A sequence back from loading holds its blocks, hit and loaded, computed.
            let loaded = !seq.blocks.is_empty();
            let hit_blocks = if loaded {
                seq.blocks.len()
            } else {
                self.pool
                    .cached_prefix_len(&seq.block_hashes)
                    .min(max_hit_blocks)
            };
            // The blocks after the GPU hit that the CPU tier holds (at least one, as vLLM's
            // `get_num_new_matched_tokens`): loaded before the sequence is scheduled.
            let cpu_blocks = if loaded || !self.cpu.enabled() {
                0
            } else {
                let end = max_hit_blocks.min(seq.block_hashes.len());
                let start = hit_blocks.min(end);
                self.cpu.lookup(&seq.block_hashes[start..end])
            };
            let hit_tokens = hit_blocks as u32 * bs;
            let new = if cpu_blocks > 0 {
                0
            } else {
                SchedulerConfig::chunk(threshold, total - hit_tokens, budget)
            };
            // Fresh blocks: for the loaded blocks, or for the chunk computed now.
            let need = if cpu_blocks > 0 {
                cpu_blocks as u32
            } else {
                (hit_tokens + new).div_ceil(bs) - hit_blocks as u32
            };
            // Blocks for the whole sequence beyond the hit (vLLM's `allocate_slots(...,
            // full_sequence_must_fit=True)`).
            let need_full = total.div_ceil(bs) - hit_blocks as u32;
            let mut seq = self.waiting.remove(idx).expect("index is valid");
            // Cached blocks may come out of the free queue, so take them before allocating.
            let mut blocks = if loaded {
                std::mem::take(&mut seq.blocks)
            } else {
                self.pool.take_cached(&seq.block_hashes, hit_blocks)
            };
            let fits = !self.cfg.reserve_full_isl || need_full <= self.pool.num_free();
            let fresh = if fits { self.pool.allocate(need) } else { None };
            match fresh {
                Some(fresh) => blocks.extend(fresh),
                None => {
                    if loaded {
                        seq.blocks = blocks;
                    } else {
                        self.pool.release(&blocks);
                    }
                    self.waiting.insert(idx, seq);
                    break;
                }
            }
            if cpu_blocks > 0 {
                // Loads asynchronously; takes no seat and no budget meanwhile. As vLLM sets
                // `num_cached_tokens` once, at first scheduling, a sequence loading again after
                // a preemption keeps its first figure.
                self.cpu.loaded += cpu_blocks as u64;
                let computed = (hit_blocks + cpu_blocks) as u32 * bs;
                if !seq.started {
                    seq.started = true;
                    seq.cached_tokens = computed;
                    self.metrics.prefix_cache_queries += u64::from(seq.prompt_len);
                    self.metrics.prefix_cache_hits += u64::from(hit_tokens);
                }
                seq.computed = computed;
                seq.hit_blocks = hit_blocks + cpu_blocks;
                seq.blocks = blocks;
                seq.kv_ready_at = Some(now + self.cfg.cpu_load_per_block * cpu_blocks as u32);
                self.loading.push(seq);
                continue;
            }
            if !seq.started {
                seq.started = true;
                seq.cached_tokens = hit_tokens;
                self.metrics.prefix_cache_queries += u64::from(seq.prompt_len);
                self.metrics.prefix_cache_hits += u64::from(hit_tokens);
            }
            seq.timings.first_scheduled.get_or_insert(now);
            seq.computed = hit_tokens;
            seq.hit_blocks = hit_blocks;
            seq.blocks = blocks;
            plan.scheduled.push((seq.seq_no, new));
            budget -= new;
            self.running.push(seq);
        }
        plan.shape = self.shape_of(&plan.scheduled);
        self.update_after_schedule(&mut plan);
        plan
    }

    /// vLLM's `_update_after_schedule` (and `AsyncScheduler`'s): the scheduled tokens count as
    /// computed from now on, full blocks enter the prefix cache (vLLM caches them when it
    /// allocates them: `KVCacheManager.allocate_slots` caches up to
    /// `min(num_computed_tokens + num_new_tokens, request.num_tokens)`, the output sampled so
    /// far included), and a sequence whose whole sequence is now computed gets a placeholder
    /// for the token the step samples.
    fn update_after_schedule(&mut self, plan: &mut StepPlan) {
        let new: HashMap<u64, u32> = plan.scheduled.iter().copied().collect();
        let bs = self.cfg.block_size as usize;
        for seq in &mut self.running {
            let Some(&n) = new.get(&seq.seq_no) else {
                continue;
            };
            seq.computed += n;
            let full =
                (seq.computed.min(seq.num_tokens()) as usize / bs).min(seq.block_hashes.len());
            for b in seq.registered_blocks..full {
                if b >= seq.hit_blocks {
                    self.recomputed
                        .computed(seq.block_hashes[b], self.cfg.block_size);
                }
                self.pool.register(seq.blocks[b], seq.block_hashes[b]);
                // KV offloading copies every newly computed full block to the CPU tier.
                self.cpu.store(seq.block_hashes[b]);
            }
            seq.registered_blocks = seq.registered_blocks.max(full);
            if seq.computed == seq.total_tokens() {
                seq.placeholders += 1;
                plan.sampling.push(seq.seq_no);
            }
        }
    }

    /// The step's shape for the cost model, from what was finally scheduled (before computed
    /// tokens advance).
    fn shape_of(&self, scheduled: &[(u64, u32)]) -> StepShape {
        let new: HashMap<u64, u32> = scheduled.iter().copied().collect();
        let mut shape = StepShape::default();
        for seq in &self.running {
            let Some(&n) = new.get(&seq.seq_no) else {
                continue;
            };
            if seq.is_prefilling() {
                shape.prefill_tokens += n;
                shape.prefill_seqs += 1;
                let (n, p) = (u64::from(n), u64::from(seq.computed));
                shape.prefill_attention_pairs += n * p + n * (n + 1) / 2;
            } else {
                shape.decode_seqs += 1;
                shape.context_tokens += u64::from(seq.total_tokens());
            }
        }
        shape
    }

    /// Index of the running sequence to preempt: the most recently admitted, or under the
    /// priority policy the one with the largest `priority` value (then the latest arrival).
    fn victim_index(&self) -> usize {
        if !self.cfg.priority_policy {
            return self.running.len() - 1;
        }
        (0..self.running.len())
            .max_by_key(|&i| (self.running[i].priority, self.running[i].seq_no))
            .unwrap_or(0)
    }

    /// Index of the waiting sequence to admit next.
    fn next_waiting(&self) -> usize {
        if !self.cfg.priority_policy {
            return 0;
        }
        (0..self.waiting.len())
            .min_by_key(|&i| (self.waiting[i].priority, self.waiting[i].seq_no))
            .unwrap_or(0)
    }

    fn preempt(&mut self, mut seq: Sequence) {
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        seq.registered_blocks = 0;
        seq.computed = 0;
        // A token still being sampled for it by a step in flight is delivered all the same
        // (vLLM's stale output), but is no longer counted ahead.
        seq.placeholders = 0;
        self.metrics.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Completes a planned step at time `now`: delivers the token each sampling sequence got,
    /// finishes those that reached their length. Sequences finished or aborted since planning
    /// are skipped (vLLM's `update_from_output`: "the request is already finished"); one
    /// preempted since planning still gets its token.
    pub fn complete(&mut self, plan: &StepPlan, now: Instant) {
        if plan.sampling.is_empty() {
            return;
        }
        let sampling: HashSet<u64> = plan.sampling.iter().copied().collect();
        let mut found = 0;
        let mut i = 0;
        while i < self.running.len() {
            if !sampling.contains(&self.running[i].seq_no) {
                i += 1;
                continue;
            }
            found += 1;
            let seq = &mut self.running[i];
            seq.placeholders = seq.placeholders.saturating_sub(1);
            match self.deliver(i, true, now) {
                Delivery::Kept => i += 1,
                Delivery::Gone => {}
            }
        }
        if found == sampling.len() {
            return;
        }
        // Preempted while the step ran (asynchronous scheduling only).
        let mut i = 0;
        while i < self.waiting.len() {
            if sampling.contains(&self.waiting[i].seq_no) {
                match self.deliver(i, false, now) {
                    Delivery::Kept => i += 1,
                    Delivery::Gone => {}
                }
            } else {
                i += 1;
            }
        }
    }

    /// Gives one sampled token to the sequence at `idx` of `running` (or of `waiting`), and
    /// finishes it if that was its last token or nobody reads it any more.
    fn deliver(&mut self, idx: usize, running: bool, now: Instant) -> Delivery {
        let seq = if running {
            &mut self.running[idx]
        } else {
            &mut self.waiting[idx]
        };
        seq.output_tokens += 1;
        seq.output_grew();
        let gap = seq.timings.last_token.map(|t| now - t);
        seq.timings.last_token = Some(now);
        if seq.timings.first_token.is_none() {
            seq.timings.first_token = Some(now);
            self.metrics
                .first_token(now - seq.timings.arrival, seq.prompt_len);
        }
        self.metrics.token(gap);
        let last = seq.output_tokens >= seq.target_output;
        // Nobody reads the stream any more: the client went away.
        let gone = !last && seq.tx.send(EngineEvent::Token).is_err();
        if !last && !gone {
            return Delivery::Kept;
        }
        let seq = if running {
            self.running.remove(idx)
        } else {
            self.waiting.remove(idx).expect("index is valid")
        };
        if last {
            let reason = seq.finish_at_target;
            self.finish(seq, reason, true, now);
        } else {
            self.finish(seq, FinishReason::Abort, false, now);
        }
        Delivery::Gone
    }

    fn finish(&mut self, mut seq: Sequence, reason: FinishReason, with_token: bool, now: Instant) {
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        seq.timings.finished = Some(now);
        let done = seq.finished(reason, with_token);
        self.metrics.finished(&done);
        let _ = seq.tx.send(EngineEvent::Finished(done));
    }
}

/// What became of a sequence given a token.
enum Delivery {
    /// It goes on.
    Kept,
    /// It finished (or was aborted) and left its queue.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kv_cache::block_hashes;
    use tokio::sync::mpsc::{self, UnboundedReceiver};

    fn cfg(threshold: u32, reserve_full_isl: bool) -> SchedulerConfig {
        SchedulerConfig {
            long_prefill_token_threshold: threshold,
            reserve_full_isl,
            ..SchedulerConfig::small_for_tests()
        }
    }

    /// A sequence of `prompt_len` distinct tokens that generates `out` tokens.
    fn seq(no: u64, prompt_len: u32, out: u32) -> (Sequence, UnboundedReceiver<EngineEvent>) {
        let prompt: Vec<u32> = (0..prompt_len).map(|i| (no as u32) * 100_000 + i).collect();
        seq_of(no, &prompt, out)
    }

    /// Under the priority policy a running request that is the lowest priority preempts itself
    /// when it needs a block; the requests after it (higher priority) are still scheduled in
    /// that step with the blocks it freed, as vLLM's `schedule()` goes on to them.
    #[test]
    fn a_self_preempting_request_lets_the_ones_after_it_run() {
        let mut s = Scheduler::new(SchedulerConfig {
            num_gpu_blocks: 4,
            priority_policy: true,
            ..cfg(0, false)
        });
        // Admitted first (alone, so it runs first), lowest priority; then a higher-priority one.
        // Each holds 2 of the 4 blocks by its 17th token, and needs a third at its 33rd.
        let (low, _rl) = prioritised(1, 16, 100, 5);
        let (high, _rh) = prioritised(2, 16, 100, 0);
        s.add(low);
        let plan = s.schedule(Instant::now());
        s.complete(&plan, Instant::now());
        s.add(high);
        for _ in 0..100 {
            let plan = s.schedule(Instant::now());
            if plan.preempted > 0 {
                assert!(
                    plan.scheduled.iter().any(|(no, _)| *no == 2),
                    "the higher-priority request runs in the step its blocks were freed: {:?}",
                    plan.scheduled
                );
                return;
            }
            s.complete(&plan, Instant::now());
        }
        panic!("the low-priority request never ran out of blocks");
    }

    /// Three low-priority requests decode on a cache that cannot hold them all to the end; a
    /// high-priority one comes while they run. First come, first served pre-empts the newest
    /// (the high one) and it finishes last; the priority policy pre-empts low ones instead, and
    /// the high one finishes before at least one of the lows it overtook. Stepped by hand: the
    /// order is the scheduler's, not a loaded machine's.
    #[test]
    fn the_policy_picks_whom_a_full_cache_preempts() {
        for priority_policy in [false, true] {
            let mut s = Scheduler::new(SchedulerConfig {
                num_gpu_blocks: 64,
                priority_policy,
                ..cfg(0, false)
            });
            let mut rxs = Vec::new();
            for no in 1..=3 {
                let (low, rx) = prioritised(no, 130, 300, 10);
                s.add(low);
                rxs.push((no, rx));
            }
            // The lows decode half their answers, then the high one comes.
            for _ in 0..150 {
                let plan = s.schedule(Instant::now());
                s.complete(&plan, Instant::now());
            }
            let (high, rx) = prioritised(4, 130, 300, -5);
            s.add(high);
            rxs.push((4, rx));
            let mut order = Vec::new();
            let mut preempted = 0;
            while s.has_work() {
                let plan = s.schedule(Instant::now());
                preempted += plan.preempted;
                s.complete(&plan, Instant::now());
                for (no, rx) in &mut rxs {
                    while let Ok(ev) = rx.try_recv() {
                        if matches!(ev, EngineEvent::Finished(_)) {
                            order.push(*no);
                        }
                    }
                }
            }
            assert_eq!(order.len(), 4, "{order:?}");
            assert!(preempted > 0, "the cache ran out");
            let high = order.iter().position(|no| *no == 4).unwrap();
            if priority_policy {
                assert!(
                    high < 3,
                    "priority: the high one overtakes a low one: {order:?}"
                );
            } else {
                assert_eq!(
                    high, 3,
                    "fcfs: the newest is pre-empted and ends last: {order:?}"
                );
            }
        }
    }

    /// A sequence of `prompt_len` distinct tokens that generates `out` tokens, at `priority`.
    fn prioritised(
        no: u64,
        prompt_len: u32,
        out: u32,
        priority: i64,
    ) -> (Sequence, UnboundedReceiver<EngineEvent>) {
        let prompt: Vec<u32> = (0..prompt_len).map(|i| (no as u32) * 100_000 + i).collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let s = Sequence::new(
            no.to_string(),
            no,
            &prompt,
            16,
            out,
            FinishReason::Length,
            priority,
            tx,
            Instant::now(),
        );
        (s, rx)
    }

    /// A sequence of the tokens `prompt` that generates `out` tokens.
    fn seq_of(no: u64, prompt: &[u32], out: u32) -> (Sequence, UnboundedReceiver<EngineEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let s = Sequence::new(
            no.to_string(),
            no,
            prompt,
            16,
            out,
            FinishReason::Length,
            0,
            tx,
            Instant::now(),
        );
        (s, rx)
    }

    /// The same prompt under another `cache_salt` finds nothing cached; under the same salt
    /// (or both without one) it finds its prefix.
    #[test]
    fn a_cache_salt_keeps_prompts_apart_in_the_prefix_cache() {
        let prompt: Vec<u32> = (0..64).collect();
        let cached = |first: Option<&str>, second: Option<&str>| {
            let mut s = Scheduler::new(SchedulerConfig {
                prefix_caching: true,
                ..cfg(0, true)
            });
            let (a, _ra) = seq_of(1, &prompt, 1);
            s.add(a.salted(&prompt, first));
            drain(&mut s);
            let (b, mut rb) = seq_of(2, &prompt, 1);
            s.add(b.salted(&prompt, second));
            drain(&mut s);
            finished(&mut rb).cached_tokens
        };
        assert_eq!(
            cached(None, None),
            48,
            "the last full block is computed again"
        );
        assert_eq!(cached(Some("school-a"), Some("school-a")), 48);
        assert_eq!(cached(Some("school-a"), Some("school-b")), 0);
        assert_eq!(cached(None, Some("school-b")), 0);
    }

    /// Runs every queued sequence to its end, one step at a time.
    fn drain(s: &mut Scheduler) {
        while s.has_work() {
            let plan = s.schedule(Instant::now());
            assert!(!plan.is_empty(), "nothing loads here: every step does work");
            s.complete(&plan, Instant::now());
        }
    }

    /// On an 8-block cache: A (64 prompt tokens, 1 output) runs to its end, then B (112 tokens,
    /// 2 outputs: 8 blocks) evicts every block A left in the GPU's prefix cache; then A's prompt comes
    /// again, as C (a resumed request's prompt does). Returns the scheduler with C queued.
    fn after_a_is_evicted(num_cpu_blocks: u32) -> (Scheduler, Vec<UnboundedReceiver<EngineEvent>>) {
        let mut s = Scheduler::new(SchedulerConfig {
            num_gpu_blocks: 8,
            prefix_caching: true,
            num_cpu_blocks,
            cpu_load_per_block: Duration::from_millis(10),
            ..cfg(0, true)
        });
        let prompt: Vec<u32> = (0..64).collect();
        let (a, ra) = seq_of(1, &prompt, 1);
        s.add(a);
        drain(&mut s);
        let (b, rb) = seq(2, 112, 2);
        s.add(b);
        drain(&mut s);
        assert_eq!(s.pool.cached_prefix_len(&block_hashes(&prompt, 16)), 0);
        let (c, rc) = seq_of(3, &prompt, 1);
        s.add(c);
        (s, vec![ra, rb, rc])
    }

    fn finished(rx: &mut UnboundedReceiver<EngineEvent>) -> crate::engine::sequence::Finished {
        loop {
            match rx.try_recv() {
                Ok(EngineEvent::Finished(f)) => return f,
                Ok(_) => continue,
                Err(e) => panic!("no end: {e:?}"),
            }
        }
    }

    #[test]
    fn an_evicted_prompt_is_loaded_from_the_cpu_tier_instead_of_recomputed() {
        let (mut s, mut rx) = after_a_is_evicted(100);
        let t0 = Instant::now();
        let plan = s.schedule(t0);
        assert!(plan.is_empty(), "C loads first: no seat, no tokens");
        assert_eq!((s.num_running(), s.num_waiting()), (0, 1));
        // Three blocks (the fourth holds the last prompt token, which is always computed).
        assert_eq!(s.next_load_done(), Some(t0 + Duration::from_millis(30)));
        assert!(s.schedule(t0 + Duration::from_millis(29)).is_empty());
        let plan = s.schedule(t0 + Duration::from_millis(30));
        assert_eq!(
            plan.scheduled,
            vec![(3, 16)],
            "only the last block is computed"
        );
        s.complete(&plan, Instant::now());
        drain(&mut s);
        let c = finished(&mut rx[2]);
        assert_eq!(
            c.cached_tokens, 48,
            "loaded tokens count as cached, as in vLLM"
        );
        assert_eq!(s.cpu.loaded, 3);
        // Only the block of the last prompt token (a hit never covers it) is computed again.
        assert_eq!(s.recomputed.tokens, 16);
        assert_eq!(s.pool.num_free(), 8, "every block came back");
    }

    #[test]
    fn without_offloading_an_evicted_prompt_is_recomputed() {
        let (mut s, mut rx) = after_a_is_evicted(0);
        let plan = s.schedule(Instant::now());
        assert_eq!(plan.scheduled, vec![(3, 64)]);
        s.complete(&plan, Instant::now());
        drain(&mut s);
        assert_eq!(finished(&mut rx[2]).cached_tokens, 0);
        assert!(s.cpu.is_empty());
        assert_eq!(
            s.recomputed.tokens, 64,
            "A's four full prompt blocks, computed twice"
        );
    }

    #[test]
    fn a_request_aborted_while_it_loads_gives_its_blocks_back() {
        let (mut s, _rx) = after_a_is_evicted(100);
        assert!(s.schedule(Instant::now()).is_empty());
        assert_eq!(s.pool.num_free(), 5, "C holds 3 blocks while it loads");
        assert_eq!(s.abort_where(Instant::now(), |q| q.seq_no == 3), 1);
        assert_eq!(s.pool.num_free(), 8);
        assert!(!s.has_work());
        assert_eq!(s.next_load_done(), None);
    }

    #[test]
    fn the_long_prefill_threshold_spares_a_lone_prefill_and_caps_two() {
        // vLLM's schedule() sets the threshold to 0 unless more than one request is running or
        // waiting (`num_running + num_waiting > 1`): a lone long prefill takes the step budget.
        let mut s = Scheduler::new(cfg(256, true));
        let (a, _ra) = seq(1, 1000, 4);
        s.add(a);
        let plan = s.schedule(Instant::now());
        assert_eq!(
            plan.scheduled,
            vec![(1, 1000)],
            "a lone long prefill is not capped"
        );
        // Two requests: both capped alike, the running one too.
        let mut s = Scheduler::new(cfg(256, true));
        let (a, _ra) = seq(1, 1000, 4);
        s.add(a);
        let (b, _rb) = seq(2, 1000, 4);
        s.add(b);
        let plan = s.schedule(Instant::now());
        assert_eq!(
            plan.scheduled,
            vec![(1, 256), (2, 256)],
            "two are capped alike"
        );
        s.complete(&plan, Instant::now());
        let (c, _rc) = seq(3, 1000, 4);
        s.add(c);
        let plan = s.schedule(Instant::now());
        assert_eq!(
            plan.scheduled,
            vec![(1, 256), (2, 256), (3, 256)],
            "a running prefill stays capped while others are there"
        );
        // A decode is never capped, and the cap never lets a step exceed its budget.
        let mut s = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: 300,
            ..cfg(256, true)
        });
        let (a, _ra) = seq(1, 1000, 4);
        let (b, _rb) = seq(2, 1000, 4);
        s.add(a);
        s.add(b);
        let plan = s.schedule(Instant::now());
        assert_eq!(plan.scheduled, vec![(1, 256), (2, 44)]);
    }

    /// A (96 prompt tokens) runs to its first decode on a 10-block cache, leaving 3 blocks free;
    /// then B arrives with a 64-token prompt (4 blocks) whose first 16-token chunk needs 1.
    fn admit_after_a_decoding(
        reserve_full_isl: bool,
    ) -> (StepPlan, Scheduler, Vec<UnboundedReceiver<EngineEvent>>) {
        let mut s = Scheduler::new(SchedulerConfig {
            num_gpu_blocks: 10,
            ..cfg(16, reserve_full_isl)
        });
        let (a, mut ra) = seq(1, 96, 100);
        s.add(a);
        while ra.try_recv().is_err() {
            let plan = s.schedule(Instant::now());
            assert!(!plan.is_empty());
            s.complete(&plan, Instant::now());
        }
        let plan = s.schedule(Instant::now());
        s.complete(&plan, Instant::now());
        assert_eq!(s.pool.num_free(), 3, "A holds 7 blocks (97 tokens)");
        let (b, rb) = seq(2, 64, 4);
        s.add(b);
        (s.schedule(Instant::now()), s, vec![ra, rb])
    }

    #[test]
    fn a_prompt_whose_whole_sequence_does_not_fit_waits_though_its_first_chunk_would() {
        let (plan, s, _rx) = admit_after_a_decoding(true);
        assert_eq!(plan.scheduled, vec![(1, 1)], "only A decodes");
        assert_eq!((s.num_running(), s.num_waiting()), (1, 1));
        assert_eq!(
            s.pool.num_free(),
            3,
            "B took nothing, not even its first chunk"
        );
        // Without the reservation (vLLM's scheduler_reserve_full_isl=False; the simulator's
        // old behaviour) the first chunk is enough to be admitted.
        let (plan, s, _rx) = admit_after_a_decoding(false);
        assert_eq!(plan.scheduled, vec![(1, 1), (2, 16)]);
        assert_eq!((s.num_running(), s.num_waiting()), (2, 0));
    }

    #[test]
    fn a_planned_step_advances_computed_tokens_so_the_next_can_be_planned_before_it_ends() {
        let mut s = Scheduler::new(cfg(0, true));
        let (a, mut ra) = seq(1, 100, 3);
        s.add(a);
        let first = s.schedule(Instant::now());
        assert_eq!(first.scheduled, vec![(1, 100)]);
        assert_eq!(
            first.sampling,
            vec![1],
            "the whole prompt is computed: it samples"
        );
        // Planned before `first` completes: A decodes from the token being sampled.
        let second = s.schedule(Instant::now());
        assert_eq!(second.scheduled, vec![(1, 1)]);
        assert_eq!(
            (second.shape.decode_seqs, second.shape.prefill_tokens),
            (1, 0)
        );
        s.complete(&first, Instant::now());
        assert!(matches!(ra.try_recv(), Ok(EngineEvent::Token)));
        // max_tokens (3) is reached by the tokens of `second` and the step planned now: no
        // fourth step is planned for A while they are in flight.
        let third = s.schedule(Instant::now());
        assert_eq!(third.scheduled, vec![(1, 1)]);
        s.complete(&second, Instant::now());
        assert!(
            s.schedule(Instant::now()).is_empty(),
            "A's last token is in flight"
        );
        s.complete(&third, Instant::now());
        assert!(matches!(ra.try_recv(), Ok(EngineEvent::Token)));
        match ra.try_recv() {
            Ok(EngineEvent::Finished(f)) => assert_eq!(f.output_tokens, 3),
            other => panic!("{other:?}"),
        }
        assert!(!s.has_work());
    }
}
