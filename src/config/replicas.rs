//! `[[upstream.replicas]]` and `[upstream.routing]`: several vLLM replicas behind one gateway,
//! how each one's health is watched, and how a request picks one.
//!
//! Owns [`RawReplica`], [`RawRouting`], [`ReplicaConfig`], [`RoutingConfig`] and
//! [`RoutingPolicy`], their defaults and validation. `upstream.base_url` alone stays the
//! one-replica case: [`UpstreamConfig::replica_set`](super::UpstreamConfig::replica_set) turns
//! it into a set of one.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;

/// Default `upstream.routing.policy`.
const POLICY: RoutingPolicy = RoutingPolicy::Affinity;
/// Default `upstream.routing.balance_factor`.
const BALANCE_FACTOR: f64 = 0.25;
/// Least `upstream.routing.health_interval_ms` but 0.
const MIN_HEALTH_INTERVAL_MS: u64 = 100;
/// Default `upstream.routing.health_interval_ms`.
const HEALTH_INTERVAL_MS: u64 = 2_000;
/// Default `upstream.routing.unhealthy_after`.
const UNHEALTHY_AFTER: u32 = 3;
/// Default `upstream.routing.healthy_after`.
const HEALTHY_AFTER: u32 = 2;
/// Most replicas one gateway routes to (the replica label's values are bounded by it).
pub const MAX_REPLICAS: usize = 64;

/// One `[[upstream.replicas]]` entry as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReplica {
    /// Base URL of this vLLM replica, without `/v1`.
    pub url: Option<String>,
    /// Name in logs and metric labels (default `replica-<n>`, counted from 0).
    pub name: Option<String>,
    /// Relative share of the traffic when loads are equal (default 1).
    pub weight: Option<u32>,
    /// The replica's `--max-num-seqs`: most requests sent to it at once (default: no cap).
    pub max_num_seqs: Option<u32>,
}

/// `[upstream.routing]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    /// `affinity`, `least_loaded` or `round_robin`.
    pub policy: Option<String>,
    /// ε of bounded-load hashing: skip a replica above `(1 + ε) ×` the average load.
    pub balance_factor: Option<f64>,
    /// Active `/health` check interval per replica, ms (0: no active checks, no ejection).
    pub health_interval_ms: Option<u64>,
    /// Consecutive failures (checks, connection errors, 5xx) that eject a replica.
    pub unhealthy_after: Option<u32>,
    /// Consecutive healthy checks that bring an ejected replica back.
    pub healthy_after: Option<u32>,
}

/// One vLLM replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Name in logs and the `replica` metric label.
    pub name: String,
    /// Base URL without a trailing slash and without `/v1`.
    pub url: String,
    /// Relative share of the traffic when loads are equal.
    pub weight: u32,
    /// Most requests in flight on it at once, if capped.
    pub max_num_seqs: Option<u32>,
}

impl ReplicaConfig {
    /// The one replica of a config that names only `upstream.base_url`.
    pub fn single(url: &str) -> Self {
        Self {
            name: "replica-0".to_owned(),
            url: url.trim_end_matches('/').to_owned(),
            weight: 1,
            max_num_seqs: None,
        }
    }
}

/// How a request picks its replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingPolicy {
    /// Rendezvous hashing on the prompt's prefix fingerprint, bounded by load; least loaded
    /// for prompts without a stable prefix.
    Affinity,
    /// The replica with the fewest requests in flight (per weight).
    LeastLoaded,
    /// Each replica in turn (the benchmark's baseline).
    RoundRobin,
}

impl RoutingPolicy {
    /// The name as written in the config file.
    pub const fn as_str(self) -> &'static str {
        match self {
            RoutingPolicy::Affinity => "affinity",
            RoutingPolicy::LeastLoaded => "least_loaded",
            RoutingPolicy::RoundRobin => "round_robin",
        }
    }
}

/// `[upstream.routing]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// How a request picks its replica.
    pub policy: RoutingPolicy,
    /// ε of bounded-load hashing.
    pub balance_factor: f64,
    /// Active `/health` check interval (zero: none, and no replica is ever ejected).
    pub health_interval: Duration,
    /// Consecutive failures that eject a replica.
    pub unhealthy_after: u32,
    /// Consecutive healthy checks that bring it back.
    pub healthy_after: u32,
}

impl Eq for RoutingConfig {}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            policy: POLICY,
            balance_factor: BALANCE_FACTOR,
            health_interval: Duration::from_millis(HEALTH_INTERVAL_MS),
            unhealthy_after: UNHEALTHY_AFTER,
            healthy_after: HEALTHY_AFTER,
        }
    }
}

/// Checks the replicas: each an http(s) URL with a host, names unique and label-safe, weights
/// and caps above 0. Never echoes a URL (it may hold a password).
pub(super) fn replicas(c: &mut Checker, raw: Vec<RawReplica>) -> Vec<ReplicaConfig> {
    if raw.len() > MAX_REPLICAS {
        c.fail(
            "upstream.replicas",
            format!("must list at most {MAX_REPLICAS} replicas"),
        );
    }
    let mut out: Vec<ReplicaConfig> = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let path = |key: &str| format!("upstream.replicas[{i}].{key}");
        let url = match r.url {
            Some(u) if is_http_url(&u) && ends_in_v1(&u) => {
                c.fail(path("url"), NOT_V1);
                String::new()
            }
            Some(u) if is_http_url(&u) => u.trim_end_matches('/').to_owned(),
            Some(_) => {
                c.fail(
                    path("url"),
                    "must be an http:// or https:// URL with a host",
                );
                String::new()
            }
            None => {
                c.fail(path("url"), "is required");
                String::new()
            }
        };
        let name = r.name.unwrap_or_else(|| format!("replica-{i}"));
        let label_safe = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !label_safe {
            c.fail(
                path("name"),
                "must be 1 to 64 characters of letters, digits, '-', '_' or '.'",
            );
        }
        if out.iter().any(|o| o.name == name) {
            c.fail(path("name"), "is used by another replica");
        }
        if !url.is_empty() && out.iter().any(|o| o.url == url) {
            c.fail(path("url"), "is the URL of another replica");
        }
        let weight = c.u32(&path("weight"), r.weight, 1).get();
        c.at_most(&path("weight"), u64::from(weight), 1000, "1000");
        let max_num_seqs = r.max_num_seqs.map(|n| {
            if n == 0 {
                c.fail(path("max_num_seqs"), "must be > 0");
            }
            n.max(1)
        });
        out.push(ReplicaConfig {
            name,
            url,
            weight,
            max_num_seqs,
        });
    }
    out
}

/// Checks `[upstream.routing]`.
pub(super) fn routing(c: &mut Checker, raw: RawRouting) -> RoutingConfig {
    let policy = match raw.policy.as_deref() {
        None => POLICY,
        Some("affinity") => RoutingPolicy::Affinity,
        Some("least_loaded") => RoutingPolicy::LeastLoaded,
        Some("round_robin") => RoutingPolicy::RoundRobin,
        Some(_) => {
            c.fail(
                "upstream.routing.policy",
                "must be one of affinity, least_loaded, round_robin",
            );
            POLICY
        }
    };
    let balance_factor = raw.balance_factor.unwrap_or(BALANCE_FACTOR);
    if !(balance_factor.is_finite() && balance_factor > 0.0 && balance_factor <= 10.0) {
        c.fail(
            "upstream.routing.balance_factor",
            "must be > 0 and <= 10 (0.25: a replica may take 25% more than the average load)",
        );
    }
    // Each probe must answer within the interval: a few milliseconds would fail every replica.
    let health_interval_ms = raw.health_interval_ms.unwrap_or(HEALTH_INTERVAL_MS);
    if (1..MIN_HEALTH_INTERVAL_MS).contains(&health_interval_ms) {
        c.fail(
            "upstream.routing.health_interval_ms",
            format!(
                "must be 0 (no checks) or at least {MIN_HEALTH_INTERVAL_MS}: each /health must \
                 answer within the interval"
            ),
        );
    }
    c.at_most(
        "upstream.routing.health_interval_ms",
        health_interval_ms,
        60_000,
        "60000 (a minute): only a check brings an ejected replica back",
    );
    let unhealthy_after = c
        .u32(
            "upstream.routing.unhealthy_after",
            raw.unhealthy_after,
            UNHEALTHY_AFTER,
        )
        .get();
    let healthy_after = c
        .u32(
            "upstream.routing.healthy_after",
            raw.healthy_after,
            HEALTHY_AFTER,
        )
        .get();
    c.at_most(
        "upstream.routing.unhealthy_after",
        u64::from(unhealthy_after),
        100,
        "100",
    );
    c.at_most(
        "upstream.routing.healthy_after",
        u64::from(healthy_after),
        100,
        "100",
    );
    RoutingConfig {
        policy,
        balance_factor: balance_factor.clamp(0.01, 10.0),
        health_interval: Duration::from_millis(health_interval_ms),
        unhealthy_after,
        healthy_after,
    }
}

/// What is wrong with an engine URL that ends in `/v1`: the gateway adds `/v1/...` itself, so
/// every request would go to `/v1/v1/...` and come back 404 (which looks like the client's
/// fault).
pub(super) const NOT_V1: &str =
    "must be vLLM's server root, without /v1 (the gateway adds /v1/... itself): \
     http://host:8000, not http://host:8000/v1";

/// Whether `url`'s path (not its host) ends in `/v1`, a trailing slash aside.
pub(super) fn ends_in_v1(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    path.trim_end_matches('/')
        .to_ascii_lowercase()
        .ends_with("/v1")
}

/// `http://` or `https://` followed by a host.
pub(super) fn is_http_url(url: &str) -> bool {
    url.strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .is_some_and(|h| !h.trim_end_matches('/').is_empty())
}
