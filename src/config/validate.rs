//! Stage two: [`RawConfig`] -> [`Config`]. Applies defaults, checks every key and every
//! cross-key rule, and reports all problems at once with their dotted paths.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;
use std::time::Duration;

use super::defaults as d;
use super::error::{ConfigError, ConfigIssue};
use super::quota::QuotaBackend;
use super::raw::{
    RawAbort, RawAdmission, RawClassify, RawConfig, RawLane, RawPromotion, RawServer, RawTelemetry,
    RawUpstream,
};
use super::types::*;
use crate::classify::Lane;

/// Turns the raw file into a typed [`Config`], or lists every problem found.
pub fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let mut c = Checker::default();
    let listen = match raw
        .listen
        .as_deref()
        .unwrap_or(d::LISTEN)
        .parse::<SocketAddr>()
    {
        Ok(addr) => addr,
        Err(_) => {
            c.fail("listen", "must be a socket address like 127.0.0.1:8080");
            SocketAddr::from(([127, 0, 0, 1], 8080))
        }
    };
    let upstream = upstream(&mut c, raw.upstream);
    let classify = classify(&mut c, raw.classify);
    let admission = admission(&mut c, raw.admission);
    let lanes = LanesConfig {
        small: lane(&mut c, Lane::Small, raw.lanes.small),
        medium: lane(&mut c, Lane::Medium, raw.lanes.medium),
        large: lane(&mut c, Lane::Large, raw.lanes.large),
    };
    let server = server(&mut c, raw.server);
    let telemetry = telemetry(&mut c, raw.telemetry);
    let promotion = promotion(&mut c, raw.promotion);
    let quota = super::quota::validate(&mut c, raw.quota);
    let prefix_cache = super::prefix::prefix_cache(&mut c, raw.prefix_cache);
    let courses = super::prefix::courses(&mut c, raw.courses);
    let config = Config {
        listen,
        upstream,
        classify,
        admission,
        lanes,
        server,
        promotion,
        telemetry,
        quota,
        prefix_cache,
        courses,
    };
    cross_checks(&mut c, &config);
    if c.issues.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(c.issues))
    }
}

fn telemetry(c: &mut Checker, raw: RawTelemetry) -> TelemetryConfig {
    let request_log = match raw.request_log.as_deref().unwrap_or("stdout") {
        "stdout" => RequestLogSink::Stdout,
        "off" => RequestLogSink::Off,
        _ => {
            c.fail("telemetry.request_log", "must be \"stdout\" or \"off\"");
            RequestLogSink::Off
        }
    };
    let otlp_protocol = match raw.otlp_protocol.as_deref().unwrap_or("") {
        "" => None,
        "grpc" => Some(OtlpProtocol::Grpc),
        "http/protobuf" | "http" => Some(OtlpProtocol::HttpProtobuf),
        _ => {
            c.fail(
                "telemetry.otlp_protocol",
                "must be \"grpc\" or \"http/protobuf\"",
            );
            None
        }
    };
    let endpoint = raw.otlp_endpoint.filter(|e| !e.is_empty());
    if let Some(e) = &endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            c.fail(
                "telemetry.otlp_endpoint",
                "must start with http:// or https://",
            );
        }
    }
    TelemetryConfig {
        request_log,
        tracing: raw.tracing.unwrap_or(false),
        otlp_endpoint: endpoint,
        otlp_protocol,
        service_name: raw.service_name.filter(|s| !s.is_empty()),
    }
}

fn promotion(c: &mut Checker, raw: RawPromotion) -> PromotionConfig {
    let when_full = match raw.when_full.as_deref().unwrap_or(d::PROMOTION_WHEN_FULL) {
        "cut" => WhenFull::Cut,
        "wait" => WhenFull::Wait,
        _ => {
            c.fail("promotion.when_full", "must be \"cut\" or \"wait\"");
            WhenFull::Cut
        }
    };
    PromotionConfig {
        when_full,
        wait: Duration::from_millis(raw.wait_ms.unwrap_or(d::PROMOTION_WAIT_MS)),
        continuation_window: Duration::from_millis(
            raw.continuation_window_ms
                .unwrap_or(d::CONTINUATION_WINDOW_MS),
        ),
    }
}

fn server(c: &mut Checker, raw: RawServer) -> ServerConfig {
    let max_body_bytes = raw.max_body_bytes.unwrap_or(d::MAX_BODY_BYTES);
    if !(1024..=256 * 1024 * 1024).contains(&max_body_bytes) {
        c.fail(
            "server.max_body_bytes",
            "must be between 1024 and 268435456",
        );
    }
    ServerConfig {
        max_body_bytes: max_body_bytes.clamp(1024, 256 * 1024 * 1024) as usize,
        shutdown_grace: Duration::from_millis(
            raw.shutdown_grace_ms.unwrap_or(d::SHUTDOWN_GRACE_MS),
        ),
    }
}

fn upstream(c: &mut Checker, raw: RawUpstream) -> UpstreamConfig {
    let base_url = raw.base_url.unwrap_or_else(|| d::BASE_URL.to_owned());
    let host = base_url
        .strip_prefix("http://")
        .or_else(|| base_url.strip_prefix("https://"));
    if host.is_none_or(|h| h.trim_end_matches('/').is_empty()) {
        c.fail(
            "upstream.base_url",
            "must be an http:// or https:// URL with a host",
        );
    }
    let model = raw.model.unwrap_or_else(|| d::MODEL.to_owned());
    if model.trim().is_empty() {
        c.fail("upstream.model", "must not be empty");
    }
    let connect = c.ms(
        "upstream.connect_timeout_ms",
        raw.connect_timeout_ms,
        d::CONNECT_TIMEOUT_MS,
    );
    let first = c.ms(
        "upstream.first_token_timeout_ms",
        raw.first_token_timeout_ms,
        d::FIRST_TOKEN_TIMEOUT_MS,
    );
    let idle = c.ms(
        "upstream.idle_timeout_ms",
        raw.idle_timeout_ms,
        d::IDLE_TIMEOUT_MS,
    );
    let total = c.ms(
        "upstream.total_timeout_ms",
        raw.total_timeout_ms,
        d::TOTAL_TIMEOUT_MS,
    );
    for (path, value) in [
        ("upstream.first_token_timeout_ms", first),
        ("upstream.idle_timeout_ms", idle),
    ] {
        if value > total {
            c.fail(path, "must be <= upstream.total_timeout_ms");
        }
    }
    UpstreamConfig {
        base_url: base_url.trim_end_matches('/').to_owned(),
        model,
        max_model_len: c.u32(
            "upstream.max_model_len",
            raw.max_model_len,
            d::MAX_MODEL_LEN,
        ),
        connect_timeout: connect,
        first_token_timeout: first,
        idle_timeout: idle,
        total_timeout: total,
        abort: abort(c, raw.abort),
    }
}

fn abort(c: &mut Checker, raw: RawAbort) -> AbortConfig {
    let method = match raw.method.as_deref().unwrap_or(d::ABORT_METHOD) {
        "POST" => AbortMethod::Post,
        "PUT" => AbortMethod::Put,
        "DELETE" => AbortMethod::Delete,
        "GET" => AbortMethod::Get,
        _ => {
            c.fail(
                "upstream.abort.method",
                "must be one of POST, PUT, DELETE, GET",
            );
            AbortMethod::Post
        }
    };
    let config = AbortConfig {
        enabled: raw.enabled.unwrap_or(d::ABORT_ENABLED),
        url_template: raw.url.unwrap_or_else(|| d::ABORT_URL.to_owned()),
        method,
        body_template: raw.body.unwrap_or_else(|| d::ABORT_BODY.to_owned()),
    };
    if !config.url_template.starts_with("{base_url}")
        && !config.url_template.starts_with("http://")
        && !config.url_template.starts_with("https://")
    {
        c.fail(
            "upstream.abort.url",
            "must start with {base_url}, http:// or https://",
        );
    }
    if !config.body_template.is_empty()
        && serde_json::from_str::<serde_json::Value>(&config.body("id")).is_err()
    {
        c.fail(
            "upstream.abort.body",
            "must be JSON once {id} is substituted (or empty for no body)",
        );
    }
    if config.enabled
        && !config.url_template.contains("{id}")
        && !config.body_template.contains("{id}")
    {
        c.fail(
            "upstream.abort",
            "url or body must contain {id}, or the engine cannot tell which request to abort",
        );
    }
    config
}

fn classify(c: &mut Checker, raw: RawClassify) -> ClassifyConfig {
    let tokenizer = match raw.tokenizer.as_deref() {
        None => {
            c.fail(
                "classify.tokenizer",
                "is required: a path to tokenizer.json, or \"heuristic\"",
            );
            TokenizerSource::Heuristic
        }
        Some("heuristic") => TokenizerSource::Heuristic,
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.is_file() {
                c.fail("classify.tokenizer", "names a file that does not exist");
            }
            TokenizerSource::File(path)
        }
    };
    ClassifyConfig {
        tokenizer,
        small_max_work: c.u32(
            "classify.small_max_work",
            raw.small_max_work,
            d::SMALL_MAX_WORK,
        ),
        medium_max_work: c.u32(
            "classify.medium_max_work",
            raw.medium_max_work,
            d::MEDIUM_MAX_WORK,
        ),
        default_output_tokens: c.u32(
            "classify.default_output_tokens",
            raw.default_output_tokens,
            d::DEFAULT_OUTPUT_TOKENS,
        ),
        per_message_overhead: raw.per_message_overhead.unwrap_or(d::PER_MESSAGE_OVERHEAD),
    }
}

fn admission(c: &mut Checker, raw: RawAdmission) -> AdmissionConfig {
    let policy = match raw.policy.as_deref().unwrap_or(d::POLICY) {
        "lanes" => Policy::Lanes,
        "strict" => Policy::Strict,
        "fifo" => Policy::Fifo,
        _ => {
            c.fail(
                "admission.policy",
                "must be \"lanes\", \"strict\" or \"fifo\"",
            );
            Policy::Lanes
        }
    };
    let fifo = &raw.fifo;
    let max_concurrency = NonZeroU32::new(fifo.max_concurrency.unwrap_or(d::FIFO_MAX_CONCURRENCY));
    AdmissionConfig {
        policy,
        engine_priority: raw.engine_priority.unwrap_or(false),
        seats: c.u32("admission.seats", raw.seats, d::SEATS),
        max_tokens_in_flight: c.u64(
            "admission.max_tokens_in_flight",
            raw.max_tokens_in_flight,
            d::GLOBAL_MAX_TOKENS_IN_FLIGHT,
        ),
        fifo: FifoConfig {
            max_concurrency,
            queue: c.queue(
                "admission.fifo",
                fifo.queue_len.unwrap_or(d::FIFO_QUEUE_LEN),
                fifo.queue_timeout_ms.unwrap_or(d::FIFO_QUEUE_TIMEOUT_MS),
            ),
        },
    }
}

fn lane(c: &mut Checker, lane: Lane, raw: RawLane) -> LaneConfig {
    let def = d::lane(lane);
    let path = format!("lanes.{lane}");
    LaneConfig {
        mid_stream_limit: NonZeroU32::new(raw.mid_stream_limit.unwrap_or(def.mid_stream_limit)),
        ceiling: c.u32(&format!("{path}.ceiling"), raw.ceiling, def.ceiling),
        lend: raw.lend.unwrap_or(def.lend),
        borrow: raw.borrow.unwrap_or(def.borrow),
        max_concurrency: c.u32(
            &format!("{path}.max_concurrency"),
            raw.max_concurrency,
            def.max_concurrency,
        ),
        max_tokens_in_flight: c.u64(
            &format!("{path}.max_tokens_in_flight"),
            raw.max_tokens_in_flight,
            def.max_tokens_in_flight,
        ),
        queue: c.queue(
            &path,
            raw.queue_len.unwrap_or(def.queue_len),
            raw.queue_timeout_ms.unwrap_or(def.queue_timeout_ms),
        ),
    }
}

/// Rules that involve more than one key. A request that passes classification must always be
/// admittable, so every budget must hold the largest request that can reach it.
fn cross_checks(c: &mut Checker, config: &Config) {
    let small = config.classify.small_max_work.get();
    let medium = config.classify.medium_max_work.get();
    let max_len = config.upstream.max_model_len.get();
    if small >= medium {
        c.fail(
            "classify.small_max_work",
            "must be < classify.medium_max_work",
        );
    }
    if config.classify.default_output_tokens.get() >= max_len {
        c.fail(
            "classify.default_output_tokens",
            "must be < upstream.max_model_len",
        );
    }
    let largest = [
        (Lane::Small, small.min(max_len), "classify.small_max_work"),
        (
            Lane::Medium,
            medium.min(max_len),
            "classify.medium_max_work",
        ),
        (Lane::Large, max_len, "upstream.max_model_len"),
    ];
    for (lane, need, why) in largest {
        if config.lanes.get(lane).max_tokens_in_flight.get() < u64::from(need) {
            c.fail(
                format!("lanes.{lane}.max_tokens_in_flight"),
                format!("must be >= {why} ({need}), or the lane's largest request never fits"),
            );
        }
    }
    if config.quota.backend == QuotaBackend::Redis && config.admission.policy == Policy::Fifo {
        c.fail(
            "quota.backend",
            "\"redis\" requires admission.policy = \"lanes\" or \"strict\"",
        );
    }
    for lane in Lane::ALL {
        let l = config.lanes.get(lane);
        if l.ceiling < l.max_concurrency {
            c.fail(
                format!("lanes.{lane}.ceiling"),
                format!("must be >= lanes.{lane}.max_concurrency"),
            );
        }
    }
    if config.admission.max_tokens_in_flight.get() < u64::from(max_len) {
        c.fail(
            "admission.max_tokens_in_flight",
            format!(
                "must be >= upstream.max_model_len ({max_len}), or the largest request never fits"
            ),
        );
    }
}

/// Collects issues; each check returns a placeholder on failure so validation can go on.
#[derive(Default)]
pub(super) struct Checker {
    issues: Vec<ConfigIssue>,
}

impl Checker {
    pub(super) fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue::new(path, message));
    }

    fn u32(&mut self, path: &str, value: Option<u32>, default: u32) -> NonZeroU32 {
        NonZeroU32::new(value.unwrap_or(default)).unwrap_or_else(|| {
            self.fail(path, "must be > 0");
            NonZeroU32::MIN
        })
    }

    fn u64(&mut self, path: &str, value: Option<u64>, default: u64) -> NonZeroU64 {
        NonZeroU64::new(value.unwrap_or(default)).unwrap_or_else(|| {
            self.fail(path, "must be > 0");
            NonZeroU64::MIN
        })
    }

    pub(super) fn ms(&mut self, path: &str, value: Option<u64>, default: u64) -> Duration {
        let ms = value.unwrap_or(default);
        if ms == 0 {
            self.fail(path, "must be > 0");
        }
        Duration::from_millis(ms)
    }

    fn queue(&mut self, section: &str, len: u32, timeout_ms: u64) -> QueueConfig {
        if len > 0 && timeout_ms == 0 {
            self.fail(
                format!("{section}.queue_timeout_ms"),
                "must be > 0 when queue_len > 0",
            );
        }
        QueueConfig {
            len,
            timeout: Duration::from_millis(timeout_ms),
        }
    }
}
