//! vLLM V1's scheduler, one step at a time, with no clock of its own.
//!
//! Each step has a token budget (`max_num_batched_tokens`) and at most `max_num_seqs` running
//! sequences. Running sequences are served first, in admission order: a decode takes one token,
//! an unfinished prefill takes a chunk of what is left of the budget (chunked prefill). When a
//! sequence needs a KV block and none is free, the most recently admitted running sequence is
//! preempted (its blocks freed, its tokens recomputed later). Then, if nothing was preempted,
//! waiting sequences are admitted in arrival order (or by `priority`) while seats, budget and
//! blocks last, each first taking the prefix-cache hit of its prompt.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::kv_cache::BlockPool;
use super::sequence::{EngineEvent, FinishReason, Sequence};
use crate::metrics::EngineMetrics;
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
    /// Most prompt tokens one long prefill may compute in a step (vLLM's
    /// `--long-prefill-token-threshold`); 0: no cap beyond the step budget.
    pub long_prefill_token_threshold: u32,
}

impl SchedulerConfig {
    /// A prefill chunk of `remaining` tokens under `budget`, capped by the long-prefill threshold.
    fn chunk(&self, remaining: u32, budget: u32, prefilling: bool) -> u32 {
        let n = remaining.min(budget);
        if prefilling && self.long_prefill_token_threshold > 0 {
            n.min(self.long_prefill_token_threshold)
        } else {
            n
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

    /// Sequences waiting (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether any sequence is running or waiting.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
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
        let n = aborted.len();
        for seq in aborted {
            self.finish(seq, FinishReason::Abort, false, now);
        }
        n
    }

    /// Plans the next step (and preempts if blocks run out).
    pub fn schedule(&mut self, now: Instant) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let bs = self.cfg.block_size;

        // 1. Running sequences, in admission order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let new = self
                .cfg
                .chunk(seq.num_tokens() - seq.computed, budget, seq.is_prefilling());
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
                break;
            }
            let seq = &self.running[i];
            plan.scheduled.push((seq.seq_no, new));
            budget -= new;
            i += 1;
        }

        // 2. Waiting sequences, only if nothing was preempted.
        while plan.preempted == 0
            && budget > 0
            && (self.running.len() as u32) < self.cfg.max_num_seqs
            && !self.waiting.is_empty()
        {
            let idx = self.next_waiting();
            let seq = &self.waiting[idx];
            // A hit never covers the last token: it must be computed to sample from it.
            let max_hit_blocks = ((seq.num_tokens() - 1) / bs) as usize;
            let hit_blocks = self
                .pool
                .cached_prefix_len(&seq.block_hashes)
                .min(max_hit_blocks);
            let hit_tokens = hit_blocks as u32 * bs;
            let new = self.cfg.chunk(seq.num_tokens() - hit_tokens, budget, true);
            let need = (hit_tokens + new).div_ceil(bs) - hit_blocks as u32;
            let mut seq = self.waiting.remove(idx).expect("index is valid");
            // Cached blocks may come out of the free queue, so take them before allocating.
            let mut blocks = self.pool.take_cached(&seq.block_hashes, hit_blocks);
            match self.pool.allocate(need) {
                Some(fresh) => blocks.extend(fresh),
                None => {
                    self.pool.release(&blocks);
                    self.waiting.insert(idx, seq);
                    break;
                }
            }
            if !seq.started {
                seq.started = true;
                seq.cached_tokens = hit_tokens;
                self.metrics.prefix_cache_queries += u64::from(seq.prompt_len);
                self.metrics.prefix_cache_hits += u64::from(hit_tokens);
            }
            seq.timings.first_scheduled.get_or_insert(now);
            seq.computed = hit_tokens;
            seq.blocks = blocks;
            plan.scheduled.push((seq.seq_no, new));
            budget -= new;
            self.running.push(seq);
        }
        plan.shape = self.shape_of(&plan.scheduled);
        plan
    }

    /// The step's shape for the cost model, from what was finally scheduled.
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
                shape.context_tokens += u64::from(seq.num_tokens());
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
        self.metrics.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Applies a planned step at time `now`: advances computed tokens, samples tokens, sends
    /// them, finishes sequences. Sequences aborted since planning are skipped.
    pub fn complete(&mut self, plan: &StepPlan, now: Instant) {
        let scheduled: HashMap<u64, u32> = plan.scheduled.iter().copied().collect();
        let bs = self.cfg.block_size as usize;
        let mut i = 0;
        while i < self.running.len() {
            let Some(&new) = scheduled.get(&self.running[i].seq_no) else {
                i += 1;
                continue;
            };
            let seq = &mut self.running[i];
            seq.computed += new;
            // Register prompt blocks that became full.
            let full = (seq.computed.min(seq.prompt_len) as usize / bs).min(seq.block_hashes.len());
            for b in seq.registered_blocks..full {
                self.pool.register(seq.blocks[b], seq.block_hashes[b]);
            }
            seq.registered_blocks = seq.registered_blocks.max(full);
            if seq.computed < seq.num_tokens() {
                i += 1;
                continue;
            }
            // The whole sequence is computed: sample one token.
            seq.output_tokens += 1;
            let gap = seq.timings.last_token.map(|t| now - t);
            seq.timings.last_token = Some(now);
            if seq.timings.first_token.is_none() {
                seq.timings.first_token = Some(now);
                self.metrics
                    .first_token(now - seq.timings.arrival, seq.prompt_len);
            }
            self.metrics.token(gap);
            if seq.output_tokens >= seq.target_output {
                let seq = self.running.remove(i);
                let reason = seq.finish_at_target;
                self.finish(seq, reason, true, now);
                continue;
            }
            if seq.tx.send(EngineEvent::Token).is_err() {
                // Nobody reads the stream any more: the client went away.
                let seq = self.running.remove(i);
                self.finish(seq, FinishReason::Abort, false, now);
                continue;
            }
            i += 1;
        }
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
