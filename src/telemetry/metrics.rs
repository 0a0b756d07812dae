//! Prometheus series of the gateway. Names are a public contract (dashboards, alerts); every
//! series is listed in `docs/operations.md`.
//!
//! - `tutor_gateway_lane_in_flight{lane}`, `tutor_gateway_lane_reserved_tokens{lane}`,
//!   `tutor_gateway_lane_queue_depth{lane}`: gauges read from admission at scrape time.
//! - `tutor_gateway_prefill_tokens_in_flight`: estimated prompt tokens between dispatch and
//!   first token (read from admission at scrape time); `tutor_gateway_prefill_wait_seconds{lane}`:
//!   how long long prompts waited for room in the prefill budget.
//! - `tutor_gateway_requests_total{lane,route,outcome}`: every request once, when it ends.
//!   `lane="none"` for requests rejected before classification (bad input).
//! - `tutor_gateway_cancelled_after_tokens{lane}`: output tokens relayed before the client went
//!   away (M21); `tutor_gateway_cancellations_total{lane,stage}`: where it went away.
//! - Latency histograms per lane (M1-M3): queue wait, time to first token (from arrival),
//!   prefill, engine queue, time per output token, decode tokens/s, output tokens.
//! - `tutor_gateway_prefix_cache_queries_total{lane}`, `tutor_gateway_prefix_cache_hits_total{lane}`:
//!   prompt tokens, and those vLLM served from its prefix cache (`cached_tokens`), M18.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use super::admission_rate::AdmissionRate;
use super::autopilot_metrics::AutopilotMetrics;
use super::estimate_metrics::EstimateMetrics;
use super::focus_metrics::FocusMetrics;
use super::job_metrics::JobMetrics;
use super::registered::{counter_vec, gauge_vec, registered};
use super::relay_metrics::RelayMetrics;
use super::snapshot::AdmissionSnapshot;
use super::ttft_window::TtftWindow;
use crate::lane::Lane;
use crate::telemetry::config_metrics::ConfigMetrics;
use crate::telemetry::latency::{LatencySplit, UpstreamView};
use crate::telemetry::prefix_metrics::PrefixMetrics;
use crate::telemetry::promotion_metrics::PromotionMetrics;
use crate::telemetry::quota_metrics::QuotaMetrics;
use crate::telemetry::replica_metrics::ReplicaMetrics;

/// Where a request was when its client went away (the `stage` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before admission: parsing, classifying or waiting for a lane slot.
    Queued,
    /// Admitted, no token yet: engine queue and prefill.
    Prefill,
    /// Tokens were flowing.
    Decode,
}

impl Stage {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Queued => "queued",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
        }
    }
}

/// Buckets for interactive latency, seconds: fine below a second, coarse up to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0,
    60.0, 120.0, 300.0,
];
/// Buckets for time per output token, seconds.
const TPOT_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];
/// Buckets for decode speed, tokens per second.
const TPS_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0,
];
/// Buckets for token counts.
const TOKEN_BUCKETS: &[f64] = &[
    0.0, 1.0, 8.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// Which API a request came through (the `route` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/answer` (SSE for the tutoring frontend).
    Answer,
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/completions`.
    Completions,
    /// A background job (`POST /jobs`).
    Job,
}

impl Route {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Route::Answer => "answer",
            Route::ChatCompletions => "chat_completions",
            Route::Completions => "completions",
            Route::Job => "job",
        }
    }
}

/// How a request ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Streamed to the end.
    Ok,
    /// The client went away first.
    Cancelled,
    /// Rejected: malformed or invalid input.
    BadRequest,
    /// Rejected: longer than the model's maximum length.
    TooLong,
    /// Rejected: the lane's queue was full (429), or the gateway's (bytes queued or being
    /// received, the job store).
    QueueFull,
    /// Refused by its tenant's own limits (429): its budget, its requests or bytes queued, its
    /// jobs, its job event streams. Not the lanes' capacity: outside the queue alert.
    TenantLimited,
    /// Waited the lane's queue timeout without a slot (503).
    QueueTimeout,
    /// Refused at once: its predicted wait already missed its `x-tutor-deadline-ms` (503).
    DeadlineUnmet,
    /// The shared quota (Redis) was unreachable under `fail_closed` (503).
    QuotaUnavailable,
    /// The engine could not be reached (503).
    UpstreamUnavailable,
    /// The engine stalled: first-token, idle or total timeout (504).
    UpstreamTimeout,
    /// The engine answered an error, or spoke garbage (502), or refused the gateway's own
    /// credentials (vLLM's 401/403).
    UpstreamError,
    /// The engine refused the request itself (vLLM's other 4xx: a model it does not serve, a
    /// parameter it does not take): the client's doing, not the engine's health.
    UpstreamRejected,
    /// A bug in the gateway (500).
    Internal,
    /// Cut at its lane's output limit: the next lane had no room (M14).
    Cut,
    /// A background job that gave its seat back to an interactive request (`jobs.preempt`):
    /// the engine's work was aborted; the job resumes as another request.
    Preempted,
}

impl Outcome {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Cancelled => "cancelled",
            Outcome::BadRequest => "bad_request",
            Outcome::TooLong => "too_long",
            Outcome::QueueFull => "queue_full",
            Outcome::TenantLimited => "tenant_limited",
            Outcome::QuotaUnavailable => "quota_unavailable",
            Outcome::QueueTimeout => "queue_timeout",
            Outcome::DeadlineUnmet => "deadline_unmet",
            Outcome::UpstreamUnavailable => "upstream_unavailable",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamRejected => "upstream_rejected",
            Outcome::Internal => "internal",
            Outcome::Cut => "cut",
            Outcome::Preempted => "preempted",
        }
    }

    /// Whether the request failed by the engine's or the gateway's fault (a 5xx: the engine
    /// unreachable, stalled or erring, the shared quota unreachable, a bug), not the client's
    /// input, its going away, or a refusal for capacity: its span's status is Error.
    pub const fn is_fault(self) -> bool {
        matches!(
            self,
            Outcome::QuotaUnavailable
                | Outcome::UpstreamUnavailable
                | Outcome::UpstreamTimeout
                | Outcome::UpstreamError
                | Outcome::Internal
        )
    }
}

/// A counter of the lines a log writer dropped, brought up to the writer's own total at each
/// scrape.
#[derive(Debug, Clone)]
struct DroppedLines {
    counter: prometheus::IntCounter,
    /// The dropped lines already counted.
    seen: Arc<std::sync::atomic::AtomicU64>,
}

impl DroppedLines {
    fn new(counter: prometheus::IntCounter) -> Self {
        Self {
            counter,
            seen: Arc::default(),
        }
    }

    /// The writer has dropped `total` lines so far: two scrapes at once each add only what the
    /// other has not.
    fn catch_up(&self, total: u64) {
        let counted = self
            .seen
            .fetch_max(total, std::sync::atomic::Ordering::AcqRel);
        if total > counted {
            self.counter.inc_by(total - counted);
        }
    }
}

/// A connection counted in `tutor_gateway_connections_open` until dropped.
#[derive(Debug)]
pub struct ConnectionOpen(IntGauge);

impl Drop for ConnectionOpen {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The gateway's metric families, registered once.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    lane_in_flight: IntGaugeVec,
    lane_reserved_tokens: IntGaugeVec,
    lane_queue_depth: IntGaugeVec,
    prefill_tokens_in_flight: IntGauge,
    requests_in_flight: IntGauge,
    connections_open: IntGaugeVec,
    prefill_wait: HistogramVec,
    requests: IntCounterVec,
    cancelled_after_tokens: HistogramVec,
    cancellations: IntCounterVec,
    queue_wait: HistogramVec,
    time_to_first_token: HistogramVec,
    prefill: HistogramVec,
    engine_queue: HistogramVec,
    time_per_output_token: HistogramVec,
    decode_tps: HistogramVec,
    output_tokens: HistogramVec,
    prefix_queries: IntCounterVec,
    prefix_hits: IntCounterVec,
    refused: IntCounterVec,
    denied: IntCounterVec,
    panics: IntCounterVec,
    key_file_refused: IntGauge,
    background: crate::telemetry::panic::Background,
    request_log_dropped: DroppedLines,
    log_dropped: DroppedLines,
    tenant_refused: IntCounterVec,
    quota: QuotaMetrics,
    promotion: PromotionMetrics,
    prefix: PrefixMetrics,
    relay: RelayMetrics,
    focus: FocusMetrics,
    estimate: EstimateMetrics,
    pieces: super::piece_metrics::PieceMetrics,
    ttft_window: Arc<TtftWindow>,
    step_window: Arc<super::step_window::StepWindow>,
    autopilot: AutopilotMetrics,
    admission_rate: Arc<AdmissionRate>,
    jobs: JobMetrics,
    config: ConfigMetrics,
    replicas: ReplicaMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family in a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| gauge_vec(&registry, name, help, &["lane"]);
        let lane_in_flight = gauge(
            "tutor_gateway_lane_in_flight",
            "Requests admitted and not yet finished, per lane.",
        );
        let lane_reserved_tokens = gauge(
            "tutor_gateway_lane_reserved_tokens",
            "Tokens reserved by admitted requests (input estimate + output budget), per lane.",
        );
        let lane_queue_depth = gauge(
            "tutor_gateway_lane_queue_depth",
            "Requests waiting for admission, per lane.",
        );
        let prefill_tokens_in_flight = IntGauge::new(
            "tutor_gateway_prefill_tokens_in_flight",
            "Estimated prompt tokens of admitted requests without a first token yet (the prefill budget's usage).",
        )
        .expect("valid gauge");
        registry
            .register(Box::new(prefill_tokens_in_flight.clone()))
            .expect("registered once");
        let requests_in_flight = IntGauge::new(
            "tutor_gateway_requests_in_flight",
            "Requests this replica is handling now, streams included until their last byte \
             (what server.max_requests_in_flight bounds): the gateway tier's own load.",
        )
        .expect("valid gauge");
        registry
            .register(Box::new(requests_in_flight.clone()))
            .expect("registered once");
        let connections_open = gauge_vec(
            &registry,
            "tutor_gateway_connections_open",
            "Client connections a listener holds open (listener is public or admin): what \
             server.max_connections bounds, each listener apart.",
            &["listener"],
        );
        for listener in ["public", "admin"] {
            connections_open.with_label_values(&[listener]);
        }
        let requests = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_requests_total",
                "Requests by lane, route and how they ended.",
            ),
            &["lane", "route", "outcome"],
        )
        .expect("valid counter");
        registry
            .register(Box::new(requests.clone()))
            .expect("registered once");
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            registered(&registry, HistogramVec::new(opts, &["lane"]))
        };
        let counter =
            |name: &str, help: &str, labels: &[&str]| counter_vec(&registry, name, help, labels);
        let cancelled_after_tokens = histogram(
            "tutor_gateway_cancelled_after_tokens",
            "Output tokens relayed before the client disconnected.",
            TOKEN_BUCKETS,
        );
        let cancellations = counter(
            "tutor_gateway_cancellations_total",
            "Clients that went away before their answer ended, by stage (queued, prefill, decode).",
            &["lane", "stage"],
        );
        let queue_wait = histogram(
            "tutor_gateway_queue_wait_seconds",
            "Time waiting in the gateway for a lane slot and token budget.",
            LATENCY_BUCKETS,
        );
        let prefill_wait = histogram(
            "tutor_gateway_prefill_wait_seconds",
            "Time long prompts waited for room in the prefill budget (part of the queue wait).",
            LATENCY_BUCKETS,
        );
        let time_to_first_token = histogram(
            "tutor_gateway_time_to_first_token_seconds",
            "Arrival at the gateway to the first token: what the student felt.",
            LATENCY_BUCKETS,
        );
        let prefill = histogram(
            "tutor_gateway_prefill_seconds",
            "Engine prefill (vLLM's TTFT minus its queue time when reported; else admission to first token).",
            LATENCY_BUCKETS,
        );
        let engine_queue = histogram(
            "tutor_gateway_engine_queue_seconds",
            "Time in vLLM's own queue, from vLLM's per-request metrics (when enabled).",
            LATENCY_BUCKETS,
        );
        let time_per_output_token = histogram(
            "tutor_gateway_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            TPOT_BUCKETS,
        );
        let decode_tps = histogram(
            "tutor_gateway_decode_tokens_per_second",
            "Decode speed per request: tokens after the first per second from first token to end.",
            TPS_BUCKETS,
        );
        let output_tokens = histogram(
            "tutor_gateway_output_tokens",
            "Output tokens per request that reached the engine.",
            TOKEN_BUCKETS,
        );
        let prefix_queries = counter(
            "tutor_gateway_prefix_cache_queries_total",
            "Prompt tokens of requests whose usage vLLM reported.",
            &["lane"],
        );
        let prefix_hits = counter(
            "tutor_gateway_prefix_cache_hits_total",
            "Prompt tokens vLLM served from its prefix cache (usage cached_tokens).",
            &["lane"],
        );
        let refused = counter(
            "tutor_gateway_refused_total",
            "Connections and requests refused before reaching a lane: limit is connections (server.max_connections), requests_in_flight (server.max_requests_in_flight), probes (the 16 places of /healthz, /health, /ping and /metrics), receiving_bytes (server.max_receiving_bytes) or stream_resets (an HTTP/2 connection closed for resetting more than 100 requests in a burst).",
            &["limit"],
        );
        for limit in [
            "connections",
            "requests_in_flight",
            "probes",
            "receiving_bytes",
            "stream_resets",
        ] {
            refused.with_label_values(&[limit]);
        }
        let request_log_dropped = DroppedLines::new(registered(
            &registry,
            prometheus::IntCounter::new(
                "tutor_gateway_request_log_dropped_total",
                "Request log lines dropped because the writer fell behind (stdout not read fast enough: 16,384 lines waited).",
            ),
        ));
        let log_dropped = DroppedLines::new(registered(
            &registry,
            prometheus::IntCounter::new(
                "tutor_gateway_log_dropped_total",
                "Diagnostic log lines dropped because stderr was not read fast enough (16,384 lines waited).",
            ),
        ));
        let denied = counter(
            "tutor_gateway_denied_total",
            "Requests denied before any route, by reason: auth (no valid API key or token, or not the admin listener's token: 401), host (a Host not in server.allowed_hosts: 403), origin (a browser Origin not in server.cors_allow_origins: 403), body (a Content-Length above server.max_body_bytes: 413, or a Content-Encoding: 415, before the body is read).",
            &["reason"],
        );
        for reason in ["auth", "host", "origin", "body"] {
            denied.with_label_values(&[reason]);
        }
        let panics = counter(
            "tutor_gateway_panics_total",
            "Panics inside the gateway while serving a request (a bug: each is reported on stderr with its place), by where: handler (before the response began: the client got a 500 internal), relay (mid-stream: the stream ended with an internal error event; either way its seat, tokens and engine work were given back), background (a long-lived task: the Redis quota's heartbeat, releaser or listeners, the job scheduler, the autopilot...; /healthz and /readyz answer 503 from then on so that the replica is restarted).",
            &["at"],
        );
        for at in ["handler", "relay", "background"] {
            panics.with_label_values(&[at]);
        }
        let key_file_refused = IntGauge::new(
            "tutor_gateway_key_file_refused",
            "1 while the last look at auth.keys_file found it invalid or unreadable, or with no \
             key left, so the keys in force stay the earlier ones: a key removed from it (a \
             revocation) still works until the file is mended; 0 once a file is put in force.",
        )
        .expect("valid gauge");
        registry
            .register(Box::new(key_file_refused.clone()))
            .expect("registered once");
        let tenant_refused = counter(
            "tutor_gateway_tenant_refused_total",
            "Requests refused by their tenant's budget ([auth.tenants.<name>]), by tenant (only \
             tenants with a budget) and limit: requests_per_minute, tokens_per_minute, \
             tokens_per_day.",
            &["tenant", "limit"],
        );
        let background = crate::telemetry::panic::Background::new(panics.clone());
        let quota = QuotaMetrics::register(&registry, background.clone());
        let promotion = PromotionMetrics::register(&registry);
        let relay = RelayMetrics::register(&registry);
        let focus = FocusMetrics::register(&registry);
        let estimate = EstimateMetrics::register(&registry);
        let pieces = super::piece_metrics::PieceMetrics::register(&registry);
        let autopilot = AutopilotMetrics::register(&registry);
        let admission_rate = Arc::new(AdmissionRate::register(&registry));
        let jobs = JobMetrics::register(&registry);
        let prefix = PrefixMetrics::register(&registry);
        let config = ConfigMetrics::register(&registry);
        let replicas = ReplicaMetrics::register_watched(&registry, background.clone());
        // These lane series exist from the start, so dashboards and rate() see zeros, not gaps
        // (requests_total's appear with the first request of each label set).
        for lane in Lane::ALL {
            let l = [lane.as_str()];
            for h in [
                &cancelled_after_tokens,
                &queue_wait,
                &prefill_wait,
                &time_to_first_token,
                &prefill,
                &engine_queue,
                &time_per_output_token,
                &decode_tps,
                &output_tokens,
            ] {
                h.with_label_values(&l);
            }
            prefix_queries.with_label_values(&l);
            prefix_hits.with_label_values(&l);
            for stage in [Stage::Queued, Stage::Prefill, Stage::Decode] {
                cancellations.with_label_values(&[lane.as_str(), stage.as_str()]);
            }
        }
        Self {
            registry,
            lane_in_flight,
            lane_reserved_tokens,
            lane_queue_depth,
            prefill_tokens_in_flight,
            requests_in_flight,
            connections_open,
            prefill_wait,
            requests,
            cancelled_after_tokens,
            cancellations,
            queue_wait,
            time_to_first_token,
            prefill,
            engine_queue,
            time_per_output_token,
            decode_tps,
            output_tokens,
            prefix_queries,
            prefix_hits,
            quota,
            promotion,
            relay,
            focus,
            estimate,
            pieces,
            ttft_window: Arc::default(),
            step_window: Arc::default(),
            autopilot,
            admission_rate,
            jobs,
            prefix,
            refused,
            denied,
            panics,
            key_file_refused,
            background,
            request_log_dropped,
            log_dropped,
            tenant_refused,
            config,
            replicas,
        }
    }

    /// The configuration reload families.
    pub fn config(&self) -> &ConfigMetrics {
        &self.config
    }

    /// The `tutor_gateway_replica_*` families.
    pub fn replicas(&self) -> &ReplicaMetrics {
        &self.replicas
    }

    /// A reload ended with `outcome` (`applied`: `sha256` is in force).
    pub fn config_reloaded(&self, outcome: &str, sha256: &str) {
        self.config.reloaded(outcome, sha256);
    }

    /// The per-fingerprint prefix-cache families and drift detection.
    pub fn prefix(&self) -> &PrefixMetrics {
        &self.prefix
    }

    /// The shared quota backend's families (`tutor_gateway_quota_*`).
    pub fn quota(&self) -> &QuotaMetrics {
        &self.quota
    }

    /// The gauge of requests being handled (`server.max_requests_in_flight`'s permits taken).
    pub fn requests_in_flight(&self) -> &IntGauge {
        &self.requests_in_flight
    }

    /// Counts a connection open on `listener` (`public`, `admin`) until the guard is dropped.
    pub fn connection_open(&self, listener: &'static str) -> ConnectionOpen {
        let gauge = self.connections_open.with_label_values(&[listener]);
        gauge.inc();
        ConnectionOpen(gauge)
    }

    /// Counts a connection or request refused at `limit` (`connections`, `requests_in_flight`).
    pub fn refused(&self, limit: &str) {
        self.refused.with_label_values(&[limit]).inc();
    }

    /// Counts a request denied before any route for `reason` (`auth`, `host`, `origin`).
    pub fn denied(&self, reason: &str) {
        self.denied.with_label_values(&[reason]).inc();
    }

    /// Counts a panic while serving a request, `at` the `handler` or the `relay`.
    pub fn panicked(&self, at: &str) {
        self.panics.with_label_values(&[at]).inc();
    }

    /// The watch over this gateway's background tasks.
    pub fn background(&self) -> &crate::telemetry::panic::Background {
        &self.background
    }

    /// `tutor_gateway_key_file_refused`, which the key file's watcher sets.
    pub fn key_file_refused(&self) -> IntGauge {
        self.key_file_refused.clone()
    }

    /// Requests denied so far for `reason`.
    pub fn denied_count(&self, reason: &str) -> u64 {
        self.denied.with_label_values(&[reason]).get()
    }

    /// Connections and requests refused so far by `limit`.
    pub fn refused_count(&self, limit: &str) -> u64 {
        self.refused.with_label_values(&[limit]).get()
    }

    /// Counts a request of `tenant` refused by its budget `limit`.
    pub fn tenant_refused(&self, tenant: &str, limit: &str) {
        self.tenant_refused
            .with_label_values(&[tenant, limit])
            .inc();
    }

    /// The promotion families.
    pub fn promotion(&self) -> &PromotionMetrics {
        &self.promotion
    }

    /// The lanes' recent admissions (wait predictions) and the prediction's error.
    pub fn admission_rate(&self) -> &AdmissionRate {
        &self.admission_rate
    }

    /// The autopilot's families.
    pub fn autopilot(&self) -> &AutopilotMetrics {
        &self.autopilot
    }

    /// The lanes' recent times to first token (the autopilot's input).
    pub fn ttft_window(&self) -> &TtftWindow {
        &self.ttft_window
    }

    /// The engine's steps as streams saw them (the autopilot's piecing input).
    pub fn step_window(&self) -> &super::step_window::StepWindow {
        &self.step_window
    }

    /// Long prompts prefilled in pieces.
    pub fn pieces(&self) -> &super::piece_metrics::PieceMetrics {
        &self.pieces
    }

    /// The input estimate against the engine's count (M12).
    pub fn estimate(&self) -> &EstimateMetrics {
        &self.estimate
    }

    /// The focusing families (M11).
    pub fn focus(&self) -> &FocusMetrics {
        &self.focus
    }

    /// The relay latency family.
    pub fn relay(&self) -> &RelayMetrics {
        &self.relay
    }

    /// The background jobs' families.
    pub fn jobs(&self) -> &JobMetrics {
        &self.jobs
    }

    /// Records a client that went away at `stage` after `tokens` output tokens.
    pub fn cancelled(&self, lane: Option<Lane>, stage: Stage, tokens: u32) {
        let l = lane.map_or("none", Lane::as_str);
        self.cancellations
            .with_label_values(&[l, stage.as_str()])
            .inc();
        if stage != Stage::Queued {
            self.cancelled_after_tokens
                .with_label_values(&[l])
                .observe(f64::from(tokens));
        }
    }

    /// Records how long a long prompt of `lane` waited for room in the prefill budget.
    pub fn prefill_waited(&self, lane: Lane, wait: Duration) {
        self.prefill_wait
            .with_label_values(&[lane.as_str()])
            .observe(wait.as_secs_f64());
    }

    /// Records the latency split and token counts of a finished request.
    ///
    /// What happened before the first token (the waits, the first token, the prefill, the
    /// prompt's prefix-cache hits) is filed under `first`, the lane the request was admitted to;
    /// the decode and the output under `last`, its lane at the end (a mid-stream promotion moves
    /// a request, not the first token it already had in its first lane).
    pub fn observe(
        &self,
        first: Lane,
        last: Lane,
        split: &LatencySplit,
        up: Option<&UpstreamView>,
    ) {
        let (f, l) = ([first.as_str()], [last.as_str()]);
        let secs = |ms: f64| ms / 1000.0;
        if let Some(v) = split.queue_wait_ms {
            self.queue_wait.with_label_values(&f).observe(secs(v));
        }
        if let Some(v) = split.time_to_first_token_ms {
            self.time_to_first_token
                .with_label_values(&f)
                .observe(secs(v));
            let waited = split.queue_wait_ms.map_or(0.0, secs);
            // How long ago the first token came (the request ends now).
            let ago = up.and_then(|u| u.first_content_at).map_or_else(
                || {
                    std::time::Duration::try_from_secs_f64(secs(split.total_ms - v))
                        .unwrap_or_default()
                },
                |at| at.elapsed(),
            );
            self.ttft_window.observe(first, secs(v), waited, ago);
        }
        if let Some(v) = split.prefill_ms {
            self.prefill.with_label_values(&f).observe(secs(v));
        }
        if let Some(v) = split.engine_queue_ms {
            self.engine_queue.with_label_values(&f).observe(secs(v));
        }
        if let Some(v) = split.time_per_output_token_ms {
            self.time_per_output_token
                .with_label_values(&l)
                .observe(secs(v));
        }
        if let Some(v) = split.decode_tps {
            self.decode_tps.with_label_values(&l).observe(v);
        }
        if let Some(up) = up {
            self.output_tokens
                .with_label_values(&l)
                .observe(f64::from(up.output_tokens));
            // Only the final usage says what was cached: a stream cut before it (a client gone,
            // a cut, a timeout) would count its whole prompt as a miss.
            if let Some(u) = up.usage.filter(|u| u.reported) {
                self.prefix_queries
                    .with_label_values(&f)
                    .inc_by(u64::from(u.prompt_tokens));
                self.prefix_hits
                    .with_label_values(&f)
                    .inc_by(u64::from(u.cached_tokens.unwrap_or(0)));
            }
        }
    }

    /// Counts one finished request.
    pub fn request_done(&self, lane: Option<Lane>, route: Route, outcome: Outcome) {
        let lane = lane.map_or("none", Lane::as_str);
        self.requests
            .with_label_values(&[lane, route.as_str(), outcome.as_str()])
            .inc();
    }

    /// Requests counted with these labels so far (for tests and the soak check).
    pub fn requests_count(&self, lane: Option<Lane>, route: Route, outcome: Outcome) -> u64 {
        let lane = lane.map_or("none", Lane::as_str);
        self.requests
            .with_label_values(&[lane, route.as_str(), outcome.as_str()])
            .get()
    }

    /// The diagnostic log's dropped lines, `total` of them so far.
    pub fn log_dropped(&self, total: u64) {
        self.log_dropped.catch_up(total);
    }

    /// The request log's dropped lines, `total` of them so far.
    pub fn request_log_dropped(&self, total: u64) {
        self.request_log_dropped.catch_up(total);
    }

    /// The text exposition, with lane gauges taken from `admission` now.
    pub fn render(&self, admission: &AdmissionSnapshot) -> String {
        for lane in Lane::ALL {
            let s = admission.lane(lane);
            let l = [lane.as_str()];
            self.lane_in_flight
                .with_label_values(&l)
                .set(i64::from(s.in_flight));
            self.lane_reserved_tokens
                .with_label_values(&l)
                .set(s.reserved_tokens as i64);
            self.lane_queue_depth
                .with_label_values(&l)
                .set(i64::from(s.queue_depth));
        }
        self.prefill_tokens_in_flight
            .set(i64::try_from(admission.prefill_tokens).unwrap_or(i64::MAX));
        let mut out = Vec::with_capacity(8 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}
