//! The capacity planner (`tutor-gateway capacity`): pure arithmetic from a model's shape, a
//! GPU's memory and the product's context lengths to the engine's flags and the gateway's lane
//! budgets.
//!
//! ```text
//! KV bytes per token = layers x kv_heads x head_dim x 2 (K and V) x kv dtype bytes
//! KV cache bytes     = GPU GiB x gpu_memory_utilization - weights - overhead
//! KV blocks          = floor(KV cache bytes / (bytes per token x block_size))
//! KV tokens          = KV blocks x block_size
//! ```
//!
//! vLLM measures the same thing at start-up (`GPU KV cache size: N tokens`, and
//! `vllm:cache_config_info`): its figure wins, and the gateway checks its budgets against it
//! ([`super::overcommit`]). The planner is for choosing a GPU and the flags before that.

use anyhow::{bail, Result};
use serde::Serialize;

use super::model::{dtype_bytes, ModelShape};
use crate::config::Config;
use crate::lane::Lane;

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// One lane's part of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneInput {
    /// The lane's largest request, input + output tokens (the config's classification bound:
    /// `classify.small_max_work`, `classify.medium_max_work`, `upstream.max_model_len`).
    pub context: u32,
    /// The lane's share of the KV cache is proportional to this (the config's
    /// `lanes.<lane>.max_tokens_in_flight`).
    pub weight: u64,
    /// The configured `lanes.<lane>.max_concurrency`, to say when the budget cannot hold it.
    pub max_concurrency: u32,
    /// The configured `lanes.<lane>.ceiling`, to say when the budget holds more than it.
    pub ceiling: u32,
}

impl LaneInput {
    /// Each lane's input read from a gateway config, smallest lane first.
    pub fn from_config(config: &Config) -> [LaneInput; 3] {
        let context = |lane: Lane| match lane {
            Lane::Small => config.classify.small_max_work.get(),
            Lane::Medium => config.classify.medium_max_work.get(),
            Lane::Large => config.upstream.max_model_len.get(),
        };
        Lane::ALL.map(|lane| LaneInput {
            context: context(lane),
            weight: config.lanes.get(lane).max_tokens_in_flight.get(),
            max_concurrency: config.lanes.get(lane).max_concurrency.get(),
            ceiling: config.lanes.get(lane).ceiling.get(),
        })
    }
}

/// Everything the planner is given.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// The model, from its `config.json`.
    pub model: ModelShape,
    /// Memory of one GPU, GiB (nvidia-smi's MiB / 1024: an 80 GB H100 shows 79.6).
    pub gpu_memory_gib: f64,
    /// vLLM's `--gpu-memory-utilization` (its default 0.9).
    pub gpu_memory_utilization: f64,
    /// The weights' size, GiB; `None`: estimated from the shape (dense models only).
    pub weights_gib: Option<f64>,
    /// Memory neither weights nor KV: activation peak, CUDA graphs, the CUDA context. vLLM
    /// logs what it measured at start-up.
    pub overhead_gib: f64,
    /// vLLM's `--kv-cache-dtype`: `auto` (the model's dtype) or e.g. `fp8`.
    pub kv_cache_dtype: String,
    /// vLLM's `--block-size` (16).
    pub block_size: u32,
    /// Small, medium, large.
    pub lanes: [LaneInput; 3],
    /// The config's `admission.prefill_budget_tokens`, repeated in the snippet.
    pub prefill_budget_tokens: u64,
}

/// One lane's line of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LanePlan {
    /// `small`, `medium`, `large`.
    pub lane: &'static str,
    /// Its largest request, tokens.
    pub context: u32,
    /// KV blocks one such request takes.
    pub blocks_per_request: u64,
    /// Requests of this size the whole KV cache holds at once (this lane alone).
    pub sequences_alone: u64,
    /// Requests of this size the suggested budget holds.
    pub budget_requests: u64,
    /// Suggested `lanes.<lane>.max_tokens_in_flight`.
    pub max_tokens_in_flight: u64,
    /// The planned config's `lanes.<lane>.max_concurrency` (its reserved seats).
    pub max_concurrency: u32,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The model's shape.
    pub model: ModelShape,
    /// The KV cache's dtype (the model's for `auto`).
    pub kv_cache_dtype: String,
    /// Its bytes per element.
    pub kv_dtype_bytes: u32,
    /// `layers x kv_heads x head_dim x 2 x kv_dtype_bytes`.
    pub kv_bytes_per_token: u64,
    /// Input, GiB.
    pub gpu_memory_gib: f64,
    /// Input.
    pub gpu_memory_utilization: f64,
    /// The weights, GiB.
    pub weights_gib: f64,
    /// Parameters the weights were estimated from; `None` when `--weights-gib` was given.
    pub estimated_parameters: Option<u64>,
    /// Input, GiB.
    pub overhead_gib: f64,
    /// What is left for the KV cache, GiB.
    pub kv_cache_gib: f64,
    /// Tokens per block.
    pub block_size: u32,
    /// KV blocks.
    pub kv_blocks: u64,
    /// KV blocks x block size.
    pub kv_tokens: u64,
    /// Small, medium, large.
    pub lanes: Vec<LanePlan>,
    /// Suggested `--max-model-len` and `upstream.max_model_len`: the large lane's context,
    /// rounded up to whole blocks.
    pub max_model_len: u32,
    /// Suggested `--max-num-seqs` and `admission.seats`: the requests the lane budgets hold.
    pub max_num_seqs: u64,
    /// Suggested `admission.max_tokens_in_flight`: the KV tokens.
    pub max_tokens_in_flight: u64,
    /// `admission.prefill_budget_tokens`, unchanged (it follows `--max-num-batched-tokens`).
    pub prefill_budget_tokens: u64,
    /// Things the reader should know.
    pub warnings: Vec<String>,
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Computes the plan.
pub fn plan(input: &PlanInput) -> Result<Plan> {
    let PlanInput {
        model,
        gpu_memory_gib: gpu,
        gpu_memory_utilization: util,
        ..
    } = input;
    if !(gpu.is_finite() && *gpu > 0.0) {
        bail!("--gpu-memory-gib must be > 0");
    }
    if !(*util > 0.0 && *util <= 1.0) {
        bail!("--gpu-memory-utilization must be in (0, 1]");
    }
    if !(input.overhead_gib.is_finite() && input.overhead_gib >= 0.0) {
        bail!("--overhead-gib must be >= 0");
    }
    if input.block_size == 0 {
        bail!("--block-size must be > 0");
    }
    let bs = u64::from(input.block_size);
    // vLLM's `--kv-cache-dtype` choices (`CacheDType`): auto (the served dtype), bfloat16 and
    // the fp8 kinds; a value it would refuse is refused here, not put in the command line.
    let (kv_cache_dtype, kv_dtype_bytes) = match input.kv_cache_dtype.as_str() {
        "auto" => model.served(),
        other @ ("bfloat16" | "fp8" | "fp8_e4m3" | "fp8_e5m2" | "fp8_inc") => {
            (other.to_owned(), dtype_bytes(other).unwrap_or(1))
        }
        other => bail!(
            "--kv-cache-dtype {other:?}: expected auto, bfloat16 or fp8 (fp8_e4m3, fp8_e5m2, \
             fp8_inc), as vLLM takes it"
        ),
    };
    let served_bytes = model.served().1;
    let (weights_gib, estimated_parameters) = match input.weights_gib {
        Some(w) if w.is_finite() && w >= 0.0 => (w, None),
        Some(_) => bail!("--weights-gib must be >= 0"),
        None => match &model.parameters {
            Ok(p) => (*p as f64 * f64::from(served_bytes) / GIB, Some(*p)),
            Err(why) => bail!("{why}: its weights cannot be estimated; give --weights-gib"),
        },
    };
    let per_token = model.kv_bytes_per_token(kv_dtype_bytes);
    let kv_cache_gib = gpu * util - weights_gib - input.overhead_gib;
    if kv_cache_gib <= 0.0 {
        bail!(
            "no room for the KV cache: {gpu} GiB x {util} = {:.2} GiB, of which the weights take \
             {weights_gib:.2} GiB and the overhead {:.2} GiB",
            gpu * util,
            input.overhead_gib
        );
    }
    let kv_blocks = ((kv_cache_gib * GIB).floor() as u64) / (per_token * bs);
    let kv_tokens = kv_blocks * bs;

    let contexts = input.lanes.map(|l| l.context);
    if contexts.contains(&0) || contexts[0] >= contexts[1] || contexts[1] >= contexts[2] {
        bail!(
            "lane contexts must grow from small to large and be > 0 (got {} / {} / {}; from a \
             config, classify.small_max_work < classify.medium_max_work < \
             upstream.max_model_len: at or above max_model_len, no request is classified into \
             the lane above, and the gateway runs without it; or set them with \
             --small-context, --medium-context, --large-context)",
            contexts[0],
            contexts[1],
            contexts[2]
        );
    }
    let max_model_len = round_up(u64::from(contexts[2]), bs);
    let Ok(max_model_len) = u32::try_from(max_model_len) else {
        bail!("the large lane's context is too large");
    };
    let mut warnings = Vec::new();
    if let Some(window) = model.max_position_embeddings {
        if max_model_len > window {
            warnings.push(format!(
                "--max-model-len {max_model_len} is above the model's window \
                 (max_position_embeddings {window}): vLLM refuses it without rope scaling"
            ));
        }
    }
    // A request's KV is whole blocks; the large lane's is max_model_len.
    let need = |i: usize| {
        if i == 2 {
            u64::from(max_model_len)
        } else {
            u64::from(contexts[i])
        }
    };
    let one: [u64; 3] = std::array::from_fn(|i| round_up(need(i), bs));
    let one_each: u64 = one.iter().sum();
    if one_each > kv_tokens {
        bail!(
            "the KV cache holds {kv_tokens} tokens ({kv_blocks} blocks of {bs}), less than one \
             request of each lane ({} + {} + {} = {one_each} tokens): use a larger GPU, \
             --kv-cache-dtype fp8, or smaller contexts (--large-context)",
            one[0],
            one[1],
            one[2]
        );
    }
    // Split the KV cache across the lanes in proportion to the config's lane budgets, after
    // one request of each: every lane can always run its largest request.
    let rest = u128::from(kv_tokens - one_each);
    let total_weight: u128 = input.lanes.iter().map(|l| u128::from(l.weight)).sum();
    let mut lanes = Vec::new();
    let mut max_num_seqs = 0;
    for (i, lane) in Lane::ALL.into_iter().enumerate() {
        let w = u128::from(input.lanes[i].weight);
        let extra = if total_weight == 0 {
            0
        } else {
            (rest * w / (total_weight * u128::from(one[i]))) as u64
        };
        let n = 1 + extra;
        max_num_seqs += n;
        let configured = u64::from(input.lanes[i].max_concurrency);
        if n < configured {
            warnings.push(format!(
                "lanes.{lane}: the budget holds {n} requests of {} tokens, fewer than its \
                 max_concurrency {configured}: its reserved seats only fill with shorter requests",
                need(i)
            ));
        }
        let ceiling = u64::from(input.lanes[i].ceiling);
        if n > ceiling {
            warnings.push(format!(
                "lanes.{lane}: the budget holds {n} requests of {} tokens, more than its ceiling \
                 {ceiling} seats: raise lanes.{lane}.ceiling to use them",
                need(i)
            ));
        }
        lanes.push(LanePlan {
            lane: lane.as_str(),
            context: need(i) as u32,
            blocks_per_request: one[i] / bs,
            sequences_alone: kv_tokens / one[i],
            budget_requests: n,
            max_tokens_in_flight: n * need(i),
            max_concurrency: input.lanes[i].max_concurrency,
        });
    }
    Ok(Plan {
        model: model.clone(),
        kv_cache_dtype,
        kv_dtype_bytes,
        kv_bytes_per_token: per_token,
        gpu_memory_gib: *gpu,
        gpu_memory_utilization: *util,
        weights_gib,
        estimated_parameters,
        overhead_gib: input.overhead_gib,
        kv_cache_gib,
        block_size: input.block_size,
        kv_blocks,
        kv_tokens,
        lanes,
        max_model_len,
        max_num_seqs,
        max_tokens_in_flight: kv_tokens,
        prefill_budget_tokens: input.prefill_budget_tokens,
        warnings,
    })
}

impl Plan {
    /// The human report: the arithmetic, the lanes, the flags and the config keys.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let m = &self.model;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "Model:        {}: {} layers, {} KV heads ({} attention heads), head_dim {}, {}",
            m.architecture.as_deref().unwrap_or("config.json"),
            m.layers,
            m.kv_heads,
            m.attention_heads,
            m.head_dim,
            m.dtype
        );
        let _ = writeln!(
            o,
            "KV per token: {} bytes ({} KiB) = {} layers x {} kv_heads x {} head_dim x 2 (K, V) x {} bytes ({})",
            self.kv_bytes_per_token,
            self.kv_bytes_per_token as f64 / 1024.0,
            m.layers,
            m.kv_heads,
            m.head_dim,
            self.kv_dtype_bytes,
            self.kv_cache_dtype
        );
        let weights = match self.estimated_parameters {
            Some(p) => format!(
                "{:.2} GiB (estimated: {:.2}B parameters x {} bytes)",
                self.weights_gib,
                p as f64 / 1e9,
                m.served().1
            ),
            None => format!("{:.2} GiB (--weights-gib)", self.weights_gib),
        };
        let _ = writeln!(
            o,
            "GPU memory:   {} GiB x {} = {:.2} GiB; weights {weights}; overhead {:.2} GiB",
            self.gpu_memory_gib,
            self.gpu_memory_utilization,
            self.gpu_memory_gib * self.gpu_memory_utilization,
            self.overhead_gib
        );
        let _ = writeln!(
            o,
            "KV cache:     {:.2} GiB = {} blocks of {} tokens = {} tokens",
            self.kv_cache_gib, self.kv_blocks, self.block_size, self.kv_tokens
        );
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{:<8} {:>9} {:>17} {:>15} {:>22}",
            "lane", "context", "sequences (alone)", "budget requests", "max_tokens_in_flight"
        );
        for l in &self.lanes {
            let _ = writeln!(
                o,
                "{:<8} {:>9} {:>17} {:>15} {:>22}",
                l.lane, l.context, l.sequences_alone, l.budget_requests, l.max_tokens_in_flight
            );
        }
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "\"sequences (alone)\": requests of that lane's largest size the whole KV cache holds at once."
        );
        let _ = writeln!(
            o,
            "Budgets: one request of each lane, the rest of the KV cache split like the config's lane budgets."
        );
        for w in &self.warnings {
            let _ = writeln!(o, "warning: {w}");
        }
        let _ = writeln!(o);
        o.push_str(&self.snippet());
        o
    }

    /// The engine flags and the config keys to set, ready to paste.
    pub fn snippet(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let kv_flag = if self.kv_cache_dtype == self.model.served().0 {
            String::new()
        } else {
            format!(" --kv-cache-dtype {}", self.kv_cache_dtype)
        };
        let _ = writeln!(
            o,
            "# vLLM:\n# vllm serve <model> --gpu-memory-utilization {} --max-model-len {} --max-num-seqs {} --block-size {}{kv_flag}",
            self.gpu_memory_utilization, self.max_model_len, self.max_num_seqs, self.block_size
        );
        let _ = writeln!(
            o,
            "# tutor-gateway: set these keys in their sections of config.toml, then check it with\n\
             # `tutor-gateway check-config --probe` against the running engine.\n"
        );
        let _ = writeln!(o, "[upstream]\nmax_model_len = {}\n", self.max_model_len);
        let _ = writeln!(
            o,
            "[classify]\nsmall_max_work = {}\nmedium_max_work = {}\n",
            self.lanes[0].context, self.lanes[1].context
        );
        let _ = writeln!(
            o,
            "[admission]\nseats = {} # = --max-num-seqs\n\
             max_tokens_in_flight = {} # the KV cache, in tokens\n\
             prefill_budget_tokens = {} # unchanged: follows --max-num-batched-tokens",
            self.max_num_seqs, self.max_tokens_in_flight, self.prefill_budget_tokens
        );
        // The lanes' reserved seats must fit `seats`: the planned config's scaled down to an
        // engine with fewer seats, each at least 1.
        let reserved: u64 = self
            .lanes
            .iter()
            .map(|l| u64::from(l.max_concurrency))
            .sum();
        for l in &self.lanes {
            let _ = writeln!(
                o,
                "\n[lanes.{}]\nmax_tokens_in_flight = {} # {} requests x {} tokens",
                l.lane, l.max_tokens_in_flight, l.budget_requests, l.context
            );
            if self.max_num_seqs < reserved {
                let own = l.max_concurrency;
                let scaled = (u64::from(own) * self.max_num_seqs / reserved).max(1);
                let _ = writeln!(
                    o,
                    "max_concurrency = {scaled} # reserved seats: the configured {own}, scaled \
                     to seats = {}",
                    self.max_num_seqs
                );
            }
        }
        o
    }
}
