//! Command-line flags, named like `vllm serve`'s where they mean the same thing.

use std::path::PathBuf;

use clap::Parser;

/// Flags of the `vllm-sim` binary. Also built in tests with [`SimArgs::for_test`].
#[derive(Debug, Clone, Parser)]
#[command(
    name = "vllm-sim",
    version,
    about = "A vLLM stand-in for machines without a GPU"
)]
pub struct SimArgs {
    /// Address to bind (as vLLM's `--host`).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (as vLLM's `--port`); 0 picks a free one.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name reported by `/v1/models` and accepted in requests.
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub served_model_name: String,
    /// Longest prompt + output, in tokens; longer requests get vLLM's 400.
    #[arg(long, default_value_t = 16384)]
    pub max_model_len: u32,
    /// Most sequences running in one scheduler step (vLLM `--max-num-seqs`).
    #[arg(long, default_value_t = 1024)]
    pub max_num_seqs: u32,
    /// Token budget of one scheduler step (vLLM `--max-num-batched-tokens`).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: u32,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// KV-cache blocks on the simulated GPU; default: the profile's.
    #[arg(long)]
    pub num_gpu_blocks: Option<u32>,
    /// GiB of CPU memory for offloaded KV blocks (vLLM's `--kv-offloading-size`): every block
    /// a step computes is copied there, and a waiting request loads the blocks after its GPU
    /// prefix-cache hit from there instead of recomputing them. Default: no offloading.
    #[arg(long)]
    pub kv_offloading_size: Option<f64>,
    /// Where offloaded KV goes (vLLM's `--kv-offloading-backend`): only `native` (vLLM's
    /// `OffloadingConnector` to CPU memory) is simulated.
    #[arg(long, default_value = "native")]
    pub kv_offloading_backend: String,
    /// Prefix caching is on by default, as in vLLM V1.
    #[arg(
        long,
        default_value_t = true,
        overrides_with = "no_enable_prefix_caching"
    )]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Report `usage.prompt_tokens_details.cached_tokens` (vLLM's flag of the same name).
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
    /// Leave the tools out of the prompt of a chat request with `tool_choice: "none"` (vLLM's
    /// flag of the same name: its chat serving passes no tools to the template then).
    #[arg(long)]
    pub exclude_tools_when_tool_choice_none: bool,
    /// A vision model: an image part costs one token per square of this many pixels a side, as
    /// Qwen2-VL and Qwen2.5-VL count them (28; Hugging Face's `smart_resize`: each side rounded
    /// to a multiple, the picture scaled down to `--image-max-tokens` squares or up to 4), and
    /// renders as `<|vision_start|>`, that many `<|image_pad|>` and `<|vision_end|>`. A picture
    /// whose size cannot be read from its `data:` URL (a fetched URL: the simulator fetches
    /// nothing) costs `--image-max-tokens`. 0 (the default): a text model, which renders every
    /// media part as its JSON.
    #[arg(long, default_value_t = 0)]
    pub image_token_pixels: u32,
    /// The most tokens one picture costs with `--image-token-pixels` (Qwen2.5-VL's default
    /// `max_pixels` of 12,845,056 is 16,384 squares of 28 pixels).
    #[arg(long, default_value_t = 16384)]
    pub image_max_tokens: u32,
    /// A model that calls a tool whenever it is offered one: a chat request with `tools` and
    /// `tool_choice` `"auto"` (or none) is answered with a call of its first tool, streamed as
    /// vLLM's auto tool choice streams one its tool parser found (`--enable-auto-tool-choice`):
    /// the call's pieces as `delta.tool_calls`, `finish_reason` `"tool_calls"`, and `content`
    /// null in a whole answer. Off: such requests are answered in text.
    #[arg(long)]
    pub call_tools: bool,
    /// Put vLLM's per-request `metrics` object on the final usage chunk.
    #[arg(long)]
    pub enable_per_request_metrics: bool,
    /// Echo `X-Request-Id` on responses (vLLM's flag of the same name).
    #[arg(long)]
    pub enable_request_id_headers: bool,
    /// Serve vLLM's abort endpoint, `POST /inference/v1/abort_requests`, as `vllm serve
    /// --enable-scale-out` does (the simulator has no other scale-out routes). Without it the
    /// simulator is a default `vllm serve`: that path answers 403 and `/abort_requests` 404,
    /// and only a closed connection aborts a request.
    #[arg(long)]
    pub enable_scale_out: bool,
    /// Require `Authorization: Bearer <key>` on `/v1/*` and `/inference/*` routes (vLLM's
    /// `--api-key`): 401 `{"error":"Unauthorized"}` otherwise.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Plan the next step while the current one runs, as vLLM V1 does by default
    /// (`--async-scheduling`): a request arriving during step N is first scheduled in step
    /// N+2. `--no-async-scheduling`: plan each step after the previous one completed.
    #[arg(long, default_value_t = true, overrides_with = "no_async_scheduling")]
    pub async_scheduling: bool,
    /// Turn asynchronous scheduling off.
    #[arg(long)]
    pub no_async_scheduling: bool,
    /// Most prompt tokens one long prefill may compute per step (vLLM's flag); 0: no cap.
    #[arg(long, default_value_t = 0)]
    pub long_prefill_token_threshold: u32,
    /// `fcfs` (arrival order) or `priority` (lower `priority` field first, then arrival).
    #[arg(long, default_value = "fcfs")]
    pub scheduling_policy: String,
    /// A HuggingFace `tokenizer.json`; without it a documented heuristic counts tokens.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Step-time model: `llama-3.1-8b-h100`, `llama-3.1-8b-h200`, `fixed`, or `tiny-test`.
    #[arg(long, default_value = "llama-3.1-8b-h100")]
    pub profile: String,
    /// A profile file (TOML, the format of `sim/profiles/*.toml`) instead of a built-in
    /// `--profile`; the two flags are mutually exclusive.
    #[arg(long, conflicts_with = "profile")]
    pub profile_file: Option<PathBuf>,
    /// Run this many times faster than real time (tests use 10-100).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// `fixed` profile: time to first token, milliseconds (before `--speed`).
    #[arg(long, default_value_t = 50.0)]
    pub fixed_ttft_ms: f64,
    /// `fixed` profile: time between tokens, milliseconds (before `--speed`).
    #[arg(long, default_value_t = 20.0)]
    pub fixed_itl_ms: f64,
    /// A reasoning model: the first N output tokens of every chat answer are reasoning,
    /// streamed as `delta.reasoning` before the content (non-streaming: `message.reasoning`)
    /// and counted in `usage.completion_tokens`, as vLLM with a reasoning parser does. They
    /// come out of the answer's length (`max_tokens` included). 0: no reasoning.
    #[arg(long, default_value_t = 0)]
    pub reasoning_tokens: u32,
    /// With `--reasoning-tokens`: the chat template writes a closed think block before a
    /// continued final assistant message (Qwen3's writes `<think>\n\n</think>` there), so vLLM
    /// finds the reasoning ended in the prompt (`is_reasoning_end(prompt_token_ids)`) and streams
    /// the continuation as content. Off (the default): as DeepSeek-R1's template, which leaves no
    /// think tag in a continued message; vLLM's `deepseek_r1` parser then streams every token
    /// before a `</think>` as reasoning, the continued answer's included
    /// (`vllm/reasoning/deepseek_r1_reasoning_parser.py`; vLLM PR #38749 proposes skipping the
    /// parser for `continue_final_message`).
    #[arg(long)]
    pub template_closes_reasoning: bool,
    /// Mean output length when neither `max_tokens` nor `ignore_eos` decides it.
    #[arg(long, default_value_t = 200)]
    pub mean_output_tokens: u32,
    /// Seed for output lengths and fault injection (with the request's own `seed`).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fraction of requests answered with a 500 before streaming.
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Fraction of streams that send `data: {"error":...}` after `--error-after-tokens`.
    #[arg(long, default_value_t = 0.0)]
    pub midstream_error_rate: f64,
    /// Tokens sent before an injected mid-stream error.
    #[arg(long, default_value_t = 5)]
    pub error_after_tokens: u32,
    /// Streams stall (connection open, no more bytes) after this many tokens.
    #[arg(long)]
    pub stall_after_tokens: Option<u32>,
    /// Fraction of streams that stall when `--stall-after-tokens` is set.
    #[arg(long, default_value_t = 1.0)]
    pub stall_rate: f64,
    /// Fraction of streams that end without `data: [DONE]`.
    #[arg(long, default_value_t = 0.0)]
    pub omit_done_rate: f64,
    /// Streams that end without `[DONE]` keep the connection open, sending nothing more,
    /// instead of closing it (like a proxy in between that never forwards the end).
    #[arg(long)]
    pub omit_done_hang: bool,
    /// Fraction of streams with a non-JSON `data:` line in the middle.
    #[arg(long, default_value_t = 0.0)]
    pub garbage_rate: f64,
    /// A broken engine: after the finish reason (and the usage chunk) every stream goes on
    /// sending a text chunk every 10 ms instead of `[DONE]`, without end, until the client
    /// closes.
    #[arg(long)]
    pub chatter_after_finish: bool,
    /// A broken engine: after the finish reason every stream sends an error event in place of
    /// its usage chunk, then `[DONE]`, as vLLM's stream generator does when its code after the
    /// generation loop (the final usage, a tool parser's end) raises.
    #[arg(long)]
    pub error_after_finish: bool,
    /// A broken engine: every answer chunk carries this many bytes more (an `x_padding` field),
    /// so a few tokens make megabytes.
    #[arg(long, default_value_t = 0)]
    pub chunk_padding_bytes: usize,
    /// A broken engine (or a proxy in front of it): every generation request is answered
    /// `307 Temporary Redirect` to this base URL (the same path), nothing generated.
    #[arg(long)]
    pub redirect_to: Option<String>,
    /// Log filter (as `RUST_LOG`).
    #[arg(long, default_value = "info")]
    pub log: String,
}

impl SimArgs {
    /// Flags for an in-process simulator on `127.0.0.1:0`, plus `extra` flags as on the command line.
    pub fn for_test(extra: &[&str]) -> Self {
        let mut argv = vec!["vllm-sim", "--port", "0"];
        argv.extend_from_slice(extra);
        Self::parse_from(argv)
    }

    /// Whether asynchronous scheduling is in effect after `--no-async-scheduling`.
    pub fn async_scheduling(&self) -> bool {
        self.async_scheduling && !self.no_async_scheduling
    }

    /// Whether prefix caching is in effect after `--no-enable-prefix-caching`.
    pub fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching && !self.no_enable_prefix_caching
    }
}
