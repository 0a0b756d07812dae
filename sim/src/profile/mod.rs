//! Step-time models: how long one engine step takes on the simulated GPU.
//!
//! A batched step costs, in milliseconds,
//!
//! ```text
//! overhead + max(weight_read, (prefill_tokens + decode_seqs) * per_token)
//!          + prefill_attention_pairs * per_attention_pair + context_tokens * per_context_token
//! ```
//!
//! where `overhead` is `decode_overhead` for a step of decodes only (vLLM replays a full CUDA
//! graph) and `mixed_overhead` for a step with any prompt chunk (run eagerly once it is larger
//! than the largest captured graph). The constants of the GPU profiles live in `sim/profiles/*.toml` ([`ProfileFile`]),
//! with the arithmetic and sources of each; `sim/README.md` ("Step time") summarises them.

mod cost;
mod file;

use std::time::Duration;

pub use cost::{BatchedCost, StepShape};
pub use file::{Anchor, ProfileFile, ProfileStatus};

/// The engine timing model selected with `--profile` or `--profile-file`.
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

/// `sim/profiles/llama-3.1-8b-h100.toml`, the default `--profile`.
pub const LLAMA_31_8B_H100_TOML: &str = include_str!("../../profiles/llama-3.1-8b-h100.toml");
/// `sim/profiles/llama-3.1-8b-h200.toml`.
pub const LLAMA_31_8B_H200_TOML: &str = include_str!("../../profiles/llama-3.1-8b-h200.toml");

/// Llama-3.1-8B-Instruct, bf16, one H100 80GB SXM: the constants of
/// `sim/profiles/llama-3.1-8b-h100.toml` (the source of truth, with the arithmetic; a test keeps
/// the two equal), as a constant for offline runs and benches.
pub const LLAMA_31_8B_H100: BatchedCost = BatchedCost {
    decode_overhead_ms: 0.5,
    mixed_overhead_ms: 2.0,
    weight_read_ms: 5.64,
    per_token_ms: 0.028_23,
    per_attention_pair_ms: 0.000_001_06,
    per_context_token_ms: 0.000_046,
    default_gpu_blocks: 25_000,
    kv_bytes_per_token: 131_072,
    kv_load_gb_per_s: 25.0,
};

/// A small, slow engine that makes queueing, chunking and preemption easy to provoke in tests.
/// Before the two-overhead model it cost `5 + 0.01 * prefill_tokens + 0.05 * decode_seqs` ms;
/// decode steps cost the same now (tests rely on how long streams last), and prompt tokens cost
/// what a decode does (0.05 ms), so no step is shorter than before.
pub const TINY_TEST: BatchedCost = BatchedCost {
    decode_overhead_ms: 5.0,
    mixed_overhead_ms: 5.0,
    weight_read_ms: 0.0,
    per_token_ms: 0.05,
    per_attention_pair_ms: 0.0,
    per_context_token_ms: 0.0,
    default_gpu_blocks: 2_048,
    kv_bytes_per_token: 131_072,
    kv_load_gb_per_s: 25.0,
};

impl Profile {
    /// Looks a profile up by its `--profile` name.
    pub fn by_name(name: &str, fixed_ttft_ms: f64, fixed_itl_ms: f64) -> Option<Self> {
        let embedded = |toml: &str| {
            // The embedded files are checked by this module's tests; a broken one is a build bug.
            ProfileFile::from_toml_str(toml)
                .map(|f| Self::Batched(f.cost()))
                .unwrap_or_else(|e| panic!("embedded profile {name}: {e:#}"))
        };
        match name {
            "llama-3.1-8b-h100" => Some(embedded(LLAMA_31_8B_H100_TOML)),
            "llama-3.1-8b-h200" => Some(embedded(LLAMA_31_8B_H200_TOML)),
            "tiny-test" => Some(Self::Batched(TINY_TEST)),
            "fixed" => Some(Self::Fixed {
                ttft: Duration::from_secs_f64(fixed_ttft_ms.max(0.0) / 1000.0),
                itl: Duration::from_secs_f64(fixed_itl_ms.max(0.0) / 1000.0),
            }),
            _ => None,
        }
    }

    /// The names `--profile` accepts.
    pub const NAMES: &'static [&'static str] = &[
        "llama-3.1-8b-h100",
        "llama-3.1-8b-h200",
        "fixed",
        "tiny-test",
    ];

    /// The embedded profile files, by `--profile` name.
    pub const FILES: &'static [(&'static str, &'static str)] = &[
        ("llama-3.1-8b-h100", LLAMA_31_8B_H100_TOML),
        ("llama-3.1-8b-h200", LLAMA_31_8B_H200_TOML),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_h100_constant_is_the_embedded_file() {
        let file = ProfileFile::from_toml_str(LLAMA_31_8B_H100_TOML).unwrap();
        assert_eq!(file.cost(), LLAMA_31_8B_H100);
        assert_eq!(
            Profile::by_name("llama-3.1-8b-h100", 0.0, 0.0),
            Some(Profile::Batched(LLAMA_31_8B_H100))
        );
    }

    #[test]
    fn every_batched_name_resolves() {
        for name in Profile::NAMES {
            assert!(Profile::by_name(name, 50.0, 20.0).is_some(), "{name}");
        }
        for (name, toml) in Profile::FILES {
            let file = ProfileFile::from_toml_str(toml).unwrap();
            assert_eq!(file.name, *name);
        }
    }

    #[test]
    fn decode_step_at_batch_one_is_a_few_milliseconds() {
        let t = LLAMA_31_8B_H100.step_time(StepShape::decode(1, 500));
        assert!(
            t > Duration::from_millis(5) && t < Duration::from_millis(8),
            "{t:?}"
        );
    }

    #[test]
    fn small_batches_are_bound_by_the_weight_read() {
        let c = LLAMA_31_8B_H100;
        // No context: one decode and 64 decodes both read the weights once.
        let one = c.step_ms(StepShape::decode(1, 0));
        let many = c.step_ms(StepShape::decode(64, 0));
        assert_eq!(one, many);
        // Past the crossover, tokens cost.
        let big = c.step_ms(StepShape::decode(1024, 0));
        assert!(big > 4.0 * one, "{one} vs {big}");
    }

    #[test]
    fn prefill_costs_grow_with_tokens() {
        let short = LLAMA_31_8B_H100.step_time(StepShape::chunk(300, 0));
        let long = LLAMA_31_8B_H100.step_time(StepShape::chunk(8192, 0));
        assert!(long > short * 10, "{short:?} vs {long:?}");
    }

    #[test]
    fn tiny_test_steps_are_never_shorter_than_before_the_two_overheads() {
        let old = |s: StepShape| {
            5.0 + 0.01 * f64::from(s.prefill_tokens) + 0.05 * f64::from(s.decode_seqs)
        };
        for (p, d) in [(0, 1), (0, 100), (0, 1000), (300, 0), (2048, 40), (8192, 0)] {
            let s = StepShape {
                prefill_tokens: p,
                prefill_seqs: u32::from(p > 0),
                decode_seqs: d,
                ..StepShape::default()
            };
            let new = TINY_TEST.step_ms(s);
            assert!(new >= old(s) - 1e-9, "{s:?}: {new} < {}", old(s));
            if p == 0 {
                assert!(
                    (new - old(s)).abs() < 1e-9,
                    "{s:?}: decode steps keep their cost"
                );
            }
        }
    }

    #[test]
    fn chunk_pairs_add_up_to_the_whole_prompt() {
        // 24 chunks of 512 attend to exactly the pairs of one 12,288-token causal prefill.
        let chunks: u64 = (0..24)
            .map(|i| StepShape::chunk_attention_pairs(512, i * 512))
            .sum();
        assert_eq!(chunks, StepShape::chunk_attention_pairs(12_288, 0));
    }
}
