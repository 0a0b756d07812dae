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

/// `[server]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Largest request body accepted, bytes.
    pub max_body_bytes: Option<u64>,
    /// On SIGTERM, how long in-flight streams may finish before the process exits, ms.
    pub shutdown_grace_ms: Option<u64>,
}

/// The gateway's own HTTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// On SIGTERM, how long in-flight streams may finish.
    pub shutdown_grace: Duration,
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
    ServerConfig {
        max_body_bytes: max_body_bytes.clamp(1024, 256 * 1024 * 1024) as usize,
        shutdown_grace: Duration::from_millis(raw.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS)),
    }
}
