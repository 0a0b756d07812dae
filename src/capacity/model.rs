//! A model's shape, read from its HuggingFace `config.json`: what the KV cache of one token
//! costs, and (for dense decoder models) about how much its weights weigh.
//!
//! Keys read: `num_hidden_layers`, `num_key_value_heads` (default `num_attention_heads`: no
//! grouped-query attention), `head_dim` (default `hidden_size / num_attention_heads`),
//! `torch_dtype` (or `dtype`, its newer name). A multimodal config that keeps these under
//! `text_config` is read from there. For the weights estimate: `vocab_size`,
//! `intermediate_size`, `tie_word_embeddings`.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{Map, Value};

/// Bytes per element of a `torch_dtype` / vLLM `--dtype` / `--kv-cache-dtype` name.
pub fn dtype_bytes(name: &str) -> Option<u32> {
    match name.to_ascii_lowercase().as_str() {
        "float16" | "fp16" | "half" | "bfloat16" | "bf16" => Some(2),
        "float32" | "fp32" | "float" => Some(4),
        "fp8" | "fp8_e4m3" | "fp8_e5m2" | "fp8_inc" | "float8_e4m3fn" | "float8_e5m2" => Some(1),
        _ => None,
    }
}

/// What the planner needs of a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelShape {
    /// `architectures[0]`, when the file names one.
    pub architecture: Option<String>,
    /// `num_hidden_layers`.
    pub layers: u32,
    /// `num_attention_heads`.
    pub attention_heads: u32,
    /// `num_key_value_heads` (or `num_attention_heads`).
    pub kv_heads: u32,
    /// `head_dim` (or `hidden_size / num_attention_heads`).
    pub head_dim: u32,
    /// `hidden_size`, when given.
    pub hidden_size: Option<u32>,
    /// `torch_dtype` / `dtype` as written.
    pub dtype: String,
    /// Its bytes per element.
    pub dtype_bytes: u32,
    /// `max_position_embeddings`: the model's own window, when given.
    pub max_position_embeddings: Option<u32>,
    /// Parameters estimated from the shape (dense decoders only; `None` with the reason).
    #[serde(skip)]
    pub parameters: std::result::Result<u64, String>,
}

impl ModelShape {
    /// Parses `config.json` text.
    pub fn from_json(text: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text).context("config.json is not JSON")?;
        let Some(root) = root.as_object() else {
            bail!("config.json is not a JSON object");
        };
        // Multimodal configs (Llama 4, Gemma 3, Qwen2.5-VL...) keep the language model's
        // shape under text_config.
        let obj = match root.get("text_config").and_then(Value::as_object) {
            Some(text) if !root.contains_key("num_hidden_layers") => text,
            _ => root,
        };
        if obj.contains_key("kv_lora_rank") {
            bail!(
                "config.json has `kv_lora_rank`: multi-head latent attention (DeepSeek) caches \
                 a compressed latent, not layers x kv_heads x head_dim x 2; this planner does \
                 not cover it"
            );
        }
        let layers = req_u32(obj, "num_hidden_layers")?;
        let attention_heads = req_u32(obj, "num_attention_heads")?;
        let kv_heads = opt_u32(obj, "num_key_value_heads")?.unwrap_or(attention_heads);
        let hidden_size = opt_u32(obj, "hidden_size")?;
        let head_dim = match opt_u32(obj, "head_dim")? {
            Some(d) => d,
            None => {
                let Some(hidden) = hidden_size else {
                    bail!("config.json: missing `head_dim` (and `hidden_size` to derive it from)");
                };
                if attention_heads == 0 {
                    bail!("config.json: `num_attention_heads` must be > 0");
                }
                if hidden % attention_heads != 0 {
                    bail!(
                        "config.json: `hidden_size` ({hidden}) is not a multiple of \
                         `num_attention_heads` ({attention_heads}); give `head_dim`"
                    );
                }
                hidden / attention_heads
            }
        };
        let dtype = ["torch_dtype", "dtype"]
            .iter()
            .find_map(|k| obj.get(*k).or_else(|| root.get(*k)))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .context("config.json: missing `torch_dtype` (or `dtype`)")?;
        let Some(dtype_bytes) = dtype_bytes(&dtype) else {
            bail!(
                "config.json: `torch_dtype` {dtype:?} is not float16, bfloat16 or float32; \
                 give --kv-cache-dtype and --weights-gib"
            );
        };
        for (k, v) in [
            ("num_hidden_layers", layers),
            ("num_attention_heads", attention_heads),
            ("num_key_value_heads", kv_heads),
            ("head_dim", head_dim),
        ] {
            if v == 0 {
                bail!("config.json: `{k}` must be > 0");
            }
        }
        let architecture = root
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut shape = ModelShape {
            architecture,
            layers,
            attention_heads,
            kv_heads,
            head_dim,
            hidden_size,
            dtype,
            dtype_bytes,
            max_position_embeddings: opt_u32(obj, "max_position_embeddings")?,
            parameters: Err(String::new()),
        };
        shape.parameters = estimate_parameters(root, obj, &shape);
        Ok(shape)
    }

    /// The dtype vLLM serves the model in with `--dtype auto` (its default), and its bytes: a
    /// float32 checkpoint is served in float16 ("auto will use FP16 precision for FP32 and
    /// FP16 models", vLLM's `ModelConfig`), the others in their own. The weights and an `auto`
    /// KV cache take this.
    pub fn served(&self) -> (String, u32) {
        if self.dtype_bytes == 4 {
            ("float16".to_owned(), 2)
        } else {
            (self.dtype.clone(), self.dtype_bytes)
        }
    }

    /// KV cache bytes one token takes in every layer: `layers x kv_heads x head_dim x 2 (K and
    /// V) x kv_dtype_bytes`.
    pub fn kv_bytes_per_token(&self, kv_dtype_bytes: u32) -> u64 {
        u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * 2
            * u64::from(kv_dtype_bytes)
    }
}

/// Parameters of a dense decoder (Llama, Qwen2, Mistral, Gemma): embeddings, the LM head
/// unless tied, and per layer the attention projections (q and o: hidden x heads x head_dim;
/// k and v: hidden x kv_heads x head_dim) and a gated MLP (3 x hidden x intermediate). Norms
/// and biases (well under 0.1 %) are left out. Mixture-of-experts and quantized checkpoints are
/// refused: their weights are not this.
fn estimate_parameters(
    root: &Map<String, Value>,
    obj: &Map<String, Value>,
    s: &ModelShape,
) -> std::result::Result<u64, String> {
    for key in ["quantization_config", "compression_config"] {
        if root.contains_key(key) || obj.contains_key(key) {
            return Err(format!("config.json has `{key}`: quantized weights"));
        }
    }
    for key in [
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "moe_intermediate_size",
    ] {
        if obj.get(key).is_some_and(|v| !v.is_null()) {
            return Err(format!("config.json has `{key}`: a mixture of experts"));
        }
    }
    if root.contains_key("vision_config") || root.contains_key("text_config") {
        return Err("config.json has a vision tower (`vision_config`/`text_config`)".into());
    }
    let get = |k: &str| -> std::result::Result<u64, String> {
        obj.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("config.json: missing `{k}`"))
    };
    let hidden = get("hidden_size")?;
    let vocab = get("vocab_size")?;
    let intermediate = get("intermediate_size")?;
    let tied = obj
        .get("tie_word_embeddings")
        .or_else(|| root.get("tie_word_embeddings"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let heads = u64::from(s.attention_heads);
    let kv = u64::from(s.kv_heads);
    let hd = u64::from(s.head_dim);
    let attention = 2 * hidden * heads * hd + 2 * hidden * kv * hd;
    let mlp = 3 * hidden * intermediate;
    let embeddings = vocab * hidden * if tied { 1 } else { 2 };
    Ok(embeddings + u64::from(s.layers) * (attention + mlp))
}

fn opt_u32(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .with_context(|| format!("config.json: `{key}` must be a whole number")),
    }
}

fn req_u32(obj: &Map<String, Value>, key: &str) -> Result<u32> {
    opt_u32(obj, key)?.with_context(|| format!("config.json: missing `{key}`"))
}
