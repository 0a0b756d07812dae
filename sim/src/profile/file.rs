//! Profile files: a GPU profile's cost constants, KV size and the figures it reproduces, in TOML
//! (`sim/profiles/*.toml`; `sim/calibrate` writes measured ones). The schema, with every key:
//!
//! ```toml
//! name = "llama-3.1-8b-h100"
//! model = "meta-llama/Llama-3.1-8B-Instruct, bf16"
//! gpu = "NVIDIA H100 80GB HBM3 (SXM)"
//! status = "estimated"        # or "measured"
//! note = "..."
//! [cost]                      # milliseconds; finite and >= 0
//! decode_overhead_ms = 0.5
//! mixed_overhead_ms = 2.0
//! weight_read_ms = 5.64
//! per_token_ms = 0.02823
//! per_attention_pair_ms = 0.00000106
//! per_context_token_ms = 0.000046
//! [kv]
//! gpu_blocks = 25000          # blocks of 16 tokens, > 0
//! bytes_per_token = 131072    # KV of one token, all layers; > 0 (default: Llama-3.1-8B's)
//! load_gb_per_s = 25.0        # host-to-GPU copy of offloaded KV; finite, > 0 (default 25)
//! [[anchor]]                  # 0 or more
//! what = "single-stream decode, 1k context"
//! source = "URL or citation"
//! decode_seqs = 1             # StepShape fields, each optional (default 0)
//! context_tokens = 1000
//! expect_ms = 6.2             # finite, > 0
//! tolerance = 0.15            # relative, in (0, 1]
//! [calibration]               # optional, free-form
//! ```
//!
//! Unknown keys anywhere but under `[calibration]` are refused, as are negative or non-finite
//! constants; errors name the key (and, from [`ProfileFile::load`], the file).

use std::fmt;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;

use super::cost::{BatchedCost, StepShape};

/// Where a profile's constants come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileStatus {
    /// From datasheets and published benchmarks, not measured on the GPU.
    Estimated,
    /// Fitted to step times measured on the GPU (`sim/calibrate`).
    Measured,
}

impl ProfileStatus {
    /// The word used in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Estimated => "estimated",
            Self::Measured => "measured",
        }
    }
}

impl fmt::Display for ProfileStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for ProfileStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ProfileStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A figure the profile reproduces: a step of this shape takes `expect_ms`, within `tolerance`
/// (relative).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    /// What was measured, in words.
    pub what: String,
    /// Where the figure comes from: a URL or citation, or the arithmetic behind it.
    pub source: String,
    /// Prompt tokens of the step.
    #[serde(default)]
    pub prefill_tokens: u32,
    /// Sequences with a prompt chunk in the step.
    #[serde(default)]
    pub prefill_seqs: u32,
    /// Query-key pairs of the step's prompt chunks.
    #[serde(default)]
    pub prefill_attention_pairs: u64,
    /// Decoding sequences of the step.
    #[serde(default)]
    pub decode_seqs: u32,
    /// KV tokens the decoding sequences attend to.
    #[serde(default)]
    pub context_tokens: u64,
    /// The step's expected duration, milliseconds.
    pub expect_ms: f64,
    /// Relative tolerance, in (0, 1].
    pub tolerance: f64,
}

impl Anchor {
    /// The step this anchor describes.
    pub fn shape(&self) -> StepShape {
        StepShape {
            prefill_tokens: self.prefill_tokens,
            prefill_seqs: self.prefill_seqs,
            prefill_attention_pairs: self.prefill_attention_pairs,
            decode_seqs: self.decode_seqs,
            context_tokens: self.context_tokens,
        }
    }

    /// `(model - expect) / expect` for this anchor's step under `cost`.
    pub fn relative_error(&self, cost: &BatchedCost) -> f64 {
        (cost.step_ms(self.shape()) - self.expect_ms) / self.expect_ms
    }

    /// Whether `cost` reproduces this anchor within its tolerance.
    pub fn holds(&self, cost: &BatchedCost) -> bool {
        self.relative_error(cost).abs() <= self.tolerance
    }
}

/// The `[cost]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CostTable {
    decode_overhead_ms: f64,
    mixed_overhead_ms: f64,
    weight_read_ms: f64,
    per_token_ms: f64,
    per_attention_pair_ms: f64,
    per_context_token_ms: f64,
}

/// The `[kv]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct KvTable {
    gpu_blocks: u32,
    #[serde(default = "default_bytes_per_token")]
    bytes_per_token: u32,
    #[serde(default = "default_load_gb_per_s")]
    load_gb_per_s: f64,
}

/// Llama-3.1-8B's KV per token, for files written before the key existed.
fn default_bytes_per_token() -> u32 {
    131_072
}

/// The H100 profile's estimate, for files written before the key existed.
fn default_load_gb_per_s() -> f64 {
    25.0
}

/// The file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    name: String,
    model: String,
    gpu: String,
    status: ProfileStatus,
    note: String,
    cost: CostTable,
    kv: KvTable,
    #[serde(default, rename = "anchor")]
    anchors: Vec<Anchor>,
    #[serde(default)]
    calibration: Option<toml::Table>,
}

/// A loaded, validated profile file.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileFile {
    /// Short name (`llama-3.1-8b-h100`).
    pub name: String,
    /// Model and precision.
    pub model: String,
    /// The GPU.
    pub gpu: String,
    /// Estimated or measured.
    pub status: ProfileStatus,
    /// What is estimated and how it was measured.
    pub note: String,
    /// Published or measured figures the profile reproduces.
    pub anchors: Vec<Anchor>,
    /// The free-form `[calibration]` table, if any.
    pub calibration: Option<toml::Table>,
    cost: BatchedCost,
}

impl ProfileFile {
    /// Reads and validates a profile file; errors name the file and the key.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading profile file {}", path.display()))?;
        Self::from_toml_str(&text).map_err(|e| anyhow!("profile file {}: {e:#}", path.display()))
    }

    /// Parses and validates a profile from TOML text; errors name the key.
    pub fn from_toml_str(text: &str) -> anyhow::Result<Self> {
        let raw: RawFile = toml::from_str(text).map_err(|e| anyhow!("{}", e.to_string().trim()))?;
        let c = &raw.cost;
        for (key, value) in [
            ("decode_overhead_ms", c.decode_overhead_ms),
            ("mixed_overhead_ms", c.mixed_overhead_ms),
            ("weight_read_ms", c.weight_read_ms),
            ("per_token_ms", c.per_token_ms),
            ("per_attention_pair_ms", c.per_attention_pair_ms),
            ("per_context_token_ms", c.per_context_token_ms),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                bail!("[cost] {key} must be a finite number >= 0, got {value}");
            }
        }
        if raw.kv.gpu_blocks == 0 {
            bail!("[kv] gpu_blocks must be > 0");
        }
        if raw.kv.bytes_per_token == 0 {
            bail!("[kv] bytes_per_token must be > 0");
        }
        if !(raw.kv.load_gb_per_s.is_finite() && raw.kv.load_gb_per_s > 0.0) {
            bail!(
                "[kv] load_gb_per_s must be a finite number > 0, got {}",
                raw.kv.load_gb_per_s
            );
        }
        for (i, a) in raw.anchors.iter().enumerate() {
            if !(a.expect_ms.is_finite() && a.expect_ms > 0.0) {
                bail!(
                    "[[anchor]] {} ({:?}): expect_ms must be a finite number > 0, got {}",
                    i + 1,
                    a.what,
                    a.expect_ms
                );
            }
            if !(a.tolerance > 0.0 && a.tolerance <= 1.0) {
                bail!(
                    "[[anchor]] {} ({:?}): tolerance must be in (0, 1], got {}",
                    i + 1,
                    a.what,
                    a.tolerance
                );
            }
        }
        Ok(Self {
            cost: BatchedCost {
                decode_overhead_ms: c.decode_overhead_ms,
                mixed_overhead_ms: c.mixed_overhead_ms,
                weight_read_ms: c.weight_read_ms,
                per_token_ms: c.per_token_ms,
                per_attention_pair_ms: c.per_attention_pair_ms,
                per_context_token_ms: c.per_context_token_ms,
                default_gpu_blocks: raw.kv.gpu_blocks,
                kv_bytes_per_token: raw.kv.bytes_per_token,
                kv_load_gb_per_s: raw.kv.load_gb_per_s,
            },
            name: raw.name,
            model: raw.model,
            gpu: raw.gpu,
            status: raw.status,
            note: raw.note,
            anchors: raw.anchors,
            calibration: raw.calibration,
        })
    }

    /// The step cost model (with `[kv] gpu_blocks` as its default KV size).
    pub fn cost(&self) -> BatchedCost {
        self.cost
    }

    /// The anchors this profile misses: `(anchor, relative error)` for each outside its tolerance.
    pub fn missed_anchors(&self) -> Vec<(&Anchor, f64)> {
        self.anchors
            .iter()
            .filter(|a| !a.holds(&self.cost))
            .map(|a| (a, a.relative_error(&self.cost)))
            .collect()
    }
}
