//! One step's shape and the batched cost model that prices it (see the module docs of
//! [`super`]): a leaf the profiles and the profile files share.

use std::time::Duration;

/// What one step did, as far as its duration is concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepShape {
    /// Prompt tokens computed in this step (all prefill chunks together).
    pub prefill_tokens: u32,
    /// Sequences that computed a prompt chunk in this step.
    pub prefill_seqs: u32,
    /// Query-key pairs of the step's prompt chunks: a chunk of `n` tokens starting at position
    /// `p` attends to `p + 1 ..= p + n` tokens, `n * p + n * (n + 1) / 2` pairs, so a late chunk
    /// of a long prompt costs more than an early one.
    pub prefill_attention_pairs: u64,
    /// Sequences that decoded one token in this step.
    pub decode_seqs: u32,
    /// Tokens of context attended by the decoding sequences.
    pub context_tokens: u64,
}

impl StepShape {
    /// Query-key pairs of one prompt chunk of `n` tokens starting at position `p` (causal).
    pub fn chunk_attention_pairs(n: u32, p: u32) -> u64 {
        let (n, p) = (u64::from(n), u64::from(p));
        n * p + n * (n + 1) / 2
    }

    /// A step that computes one prompt chunk of `n` tokens at position `p` and nothing else.
    pub fn chunk(n: u32, p: u32) -> Self {
        Self {
            prefill_tokens: n,
            prefill_seqs: 1,
            prefill_attention_pairs: Self::chunk_attention_pairs(n, p),
            ..Self::default()
        }
    }

    /// A step of `seqs` decodes, each with `context` tokens of KV.
    pub fn decode(seqs: u32, context: u64) -> Self {
        Self {
            decode_seqs: seqs,
            context_tokens: u64::from(seqs) * context,
            ..Self::default()
        }
    }
}

/// Cost model of one batched step, in milliseconds of GPU time (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchedCost {
    /// Fixed cost of a step of decodes only: a full CUDA graph replay, sampling, scheduling.
    pub decode_overhead_ms: f64,
    /// Fixed cost of a step with any prompt chunk: kernel launches (vLLM runs a step larger
    /// than its largest captured CUDA graph eagerly) and the attention metadata of
    /// variable-length chunks.
    pub mixed_overhead_ms: f64,
    /// Reading the weights once: the least a forward pass takes, however few its tokens.
    pub weight_read_ms: f64,
    /// Matrix-multiply cost of each token in the step (prompt token or decode), once the step
    /// has enough tokens to be compute-bound.
    pub per_token_ms: f64,
    /// Attention cost of each query-key pair of the step's prompt chunks.
    pub per_attention_pair_ms: f64,
    /// Reading the KV of each context token of the step's decodes.
    pub per_context_token_ms: f64,
    /// KV blocks of 16 tokens the GPU holds when `--num-gpu-blocks` is not given.
    pub default_gpu_blocks: u32,
    /// Bytes of KV one token takes (all layers, K and V): sizes the CPU tier of
    /// `--kv-offloading-size`.
    pub kv_bytes_per_token: u32,
    /// Host-to-GPU copy rate of offloaded KV blocks, GB/s: a load from the CPU tier takes
    /// `bytes / rate`.
    pub kv_load_gb_per_s: f64,
}

impl BatchedCost {
    /// GPU time of a step of this shape, in milliseconds.
    pub fn step_ms(&self, shape: StepShape) -> f64 {
        let overhead = if shape.prefill_tokens > 0 || shape.prefill_seqs > 0 {
            self.mixed_overhead_ms
        } else {
            self.decode_overhead_ms
        };
        let tokens = f64::from(shape.prefill_tokens) + f64::from(shape.decode_seqs);
        overhead
            + self.weight_read_ms.max(tokens * self.per_token_ms)
            + shape.prefill_attention_pairs as f64 * self.per_attention_pair_ms
            + shape.context_tokens as f64 * self.per_context_token_ms
    }

    /// GPU time of a step of this shape.
    pub fn step_time(&self, shape: StepShape) -> Duration {
        Duration::from_secs_f64(self.step_ms(shape) / 1000.0)
    }
}
