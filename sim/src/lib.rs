//! `vllm-sim`: a vLLM stand-in for machines without a GPU.
//!
//! It speaks vLLM's OpenAI-compatible wire format byte for byte and models vLLM V1's
//! continuous-batching scheduler (token budget per step, max sequences, chunked prefill, KV blocks,
//! prefix cache, preemption, abort) with step times from a calibrated profile. See `sim/README.md`.
//!
//! # Layout
//! - [`args`]: command-line flags, named like `vllm serve`'s.
//! - [`tokenizer`]: prompt tokens (a `tokenizer.json`, or a documented heuristic) and the chat template.
//! - [`api`]: HTTP routes: request validation, SSE framing, chunk JSON, errors.
//! - [`vision`]: a vision model's tokens for a picture (`--image-token-pixels`).
//! - [`text`]: seeded output lengths, filler text and fault injection.
//! - [`engine`]: the scheduler loop, KV cache and per-request state; `engine::metrics`, vLLM's
//!   Prometheus series.
//! - [`profile`]: step-time models (`llama-3.1-8b-h100`, `llama-3.1-8b-h200`, `fixed`,
//!   `tiny-test`) and profile files (`--profile-file`).
#![forbid(unsafe_code)]

pub mod api;
pub mod args;
pub mod engine;
pub mod profile;
pub mod text;
pub mod tokenizer;
pub mod vision;
pub mod words;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use api::VLLM_VERSION;
pub use args::SimArgs;
use engine::scheduler::SchedulerConfig;
use engine::Engine;
use profile::Profile;

/// A running simulator.
#[derive(Debug)]
pub struct SimServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its engine, for tests that look inside.
    pub engine: Engine,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl SimServer {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving and stops the engine.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.engine.shutdown();
        // Open streams (a stalled one, say) must not hold shutdown forever.
        if tokio::time::timeout(std::time::Duration::from_secs(2), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }

    /// Waits until the server ends.
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Validates the flags and builds the engine and handler state.
pub fn build(args: &SimArgs) -> anyhow::Result<api::AppState> {
    let profile = match &args.profile_file {
        Some(path) => Profile::Batched(profile::ProfileFile::load(path)?.cost()),
        None => {
            let Some(profile) =
                Profile::by_name(&args.profile, args.fixed_ttft_ms, args.fixed_itl_ms)
            else {
                bail!(
                    "unknown --profile {:?}; known: {}",
                    args.profile,
                    Profile::NAMES.join(", ")
                );
            };
            profile
        }
    };
    if !(args.speed > 0.0 && args.speed.is_finite()) {
        bail!("--speed must be a positive number, got {}", args.speed);
    }
    let policy = match args.scheduling_policy.as_str() {
        "fcfs" => false,
        "priority" => true,
        other => bail!("--scheduling-policy must be fcfs or priority, got {other:?}"),
    };
    if args.block_size == 0 || args.max_num_seqs == 0 || args.max_num_batched_tokens == 0 {
        bail!("--block-size, --max-num-seqs and --max-num-batched-tokens must be > 0");
    }
    let default_blocks = match profile {
        Profile::Batched(c) => c.default_gpu_blocks,
        Profile::Fixed { .. } => 1,
    };
    let num_gpu_blocks = args.num_gpu_blocks.unwrap_or(default_blocks);
    if matches!(profile, Profile::Batched(_))
        && u64::from(num_gpu_blocks) * u64::from(args.block_size) < u64::from(args.max_model_len)
    {
        bail!(
            "the KV cache ({num_gpu_blocks} blocks of {} tokens) cannot hold one sequence of \
             --max-model-len {}; lower --max-model-len or raise --num-gpu-blocks",
            args.block_size,
            args.max_model_len
        );
    }
    if args.kv_offloading_backend != "native" {
        bail!(
            "--kv-offloading-backend {:?} is not simulated; only native (vLLM's \
             OffloadingConnector to CPU memory)",
            args.kv_offloading_backend
        );
    }
    let (num_cpu_blocks, cpu_load_per_block) = match (args.kv_offloading_size, profile) {
        (None, _) => (0, std::time::Duration::ZERO),
        (Some(gib), Profile::Batched(c)) => {
            if !(gib.is_finite() && gib > 0.0) {
                bail!("--kv-offloading-size must be a positive number of GiB, got {gib}");
            }
            let block_bytes = f64::from(c.kv_bytes_per_token) * f64::from(args.block_size);
            let blocks = (gib * f64::from(1u32 << 30) / block_bytes).floor();
            if blocks < 1.0 {
                bail!("--kv-offloading-size {gib} GiB holds no block of {block_bytes} bytes");
            }
            let load = block_bytes / (c.kv_load_gb_per_s * 1e9) / args.speed;
            (
                blocks.min(f64::from(u32::MAX)) as u32,
                std::time::Duration::from_secs_f64(load),
            )
        }
        (Some(_), Profile::Fixed { .. }) => {
            bail!("--kv-offloading-size needs a batched profile (the fixed one has no KV cache)")
        }
    };
    let cfg = SchedulerConfig {
        num_cpu_blocks,
        cpu_load_per_block,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        block_size: args.block_size,
        num_gpu_blocks,
        prefix_caching: args.prefix_caching(),
        priority_policy: policy,
        long_prefill_token_threshold: args.long_prefill_token_threshold,
        reserve_full_isl: true,
        async_scheduling: args.async_scheduling(),
    };
    let tokenizer = tokenizer::PromptTokenizer::load(args.tokenizer.as_deref())?;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(api::AppState {
        engine: Engine::start(profile, args.speed, cfg),
        tokenizer: Arc::new(tokenizer),
        model: args.served_model_name.clone(),
        max_model_len: args.max_model_len,
        mean_output_tokens: args.mean_output_tokens,
        reasoning_tokens: args.reasoning_tokens,
        continued_as_reasoning: args.reasoning_tokens > 0 && !args.template_closes_reasoning,
        seed: args.seed,
        faults: text::FaultRates {
            fail: args.fail_rate,
            midstream_error: args.midstream_error_rate,
            error_after_tokens: args.error_after_tokens,
            stall_after_tokens: args.stall_after_tokens,
            stall: args.stall_rate,
            omit_done: args.omit_done_rate,
            omit_done_hang: args.omit_done_hang,
            garbage: args.garbage_rate,
            chatter_after_finish: args.chatter_after_finish,
            error_after_finish: args.error_after_finish,
            padding: args.chunk_padding_bytes,
        },
        prompt_tokens_details: args.enable_prompt_tokens_details,
        exclude_tools_when_none: args.exclude_tools_when_tool_choice_none,
        vision: crate::vision::Vision::from_args(args.image_token_pixels, args.image_max_tokens),
        call_tools: args.call_tools,
        per_request_metrics: args.enable_per_request_metrics,
        request_id_headers: args.enable_request_id_headers,
        api_key: args.api_key.clone().map(Arc::from),
        redirect_to: args.redirect_to.clone().map(Arc::from),
        scale_out: args.enable_scale_out,
        aborts: Default::default(),
        started,
        traceparents: Default::default(),
        priority_policy: policy,
        recent: Default::default(),
    })
}

/// Binds `--host:--port` and serves in the background.
pub async fn start(args: &SimArgs) -> anyhow::Result<SimServer> {
    let state = build(args)?;
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("bind {}:{}", args.host, args.port))?;
    serve_on(listener, state)
}

/// Serves on a bound listener in the background.
pub fn serve_on(listener: TcpListener, state: api::AppState) -> anyhow::Result<SimServer> {
    let addr = listener.local_addr()?;
    let engine = state.engine.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let app = api::router(state);
    // TCP_NODELAY, as vLLM's server (uvicorn) sets it: small SSE writes go out at once instead
    // of waiting on the peer's delayed ACK (a 40 ms stall per token on a warm connection).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = stopped.await;
        });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "vllm-sim server failed");
        }
    });
    Ok(SimServer {
        addr,
        engine,
        stop: Some(stop),
        task,
    })
}
