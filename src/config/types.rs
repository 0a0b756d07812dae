//! Stage two: the validated, typed configuration the rest of the gateway reads.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;
use std::time::Duration;

use crate::classify::Lane;

/// The validated configuration. Build it with [`Config::from_toml_str`], [`Config::load`] or
/// [`Config::default`] (which equals the shipped `config/config.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Address the HTTP server binds.
    pub listen: SocketAddr,
    /// The vLLM server behind the gateway.
    pub upstream: UpstreamConfig,
    /// How requests are sized and sorted into lanes.
    pub classify: ClassifyConfig,
    /// Which admission policy runs and its global limits.
    pub admission: AdmissionConfig,
    /// Per-lane limits (used by policy `lanes`).
    pub lanes: LanesConfig,
    /// `[server]`.
    pub server: ServerConfig,
    /// `[promotion]`.
    pub promotion: PromotionConfig,
    /// `[telemetry]`.
    pub telemetry: TelemetryConfig,
    /// `[quota]`.
    pub quota: super::quota::QuotaConfig,
    /// `[prefix_cache]`.
    pub prefix_cache: super::prefix::PrefixCacheConfig,
    /// `[courses.<id>]`: each course's stable prefix, by id.
    pub courses: std::collections::BTreeMap<String, crate::prompt::Course>,
}

/// What happens when a request must move to a fuller lane mid-stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// End the stream with the cut message and abort the engine's work.
    Cut,
    /// Pause the stream for up to `wait` for room, then cut.
    Wait,
}

/// Mid-stream promotion and continuation tracking (M14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromotionConfig {
    /// Policy when the next lane has no room.
    pub when_full: WhenFull,
    /// With [`WhenFull::Wait`]: longest pause.
    pub wait: Duration,
    /// How long a session's output counts toward its next request's lane.
    pub continuation_window: Duration,
}

/// Where the request log goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestLogSink {
    /// One JSON line per finished request on stdout.
    Stdout,
    /// No request log.
    Off,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318).
    HttpProtobuf,
}

/// Request log and tracing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// Request log sink.
    pub request_log: RequestLogSink,
    /// Export spans over OTLP (also turned on by `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub tracing: bool,
    /// OTLP endpoint, if set in the file.
    pub otlp_endpoint: Option<String>,
    /// OTLP transport, if set in the file.
    pub otlp_protocol: Option<OtlpProtocol>,
    /// `service.name`, if set in the file.
    pub service_name: Option<String>,
}

/// The gateway's own HTTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// On SIGTERM, how long in-flight streams may finish.
    pub shutdown_grace: Duration,
}

/// `[upstream]`: where vLLM is and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Base URL without a trailing slash and without `/v1`, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    /// Model name sent in every upstream request.
    pub model: String,
    /// vLLM's `--max-model-len`, in tokens: requests estimated above it are rejected before
    /// admission.
    pub max_model_len: NonZeroU32,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait from sending the request to the first token (covers engine queue + prefill).
    pub first_token_timeout: Duration,
    /// Longest gap between two streamed tokens.
    pub idle_timeout: Duration,
    /// Longest whole upstream request.
    pub total_timeout: Duration,
    /// The engine-side abort call made when a client goes away.
    pub abort: AbortConfig,
}

/// `[upstream.abort]`: how to stop generation in the engine (M21).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortConfig {
    /// When false the gateway only drops the upstream connection.
    pub enabled: bool,
    /// URL template with `{base_url}` and `{id}` placeholders.
    pub url_template: String,
    /// HTTP method of the abort call.
    pub method: AbortMethod,
    /// JSON body template with `{id}` placeholders; empty for no body.
    pub body_template: String,
}

impl AbortConfig {
    /// The abort URL for request `id` against `base_url`.
    pub fn url(&self, base_url: &str, id: &str) -> String {
        self.url_template
            .replace("{base_url}", base_url)
            .replace("{id}", id)
    }

    /// The abort body for request `id`; the id is JSON-escaped so the body stays valid JSON.
    pub fn body(&self, id: &str) -> String {
        let quoted = serde_json::Value::String(id.to_owned()).to_string();
        self.body_template
            .replace("{id}", &quoted[1..quoted.len() - 1])
    }
}

/// HTTP method for the abort call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortMethod {
    /// `POST` (vLLM's `/abort_requests`).
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
    /// `GET`.
    Get,
}

impl AbortMethod {
    /// The method name as sent on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            AbortMethod::Post => "POST",
            AbortMethod::Put => "PUT",
            AbortMethod::Delete => "DELETE",
            AbortMethod::Get => "GET",
        }
    }
}

/// `[classify]`: token estimate and lane thresholds (M12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassifyConfig {
    /// Where token counts come from.
    pub tokenizer: TokenizerSource,
    /// Estimated work (input + output tokens) up to which a request is `small`.
    pub small_max_work: NonZeroU32,
    /// Estimated work up to which a request is `medium`; above it, `large`.
    pub medium_max_work: NonZeroU32,
    /// Output tokens assumed (and reserved) when the client sends no max tokens.
    pub default_output_tokens: NonZeroU32,
    /// Tokens the chat template adds per message (role header and separators).
    pub per_message_overhead: u32,
}

/// Where token counts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The documented heuristic of `tutor_wire::tokens` (chosen explicitly with `"heuristic"`).
    Heuristic,
    /// A HuggingFace `tokenizer.json`, ideally the one vLLM serves with.
    File(PathBuf),
}

/// Which admission policy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Work-conserving lanes (the product): each lane's `max_concurrency` is a reserved share,
    /// idle seats are lent and borrowed up to each lane's `ceiling` within `admission.seats`;
    /// token budgets per lane and global.
    Lanes,
    /// The seed's literal caps: `max_concurrency` is a hard cap, nothing is lent or borrowed.
    Strict,
    /// One queue, one concurrency limit or none (the baseline experiments compare against).
    Fifo,
}

/// `[admission]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// The policy in force.
    pub policy: Policy,
    /// Tokens reserved across all lanes at once (policy `lanes`); size it from KV capacity (M10).
    pub max_tokens_in_flight: NonZeroU64,
    /// Seats in all (policy `lanes`): lanes borrow only while fewer are taken. Match the
    /// engine's `--max-num-seqs`.
    pub seats: NonZeroU32,
    /// Send the lane as vLLM's `priority` (small 0, medium 1, large 2; vLLM needs
    /// `--scheduling-policy priority`).
    pub engine_priority: bool,
    /// Settings of the `fifo` policy.
    pub fifo: FifoConfig,
}

/// `[admission.fifo]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FifoConfig {
    /// Concurrent requests; `None` = unlimited (the queue is then never used).
    pub max_concurrency: Option<NonZeroU32>,
    /// The one wait queue.
    pub queue: QueueConfig,
}

/// A bounded wait queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Waiters allowed; a request arriving at a full queue gets 429. 0 = never wait.
    pub len: u32,
    /// Longest wait before giving up with a timeout error.
    pub timeout: Duration,
}

/// `[lanes]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanesConfig {
    /// `[lanes.small]`.
    pub small: LaneConfig,
    /// `[lanes.medium]`.
    pub medium: LaneConfig,
    /// `[lanes.large]`.
    pub large: LaneConfig,
}

impl LanesConfig {
    /// The settings of `lane`.
    pub fn get(&self, lane: Lane) -> &LaneConfig {
        match lane {
            Lane::Small => &self.small,
            Lane::Medium => &self.medium,
            Lane::Large => &self.large,
        }
    }
}

/// `[lanes.<lane>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneConfig {
    /// Output tokens after which a request moves to the next lane; `None`: no limit.
    pub mid_stream_limit: Option<NonZeroU32>,
    /// Seats reserved to this lane (policy `lanes`), or its hard cap (policy `strict`).
    pub max_concurrency: NonZeroU32,
    /// Most seats this lane may hold, borrowed ones included (policy `lanes`).
    pub ceiling: NonZeroU32,
    /// Whether other lanes may borrow this lane's idle reserved seats.
    pub lend: bool,
    /// Whether this lane may borrow idle seats beyond its reservation.
    pub borrow: bool,
    /// Tokens (input + output budget) this lane's requests may hold in flight at once.
    pub max_tokens_in_flight: NonZeroU64,
    /// This lane's wait queue.
    pub queue: QueueConfig,
}
