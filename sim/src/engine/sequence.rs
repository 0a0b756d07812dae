//! One request inside the engine: its tokens, progress, KV blocks and timings.

use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::kv_cache::BlockId;

/// Why a sequence stopped, as in vLLM's `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// The model chose to stop (the seeded output length was reached).
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// Aborted: the client went away or `/abort_requests` named it.
    Abort,
}

impl FinishReason {
    /// The wire name (`stop`, `length`, `abort`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// Per-request timestamps, kept for vLLM's per-request `metrics` and histograms.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// When the engine received the request.
    pub arrival: Instant,
    /// When the scheduler first gave it tokens in a step.
    pub first_scheduled: Option<Instant>,
    /// When its first output token was sampled.
    pub first_token: Option<Instant>,
    /// When its latest output token was sampled.
    pub last_token: Option<Instant>,
    /// When it finished.
    pub finished: Option<Instant>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Timings {
    /// Engine queue time: arrival to first scheduling.
    pub fn queue_time(&self) -> Option<Duration> {
        Some(self.first_scheduled? - self.arrival)
    }
    /// Time to first token from arrival.
    pub fn ttft(&self) -> Option<Duration> {
        Some(self.first_token? - self.arrival)
    }
    /// Prefill: first scheduling to first token.
    pub fn prefill(&self) -> Option<Duration> {
        Some(self.first_token? - self.first_scheduled?)
    }
    /// Decode: first token to finish.
    pub fn decode(&self) -> Option<Duration> {
        Some(self.finished? - self.first_token?)
    }
    /// End to end: arrival to finish.
    pub fn e2e(&self) -> Option<Duration> {
        Some(self.finished? - self.arrival)
    }

    /// vLLM's per-request `metrics` object (`--enable-per-request-metrics`); absent values are null.
    pub fn per_request_metrics(&self, output_tokens: u32) -> serde_json::Value {
        let decode = self.decode();
        let mean_itl = match decode {
            Some(d) if output_tokens > 1 => Some(ms(d) / f64::from(output_tokens - 1)),
            _ => None,
        };
        let tps = match decode {
            Some(d) if d > Duration::ZERO && output_tokens > 1 => {
                Some(f64::from(output_tokens - 1) / d.as_secs_f64())
            }
            _ => None,
        };
        serde_json::json!({
            "time_to_first_token_ms": self.ttft().map(ms),
            "generation_time_ms": decode.map(ms),
            "queue_time_ms": self.queue_time().map(ms),
            "mean_itl_ms": mean_itl,
            "tokens_per_second": tps,
        })
    }
}

/// The end of a sequence, sent once to its stream.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Why it ended.
    pub reason: FinishReason,
    /// Whether the step that finished it also produced its last token.
    pub with_token: bool,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub cached_tokens: u32,
    /// Output tokens generated (including the last one).
    pub output_tokens: u32,
    /// Timestamps.
    pub timings: Timings,
}

/// What the engine sends to a request's stream.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// One output token that is not the last.
    Token,
    /// The sequence ended.
    Finished(Finished),
}

/// A request in the scheduler.
#[derive(Debug)]
pub struct Sequence {
    /// The id vLLM's server gives the request: `chatcmpl-` or `cmpl-` and the `X-Request-Id`
    /// (or body `request_id`, or a random one), `-0` after a completion's.
    pub request_id: String,
    /// Unique internal number, in arrival order.
    pub seq_no: u64,
    /// Prompt length in tokens.
    pub prompt_len: u32,
    /// Chained hashes of the prompt's full blocks.
    pub block_hashes: Vec<u64>,
    /// Output tokens it will generate before finishing with `finish_at_target`.
    pub target_output: u32,
    /// `Stop` when the seeded length ended it early, `Length` when `max_tokens` did.
    pub finish_at_target: FinishReason,
    /// Scheduling priority (lower first) under `--scheduling-policy priority`.
    pub priority: i64,
    /// Output tokens so far (delivered).
    pub output_tokens: u32,
    /// Output tokens that planned steps will sample but have not delivered yet (vLLM's
    /// `num_output_placeholders`): at most one with asynchronous scheduling, while a step runs.
    pub placeholders: u32,
    /// Tokens whose KV is computed, or scheduled to be by a planned step (vLLM advances
    /// `num_computed_tokens` when it schedules).
    pub computed: u32,
    /// KV blocks held, in order.
    pub blocks: Vec<BlockId>,
    /// Blocks (prompt, then output) already registered in the prefix cache.
    pub registered_blocks: usize,
    /// The token ids of its output, for the hashes of its full output blocks: output token `j`
    /// is [`crate::words::word_token`]`(from + j)`; `None`: its output blocks are not hashed.
    pub output_from: Option<u32>,
    /// The tokens after its last full block (prompt, then output), not hashed yet.
    tail: Vec<u32>,
    /// The hash of its last full block.
    last_hash: u64,
    block_size: usize,
    /// Prefix-cache hit at first scheduling, in tokens.
    pub cached_tokens: u32,
    /// Whether this sequence was ever scheduled (prefix-cache queries count once).
    pub started: bool,
    /// While it loads blocks from the CPU tier (KV offloading): when the load is done.
    pub kv_ready_at: Option<Instant>,
    /// Leading blocks it got without computing them at its latest admission (prefix-cache
    /// hit, or loaded from the CPU tier).
    pub hit_blocks: usize,
    /// Timestamps.
    pub timings: Timings,
    /// Where its tokens go.
    pub tx: UnboundedSender<EngineEvent>,
}

impl Sequence {
    /// A sequence that arrived `now` and has not been scheduled yet.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        request_id: String,
        seq_no: u64,
        prompt: &[u32],
        block_size: usize,
        target_output: u32,
        finish_at_target: FinishReason,
        priority: i64,
        tx: UnboundedSender<EngineEvent>,
        now: Instant,
    ) -> Self {
        let block_hashes = super::kv_cache::block_hashes(prompt, block_size);
        let full = block_hashes.len() * block_size;
        Self {
            request_id,
            seq_no,
            prompt_len: prompt.len() as u32,
            last_hash: block_hashes
                .last()
                .copied()
                .unwrap_or(super::kv_cache::ROOT_HASH),
            tail: prompt[full..].to_vec(),
            block_size,
            output_from: None,
            block_hashes,
            target_output: target_output.max(1),
            finish_at_target,
            priority,
            output_tokens: 0,
            placeholders: 0,
            computed: 0,
            blocks: Vec::new(),
            registered_blocks: 0,
            cached_tokens: 0,
            started: false,
            kv_ready_at: None,
            hit_blocks: 0,
            timings: Timings {
                arrival: now,
                first_scheduled: None,
                first_token: None,
                last_token: None,
                finished: None,
            },
            tx,
        }
    }

    /// The same sequence of `prompt` (the prompt it was made of), its blocks hashed under
    /// `cache_salt` ([`super::kv_cache::salted_root`]); no salt: as it is.
    pub fn salted(mut self, prompt: &[u32], cache_salt: Option<&str>) -> Self {
        if cache_salt.is_some() {
            let root = super::kv_cache::salted_root(cache_salt);
            self.block_hashes = super::kv_cache::block_hashes_from(root, prompt, self.block_size);
            self.last_hash = self.block_hashes.last().copied().unwrap_or(root);
        }
        self
    }

    /// The same sequence, its output hashed as output words `from`, `from + 1`, ... (see
    /// [`Sequence::output_from`]).
    pub fn with_output_from(mut self, from: Option<u32>) -> Self {
        self.output_from = from;
        self
    }

    /// One more output token was sampled: `output_tokens` counts it. When it fills a block,
    /// that block gets its hash, as vLLM hashes every full block of a request, output included
    /// (`Request.append_output_token_ids` extends its block hashes), so the block enters the
    /// prefix cache once computed.
    pub fn output_grew(&mut self) {
        let Some(from) = self.output_from else {
            return;
        };
        self.tail
            .push(crate::words::word_token(from + self.output_tokens - 1));
        if self.tail.len() == self.block_size {
            self.last_hash = super::kv_cache::chain_hash(self.last_hash, &self.tail);
            self.block_hashes.push(self.last_hash);
            self.tail.clear();
        }
    }

    /// Tokens of the whole sequence so far: prompt plus output.
    pub fn num_tokens(&self) -> u32 {
        self.prompt_len + self.output_tokens
    }

    /// Tokens of the whole sequence counting the placeholders of tokens still being sampled
    /// (vLLM's `num_tokens + num_output_placeholders`): what the scheduler catches up with.
    pub fn total_tokens(&self) -> u32 {
        self.num_tokens() + self.placeholders
    }

    /// Whether it still has prompt (or, after preemption, earlier output) to compute.
    pub fn is_prefilling(&self) -> bool {
        self.computed + 1 < self.total_tokens() || self.output_tokens + self.placeholders == 0
    }

    /// The end-of-sequence report.
    pub fn finished(&self, reason: FinishReason, with_token: bool) -> Finished {
        Finished {
            reason,
            with_token,
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached_tokens,
            output_tokens: self.output_tokens,
            timings: self.timings,
        }
    }
}
