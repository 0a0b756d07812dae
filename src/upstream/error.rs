//! [`UpstreamError`]: everything that can go wrong talking to vLLM, and [`EngineError`], vLLM's
//! own error JSON read in both of its shapes.
//!
//! Nothing here picks an HTTP status: the api layer maps errors to HTTP in one exhaustive
//! `match`. Each variant's doc says which status it should become there.

use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde::Deserialize;

/// An error from the upstream (vLLM) hop.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// vLLM could not be reached: connection refused, DNS failure, connect timeout.
    /// HTTP: **503** (the gateway is up, its engine is not).
    #[error("upstream unavailable: {0}")]
    Unavailable(String),

    /// vLLM answered with a non-2xx status before streaming (validation errors such as prompt
    /// too long or unknown model, or an internal error).
    /// HTTP: the upstream's own **4xx** passed through with its error (the client sent something
    /// vLLM rejects); **502** for an upstream 5xx or other status.
    #[error("upstream answered {status}: {}", .error.message)]
    Status {
        /// The upstream's status.
        status: StatusCode,
        /// vLLM's error, parsed (or a placeholder when the body was not vLLM's error JSON).
        /// Boxed to keep `Result<_, UpstreamError>` small on the hot path.
        error: Box<EngineError>,
    },

    /// vLLM reported an error inside the stream (`data: {"error":...}`); the stream is over.
    /// HTTP: **502** (or an SSE error event once streaming has begun).
    #[error("engine error: {}", .0.message)]
    Engine(Box<EngineError>),

    /// The upstream sent something that is not vLLM's SSE: a non-JSON `data:` payload, an
    /// oversized event, a shape that cannot be read, `[DONE]` before any finish reason.
    /// HTTP: **502**.
    #[error("upstream protocol error: {0}")]
    Protocol(String),

    /// The stream ended (EOF) before any finish reason arrived.
    /// HTTP: **502**.
    #[error("upstream closed the stream early")]
    ClosedEarly,

    /// The connection broke after the request was sent (reset, read error).
    /// HTTP: **502**.
    #[error("upstream connection failed: {0}")]
    Transport(String),

    /// No content-carrying chunk within `upstream.first_token_timeout` of sending (covers waiting
    /// for response headers too). HTTP: **504**.
    #[error("no first token from upstream within {0:?}")]
    FirstTokenTimeout(Duration),

    /// No event within `upstream.idle_timeout` after the first token. HTTP: **504**.
    #[error("upstream stream idle for {0:?}")]
    IdleTimeout(Duration),

    /// The whole upstream request took longer than `upstream.total_timeout`. HTTP: **504**.
    #[error("upstream request exceeded {0:?}")]
    TotalTimeout(Duration),

    /// A non-streaming call (`/v1/models`, `/health`) got no complete answer in time.
    /// HTTP: **504** (for `/readyz`: 503, not ready).
    #[error("upstream did not answer within {0:?}")]
    ResponseTimeout(Duration),

    /// The gateway's request id cannot be sent as an HTTP header (a gateway bug: ids are
    /// generated). HTTP: **500**.
    #[error("request id is not a valid header value")]
    InvalidRequestId,
}

impl UpstreamError {
    /// Whether the request may be sent again on another replica: vLLM never started it (the
    /// connection was refused, or it answered 5xx before streaming).
    pub fn retryable(&self) -> bool {
        match self {
            UpstreamError::Unavailable(_) => true,
            UpstreamError::Status { status, .. } => status.is_server_error(),
            _ => false,
        }
    }

    /// Whether vLLM refused the client's own request (a 4xx other than 401 and 403, which
    /// answer the gateway's `upstream.api_key`: an operator's problem, not the client's).
    pub fn refuses_the_request(&self) -> bool {
        matches!(self, UpstreamError::Status { status, .. }
            if status.is_client_error()
                && !matches!(*status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN))
    }

    /// Whether vLLM refused the request as longer than its context (`max_model_len`): the
    /// gateway's estimate let it through, the engine's count did not. The same cause as the
    /// gateway's own `too_long`.
    pub fn beyond_the_context(&self) -> bool {
        match self {
            UpstreamError::Status { status, error } if *status == StatusCode::BAD_REQUEST => {
                [
                    "maximum context length",
                    "maximum model length",
                    "too long to fit into the model",
                ]
                .iter()
                .any(|w| error.message.contains(w))
                    || error.param.as_deref() == Some("input_tokens")
            }
            _ => false,
        }
    }

    /// A short name of the variant, for logs.
    pub fn code(&self) -> &'static str {
        match self {
            UpstreamError::Unavailable(_) => "unavailable",
            UpstreamError::Status { .. } => "status",
            UpstreamError::Engine(_) => "engine",
            UpstreamError::Protocol(_) => "protocol",
            UpstreamError::ClosedEarly => "closed_early",
            UpstreamError::Transport(_) => "transport",
            UpstreamError::FirstTokenTimeout(_) => "first_token_timeout",
            UpstreamError::IdleTimeout(_) => "idle_timeout",
            UpstreamError::TotalTimeout(_) => "total_timeout",
            UpstreamError::ResponseTimeout(_) => "response_timeout",
            UpstreamError::InvalidRequestId => "invalid_request_id",
        }
    }
}

/// vLLM's error object: current `{"error":{"message","type","param","code"}}` or the flat
/// pre-0.10.1 `{"object":"error","message","type","param","code"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    /// Human-readable message (vLLM's wording, e.g. "This model's maximum context length...").
    pub message: String,
    /// vLLM's `type`, e.g. `BadRequestError`, `NotFoundError`, `InternalServerError`.
    pub kind: Option<String>,
    /// The offending parameter, e.g. `input_tokens`.
    pub param: Option<String>,
    /// vLLM's `code` (an HTTP status number in vLLM; a string in some OpenAI-style servers),
    /// as text.
    pub code: Option<String>,
    /// The error JSON exactly as received (capped), for a faithful relay.
    pub raw: Bytes,
}

impl EngineError {
    /// Whether this is vLLM's answer to a request for a model it does not serve (its
    /// `NotFoundError`, "The model `…` does not exist."), not any 404 (a proxy's, a route the
    /// engine lacks).
    pub fn model_not_found(&self) -> bool {
        self.kind.as_deref() == Some("NotFoundError") || self.message.contains("does not exist")
    }
}

#[derive(Deserialize)]
struct Wrapped {
    error: Fields,
}

#[derive(Deserialize)]
struct Flat {
    object: String,
    #[serde(flatten)]
    fields: Fields,
}

#[derive(Deserialize)]
struct Fields {
    #[serde(default)]
    message: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    param: Option<serde_json::Value>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

fn text_of(v: Option<serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s),
        other => Some(other.to_string()),
    }
}

impl EngineError {
    /// Reads an error body in either of vLLM's shapes; `None` when it is neither.
    pub fn parse(raw: &Bytes) -> Option<EngineError> {
        let fields = match serde_json::from_slice::<Wrapped>(raw) {
            Ok(w) => w.error,
            Err(_) => {
                let flat = serde_json::from_slice::<Flat>(raw).ok()?;
                if flat.object != "error" {
                    return None;
                }
                flat.fields
            }
        };
        Some(EngineError {
            message: fields.message.unwrap_or_default(),
            kind: fields.kind,
            param: text_of(fields.param),
            code: text_of(fields.code),
            raw: raw.clone(),
        })
    }

    /// An error body that is not vLLM's JSON: keeps the bytes, says so in the message (the body
    /// itself is never put in the message, so it cannot reach a log).
    pub fn unreadable(status: StatusCode, raw: Bytes) -> EngineError {
        EngineError {
            message: format!("upstream answered {status} without vLLM's error JSON"),
            kind: None,
            param: None,
            code: None,
            raw,
        }
    }
}
