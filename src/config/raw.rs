//! Stage one: the config file exactly as written, in human units (`_ms`), every key optional.
//!
//! Defaults and checks are applied in one place, [`super::validate`], so that every problem in a
//! file is reported at once. Unknown keys are rejected here (`deny_unknown_fields`): a typo must
//! not silently fall back to a default.

use serde::Deserialize;

/// The whole file. Top-level sections are deserialized one by one (see `parse.rs`) so that a bad
/// value in one section does not hide the problems in the others.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `listen`: socket address the gateway binds, `IP:PORT`.
    pub listen: Option<String>,
    /// `[upstream]`: the vLLM server.
    #[serde(default)]
    pub upstream: RawUpstream,
    /// `[classify]`: token estimate and lane thresholds.
    #[serde(default)]
    pub classify: RawClassify,
    /// `[admission]`: policy and global budget.
    #[serde(default)]
    pub admission: RawAdmission,
    /// `[lanes.small|medium|large]`: per-lane limits.
    #[serde(default)]
    pub lanes: RawLanes,
    /// `[server]`: the gateway's own HTTP server.
    #[serde(default)]
    pub server: RawServer,
    /// `[promotion]`: requests that outgrow their lane mid-stream, and continuations.
    #[serde(default)]
    pub promotion: RawPromotion,
    /// `[telemetry]`: request log and tracing.
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// `[quota]`: where the lane quota lives (this replica, or Redis shared by replicas).
    #[serde(default)]
    pub quota: RawQuota,
    /// `[prefix_cache]`: tool canonicalization, per-fingerprint metrics, drift detection.
    #[serde(default)]
    pub prefix_cache: RawPrefixCache,
    /// `[courses.<id>]`: course prompts for `/answer`.
    #[serde(default)]
    pub courses: std::collections::BTreeMap<String, RawCourse>,
}

/// `[prefix_cache]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrefixCache {
    /// Rewrite `/v1` `tools` as canonical JSON before forwarding.
    pub canonicalize_tools: Option<bool>,
    /// Fingerprints with their own label in the per-fingerprint metrics (the rest: `other`).
    pub fingerprint_labels: Option<u32>,
    /// Requests a fingerprint needs before it may take a label.
    pub label_after_requests: Option<u32>,
    /// Drift: observed prefill per uncached token above this many times the profile, percent.
    pub drift_factor_percent: Option<u32>,
    /// Drift: samples a fingerprint's profile needs before it is compared.
    pub drift_min_samples: Option<u32>,
    /// Drift: at most one log line per fingerprint per this window, ms.
    pub drift_log_window_ms: Option<u64>,
}

/// `[courses.<id>]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCourse {
    /// Version of the course prompt, part of the stable prefix.
    pub version: Option<String>,
    /// Stable system instructions.
    pub instructions: Option<String>,
    /// Grading rubric.
    pub rubric: Option<String>,
    /// Safety rules.
    pub safety: Option<String>,
    /// Tool schemas: a JSON array, as text.
    pub tools: Option<String>,
}

/// `[quota]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQuota {
    /// `local` or `redis`.
    pub backend: Option<String>,
    /// `redis://[user:password@]host:port/db` or `unix:///path`.
    pub redis_url: Option<String>,
    /// Lease lifetime without a heartbeat, ms.
    pub lease_ttl_ms: Option<u64>,
    /// Heartbeat (lease renewal) period, ms.
    pub heartbeat_ms: Option<u64>,
    /// Prefix of every Redis key, without braces.
    pub key_prefix: Option<String>,
    /// `fail_open` or `fail_closed`.
    pub on_redis_down: Option<String>,
    /// Replicas the local fallback divides the global limits by.
    pub expected_replicas: Option<u32>,
}

/// `[telemetry]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// `stdout` or `off`.
    pub request_log: Option<String>,
    /// Export `llm.generate` spans over OTLP.
    pub tracing: Option<bool>,
    /// OTLP endpoint; empty: `OTEL_EXPORTER_OTLP_ENDPOINT` or the protocol's default.
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`; empty: `OTEL_EXPORTER_OTLP_PROTOCOL` or `grpc`.
    pub otlp_protocol: Option<String>,
    /// `service.name`; empty: `OTEL_SERVICE_NAME` or `tutor-gateway`.
    pub service_name: Option<String>,
}

/// `[server]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Largest request body accepted, bytes.
    pub max_body_bytes: Option<u64>,
    /// On SIGTERM, how long in-flight streams may finish before the process exits, ms.
    pub shutdown_grace_ms: Option<u64>,
}

/// `[upstream]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Base URL of the vLLM OpenAI-compatible server, without `/v1`.
    pub base_url: Option<String>,
    /// Model name sent upstream.
    pub model: Option<String>,
    /// The `--max-model-len` vLLM was started with, in tokens.
    pub max_model_len: Option<u32>,
    /// TCP connect timeout, ms.
    pub connect_timeout_ms: Option<u64>,
    /// Time from sending the request to the first token, ms.
    pub first_token_timeout_ms: Option<u64>,
    /// Longest gap between two tokens, ms.
    pub idle_timeout_ms: Option<u64>,
    /// Longest whole request, ms.
    pub total_timeout_ms: Option<u64>,
    /// `[upstream.abort]`.
    #[serde(default)]
    pub abort: RawAbort,
}

/// `[upstream.abort]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAbort {
    /// Whether to call the engine's abort endpoint when a client goes away.
    pub enabled: Option<bool>,
    /// URL template; `{base_url}` and `{id}` are substituted.
    pub url: Option<String>,
    /// HTTP method, e.g. `POST`.
    pub method: Option<String>,
    /// JSON body template; `{id}` is substituted (JSON-escaped).
    pub body: Option<String>,
}

/// `[classify]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClassify {
    /// Path to `tokenizer.json`, or the literal `heuristic`. Required.
    pub tokenizer: Option<String>,
    /// Largest estimated work (tokens) that is still `small`.
    pub small_max_work: Option<u32>,
    /// Largest estimated work (tokens) that is still `medium`.
    pub medium_max_work: Option<u32>,
    /// Output budget (tokens) assumed when the client sends no max tokens.
    pub default_output_tokens: Option<u32>,
    /// Chat template tokens per message (role header, separators).
    pub per_message_overhead: Option<u32>,
}

/// `[admission]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmission {
    /// `lanes` or `fifo`.
    pub policy: Option<String>,
    /// Global token budget in flight across all lanes (policy `lanes`).
    pub max_tokens_in_flight: Option<u64>,
    /// Seats in all under policy `lanes`.
    pub seats: Option<u32>,
    /// Send the lane as vLLM's `priority` (small 0, medium 1, large 2).
    pub engine_priority: Option<bool>,
    /// `[admission.fifo]`.
    #[serde(default)]
    pub fifo: RawFifo,
}

/// `[admission.fifo]`: the baseline policy.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFifo {
    /// Concurrent requests; 0 = unlimited.
    pub max_concurrency: Option<u32>,
    /// Waiters allowed in the one queue.
    pub queue_len: Option<u32>,
    /// Longest wait in the queue, ms.
    pub queue_timeout_ms: Option<u64>,
}

/// `[lanes]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLanes {
    /// `[lanes.small]`.
    #[serde(default)]
    pub small: RawLane,
    /// `[lanes.medium]`.
    #[serde(default)]
    pub medium: RawLane,
    /// `[lanes.large]`.
    #[serde(default)]
    pub large: RawLane,
}

/// `[lanes.<lane>]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLane {
    /// Concurrent requests in this lane (reserved share under `lanes`, cap under `strict`).
    pub max_concurrency: Option<u32>,
    /// Most concurrent requests including borrowed seats (`lanes`).
    pub ceiling: Option<u32>,
    /// Lend idle reserved seats to other lanes.
    pub lend: Option<bool>,
    /// Borrow idle seats beyond the reservation.
    pub borrow: Option<bool>,
    /// Tokens (input + output budget) reserved by this lane's requests in flight.
    pub max_tokens_in_flight: Option<u64>,
    /// Waiters allowed in this lane's queue.
    pub queue_len: Option<u32>,
    /// Longest wait in this lane's queue, ms.
    pub queue_timeout_ms: Option<u64>,
    /// Output tokens after which a request moves to the next lane (0: no limit).
    pub mid_stream_limit: Option<u32>,
}

/// `[promotion]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPromotion {
    /// `cut` or `wait`.
    pub when_full: Option<String>,
    /// With `wait`: how long a stream may pause for room, ms.
    pub wait_ms: Option<u64>,
    /// How long a session's output counts toward its next request's lane, ms.
    pub continuation_window_ms: Option<u64>,
}
