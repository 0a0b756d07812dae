//! `[jobs]`: repository reviews as background jobs (`POST /jobs`), their bounds, result
//! lifetime and webhooks.
//!
//! Owns [`RawJobs`], [`JobsConfig`] and [`WebhookPattern`], their defaults and validation.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use super::secret::Secret;

/// Default `jobs.max_jobs`.
const MAX_JOBS: u64 = 1_000;
/// Default `jobs.max_bytes` (64 MiB).
const MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Default `jobs.result_ttl_ms` (one hour).
const RESULT_TTL_MS: u64 = 3_600_000;
/// Default `jobs.max_attempts`.
const MAX_ATTEMPTS: u32 = 3;
/// Default `jobs.max_preemptions`.
const MAX_PREEMPTIONS: u32 = 3;
/// Default `jobs.engine_retries`.
const ENGINE_RETRIES: u32 = 3;
/// Default `jobs.preempt_prefill_grace_tokens`.
const PREEMPT_PREFILL_GRACE_TOKENS: u32 = 1_024;
/// Default `jobs.preempt_cooldown_ms`.
const PREEMPT_COOLDOWN_MS: u64 = 5_000;
/// Most `jobs.preempt_cooldown_ms` (ten minutes).
const MAX_PREEMPT_COOLDOWN_MS: u64 = 600_000;
/// Default `jobs.webhook_attempts`.
const WEBHOOK_ATTEMPTS: u32 = 5;
/// Default `jobs.webhook_backoff_ms`.
const WEBHOOK_BACKOFF_MS: u64 = 1_000;
/// Default `jobs.webhook_timeout_ms`.
const WEBHOOK_TIMEOUT_MS: u64 = 10_000;
/// Default `jobs.max_event_streams_per_tenant`.
const MAX_EVENT_STREAMS_PER_TENANT: u64 = 256;
/// The environment variable that may hold the webhook secret instead of the file.
pub const WEBHOOK_SECRET_ENV: &str = "TUTOR_GATEWAY_WEBHOOK_SECRET";
/// The shortest webhook secret accepted, bytes.
const MIN_SECRET: usize = 16;

/// `[jobs]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJobs {
    /// Accept `POST /jobs`.
    pub enabled: Option<bool>,
    /// Jobs kept at once (queued, running, finished until expiry).
    pub max_jobs: Option<u64>,
    /// Bytes of job bodies and answers kept at once.
    pub max_bytes: Option<u64>,
    /// Jobs one tenant may keep at once; 0: a quarter of `max_jobs`.
    pub max_jobs_per_tenant: Option<u64>,
    /// Bytes one tenant's jobs may keep at once; 0: a quarter of `max_bytes`.
    pub max_bytes_per_tenant: Option<u64>,
    /// Jobs running at once; 0: only the large lane's own seats bound them.
    pub max_running: Option<u32>,
    /// How long a finished job's result stays readable, ms.
    pub result_ttl_ms: Option<u64>,
    /// Runs a job may lose with their gateway (Redis backend).
    pub max_attempts: Option<u32>,
    /// URL patterns a job's `notify` must match.
    pub webhook_allow: Option<Vec<String>>,
    /// The HMAC-SHA256 key webhooks are signed with.
    pub webhook_secret: Option<Secret>,
    /// Delivery attempts per webhook.
    pub webhook_attempts: Option<u32>,
    /// Delay before the first retry, ms (doubled each retry, with jitter).
    pub webhook_backoff_ms: Option<u64>,
    /// Each attempt's timeout, ms.
    pub webhook_timeout_ms: Option<u64>,
    /// Deliver webhooks to names that resolve to loopback, link-local or private addresses.
    pub webhook_allow_private: Option<bool>,
    /// `GET /jobs/{id}/events` streams one tenant may hold open at once on a replica.
    pub max_event_streams_per_tenant: Option<u64>,
    /// A large `/answer` that waited this long for its seat becomes a job, ms; 0: never.
    pub divert_large_after_ms: Option<u64>,
    /// Jobs take any lane's idle seats and give them back to interactive requests at once.
    pub preempt: Option<bool>,
    /// Times one job may be pre-empted; then it keeps its seat.
    pub max_preemptions: Option<u32>,
    /// Times a job's run cut by the engine goes on from its text once the engine is back.
    pub engine_retries: Option<u32>,
    /// A job whose prefill is within this many tokens of done is not pre-empted before its
    /// first token.
    pub preempt_prefill_grace_tokens: Option<u32>,
    /// After an interactive request last waited, no pre-emptible work starts or resumes for
    /// this long, ms; 0: it may as soon as nobody waits.
    pub preempt_cooldown_ms: Option<u64>,
    /// Which large `/answer` streams are pre-emptible: `off`, `marked`, `large`.
    pub preempt_answers: Option<String>,
    /// A pre-empted `/answer` stream tells its client with a `meta` event.
    pub preempt_notice: Option<bool>,
    /// Jobs' long prompts are prefilled in pieces of this many tokens; 0: as any request's.
    pub prefill_piece_tokens: Option<u32>,
}

/// Which large `/answer` streams may borrow idle seats, pre-emptible (`jobs.preempt_answers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptAnswers {
    /// None (the default).
    #[default]
    Off,
    /// Those that ask with `x-tutor-preemptible: true`.
    Marked,
    /// Every large `/answer`.
    Large,
}

impl PreemptAnswers {
    /// Whether a large `/answer` whose header said `marked` is pre-emptible.
    pub fn applies(self, marked: bool) -> bool {
        match self {
            PreemptAnswers::Off => false,
            PreemptAnswers::Marked => marked,
            PreemptAnswers::Large => true,
        }
    }
}

/// One `jobs.webhook_allow` entry: `scheme://host[:port]/path`, where the host may start with
/// `*.` (any subdomain, not the domain itself) and the path may end with `/*` (any rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookPattern {
    /// `http` or `https`.
    pub scheme: String,
    /// Lower-case host; `*.example.edu` matches subdomains of `example.edu`.
    pub host: String,
    /// The port, explicit or the scheme's default.
    pub port: u16,
    /// The path, or its prefix when `prefix` is set.
    pub path: String,
    /// The path ended with `*`.
    pub prefix: bool,
}

/// Background jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsConfig {
    /// Whether `POST /jobs` is served.
    pub enabled: bool,
    /// Jobs kept at once; a submission beyond it gets 429.
    pub max_jobs: usize,
    /// Bytes of bodies and answers kept at once; a submission beyond it gets 429.
    pub max_bytes: u64,
    /// Jobs one tenant (`[auth]`) may keep at once; beyond it 429 `tenant_jobs_full`.
    pub max_jobs_per_tenant: usize,
    /// Bytes one tenant's jobs may keep at once; beyond it 429 `tenant_jobs_full`.
    pub max_bytes_per_tenant: u64,
    /// Jobs running at once; 0: only the large lane's own seats bound them.
    pub max_running: usize,
    /// How long a finished job's result stays readable.
    pub result_ttl: Duration,
    /// With the Redis backend: how many runs a job may lose with the gateway running it
    /// (its runner lease expires; clean hand-backs do not count); then it fails with
    /// `runner_lost`.
    pub max_attempts: u32,
    /// Where webhooks may go; empty: `notify` is refused.
    pub webhook_allow: Vec<WebhookPattern>,
    /// The signing key (never logged or echoed).
    pub webhook_secret: Option<Secret>,
    /// Delivery attempts per webhook.
    pub webhook_attempts: u32,
    /// Delay before the first retry.
    pub webhook_backoff: Duration,
    /// Each attempt's timeout.
    pub webhook_timeout: Duration,
    /// Whether a webhook host name may resolve to a loopback, link-local, private or
    /// unspecified address (off: such addresses are never connected to; an IP literal on
    /// `webhook_allow` is an explicit allowance and always reachable).
    pub webhook_allow_private: bool,
    /// `GET /jobs/{id}/events` streams one tenant (or, with `[auth]` off, all clients
    /// together) may hold open at once on this replica; 429 beyond.
    pub max_event_streams_per_tenant: usize,
    /// A large `/answer` that waited this long for its seat becomes a job; `None`: never.
    pub divert_large_after: Option<Duration>,
    /// Jobs take any lane's idle own seats, pre-emptible: an interactive request that finds no
    /// seat makes the job that loses least leave, and the job resumes where it stopped (see
    /// `crate::admission::preempt`), in process and fleet-wide on the Redis backend. On by
    /// default: jobs that only ever took the large lane's idle seats still took the engine time
    /// questions needed at a busy hour, and kept it.
    pub preempt: bool,
    /// Times one job may be pre-empted (then it keeps its seat to its end).
    pub max_preemptions: u32,
    /// Times a job's run cut by the engine (unreachable, a 5xx, a stream cut, a timeout) goes
    /// on, once the engine is ready again, from the text it had; the next such cut fails the
    /// job with the reason. 0: the first fails it.
    pub engine_retries: u32,
    /// A job still prefilling and estimated within this many prompt tokens of its first token
    /// is pre-empted only after that token.
    pub preempt_prefill_grace_tokens: u32,
    /// After an interactive request last waited in a queue, no pre-emptible work takes a seat
    /// for this long (zero: as soon as nobody waits): at a crest of questions a pre-empted job
    /// would otherwise come back at each moment the queues are empty and be asked to leave
    /// again. With the Redis backend: after any replica's request was last refused a seat.
    pub preempt_cooldown: Duration,
    /// Large `/answer` streams that borrow idle seats as jobs do and, pre-empted, continue
    /// without a break for their client (in-process admission only).
    pub preempt_answers: PreemptAnswers,
    /// A pre-empted `/answer` stream sends a `meta` event `{"preempted": n}` where it goes on.
    pub preempt_notice: bool,
    /// A job's prompt longer than twice this is prefilled in pieces of this many tokens
    /// (`crate::pipeline::pieces`), so an engine step carries at most one piece of it beside
    /// the questions' prompts; 0: a job is pieced as any request is
    /// (`admission.prefill_piece_tokens`, or the autopilot's size).
    pub prefill_piece_tokens: u32,
}

impl WebhookPattern {
    /// Reads one pattern; `None` when it is not `https://host[:port]/path[*]` (or `http://`
    /// to a loopback host: `localhost`, `127.x.x.x`).
    pub fn parse(pattern: &str) -> Option<Self> {
        let (scheme, rest) = pattern.split_once("://")?;
        let default_port = match scheme {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        if authority.contains('@') || authority.is_empty() {
            return None;
        }
        // IPv6 literals are not supported (a host never contains `:`).
        let (host, port) = match authority.split_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().ok()?),
            None => (authority, default_port),
        };
        let bare = host.strip_prefix("*.").unwrap_or(host);
        if bare.is_empty() || bare.contains('*') {
            return None;
        }
        // The job's answer and its signature travel in the clear over http: only to this
        // machine (a sidecar, a test receiver).
        if scheme == "http" && !is_loopback_host(host) {
            return None;
        }
        let (path, prefix) = match path.strip_suffix('*') {
            Some(p) => (p, true),
            None => (path, false),
        };
        // A prefix ends at a path segment (`/hooks/*`, not `/hook*`, which would also match
        // `/hookshot`).
        if path.contains('*') || (prefix && !path.ends_with('/')) {
            return None;
        }
        Some(Self {
            scheme: scheme.to_owned(),
            host: host.to_ascii_lowercase(),
            port,
            path: path.to_owned(),
            prefix,
        })
    }

    /// Whether a URL with these (already normalised) parts matches.
    pub fn matches(&self, scheme: &str, host: &str, port: u16, path: &str) -> bool {
        let host_ok = match self.host.strip_prefix("*.") {
            // A wildcard names host names, never an address (`*.0.0.1` is not 127.0.0.1).
            Some(_) if host.parse::<std::net::Ipv4Addr>().is_ok() => false,
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => host == self.host,
        };
        let path_ok = if self.prefix {
            path.starts_with(&self.path)
        } else {
            path == self.path
        };
        scheme == self.scheme && host_ok && port == self.port && path_ok
    }
}

/// Checks `[jobs]`. The webhook secret may come from [`WEBHOOK_SECRET_ENV`] instead of the file.
pub(super) fn validate(c: &mut Checker, raw: RawJobs) -> JobsConfig {
    let max_jobs = c.u64("jobs.max_jobs", raw.max_jobs, MAX_JOBS).get();
    let max_bytes = c.u64("jobs.max_bytes", raw.max_bytes, MAX_BYTES).get();
    c.at_most("jobs.max_jobs", max_jobs, 10_000_000, "10000000");
    c.at_most(
        "jobs.max_bytes",
        max_bytes,
        1 << 40,
        "1099511627776 (1 TiB; in process the jobs are held in memory)",
    );
    let ms = |v: Option<u64>, default: u64| v.unwrap_or(default);
    c.at_most(
        "jobs.result_ttl_ms",
        ms(raw.result_ttl_ms, RESULT_TTL_MS),
        604_800_000,
        "604800000 (a week)",
    );
    c.at_most(
        "jobs.webhook_timeout_ms",
        ms(raw.webhook_timeout_ms, WEBHOOK_TIMEOUT_MS),
        60_000,
        "60000 (a minute)",
    );
    let mut webhook_allow = Vec::new();
    for (i, p) in raw.webhook_allow.unwrap_or_default().iter().enumerate() {
        match WebhookPattern::parse(p) {
            // A name resolving to this machine is refused at connection time unless private
            // addresses are allowed (whoever controls a listed name's DNS could point it here):
            // `localhost` would never be delivered to.
            Some(pattern)
                if pattern.host.eq_ignore_ascii_case("localhost")
                    && !raw.webhook_allow_private.unwrap_or(false) =>
            {
                c.fail(
                    format!("jobs.webhook_allow[{i}]"),
                    "names localhost, which webhooks reach only with \
                     jobs.webhook_allow_private = true (names are kept to public addresses); \
                     write 127.0.0.1 for a receiver on this machine",
                );
            }
            Some(pattern) => webhook_allow.push(pattern),
            None => c.fail(
                format!("jobs.webhook_allow[{i}]"),
                "must look like https://host[:port]/path (http:// only to localhost or \
                 127.x.x.x: the answer and its signature would travel in the clear), the host \
                 may start with `*.` and the path may end with `/*`",
            ),
        }
    }
    // Trimmed, as every secret: one from a Secret made with `--from-file` of a file written by
    // `echo` ends in a newline, which signed every webhook with a key no receiver holds.
    let webhook_secret = raw
        .webhook_secret
        .map(|s| s.expose().trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| c.env(WEBHOOK_SECRET_ENV))
        .map(Secret::from);
    match &webhook_secret {
        Some(s) if s.expose().len() < MIN_SECRET => c.fail(
            "jobs.webhook_secret",
            format!("must be at least {MIN_SECRET} bytes"),
        ),
        None if !webhook_allow.is_empty() => c.fail(
            "jobs.webhook_secret",
            format!("must be set (or {WEBHOOK_SECRET_ENV}) when jobs.webhook_allow is"),
        ),
        _ => {}
    }
    let webhook_attempts = c
        .u32(
            "jobs.webhook_attempts",
            raw.webhook_attempts,
            WEBHOOK_ATTEMPTS,
        )
        .get();
    if webhook_attempts > 20 {
        c.fail("jobs.webhook_attempts", "must be at most 20");
    }
    let max_attempts = c
        .u32("jobs.max_attempts", raw.max_attempts, MAX_ATTEMPTS)
        .get();
    if max_attempts > 100 {
        c.fail("jobs.max_attempts", "must be at most 100");
    }
    let max_preemptions = raw.max_preemptions.unwrap_or(MAX_PREEMPTIONS);
    if max_preemptions > 100 {
        c.fail("jobs.max_preemptions", "must be at most 100");
    }
    let engine_retries = raw.engine_retries.unwrap_or(ENGINE_RETRIES);
    if engine_retries > 100 {
        c.fail("jobs.engine_retries", "must be at most 100");
    }
    let preempt_cooldown_ms = raw.preempt_cooldown_ms.unwrap_or(PREEMPT_COOLDOWN_MS);
    if preempt_cooldown_ms > MAX_PREEMPT_COOLDOWN_MS {
        c.fail(
            "jobs.preempt_cooldown_ms",
            "must be at most 600000 (ten minutes)",
        );
    }
    let preempt_answers = match raw.preempt_answers.as_deref() {
        None | Some("off") => PreemptAnswers::Off,
        Some("marked") => PreemptAnswers::Marked,
        Some("large") => PreemptAnswers::Large,
        Some(_) => {
            c.fail(
                "jobs.preempt_answers",
                "must be \"off\", \"marked\" or \"large\"",
            );
            PreemptAnswers::Off
        }
    };
    JobsConfig {
        preempt_answers,
        preempt_notice: raw.preempt_notice.unwrap_or(false),
        prefill_piece_tokens: super::admission::piece_tokens(
            c,
            "jobs.prefill_piece_tokens",
            raw.prefill_piece_tokens,
        ),
        preempt: raw.preempt.unwrap_or(true),
        max_preemptions: max_preemptions.min(100),
        engine_retries: engine_retries.min(100),
        preempt_cooldown: Duration::from_millis(preempt_cooldown_ms.min(MAX_PREEMPT_COOLDOWN_MS)),
        preempt_prefill_grace_tokens: raw
            .preempt_prefill_grace_tokens
            .unwrap_or(PREEMPT_PREFILL_GRACE_TOKENS),
        enabled: raw.enabled.unwrap_or(true),
        max_attempts: max_attempts.min(100),
        max_jobs: usize::try_from(max_jobs).unwrap_or(usize::MAX),
        max_bytes,
        max_jobs_per_tenant: usize::try_from(match raw.max_jobs_per_tenant.unwrap_or(0) {
            0 => (max_jobs / 4).max(1),
            n => n.min(max_jobs),
        })
        .unwrap_or(usize::MAX),
        max_bytes_per_tenant: match raw.max_bytes_per_tenant.unwrap_or(0) {
            0 => (max_bytes / 4).max(1),
            n => n.min(max_bytes),
        },
        max_running: raw.max_running.unwrap_or(0) as usize,
        result_ttl: c.ms("jobs.result_ttl_ms", raw.result_ttl_ms, RESULT_TTL_MS),
        webhook_allow,
        webhook_secret,
        webhook_attempts: webhook_attempts.min(20),
        webhook_backoff: c.ms(
            "jobs.webhook_backoff_ms",
            raw.webhook_backoff_ms,
            WEBHOOK_BACKOFF_MS,
        ),
        webhook_timeout: c.ms(
            "jobs.webhook_timeout_ms",
            raw.webhook_timeout_ms,
            WEBHOOK_TIMEOUT_MS,
        ),
        webhook_allow_private: raw.webhook_allow_private.unwrap_or(false),
        max_event_streams_per_tenant: usize::try_from(
            c.u64(
                "jobs.max_event_streams_per_tenant",
                raw.max_event_streams_per_tenant,
                MAX_EVENT_STREAMS_PER_TENANT,
            )
            .get(),
        )
        .unwrap_or(usize::MAX),
        divert_large_after: raw
            .divert_large_after_ms
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis),
    }
}

/// `localhost` or an IPv4 loopback literal (`127.0.0.0/8`).
fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::WebhookPattern;

    fn matches(pattern: &str, url: (&str, &str, u16, &str)) -> bool {
        WebhookPattern::parse(pattern)
            .unwrap()
            .matches(url.0, url.1, url.2, url.3)
    }

    #[test]
    fn patterns_match_scheme_host_port_and_path() {
        let p = "https://hooks.example.edu/tutor/*";
        assert!(matches(
            p,
            ("https", "hooks.example.edu", 443, "/tutor/done")
        ));
        assert!(!matches(
            p,
            ("http", "hooks.example.edu", 443, "/tutor/done")
        ));
        assert!(!matches(
            p,
            ("https", "hooks.example.edu", 8443, "/tutor/done")
        ));
        assert!(!matches(p, ("https", "evil.edu", 443, "/tutor/done")));
        assert!(!matches(p, ("https", "hooks.example.edu", 443, "/other")));
        let sub = "https://*.example.edu/hook";
        assert!(matches(sub, ("https", "a.example.edu", 443, "/hook")));
        assert!(!matches(sub, ("https", "example.edu", 443, "/hook")));
        assert!(!matches(sub, ("https", "badexample.edu", 443, "/hook")));
        assert!(!matches(sub, ("https", "a.example.edu", 443, "/hook/x")));
        assert!(matches(
            "http://127.0.0.1:9000/*",
            ("http", "127.0.0.1", 9000, "/")
        ));
        assert!(matches(
            "http://localhost:9000/hook",
            ("http", "localhost", 9000, "/hook")
        ));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for p in [
            "ftp://x/",
            "https://",
            "https://user@host/",
            "https://*/",
            "https://a*b.edu/",
            "https://host/a*b",
            "https://host/hook*",
            "https://host:99999/",
            "hooks.example.edu/",
            // In the clear: only to this machine.
            "http://hooks.example.edu/",
            "http://10.0.0.5:8080/hooks/*",
            "http://*.localhost/",
        ] {
            assert!(WebhookPattern::parse(p).is_none(), "{p}");
        }
    }
}
