//! `[server]`: the gateway's own HTTP server (body limit, shutdown grace).
//!
//! Owns [`RawServer`], [`ServerConfig`], their defaults and their validation.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;

/// Default `server.max_body_bytes`.
const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
/// Default `server.shutdown_grace_ms`.
const SHUTDOWN_GRACE_MS: u64 = 30_000;
/// Default `server.max_logprobs`.
const MAX_LOGPROBS: u32 = 5;

/// `[server]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Largest request body accepted, bytes.
    pub max_body_bytes: Option<u64>,
    /// On SIGTERM, how long in-flight streams may finish before the process exits, ms.
    pub shutdown_grace_ms: Option<u64>,
    /// `/v1` body fields on no list: `forward` or `reject`.
    pub unknown_fields: Option<String>,
    /// Most log-probabilities per token a client may ask for.
    pub max_logprobs: Option<u32>,
}

/// What happens to a `/v1` body field the gateway does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownFields {
    /// Sent to vLLM as it is (vLLM ignores fields it does not know, with a warning).
    Forward,
    /// 400 naming the field.
    Reject,
}

/// The gateway's own HTTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// On SIGTERM, how long in-flight streams may finish.
    pub shutdown_grace: Duration,
    /// `/v1` body fields on no list.
    pub unknown_fields: UnknownFields,
    /// Most log-probabilities per token (`top_logprobs` on chat, `logprobs` on completions).
    pub max_logprobs: u32,
}

/// Checks `[server]`.
pub(super) fn validate(c: &mut Checker, raw: RawServer) -> ServerConfig {
    let max_body_bytes = raw.max_body_bytes.unwrap_or(MAX_BODY_BYTES);
    if !(1024..=256 * 1024 * 1024).contains(&max_body_bytes) {
        c.fail(
            "server.max_body_bytes",
            "must be between 1024 and 268435456",
        );
    }
    let unknown_fields = match raw.unknown_fields.as_deref().unwrap_or("forward") {
        "forward" => UnknownFields::Forward,
        "reject" => UnknownFields::Reject,
        _ => {
            c.fail("server.unknown_fields", "must be \"forward\" or \"reject\"");
            UnknownFields::Forward
        }
    };
    let max_logprobs = raw.max_logprobs.unwrap_or(MAX_LOGPROBS);
    if max_logprobs > 20 {
        c.fail(
            "server.max_logprobs",
            "must be at most 20 (vLLM's own default cap)",
        );
    }
    ServerConfig {
        unknown_fields,
        max_logprobs: max_logprobs.min(20),
        max_body_bytes: max_body_bytes.clamp(1024, 256 * 1024 * 1024) as usize,
        shutdown_grace: Duration::from_millis(raw.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS)),
    }
}
