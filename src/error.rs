//! [`GatewayError`]: everything a request can fail with, and the one place where an error
//! becomes an HTTP answer. It sits below `api` so the pipeline and the relay can name it without
//! importing the routes.
//!
//! | error | status | `code` |
//! |---|---|---|
//! | malformed JSON, wrong field types, bad values | 400 | `bad_request` |
//! | body over `server.max_body_bytes` | 413 | `body_too_large` |
//! | body not sent within `server.body_read_timeout_ms` | 408 | `body_timeout` |
//! | `server.max_requests_in_flight` reached | 503 + `Retry-After` | `overloaded` |
//! | queued bodies would pass `server.max_queued_bytes` | 429 + `Retry-After` | `queue_full` |
//! | a prompt that fills the model's maximum length, or an output limit above it | 400 | `too_long` |
//! | the tenant has `server.max_requests_in_flight_per_tenant` requests in flight | 429 + `Retry-After: 1` | `tenant_overloaded` |
//! | the tenant's budget (`[auth.tenants.<name>]`) is used up | 429 + `Retry-After` | `tenant_budget` |
//! | lane queue full | 429 + `Retry-After` | `queue_full` |
//! | the tenant keeps `jobs.max_jobs_per_tenant` jobs or `jobs.max_bytes_per_tenant` bytes | 429 + `Retry-After` | `tenant_jobs_full` |
//! | lane queue full and the tenant holds its share of it (`[auth]`) | 429 + `Retry-After` | `tenant_queue_full` |
//! | waited the lane's queue timeout | 503 + `Retry-After` | `queue_timeout` |
//! | Redis unreachable under `quota.on_redis_down = "fail_closed"` | 503 + `Retry-After: 1` | `quota_unavailable` |
//! | vLLM unreachable | 503 | `upstream_unavailable` |
//! | vLLM silent past first-token / idle / total timeout | 504 | `upstream_timeout` |
//! | vLLM rejected the request (its 4xx) | vLLM's status | `upstream_rejected` |
//! | vLLM error (5xx or mid-stream: status and type only) or garbage; an answer too large | 502 | `upstream_error` |
//! | no, an unknown or a revoked API key; a bad or expired token (`[auth]`) | 401 | `invalid_api_key` |
//! | a browser request from an origin not in `server.cors_allow_origins` | 403 | `origin_not_allowed` |
//! | a request whose `Host` names a host not in `server.allowed_hosts` (on a loopback listener by default: not localhost or a loopback address) | 403 | `host_not_allowed` |
//! | a cross-origin POST that is not `application/json` | 415 | `unsupported_media_type` |
//! | a body with a `Content-Encoding` other than `identity` | 415 | `unsupported_media_type` |
//! | no job with that id (or forgotten after expiry) | 404 | `job_not_found` |
//! | no route with that path | 404 | `not_found` |
//! | a route's path with a method it does not take | 405 | `method_not_allowed` |
//! | `jobs.max_jobs` or `jobs.max_bytes` reached | 429 + `Retry-After` | `jobs_full` |
//! | a job's request alone counts more than `jobs.max_bytes` (or its tenant's `jobs.max_bytes_per_tenant`) | 413 | `job_too_large` |
//! | `jobs.max_event_streams_per_tenant` event streams open | 429 + `Retry-After` | `too_many_streams` |
//! | jobs switched off, or not run by this quota backend | 501 | `jobs_unavailable` |
//! | still open when the shutdown grace period is over | 503 + `Retry-After` | `shutdown` |
//! | a stream's client fell `server.client_buffer_bytes` behind, or took nothing for `server.client_write_timeout_ms` | (mid-stream only) | `client_too_slow` |
//! | gateway bug | 500 | `internal` |
//!
//! On `/v1` the body is OpenAI's error shape `{"error":{"message","type","param","code"}}`; on
//! `/answer` before streaming the same JSON, and once streaming began an SSE `error` event with
//! `{"code","message"}`. Messages the gateway writes never contain prompt text; a 4xx from vLLM
//! keeps vLLM's wording, which may quote the client's own request back to it, while vLLM's 5xx
//! and its errors mid-stream are told by status and error type only.

use std::borrow::Cow;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::admission::AdmissionError;
use crate::classify::ClassifyError;
use crate::telemetry::{printable, Outcome};
use crate::upstream::UpstreamError;

/// Longest error message sent to a client, bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// The body read error the request limits put in the body stream when the client was too slow
/// (`server.body_read_timeout`); the body extractor's error carries it to [`GatewayError`].
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// The body stream's error when receiving more of it would pass `server.max_receiving_bytes`;
/// the body extractor's error carries it to [`GatewayError::ReceivingBytes`].
#[derive(Debug, thiserror::Error)]
#[error("too many request bodies are arriving at once")]
pub struct ReceivingFull;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The request is malformed or invalid.
    #[error("{message}")]
    BadRequest {
        /// What is wrong, naming the field.
        message: String,
        /// The offending field (a path such as `messages[2].role` where it has an index).
        param: Option<Cow<'static, str>>,
    },
    /// The body is larger than allowed.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body holds more JSON values and keys than any request needs (its parsed form would
    /// hold many times its size).
    #[error(
        "the request body holds more than {max} JSON values and keys (a prompt of token ids as \
         long as upstream.max_model_len four times over, and 16384 more): no request needs so \
         many"
    )]
    TooManyValues {
        /// The most a body may hold.
        max: usize,
    },
    /// The body did not arrive within `server.body_read_timeout`.
    #[error("the request body did not arrive within {} ms", after.as_millis())]
    BodyTimeout {
        /// The timeout.
        after: Duration,
    },
    /// `server.max_requests_in_flight` requests are being handled already.
    #[error("the gateway is handling as many requests as it may at once; retry shortly")]
    Overloaded,
    /// Admitting this body to a queue would pass `server.max_queued_bytes`.
    #[error("too many request bytes are waiting for admission; retry shortly")]
    QueuedBytes,
    /// Receiving more of this body would pass `server.max_receiving_bytes`.
    #[error("too many request bodies are arriving at once; retry shortly")]
    ReceivingBytes,
    /// No valid API key or token (`[auth]`).
    #[error("{0}")]
    Unauthorized(&'static str),
    /// A browser request from an origin that is not allowed.
    #[error("requests from this web origin are not allowed here (server.cors_allow_origins)")]
    OriginNotAllowed,
    /// A request naming a host the listener does not answer to (`server.allowed_hosts`).
    #[error(
        "this gateway does not answer to the name in the request's Host header \
         (server.allowed_hosts; a gateway listening on a loopback address answers only to \
         localhost and IP addresses unless names are listed)"
    )]
    HostNotAllowed,
    /// A POST whose body is not declared as JSON, where JSON is required: cross-origin, and on
    /// the admin listener (no web page can send that to another origin unasked).
    #[error(
        "this POST must carry Content-Type: application/json (for example curl -H \
         'content-type: application/json' -d '{{}}')"
    )]
    UnsupportedMediaType,
    /// The body is compressed (`Content-Encoding` other than `identity`): the gateway reads
    /// bodies as sent (a compressed one would be unreadable JSON, or a zip bomb to inflate).
    #[error(
        "request bodies are read as sent: send this one without Content-Encoding (it was {0})"
    )]
    CompressedBody(String),
    /// No job has this id (never, or forgotten after it expired).
    #[error("no job with this id (results are forgotten some time after they expire)")]
    JobNotFound,
    /// No route has this path.
    #[error(
        "no such endpoint on this gateway (the endpoints are in docs/operations.md, \"Endpoints\"; \
         with server.admin_listen set, /metrics, /readyz and /admin/reload are on that listener)"
    )]
    NotFound,
    /// The path exists, not with this method.
    #[error("this endpoint does not take this method")]
    MethodNotAllowed,
    /// `jobs.max_jobs` or `jobs.max_bytes` is reached.
    #[error("the gateway holds as many jobs as it may; retry later")]
    JobsFull,
    /// A job's request alone counts more than a bound of the job store: no store of this size
    /// could ever keep it, so waiting would not help.
    #[error(
        "this job's request counts {held} bytes in the job store, more than {limit} ({max}): \
         no job store of this size can keep it; send less, or an /answer"
    )]
    JobTooLarge {
        /// What the request counts.
        held: u64,
        /// The bound's key: `jobs.max_bytes` or `jobs.max_bytes_per_tenant`.
        limit: &'static str,
        /// The bound.
        max: u64,
    },
    /// The submitting tenant keeps `jobs.max_jobs_per_tenant` jobs (or its jobs keep
    /// `jobs.max_bytes_per_tenant` bytes) already: its own limit, whatever other tenants hold.
    #[error(
        "tenant {tenant} keeps {held} {what} of job store, its limit jobs.max_{what}_per_tenant \
         is {limit}; DELETE /jobs/{{id}} of a job that ended (done, failed or cancelled) frees \
         its room at once (its result is dropped), or retry when its results expire \
         (jobs.result_ttl_ms after they ended)"
    )]
    TenantJobsFull {
        /// The tenant.
        tenant: String,
        /// "jobs" or "bytes".
        what: &'static str,
        /// What it keeps.
        held: u64,
        /// Its limit.
        limit: u64,
    },
    /// The tenant's budget (`[auth.tenants.<name>]`) refuses the request.
    #[error(
        "tenant {tenant} used {used} of its {limit} of {max}; retry after {}s",
        retry_after.as_secs()
    )]
    TenantBudget {
        /// The tenant.
        tenant: String,
        /// The limit's key.
        limit: &'static str,
        /// What the tenant used of it.
        used: u64,
        /// The limit.
        max: u64,
        /// When to come back.
        retry_after: Duration,
    },
    /// The tenant's waiting requests hold `server.max_queued_bytes_per_tenant` bytes of bodies.
    #[error(
        "tenant {tenant} has {held} bytes of request bodies waiting for admission; with this \
         request's {asked} that passes its limit server.max_queued_bytes_per_tenant ({max}); \
         retry shortly"
    )]
    TenantQueuedBytes {
        /// The tenant.
        tenant: String,
        /// Bytes its waiting requests hold.
        held: u64,
        /// This request's body.
        asked: u64,
        /// Its limit.
        max: u64,
    },
    /// The tenant has `server.max_requests_in_flight_per_tenant` requests in flight already.
    #[error(
        "tenant {tenant} has {held} requests in flight, bodies arriving or whole answers its \
         clients have not read, its limit (server.max_requests_in_flight_per_tenant = {held}); \
         retry when one ends"
    )]
    TenantOverloaded {
        /// The tenant.
        tenant: String,
        /// Its requests in flight (its limit).
        held: usize,
    },
    /// The tenant holds `jobs.max_event_streams_per_tenant` event streams already.
    #[error(
        "this tenant holds as many job event streams open as it may \
         (jobs.max_event_streams_per_tenant); close one or retry shortly"
    )]
    TooManyStreams,
    /// Jobs are switched off or not run by this deployment.
    #[error("{0}")]
    JobsUnavailable(&'static str),
    /// The shared job store (Redis) cannot be reached.
    #[error("the shared job store (Redis) cannot be reached; retry shortly")]
    JobStoreDown,
    /// The gateway is shutting down and its grace period is over: the request was ended (its
    /// engine work aborted). Recorded with the outcome `cancelled`.
    #[error("the gateway is shutting down; retry (another replica will answer)")]
    Shutdown,
    /// A stream's client fell more than `server.client_buffer_bytes` behind the engine, or took
    /// nothing for `server.client_write_timeout` while bytes waited: it was cut and the
    /// engine's work aborted. Only ever mid-stream; recorded with the outcome `cancelled`.
    #[error("the client did not take the stream's bytes in time; the stream was ended")]
    ClientTooSlow,
    /// The gateway panicked while serving the request (a bug): its seat, tokens and engine
    /// work were given back, and the panic was reported on stderr and counted in
    /// `tutor_gateway_panics_total`. Recorded with the outcome `internal`.
    #[error(
        "the gateway failed while serving this request (an internal error, logged under this \
         answer's x-request-id); retry"
    )]
    Internal,
    /// Classification failed (too long for the model, or a tokenizer failure).
    #[error(transparent)]
    Classify(#[from] ClassifyError),
    /// Not admitted.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The engine failed.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

impl GatewayError {
    /// A 400 about `param`.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: param.map(Cow::Borrowed),
        }
    }

    /// A 400 about the field at `path`, built by the gateway from field names it knows and
    /// indexes (never a name the client chose: the path is logged).
    pub fn bad_field(message: impl Into<String>, path: String) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: Some(Cow::Owned(path)),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } | Self::TooManyValues { .. } | Self::JobTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Overloaded | Self::ReceivingBytes => StatusCode::SERVICE_UNAVAILABLE,
            Self::QueuedBytes
            | Self::TenantQueuedBytes { .. }
            | Self::JobsFull
            | Self::TenantJobsFull { .. }
            | Self::TenantOverloaded { .. }
            | Self::TenantBudget { .. }
            | Self::TooManyStreams => StatusCode::TOO_MANY_REQUESTS,
            Self::JobNotFound | Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::OriginNotAllowed => StatusCode::FORBIDDEN,
            Self::HostNotAllowed => StatusCode::FORBIDDEN,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::UnsupportedMediaType | Self::CompressedBody(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Self::JobsUnavailable(_) => StatusCode::NOT_IMPLEMENTED,
            Self::JobStoreDown | Self::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
            Self::ClientTooSlow => StatusCode::REQUEST_TIMEOUT,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Classify(e) => match e {
                ClassifyError::ExceedsModelLen { .. } => StatusCode::BAD_REQUEST,
                ClassifyError::TokenizerLoad { .. } | ClassifyError::Internal(_) => {
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            },
            Self::Admission(e) => match e {
                AdmissionError::QueueFull { .. } | AdmissionError::TenantQueueFull { .. } => {
                    StatusCode::TOO_MANY_REQUESTS
                }
                AdmissionError::Timeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
                AdmissionError::QuotaUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
                AdmissionError::WouldMissDeadline {
                    over_share: true, ..
                } => StatusCode::TOO_MANY_REQUESTS,
                AdmissionError::WouldMissDeadline { .. } => StatusCode::SERVICE_UNAVAILABLE,
                AdmissionError::TooLarge { .. } => StatusCode::BAD_REQUEST,
            },
            Self::Upstream(e) => match e {
                UpstreamError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                UpstreamError::Status { status, .. } if e.refuses_the_request() => {
                    StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY)
                }
                UpstreamError::Status { .. }
                | UpstreamError::Engine(_)
                | UpstreamError::Protocol(_)
                | UpstreamError::ClosedEarly
                | UpstreamError::Transport(_) => StatusCode::BAD_GATEWAY,
                UpstreamError::FirstTokenTimeout(_)
                | UpstreamError::IdleTimeout(_)
                | UpstreamError::TotalTimeout(_)
                | UpstreamError::ResponseTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
                UpstreamError::InvalidRequestId => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// The machine-readable code (SSE `error` events, OpenAI `code`): the outcome label, made
    /// finer for an oversized body and for vLLM's own rejections.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BodyTooLarge { .. } | Self::TooManyValues { .. } => "body_too_large",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::Overloaded | Self::ReceivingBytes => "overloaded",
            Self::JobNotFound => "job_not_found",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::OriginNotAllowed => "origin_not_allowed",
            Self::HostNotAllowed => "host_not_allowed",
            Self::Unauthorized(_) => crate::telemetry::INVALID_API_KEY,
            Self::UnsupportedMediaType | Self::CompressedBody(_) => "unsupported_media_type",
            Self::JobsFull => "jobs_full",
            Self::JobTooLarge { .. } => "job_too_large",
            Self::TenantJobsFull { .. } => "tenant_jobs_full",
            Self::TenantOverloaded { .. } => "tenant_overloaded",
            Self::TenantQueuedBytes { .. } => "tenant_queue_full",
            Self::TenantBudget { .. } => "tenant_budget",
            Self::TooManyStreams => "too_many_streams",
            Self::JobsUnavailable(_) => "jobs_unavailable",
            Self::JobStoreDown => "job_store_unavailable",
            Self::Shutdown => "shutdown",
            Self::ClientTooSlow => "client_too_slow",
            Self::Admission(AdmissionError::TenantQueueFull { .. }) => "tenant_queue_full",
            Self::Upstream(e) if e.beyond_the_context() => "too_long",
            Self::Upstream(e) if e.refuses_the_request() => "upstream_rejected",
            _ => self.outcome().as_str(),
        }
    }

    /// The `outcome` label of `tutor_gateway_requests_total`.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::BadRequest { .. }
            | Self::BodyTooLarge { .. }
            | Self::TooManyValues { .. }
            | Self::JobTooLarge { .. }
            | Self::BodyTimeout { .. }
            | Self::JobNotFound
            | Self::NotFound
            | Self::MethodNotAllowed
            | Self::OriginNotAllowed
            | Self::HostNotAllowed
            | Self::Unauthorized(_)
            | Self::UnsupportedMediaType
            | Self::CompressedBody(_)
            | Self::JobsUnavailable(_) => Outcome::BadRequest,
            Self::Overloaded | Self::QueuedBytes | Self::ReceivingBytes => Outcome::QueueFull,
            Self::JobsFull => Outcome::QueueFull,
            Self::TooManyStreams
            | Self::TenantJobsFull { .. }
            | Self::TenantOverloaded { .. }
            | Self::TenantQueuedBytes { .. }
            | Self::TenantBudget { .. } => Outcome::TenantLimited,
            Self::JobStoreDown => Outcome::QuotaUnavailable,
            Self::Shutdown | Self::ClientTooSlow => Outcome::Cancelled,
            Self::Internal => Outcome::Internal,
            Self::Classify(ClassifyError::ExceedsModelLen { .. }) => Outcome::TooLong,
            Self::Classify(_) => Outcome::Internal,
            Self::Admission(AdmissionError::QueueFull { .. }) => Outcome::QueueFull,
            Self::Admission(AdmissionError::TenantQueueFull { .. }) => Outcome::TenantLimited,
            Self::Admission(AdmissionError::Timeout { .. }) => Outcome::QueueTimeout,
            Self::Admission(AdmissionError::QuotaUnavailable { .. }) => Outcome::QuotaUnavailable,
            Self::Admission(AdmissionError::TooLarge { .. }) => Outcome::TooLong,
            Self::Admission(AdmissionError::WouldMissDeadline { .. }) => Outcome::DeadlineUnmet,
            Self::Upstream(UpstreamError::Unavailable(_)) => Outcome::UpstreamUnavailable,
            Self::Upstream(
                UpstreamError::FirstTokenTimeout(_)
                | UpstreamError::IdleTimeout(_)
                | UpstreamError::TotalTimeout(_)
                | UpstreamError::ResponseTimeout(_),
            ) => Outcome::UpstreamTimeout,
            Self::Upstream(UpstreamError::InvalidRequestId) => Outcome::Internal,
            Self::Upstream(e) if e.beyond_the_context() => Outcome::TooLong,
            // vLLM's 401/403 answer the gateway's `upstream.api_key`: an operator's problem.
            Self::Upstream(e) if e.refuses_the_request() => Outcome::UpstreamRejected,
            Self::Upstream(_) => Outcome::UpstreamError,
        }
    }

    /// OpenAI's `type`.
    fn kind(&self) -> String {
        if let Self::Upstream(e @ UpstreamError::Status { error, .. }) = self {
            if let Some(k) = error.kind.as_ref().filter(|_| e.refuses_the_request()) {
                // vLLM's word, kept short (an exception's class name).
                return printable(k, 64);
            }
        }
        let s = self.status();
        match s {
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error".into(),
            _ if s.is_client_error() => "invalid_request_error".into(),
            _ => "server_error".into(),
        }
    }

    fn param(&self) -> Option<String> {
        match self {
            Self::BadRequest { param, .. } => param.as_deref().map(str::to_owned),
            // Only the output's size is the client's to lower when the input leaves room.
            Self::Classify(ClassifyError::ExceedsModelLen {
                input_tokens,
                max_model_len,
                ..
            }) if input_tokens < max_model_len => Some("max_tokens".into()),
            Self::Classify(ClassifyError::ExceedsModelLen { .. }) => None,
            Self::Upstream(e @ UpstreamError::Status { error, .. }) if e.refuses_the_request() => {
                error.param.as_deref().map(|p| printable(p, 128))
            }
            _ => None,
        }
    }

    /// The message the client sees; upstream 4xx keep vLLM's own wording (about the client's
    /// own request, which it may quote). vLLM's 5xx and its errors mid-stream are told by
    /// status and vLLM's error type only: their text can quote a prompt or an answer (an
    /// engine's traceback) or the engine's internals, and it also reaches job records and
    /// webhooks. At most [`MAX_MESSAGE_BYTES`] (a message quoting a huge field name or value is
    /// cut).
    pub fn message(&self) -> String {
        let kind = |e: &crate::upstream::EngineError| {
            e.kind
                .as_deref()
                .map_or_else(String::new, |k| format!(" ({})", printable(k, 64)))
        };
        let full = match self {
            Self::Upstream(e @ UpstreamError::Status { error, .. }) if e.refuses_the_request() => {
                error.message.clone()
            }
            Self::Upstream(UpstreamError::Status { status, .. }) if status.is_client_error() => {
                format!(
                    "the gateway could not authenticate to the model server (it answered \
                     {status}): an operator's problem (upstream.api_key_env or \
                     upstream.api_key_file), not this request's"
                )
            }
            Self::Upstream(UpstreamError::Status { error, status }) => {
                format!(
                    "the engine failed the request: it answered {status}{}",
                    kind(error)
                )
            }
            Self::Upstream(UpstreamError::Engine(error)) => {
                format!(
                    "the engine reported an error while answering{}",
                    kind(error)
                )
            }
            other => other.to_string(),
        };
        if full.len() <= MAX_MESSAGE_BYTES {
            return full;
        }
        let mut end = MAX_MESSAGE_BYTES;
        while !full.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &full[..end])
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Admission(
                AdmissionError::QueueFull { retry_after, .. }
                | AdmissionError::TenantQueueFull { retry_after, .. },
            ) => Some(*retry_after),
            Self::Admission(AdmissionError::Timeout { .. }) => Some(Duration::from_secs(1)),
            Self::Admission(AdmissionError::WouldMissDeadline { predicted, .. }) => Some(
                Duration::from_secs(crate::admission::retry_secs(*predicted)),
            ),
            Self::Overloaded | Self::QueuedBytes | Self::ReceivingBytes | Self::TooManyStreams => {
                Some(Duration::from_secs(1))
            }
            Self::JobsFull | Self::TenantJobsFull { .. } => Some(Duration::from_secs(10)),
            Self::TenantOverloaded { .. } | Self::TenantQueuedBytes { .. } => {
                Some(Duration::from_secs(1))
            }
            Self::TenantBudget { retry_after, .. } => {
                Some((*retry_after).max(Duration::from_secs(1)))
            }
            Self::JobStoreDown | Self::Shutdown => Some(Duration::from_secs(1)),
            // vLLM restarting or a replica ejected: a client's backoff has something to go by.
            Self::Upstream(UpstreamError::Unavailable(_)) => Some(Duration::from_secs(1)),
            Self::Admission(AdmissionError::QuotaUnavailable { .. }) => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        }
    }

    /// The OpenAI error body. An early refusal (`deadline_unmet`) adds its estimate:
    /// `predicted_wait_ms` and `deadline_ms` (what was left of the deadline).
    pub fn body(&self) -> serde_json::Value {
        let mut body = json!({"error": {
            "message": self.message(),
            "type": self.kind(),
            "param": self.param(),
            "code": self.code(),
        }});
        if let (Some((predicted, deadline)), Some(error)) =
            (self.wait_estimate(), body["error"].as_object_mut())
        {
            error.insert("predicted_wait_ms".into(), json!(predicted.as_millis()));
            error.insert("deadline_ms".into(), json!(deadline.as_millis()));
            error.insert("tenant_over_share".into(), json!(self.over_share()));
        }
        body
    }

    /// Whether an early refusal's tenant held more than its share of its lane's waiters.
    pub fn over_share(&self) -> bool {
        matches!(
            self,
            Self::Admission(AdmissionError::WouldMissDeadline {
                over_share: true,
                ..
            })
        )
    }

    /// An early refusal's predicted wait and what was left of its deadline.
    pub fn wait_estimate(&self) -> Option<(Duration, Duration)> {
        match self {
            Self::Admission(AdmissionError::WouldMissDeadline {
                predicted,
                deadline,
                ..
            }) => Some((*predicted, *deadline)),
            _ => None,
        }
    }

    /// `Retry-After`, whole seconds, when the error has one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(|after| after.as_secs().max(1))
    }

    /// What the gateway's own log says about this error: its class, status and vLLM's error
    /// type, never a message that could quote the request (vLLM's wording, or serde's about a
    /// field's value).
    pub fn log_summary(&self) -> String {
        let kind = |e: &crate::upstream::EngineError| {
            e.kind
                .as_deref()
                .map_or_else(|| "no type".to_owned(), |k| printable(k, 64))
        };
        match self {
            Self::BadRequest { param: Some(p), .. } => format!("invalid request (field {p})"),
            Self::BadRequest { param: None, .. } => "invalid request".to_owned(),
            Self::Upstream(UpstreamError::Status { status, error }) => {
                format!("upstream answered {status} ({})", kind(error))
            }
            Self::Upstream(UpstreamError::Engine(error)) => {
                format!("engine error ({})", kind(error))
            }
            other => other.to_string(),
        }
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        if matches!(self, Self::Unauthorized(_)) {
            // RFC 6750: a 401 names the scheme the client should use.
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tutor-gateway\""),
            );
        }
        if let Some(secs) = self.retry_after_secs() {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

/// The failing field `field` as an error's `param`, when it can be one: one of the route's own
/// field names (lower case and underscores, at most 64 bytes). A field the client named (the
/// `problem` is an unknown field) never is: a `param` is logged and counted.
pub fn param_of(field: &str, problem: &str) -> Option<String> {
    let ours = !problem.contains("unknown field")
        && !field.is_empty()
        && field.len() <= 64
        && field.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    ours.then(|| field.to_owned())
}

/// `message` cut to at most `max` characters (then ending in `…`): a message that quotes what
/// a client sent (an unknown field's name, a value of the wrong type) does not echo megabytes.
pub fn shortened(message: String, max: usize) -> String {
    match message.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &message[..at]),
        None => message,
    }
}

/// The most characters of an error message that quotes a client's input.
pub const QUOTED_MAX: usize = 256;

/// `serde`'s message with its Rust type names said in words ("expected u32" is "expected a
/// whole number from 0 to 4294967295").
pub fn plain(message: &str) -> String {
    const WORDS: [(&str, &str); 8] = [
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        (
            "expected u64",
            "expected a whole number from 0 to 18446744073709551615",
        ),
        ("expected usize", "expected a whole number from 0 up"),
        ("expected i64", "expected a whole number"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
    ];
    let mut out = message.to_owned();
    for (rust, words) in WORDS {
        // Whole words only: `u8` is not the start of `u80`.
        let mut from = 0;
        while let Some(at) = out[from..].find(rust).map(|i| i + from) {
            let end = at + rust.len();
            if out[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                from = end;
                continue;
            }
            out.replace_range(at..end, words);
            from = at + words.len();
        }
    }
    out
}

impl From<axum::extract::rejection::QueryRejection> for GatewayError {
    /// The query string's problem in the gateway's words, `param` naming the field when it is
    /// one of the route's (axum says "Failed to deserialize query string: missing field
    /// `prompt`", or "<field>: <problem>").
    fn from(e: axum::extract::rejection::QueryRejection) -> Self {
        let text = e.body_text();
        let detail = text
            .strip_prefix("Failed to deserialize query string: ")
            .unwrap_or(&text);
        let field = detail
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
            .or_else(|| detail.split_once(": ").map(|(field, _)| field))
            .and_then(|f| param_of(f, detail));
        // "<field>: <problem>", each part cut on its own (the field may be a client's name).
        let message = match detail.split_once(": ") {
            Some((name, problem)) => format!(
                "the query string: {}: {}",
                shortened(name.to_owned(), 64),
                shortened(plain(problem), QUOTED_MAX - 64)
            ),
            None => shortened(format!("the query string: {}", plain(detail)), QUOTED_MAX),
        };
        match field {
            Some(field) => GatewayError::bad_field(message, field),
            None => GatewayError::bad_request(message, None),
        }
    }
}

#[cfg(test)]
mod plain_tests {
    use super::{param_of, plain};

    #[test]
    fn only_the_routes_own_field_names_become_a_param() {
        let problem = "invalid type: string \"x\", expected a number";
        assert_eq!(
            param_of("max_tokens", problem).as_deref(),
            Some("max_tokens")
        );
        // A name the client made up is never a param (a param is logged): an unknown field, a
        // name with other characters, an overlong one, an empty one.
        assert_eq!(param_of("tempreature", "unknown field `tempreature`"), None);
        assert_eq!(param_of("Max-Tokens", problem), None);
        assert_eq!(param_of(&"a".repeat(65), problem), None);
        assert_eq!(param_of("", problem), None);
    }

    #[test]
    fn rust_type_names_are_said_in_words_and_nothing_else_changes() {
        assert_eq!(
            plain("invalid value: integer `-3`, expected u32"),
            "invalid value: integer `-3`, expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            plain("invalid type: string \"hot\", expected f64"),
            "invalid type: string \"hot\", expected a number"
        );
        // Whole words only, and text without a type name is left as it is.
        assert_eq!(plain("expected u80 things"), "expected u80 things");
        assert_eq!(plain("missing field `prompt`"), "missing field `prompt`");
    }
}
