//! `[quota]`: where the lane quota lives, and what happens when Redis is unreachable.
//!
//! Owns [`RawQuota`], [`QuotaConfig`], [`QuotaBackend`], [`OnRedisDown`] and [`RedisUrl`], their
//! defaults and validation. The rule that ties the backend to `admission.policy` is a
//! cross-section check, in `file.rs`.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;

/// Default `quota.backend`.
const BACKEND: &str = "local";
/// Default `quota.redis_url`.
const REDIS_URL: &str = "redis://127.0.0.1:6379/0";
/// Default `quota.lease_ttl_ms`.
const LEASE_TTL_MS: u64 = 10_000;
/// Least `quota.lease_ttl_ms`: twice the longest a Redis call may take (500 ms).
const MIN_LEASE_TTL_MS: u64 = 1_000;
/// Default `quota.heartbeat_ms`.
const HEARTBEAT_MS: u64 = 2_000;
/// Default `quota.key_prefix`.
const KEY_PREFIX: &str = "tg:v2";
/// Default `quota.on_redis_down`.
const ON_REDIS_DOWN: &str = "fail_open";
/// Default `quota.expected_replicas`.
const EXPECTED_REPLICAS: u32 = 2;
/// Default `quota.batch_max`.
const BATCH_MAX: u32 = 32;
/// Largest `quota.batch_max`: one script call stays well under a millisecond of Redis's time.
const BATCH_MAX_MOST: u32 = 256;

/// `[quota]` as written.
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
    /// Leases one acquire (a line's head and those behind it) or release call carries at most.
    pub batch_max: Option<u32>,
    /// PEM CA certificate(s) a `rediss://` server's certificate is checked against.
    pub redis_ca_file: Option<String>,
    /// An environment variable holding the Redis password (kept out of `redis_url`).
    pub redis_password_env: Option<String>,
    /// A file holding the Redis password (kept out of `redis_url`).
    pub redis_password_file: Option<String>,
}

/// Where admission counts slots and tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaBackend {
    /// In this process only: right for one replica.
    Local,
    /// In Redis, shared by every replica (M15).
    Redis,
}

/// What a replica does while Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRedisDown {
    /// Admit under local limits: the global limits divided by `expected_replicas`.
    FailOpen,
    /// Refuse new requests with 503 until Redis is back.
    FailClosed,
}

/// A Redis URL that may carry a password: `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// Wraps `url` (not validated here; see `validate`).
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its password, for the Redis client only. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any `user:password@` part replaced by `***@`, and the value of a query
    /// parameter naming a password (`?pass=`, which the Redis client reads for a `unix://`
    /// socket) by `***`, safe for logs.
    pub fn redacted(&self) -> String {
        let (url, query) = match self.0.split_once('?') {
            Some((url, query)) => (url, Some(query)),
            None => (self.0.as_str(), None),
        };
        let mut out = match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}***{}", &url[..scheme + 3], &url[at..])
            }
            _ => url.to_owned(),
        };
        if let Some(query) = query {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.to_ascii_lowercase().contains("pass") => {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            out.push('?');
            out.push_str(&pairs.join("&"));
        }
        out
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({:?})", self.redacted())
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `[quota]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Local or Redis.
    pub backend: QuotaBackend,
    /// The Redis server (backend `redis`); `rediss://` is TLS (rustls).
    pub redis_url: RedisUrl,
    /// With `rediss://`: PEM CA certificates to trust instead of the system's roots.
    pub redis_ca_pem: Option<Vec<u8>>,
    /// How long a lease lives without renewal: the longest a crashed replica's slots stay taken.
    pub lease_ttl: Duration,
    /// How often a replica renews its leases; at most a third of `lease_ttl`.
    pub heartbeat: Duration,
    /// Prefix of every key (a version in it lets old and new layouts run side by side).
    pub key_prefix: String,
    /// Behaviour while Redis is unreachable.
    pub on_redis_down: OnRedisDown,
    /// Replicas the global limits are divided by under `fail_open`.
    pub expected_replicas: NonZeroU32,
    /// Leases one script call takes (a line's head and the waiters behind it) or gives back
    /// at most; 1: one lease a call.
    pub batch_max: u32,
}

/// Checks `[quota]`. Never echoes the URL: it may hold a password.
pub(super) fn validate(c: &mut Checker, raw: RawQuota) -> QuotaConfig {
    let backend = match raw.backend.as_deref().unwrap_or(BACKEND) {
        "local" => QuotaBackend::Local,
        "redis" => QuotaBackend::Redis,
        _ => {
            c.fail("quota.backend", "must be \"local\" or \"redis\"");
            QuotaBackend::Local
        }
    };
    let mut url = raw.redis_url.unwrap_or_else(|| REDIS_URL.to_owned());
    if redis::Client::open(url.as_str()).is_err() {
        c.fail(
            "quota.redis_url",
            "must be a redis://host:port/db or unix:///path URL",
        );
    }
    let from = if raw
        .redis_password_file
        .as_deref()
        .is_some_and(|f| !f.is_empty())
    {
        "quota.redis_password_file"
    } else {
        "quota.redis_password_env"
    };
    let password = c.secret(
        ("quota.redis_password_env", raw.redis_password_env),
        ("quota.redis_password_file", raw.redis_password_file),
    );
    if let Some(password) = password {
        match with_password(&url, &password) {
            Ok(full) => url = full,
            Err(why) => c.fail(from, why),
        }
    }
    let redis_ca_pem = super::upstream::ca_pem(c, "quota.redis_ca_file", raw.redis_ca_file);
    if redis_ca_pem.is_some() && !url.starts_with("rediss://") {
        c.fail(
            "quota.redis_ca_file",
            "needs a TLS quota.redis_url (rediss://host:port/db)",
        );
    }
    let lease_ttl = c.ms("quota.lease_ttl_ms", raw.lease_ttl_ms, LEASE_TTL_MS);
    let heartbeat = c.ms("quota.heartbeat_ms", raw.heartbeat_ms, HEARTBEAT_MS);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    c.at_most(
        "quota.lease_ttl_ms",
        ms(lease_ttl),
        3_600_000,
        "3600000 (an hour: a crashed replica's seats come back only then)",
    );
    if (1..100).contains(&ms(heartbeat)) {
        c.fail(
            "quota.heartbeat_ms",
            "must be at least 100 (each beat is a Redis call per replica)",
        );
    }
    if backend == QuotaBackend::Redis
        && !lease_ttl.is_zero()
        && lease_ttl < Duration::from_millis(MIN_LEASE_TTL_MS)
    {
        c.fail(
            "quota.lease_ttl_ms",
            format!(
                "must be >= {MIN_LEASE_TTL_MS}: twice the 500 ms a Redis call may take, or a \
                 slow renewal lets the leases of running requests expire"
            ),
        );
    }
    if heartbeat * 3 > lease_ttl {
        c.fail(
            "quota.heartbeat_ms",
            "must be <= a third of quota.lease_ttl_ms, so a lease survives two missed beats",
        );
    }
    let key_prefix = raw.key_prefix.unwrap_or_else(|| KEY_PREFIX.to_owned());
    if key_prefix.is_empty() || key_prefix.contains(['{', '}']) {
        c.fail(
            "quota.key_prefix",
            "must be non-empty and without braces (the {quota} hash tag is added)",
        );
    }
    let on_redis_down = match raw.on_redis_down.as_deref().unwrap_or(ON_REDIS_DOWN) {
        "fail_open" => OnRedisDown::FailOpen,
        "fail_closed" => OnRedisDown::FailClosed,
        _ => {
            c.fail(
                "quota.on_redis_down",
                "must be \"fail_open\" or \"fail_closed\"",
            );
            OnRedisDown::FailOpen
        }
    };
    let expected_replicas = NonZeroU32::new(raw.expected_replicas.unwrap_or(EXPECTED_REPLICAS))
        .unwrap_or_else(|| {
            c.fail("quota.expected_replicas", "must be > 0");
            NonZeroU32::MIN
        });
    let batch_max = raw.batch_max.unwrap_or(BATCH_MAX);
    if !(1..=BATCH_MAX_MOST).contains(&batch_max) {
        c.fail(
            "quota.batch_max",
            format!("must be 1 to {BATCH_MAX_MOST} (1: one lease a script call)"),
        );
    }
    QuotaConfig {
        backend,
        redis_url: RedisUrl::new(url),
        redis_ca_pem,
        lease_ttl,
        heartbeat,
        key_prefix,
        on_redis_down,
        expected_replicas,
        batch_max: batch_max.clamp(1, BATCH_MAX_MOST),
    }
}

/// `url` with `password` as its password (percent-encoded, no user), or why it cannot take one.
fn with_password(url: &str, password: &str) -> Result<String, &'static str> {
    if password.is_empty() {
        return Err("is empty");
    }
    let rest = url
        .strip_prefix("redis://")
        .map(|r| ("redis://", r))
        .or_else(|| url.strip_prefix("rediss://").map(|r| ("rediss://", r)));
    let Some((scheme, rest)) = rest else {
        return Err("needs a redis:// or rediss:// quota.redis_url");
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    if authority.contains('@') {
        return Err(
            "must not be set while quota.redis_url carries user:password@ (keep the password in \
             one place)",
        );
    }
    let mut encoded = String::with_capacity(password.len() * 3);
    for b in password.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(format!("{scheme}:{encoded}@{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_never_prints_its_password() {
        let url = RedisUrl::new("redis://user:hunter2@cache:6379/0");
        assert_eq!(url.to_string(), "redis://***@cache:6379/0");
        assert!(!format!("{url:?}").contains("hunter2"));
        // A socket's password rides in the query, where the Redis client reads it.
        let url = RedisUrl::new("unix:///run/redis.sock?db=1&pass=hunter2");
        let info = redis::Client::open(url.expose()).unwrap();
        assert_eq!(
            info.get_connection_info().redis.password.as_deref(),
            Some("hunter2")
        );
        assert_eq!(url.to_string(), "unix:///run/redis.sock?db=1&pass=***");
        assert!(!format!("{url:?}").contains("hunter2"));
    }

    #[test]
    fn a_password_from_outside_the_file_joins_the_url_encoded() {
        let full = with_password("rediss://cache:6380/0", "p@ss:w/rd").unwrap();
        assert_eq!(full, "rediss://:p%40ss%3Aw%2Frd@cache:6380/0");
        let info = redis::Client::open(full.as_str()).unwrap();
        assert_eq!(
            info.get_connection_info().redis.password.as_deref(),
            Some("p@ss:w/rd")
        );
        assert!(with_password("redis://u:x@cache:6379/0", "y").is_err());
        assert!(with_password("unix:///run/redis.sock", "y").is_err());
        assert!(with_password("redis://cache:6379/0", "").is_err());
    }
}
