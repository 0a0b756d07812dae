//! `[server]`: the gateway's own HTTP server (body limit, shutdown grace).
//!
//! Owns [`RawServer`], [`ServerConfig`], their defaults and their validation.

use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use super::secret::Secret;

/// Default `server.max_body_bytes`.
const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
/// Default `server.shutdown_grace_ms`.
const SHUTDOWN_GRACE_MS: u64 = 30_000;
/// Default `server.drain_announce_ms`.
const DRAIN_ANNOUNCE_MS: u64 = 0;
/// Default `server.max_logprobs`.
const MAX_LOGPROBS: u32 = 5;
/// Default `server.max_connections`.
const MAX_CONNECTIONS: u64 = 10_000;
/// Default `server.max_requests_in_flight`.
const MAX_REQUESTS_IN_FLIGHT: u64 = 4_096;
/// Default `server.header_read_timeout_ms`.
const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Default `server.keep_alive_idle_ms`.
const KEEP_ALIVE_IDLE_MS: u64 = 10_000;
/// Default `server.body_read_timeout_ms`.
const BODY_READ_TIMEOUT_MS: u64 = 30_000;
/// Default `server.max_queued_bytes`.
const MAX_QUEUED_BYTES: u64 = 256 * 1024 * 1024;
/// Default `server.max_receiving_bytes`.
const MAX_RECEIVING_BYTES: u64 = 256 * 1024 * 1024;
/// Default `server.max_head_bytes`.
const MAX_HEAD_BYTES: u64 = 32 * 1024;
/// Smallest `server.max_head_bytes`: hyper's HTTP/1 read buffer cannot be smaller.
const MIN_HEAD_BYTES: u64 = 8 * 1024;
/// Largest `server.max_head_bytes`.
const MAX_MAX_HEAD_BYTES: u64 = 1024 * 1024;
/// Default `server.cors_max_age_s`.
const CORS_MAX_AGE_S: u64 = 600;
/// The environment variable that may hold the admin listener's token.
pub const ADMIN_TOKEN_ENV: &str = "TUTOR_GATEWAY_ADMIN_TOKEN";
/// Shortest `server.config_watch_ms` other than 0 (off).
const MIN_CONFIG_WATCH_MS: u64 = 100;
/// Default `server.client_buffer_bytes`.
const CLIENT_BUFFER_BYTES: u64 = 1024 * 1024;
/// Largest `server.client_buffer_bytes`.
const MAX_CLIENT_BUFFER_BYTES: u64 = 256 * 1024 * 1024;
/// Default `server.client_write_timeout_ms`.
const CLIENT_WRITE_TIMEOUT_MS: u64 = 30_000;

/// `[server]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Largest request body accepted, bytes.
    pub max_body_bytes: Option<u64>,
    /// On SIGTERM, how long in-flight streams may finish before the process exits, ms.
    pub shutdown_grace_ms: Option<u64>,
    /// On SIGTERM, how long `/readyz` answers `draining` before the listener stops accepting, ms.
    pub drain_announce_ms: Option<u64>,
    /// How often the config file is checked for a change (and reloaded), ms; 0: never.
    pub config_watch_ms: Option<u64>,
    /// `/v1` body fields on no list: `forward` or `reject`.
    pub unknown_fields: Option<String>,
    /// Most log-probabilities per token a client may ask for.
    pub max_logprobs: Option<u32>,
    /// Open client connections at once; more get 503.
    pub max_connections: Option<u64>,
    /// Requests being handled at once (streams included); more get 503.
    pub max_requests_in_flight: Option<u64>,
    /// `/answer` and `/v1` requests one tenant may have in flight; 0: a quarter of
    /// `max_requests_in_flight`.
    pub max_requests_in_flight_per_tenant: Option<u64>,
    /// Longest a new connection may take to send its first request's headers, ms.
    pub header_read_timeout_ms: Option<u64>,
    /// Longest a connection may stay open with no request in progress after one, ms.
    pub keep_alive_idle_ms: Option<u64>,
    /// Longest a client may take to send a request's body, ms.
    pub body_read_timeout_ms: Option<u64>,
    /// Request bodies held by requests waiting for admission, bytes; more get 429.
    pub max_queued_bytes: Option<u64>,
    /// Of those, what one tenant's waiting requests may hold; 0: a quarter of
    /// `max_queued_bytes`.
    pub max_queued_bytes_per_tenant: Option<u64>,
    /// Request body bytes being received at once, all requests together; more get 503.
    pub max_receiving_bytes: Option<u64>,
    /// Largest request head (request line and headers), bytes; larger get 431.
    pub max_head_bytes: Option<u64>,
    /// Browser origins allowed to call the gateway cross-origin (CORS).
    pub cors_allow_origins: Option<Vec<String>>,
    /// Names the listeners answer to (`Host`); empty: see [`crate::api::hosts`].
    pub allowed_hosts: Option<Vec<String>>,
    /// A second listener for operators (`/metrics`, `/readyz`), `IP:PORT`; empty: none.
    pub admin_listen: Option<String>,
    /// The token the admin listener asks for (`Authorization: Bearer`); empty: none (better:
    /// [`ADMIN_TOKEN_ENV`]).
    pub admin_token: Option<Secret>,
    /// PEM certificate chain for TLS on the public listener.
    pub tls_cert: Option<String>,
    /// PEM private key for TLS on the public listener.
    pub tls_key: Option<String>,
    /// How long a browser may cache a CORS preflight answer, seconds.
    pub cors_max_age_s: Option<u64>,
    /// Stream bytes read from vLLM and not yet taken by the client, per stream, bytes.
    pub client_buffer_bytes: Option<u64>,
    /// Longest a stream's client may take nothing while bytes wait for it, ms.
    pub client_write_timeout_ms: Option<u64>,
    /// Serve the demo page at `GET /demo`.
    pub demo: Option<bool>,
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
    /// On SIGTERM, how long `/readyz` says `draining` while new requests are still served, so
    /// that a load balancer polling it stops sending before the listener closes.
    pub drain_announce: Duration,
    /// How often the file the gateway started from is read again, reloaded when its bytes
    /// changed (a Kubernetes ConfigMap update, an edit); `None`: only on SIGHUP or
    /// `POST /admin/reload`.
    pub config_watch: Option<Duration>,
    /// `/v1` body fields on no list.
    pub unknown_fields: UnknownFields,
    /// Most log-probabilities per token (`top_logprobs` on chat, `logprobs` on completions).
    pub max_logprobs: u32,
    /// Open client connections at once (503 beyond).
    pub max_connections: usize,
    /// Requests handled at once, streams included (503 beyond).
    pub max_requests_in_flight: usize,
    /// `/answer` and `/v1` requests one tenant (`[auth]`) may have in flight at once, streams
    /// included (429 `tenant_overloaded` beyond).
    pub max_requests_in_flight_per_tenant: usize,
    /// `max_requests_in_flight_per_tenant` as the file sets it (0: a quarter of
    /// `max_requests_in_flight`): a reload that keeps the running `max_requests_in_flight`
    /// derives the per-tenant limit from that ([`per_tenant_in_flight`]).
    pub max_requests_in_flight_per_tenant_set: u64,
    /// Longest a new connection may take, from accepting, to complete its first request's
    /// head (the TLS handshake included); the connection is closed then.
    pub header_read_timeout: Duration,
    /// Longest a connection may stay idle after a request ended (no request in progress: an
    /// HTTP/1 keep-alive connection between requests, an HTTP/2 connection with no open
    /// stream) before it is closed. The next request's head must be complete within it.
    pub keep_alive_idle: Duration,
    /// Longest a client may take to send a request's body (408).
    pub body_read_timeout: Duration,
    /// Request bodies held by requests waiting for admission (429 beyond).
    pub max_queued_bytes: u64,
    /// Of those, what one tenant's (`[auth]`) waiting requests may hold (429
    /// `tenant_queue_full` beyond).
    pub max_queued_bytes_per_tenant: u64,
    /// Request body bytes being received at once, all requests together (503 beyond; a body
    /// alone always passes, `max_body_bytes` bounding it).
    pub max_receiving_bytes: u64,
    /// Largest request head, bytes: on HTTP/1 the request line and headers as sent (also the
    /// most a connection buffers of a head still arriving), on HTTP/2 the decoded header
    /// list. Larger: 431.
    pub max_head_bytes: usize,
    /// Origins (`scheme://host[:port]`, lower case) allowed cross-origin; `*` allows any.
    pub cors_allow_origins: Vec<String>,
    /// Names the listeners answer to, validated (lower case, `*.suffix`, or `*`); empty: on a
    /// loopback address only loopback names, elsewhere any ([`crate::api::hosts`]).
    pub allowed_hosts: Vec<String>,
    /// Where `/metrics` and `/readyz` are served instead of the public listener, if set.
    pub admin_listen: Option<std::net::SocketAddr>,
    /// The admin listener's token (`Authorization: Bearer <token>` on every admin request);
    /// `None`: none asked.
    pub admin_token: Option<Secret>,
    /// TLS on the public listener: certificate chain and key files (re-read when they change).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// `Access-Control-Max-Age` of preflight answers.
    pub cors_max_age: Duration,
    /// Per stream, the most bytes read from vLLM that wait for the client to take them; a
    /// client further behind is cut (`client_too_slow`) and the engine's work aborted.
    pub client_buffer_bytes: usize,
    /// Longest a stream's client may take nothing while bytes wait for it; then it is cut
    /// (`client_too_slow`) and the engine's work aborted.
    pub client_write_timeout: Duration,
    /// Whether `GET /demo` serves the demo page (`web/demo.html`); 404 when off.
    pub demo: bool,
}

/// Checks `[server]`.
/// `server.max_requests_in_flight_per_tenant` set to `set` (0: a quarter of `max`, at least
/// 1), at most `max` (`server.max_requests_in_flight`).
pub fn per_tenant_in_flight(set: u64, max: usize) -> usize {
    match usize::try_from(set).unwrap_or(usize::MAX) {
        0 => (max / 4).max(1),
        n => n.min(max),
    }
}

pub(super) fn validate(c: &mut Checker, raw: RawServer) -> ServerConfig {
    let shutdown_grace_ms = raw.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS);
    c.at_most(
        "server.shutdown_grace_ms",
        shutdown_grace_ms,
        3_600_000,
        "3600000 (an hour; past the orchestrator's own grace the process is killed without \
         giving its leases back)",
    );
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
    let mut count = |key: &str, v: Option<u64>, default: u64, max: u64| -> u64 {
        let v = v.unwrap_or(default);
        if !(1..=max).contains(&v) {
            c.fail(key, format!("must be between 1 and {max}"));
        }
        v.clamp(1, max)
    };
    let max_connections = count(
        "server.max_connections",
        raw.max_connections,
        MAX_CONNECTIONS,
        1_000_000,
    );
    let max_requests_in_flight = count(
        "server.max_requests_in_flight",
        raw.max_requests_in_flight,
        MAX_REQUESTS_IN_FLIGHT,
        1_000_000,
    );
    let header_ms = count(
        "server.header_read_timeout_ms",
        raw.header_read_timeout_ms,
        HEADER_READ_TIMEOUT_MS,
        3_600_000,
    );
    let keep_alive_ms = count(
        "server.keep_alive_idle_ms",
        raw.keep_alive_idle_ms,
        KEEP_ALIVE_IDLE_MS,
        3_600_000,
    );
    let body_ms = count(
        "server.body_read_timeout_ms",
        raw.body_read_timeout_ms,
        BODY_READ_TIMEOUT_MS,
        3_600_000,
    );
    let max_queued_bytes = count(
        "server.max_queued_bytes",
        raw.max_queued_bytes,
        MAX_QUEUED_BYTES,
        1 << 40,
    );
    let max_receiving_bytes = count(
        "server.max_receiving_bytes",
        raw.max_receiving_bytes,
        MAX_RECEIVING_BYTES,
        1 << 40,
    );
    let client_buffer_bytes = count(
        "server.client_buffer_bytes",
        raw.client_buffer_bytes,
        CLIENT_BUFFER_BYTES,
        MAX_CLIENT_BUFFER_BYTES,
    );
    let client_write_ms = count(
        "server.client_write_timeout_ms",
        raw.client_write_timeout_ms,
        CLIENT_WRITE_TIMEOUT_MS,
        3_600_000,
    );
    let max_head_bytes = raw.max_head_bytes.unwrap_or(MAX_HEAD_BYTES);
    if !(MIN_HEAD_BYTES..=MAX_MAX_HEAD_BYTES).contains(&max_head_bytes) {
        c.fail(
            "server.max_head_bytes",
            format!("must be between {MIN_HEAD_BYTES} and {MAX_MAX_HEAD_BYTES}"),
        );
    }
    let mut cors_allow_origins = Vec::new();
    for (i, origin) in raw
        .cors_allow_origins
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        match cors_origin(origin) {
            Some(o) => cors_allow_origins.push(o),
            None => c.fail(
                format!("server.cors_allow_origins[{i}]"),
                "must be an origin like https://tutor.example.edu (scheme, host, optional \
                 port; no path), or \"*\"",
            ),
        }
    }
    let mut allowed_hosts = Vec::new();
    for (i, entry) in raw.allowed_hosts.unwrap_or_default().iter().enumerate() {
        match allowed_host(entry) {
            Some(h) => allowed_hosts.push(h),
            None => c.fail(
                format!("server.allowed_hosts[{i}]"),
                "must be a host name like tutor.example.edu (no scheme or port), an IP \
                 address, *.example.edu (any name under it), or \"*\"",
            ),
        }
    }
    let cors_max_age_s = raw.cors_max_age_s.unwrap_or(CORS_MAX_AGE_S);
    if cors_max_age_s > 86_400 {
        c.fail("server.cors_max_age_s", "must be at most 86400");
    }
    let admin_listen = match raw.admin_listen.as_deref().filter(|a| !a.is_empty()) {
        None => None,
        Some(addr) => match addr.parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                c.fail(
                    "server.admin_listen",
                    "must be a socket address like 127.0.0.1:9090, or empty",
                );
                None
            }
        },
    };
    // Trimmed: a token read from a file written by `echo` ends in a newline, which no header
    // value can carry (it was never matched: every admin call got 401).
    let admin_token = raw
        .admin_token
        .map(|s| s.expose().trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| c.env(ADMIN_TOKEN_ENV))
        .map(Secret::from);
    if admin_token.as_ref().is_some_and(|s| s.expose().len() < 16) {
        c.fail("server.admin_token", "must be at least 16 bytes");
    }
    let tls = match (
        raw.tls_cert.filter(|p| !p.is_empty()),
        raw.tls_key.filter(|p| !p.is_empty()),
    ) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            for (path, file) in [("server.tls_cert", &cert), ("server.tls_key", &key)] {
                if let Err(e) = std::fs::metadata(file) {
                    c.fail(path, format!("cannot be read ({})", e.kind()));
                }
            }
            Some((cert.into(), key.into()))
        }
        _ => {
            c.fail(
                "server.tls_cert",
                "set both server.tls_cert and server.tls_key, or neither",
            );
            None
        }
    };
    ServerConfig {
        cors_allow_origins,
        allowed_hosts,
        admin_listen,
        admin_token,
        tls,
        cors_max_age: Duration::from_secs(cors_max_age_s.min(86_400)),
        max_connections: max_connections as usize,
        max_requests_in_flight: max_requests_in_flight as usize,
        max_requests_in_flight_per_tenant: per_tenant_in_flight(
            raw.max_requests_in_flight_per_tenant.unwrap_or(0),
            max_requests_in_flight as usize,
        ),
        max_requests_in_flight_per_tenant_set: raw.max_requests_in_flight_per_tenant.unwrap_or(0),
        header_read_timeout: Duration::from_millis(header_ms),
        keep_alive_idle: Duration::from_millis(keep_alive_ms),
        body_read_timeout: Duration::from_millis(body_ms),
        max_queued_bytes,
        max_queued_bytes_per_tenant: match raw.max_queued_bytes_per_tenant.unwrap_or(0) {
            0 => (max_queued_bytes / 4).max(1),
            n => n.min(max_queued_bytes),
        },
        max_receiving_bytes,
        max_head_bytes: max_head_bytes.clamp(MIN_HEAD_BYTES, MAX_MAX_HEAD_BYTES) as usize,
        client_buffer_bytes: usize::try_from(client_buffer_bytes).unwrap_or(usize::MAX),
        client_write_timeout: Duration::from_millis(client_write_ms),
        unknown_fields,
        demo: raw.demo.unwrap_or(false),
        max_logprobs: max_logprobs.min(20),
        max_body_bytes: max_body_bytes.clamp(1024, 256 * 1024 * 1024) as usize,
        shutdown_grace: Duration::from_millis(shutdown_grace_ms),
        drain_announce: Duration::from_millis({
            let ms = raw.drain_announce_ms.unwrap_or(DRAIN_ANNOUNCE_MS);
            if ms > 600_000 {
                c.fail(
                    "server.drain_announce_ms",
                    "must be at most 600000 (10 minutes)",
                );
            }
            ms.min(600_000)
        }),
        config_watch: match raw.config_watch_ms.unwrap_or(0) {
            0 => None,
            ms if ms < MIN_CONFIG_WATCH_MS => {
                c.fail(
                    "server.config_watch_ms",
                    format!("must be 0 (off) or at least {MIN_CONFIG_WATCH_MS}"),
                );
                None
            }
            ms => Some(Duration::from_millis(ms)),
        },
    }
}

/// An allowed origin as browsers send it (`scheme://host[:port]`, lower case), or `*`.
fn cors_origin(origin: &str) -> Option<String> {
    if origin == "*" {
        return Some(origin.to_owned());
    }
    let (scheme, rest) = origin.split_once("://")?;
    let ok = matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '@', '?', '#', '*', ' ']);
    ok.then(|| origin.to_ascii_lowercase())
}

/// Checks an entry of `server.allowed_hosts`: `*`, a name (letters, digits, `-`, `_`, `.`), an
/// IP address, or `*.` and a name; lower-cased. `None`: not one of those.
pub fn allowed_host(entry: &str) -> Option<String> {
    if entry == "*" {
        return Some(entry.to_owned());
    }
    let (wild, rest) = match entry.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, entry),
    };
    let bare = rest
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(rest);
    if let Some(ip) = bare.parse::<IpAddr>().ok().filter(|_| !wild) {
        return Some(ip.to_string());
    }
    let name = rest.strip_suffix('.').unwrap_or(rest).to_ascii_lowercase();
    let fine = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        });
    fine.then(|| if wild { format!("*.{name}") } else { name })
}
