//! Step-time models: how long one engine step takes on the simulated GPU.
//!
//! A batched step costs `fixed + prefill_tokens * per_prefill_token + decode_seqs * per_decode_seq
//! + context_tokens * per_context_token` milliseconds, where `context_tokens` is the KV the step's
//! decodes attend to. `sim/README.md` gives the sources of each calibration.

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

/// Linear cost model of one batched step, in milliseconds of GPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchedCost {
    /// Launch and sampling overhead of any step.
    pub fixed_ms: f64,
    /// Cost of each prompt token in the step.
    pub per_prefill_token_ms: f64,
    /// Cost of each decoding sequence (weights are read once, so this is small).
    pub per_decode_seq_ms: f64,
    /// Cost of each attended context token of the decoding sequences.
    pub per_context_token_ms: f64,
    /// KV blocks of 16 tokens the GPU holds when `--num-gpu-blocks` is not given.
    pub default_gpu_blocks: u32,
}

impl BatchedCost {
    /// GPU time of a step of this shape.
    pub fn step_time(&self, shape: StepShape) -> Duration {
        let ms = self.fixed_ms
            + f64::from(shape.prefill_tokens) * self.per_prefill_token_ms
            + f64::from(shape.decode_seqs) * self.per_decode_seq_ms
            + shape.context_tokens as f64 * self.per_context_token_ms;
        Duration::from_secs_f64(ms / 1000.0)
    }
}

/// The engine timing model selected with `--profile`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Profile {
    /// Continuous batching with a step cost model.
    Batched(BatchedCost),
    /// Every request alone: constant time to first token and between tokens, no batching and no
    /// KV limit. For measuring the gateway's own overhead.
    Fixed {
        /// Time to first token.
        ttft: Duration,
        /// Time between tokens.
        itl: Duration,
    },
}

/// Llama-3.1-8B-Instruct, bf16, one H100 80GB SXM (see `sim/README.md` for the calibration).
pub const LLAMA_31_8B_H100: BatchedCost = BatchedCost {
    fixed_ms: 6.0,
    per_prefill_token_ms: 0.02,
    per_decode_seq_ms: 0.045,
    per_context_token_ms: 0.000_03,
    // (80 GB * 0.9 - 16 GB weights - ~2 GB activations) / 128 KiB per token / 16 tokens a block.
    default_gpu_blocks: 25_000,
};

/// A small, slow engine that makes queueing, chunking and preemption easy to provoke in tests.
pub const TINY_TEST: BatchedCost = BatchedCost {
    fixed_ms: 5.0,
    per_prefill_token_ms: 0.01,
    per_decode_seq_ms: 0.05,
    per_context_token_ms: 0.0,
    default_gpu_blocks: 2_048,
};

impl Profile {
    /// Looks a profile up by its `--profile` name.
    pub fn by_name(name: &str, fixed_ttft_ms: f64, fixed_itl_ms: f64) -> Option<Self> {
        match name {
            "llama-3.1-8b-h100" => Some(Self::Batched(LLAMA_31_8B_H100)),
            "tiny-test" => Some(Self::Batched(TINY_TEST)),
            "fixed" => Some(Self::Fixed {
                ttft: Duration::from_secs_f64(fixed_ttft_ms.max(0.0) / 1000.0),
                itl: Duration::from_secs_f64(fixed_itl_ms.max(0.0) / 1000.0),
            }),
            _ => None,
        }
    }

    /// The names `--profile` accepts.
    pub const NAMES: &'static [&'static str] = &["llama-3.1-8b-h100", "fixed", "tiny-test"];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_step_at_batch_one_is_a_few_milliseconds() {
        let t = LLAMA_31_8B_H100.step_time(StepShape {
            prefill_tokens: 0,
            decode_seqs: 1,
            context_tokens: 500,
            ..StepShape::default()
        });
        assert!(
            t > Duration::from_millis(5) && t < Duration::from_millis(8),
            "{t:?}"
        );
    }

    #[test]
    fn prefill_costs_grow_with_tokens() {
        let short = LLAMA_31_8B_H100.step_time(StepShape {
            prefill_tokens: 300,
            ..StepShape::default()
        });
        let long = LLAMA_31_8B_H100.step_time(StepShape {
            prefill_tokens: 8192,
            ..StepShape::default()
        });
        assert!(long > short * 10, "{short:?} vs {long:?}");
    }
}
