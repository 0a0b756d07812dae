//! The `tutor-gateway capacity` command and the `--probe` part of `check-config`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::model::ModelShape;
use super::plan::{plan, LaneInput, PlanInput};
use crate::config::Config;

/// `tutor-gateway capacity`: sizes the engine and the lane budgets for a model on a GPU.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The model's HuggingFace `config.json` (layers, KV heads, head dim, dtype).
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    pub model_config: Option<PathBuf>,
    /// A bundled model's shape instead of a file: llama-3.1-8b, llama-3.1-70b, qwen2.5-7b,
    /// qwen2.5-32b, mistral-7b.
    #[arg(long)]
    pub model: Option<String>,
    /// Memory of the GPU, GiB (nvidia-smi's MiB / 1024; an 80 GB H100 shows 79.6).
    #[arg(long)]
    pub gpu_memory_gib: f64,
    /// vLLM's `--gpu-memory-utilization`.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// The weights' size in GiB. Without it: estimated from config.json (dense models:
    /// embeddings, attention and gated MLP, x the dtype's bytes); required for quantized and
    /// mixture-of-experts models.
    #[arg(long)]
    pub weights_gib: Option<f64>,
    /// Memory that is neither weights nor KV cache, GiB: activation peak, CUDA graphs, the
    /// CUDA context. vLLM logs what it measured at start-up ("non_torch_memory", "activation
    /// peak memory").
    #[arg(long, default_value_t = 2.0)]
    pub overhead_gib: f64,
    /// vLLM's `--kv-cache-dtype`: `auto` (the dtype the model is served in: a float32
    /// checkpoint's is float16), `bfloat16`, or `fp8` (`fp8_e4m3`, `fp8_e5m2`, `fp8_inc`: 1
    /// byte).
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
    /// vLLM's `--block-size`.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Gateway config whose lane bounds (classify.small_max_work, classify.medium_max_work,
    /// upstream.max_model_len) are the product's context lengths and whose lane budgets give
    /// the split. Default: the shipped config/config.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The small lane's largest request, input + output tokens (instead of the config's).
    #[arg(long)]
    pub small_context: Option<u32>,
    /// The medium lane's largest request, input + output tokens.
    #[arg(long)]
    pub medium_context: Option<u32>,
    /// The large lane's largest request (the suggested --max-model-len), tokens.
    #[arg(long)]
    pub large_context: Option<u32>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tutor-gateway capacity`.
pub fn run(args: &PlanArgs) -> ExitCode {
    match plan_for(args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tutor-gateway capacity: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The command's output for `args`.
pub fn plan_for(args: &PlanArgs) -> anyhow::Result<String> {
    use anyhow::Context;
    let model = match (&args.model_config, &args.model) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            ModelShape::from_json(&text).with_context(|| path.display().to_string())?
        }
        (None, Some(name)) => ModelShape::from_json(super::models::bundled(name)?)
            .with_context(|| format!("bundled model {name}"))?,
        (None, None) => anyhow::bail!("give --model NAME or --model-config PATH"),
    };
    let config = match &args.config {
        Some(p) => Config::load(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
        None => Config::default(),
    };
    let mut lanes = LaneInput::from_config(&config);
    for (i, v) in [args.small_context, args.medium_context, args.large_context]
        .into_iter()
        .enumerate()
    {
        if let Some(v) = v {
            lanes[i].context = v;
        }
    }
    let plan = plan(&PlanInput {
        model,
        gpu_memory_gib: args.gpu_memory_gib,
        gpu_memory_utilization: args.gpu_memory_utilization,
        weights_gib: args.weights_gib,
        overhead_gib: args.overhead_gib,
        kv_cache_dtype: args.kv_cache_dtype.clone(),
        block_size: args.block_size,
        lanes,
        prefill_budget_tokens: config.admission.prefill_budget_tokens,
    })?;
    Ok(if args.json {
        let mut s = serde_json::to_string_pretty(&plan)?;
        s.push('\n');
        s
    } else {
        plan.render()
    })
}

/// `check-config --probe`: reads each configured replica's capacity and prints it with every
/// overcommit problem (the budgets are the fleet's, checked against every replica's KV cache
/// together; not checked when a replica cannot be read: a part of the fleet would look
/// overcommitted). Exit 0 with warnings; 1 when an engine cannot be read, or with `strict` and
/// any problem.
pub fn check_probe(path: &std::path::Path, config: &Config, strict: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = path.display();
    let mut unreadable = 0;
    let http = match super::client_for(&config.upstream) {
        Ok(http) => http,
        Err(e) => {
            eprintln!("{path}: --probe: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut caps = Vec::new();
    for replica in config.upstream.replica_set() {
        // The name only: a URL may hold a password.
        let who = format!("replica {}", replica.name);
        match rt.block_on(super::read_engine_capacity(&http, &replica.url)) {
            Ok(cap) => {
                println!("{path}: {who}: {cap}");
                caps.push(cap);
            }
            Err(e) => {
                eprintln!("{path}: --probe: {who}: {e:#}");
                unreadable += 1;
            }
        }
    }
    let found = if unreadable == 0 {
        super::fleet(&caps)
            .map(|all| super::overcommit(config, &all))
            .unwrap_or_default()
    } else {
        eprintln!(
            "{path}: --probe: the budgets were not checked: {unreadable} replica(s) could not \
             be read, and the fleet's capacity is every replica's"
        );
        Vec::new()
    };
    for p in &found {
        eprintln!("{path}: warning: KV OVERCOMMIT: {p}");
    }
    if found.is_empty() && unreadable == 0 {
        println!("{path}: the budgets fit the engines' capacity");
    }
    let problems = found.len();
    if unreadable > 0 {
        return ExitCode::FAILURE;
    }
    if strict && problems > 0 {
        eprintln!("{path}: {problems} capacity problem(s) (--strict)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
