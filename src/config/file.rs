//! The whole file: the top-level [`RawConfig`] and [`Config`], the `listen` key, and the one
//! [`validate`] that checks every section and then the rules that span sections.
//!
//! Each section's keys are checked by its own file (`server.rs`, `fields.rs`, `upstream.rs`, `classify.rs`,
//! `admission.rs`, `promotion.rs`, `telemetry.rs`, `quota.rs`, `jobs.rs`, `prefix.rs`); this file only
//! calls them in order and owns the cross-section checks.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;

use super::admission::{self, AdmissionConfig, LanesConfig, Policy, RawAdmission, RawLanes};
use super::auth::{self, AuthConfig, RawAuth};
use super::autopilot::{self, AutopilotConfig, RawAutopilot};
use super::check::Checker;
use super::classify::{self, ClassifyConfig, RawClassify};
use super::course::CourseConfig;
use super::error::ConfigError;
use super::fields::{self, FieldsConfig, RawFields};
use super::jobs::{self, JobsConfig, RawJobs};
use super::prefix::{self, PrefixCacheConfig, RawCourse, RawPrefixCache};
use super::promotion::{self, PromotionConfig, RawPromotion};
use super::quota::{self, QuotaBackend, QuotaConfig, RawQuota};
use super::server::{self, RawServer, ServerConfig};
use super::telemetry::{self, RawTelemetry, TelemetryConfig};
use super::upstream::{self, RawUpstream, UpstreamConfig};
use crate::lane::Lane;

/// Default `listen`.
const LISTEN: &str = "127.0.0.1:8080";

/// The whole file as written, every key optional. Top-level sections are deserialized one by
/// one (see `parse.rs`) so that a bad value in one section does not hide the problems in the
/// others. Unknown keys are rejected (`deny_unknown_fields`): a typo must not silently fall back
/// to a default.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `listen`: socket address the gateway binds, `IP:PORT`.
    pub listen: Option<String>,
    /// `[upstream]`: the vLLM server.
    #[serde(default)]
    pub upstream: RawUpstream,
    /// `[classify]`: token estimate and lane thresholds.
    #[serde(default)]
    pub classify: RawClassify,
    /// `[admission]`: policy and global budget.
    #[serde(default)]
    pub admission: RawAdmission,
    /// `[lanes.small|medium|large]`: per-lane limits.
    #[serde(default)]
    pub lanes: RawLanes,
    /// `[server]`: the gateway's own HTTP server.
    #[serde(default)]
    pub server: RawServer,
    /// `[fields]`: what a body may ask of the engine besides its prompt.
    #[serde(default)]
    pub fields: RawFields,
    /// `[promotion]`: requests that outgrow their lane mid-stream, and continuations.
    #[serde(default)]
    pub promotion: RawPromotion,
    /// `[telemetry]`: request log and tracing.
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// `[quota]`: where the lane quota lives (this replica, or Redis shared by replicas).
    #[serde(default)]
    pub quota: RawQuota,
    /// `[jobs]`: background jobs and their webhooks.
    #[serde(default)]
    pub jobs: RawJobs,
    /// `[auth]`: API keys and tenants.
    #[serde(default)]
    pub auth: RawAuth,
    /// `[prefix_cache]`: tool canonicalization, per-fingerprint metrics, drift detection.
    #[serde(default)]
    pub prefix_cache: RawPrefixCache,
    /// `[autopilot]`: pacing long work to the lanes' TTFT objectives.
    #[serde(default)]
    pub autopilot: RawAutopilot,
    /// `[courses.<id>]`: course prompts for `/answer`.
    #[serde(default)]
    pub courses: BTreeMap<String, RawCourse>,
}

/// The validated configuration. Build it with [`Config::from_toml_str`], [`Config::load`] or
/// [`Config::default`] (which equals the shipped `config/config.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Address the HTTP server binds.
    pub listen: SocketAddr,
    /// The vLLM server behind the gateway.
    pub upstream: UpstreamConfig,
    /// How requests are sized and sorted into lanes.
    pub classify: ClassifyConfig,
    /// Which admission policy runs and its global limits.
    pub admission: AdmissionConfig,
    /// Per-lane limits (used by policy `lanes`).
    pub lanes: LanesConfig,
    /// `[server]`.
    pub server: ServerConfig,
    /// `[fields]`.
    pub fields: FieldsConfig,
    /// `[promotion]`.
    pub promotion: PromotionConfig,
    /// `[telemetry]`.
    pub telemetry: TelemetryConfig,
    /// `[quota]`.
    pub quota: QuotaConfig,
    /// `[jobs]`.
    pub jobs: JobsConfig,
    /// `[auth]`.
    pub auth: AuthConfig,
    /// `[prefix_cache]`.
    pub prefix_cache: PrefixCacheConfig,
    /// `[autopilot]`.
    pub autopilot: AutopilotConfig,
    /// `[courses.<id>]`: each course, checked, by id (its prompt: `crate::prompt::Course`).
    pub courses: BTreeMap<String, CourseConfig>,
}

/// Turns the raw file into a typed [`Config`], or lists every problem found.
pub fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    validate_with(raw, Checker::default())
}

/// [`validate`] reading no environment variable: the built-in defaults, whatever secrets the
/// process's environment holds (a short one there is the operator's file's problem, reported
/// when that file is checked; it made every `Config::default()`, the metrics' included, panic).
pub fn validate_defaults(raw: RawConfig) -> Result<Config, ConfigError> {
    validate_with(raw, Checker::without_environment())
}

fn validate_with(raw: RawConfig, mut c: Checker) -> Result<Config, ConfigError> {
    let listen = match raw
        .listen
        .as_deref()
        .unwrap_or(LISTEN)
        .parse::<SocketAddr>()
    {
        Ok(addr) => addr,
        Err(_) => {
            c.fail("listen", "must be a socket address like 127.0.0.1:8080");
            SocketAddr::from(([127, 0, 0, 1], 8080))
        }
    };
    let upstream = upstream::validate(&mut c, raw.upstream);
    let classify = classify::validate(&mut c, raw.classify);
    let admission = admission::validate(&mut c, raw.admission);
    let lanes = admission::lanes(&mut c, raw.lanes);
    let server = server::validate(&mut c, raw.server);
    let fields = fields::validate(&mut c, raw.fields);
    let telemetry = telemetry::validate(&mut c, raw.telemetry);
    let promotion = promotion::validate(&mut c, raw.promotion);
    let quota = quota::validate(&mut c, raw.quota);
    let jobs = jobs::validate(&mut c, raw.jobs);
    let auth = auth::validate(&mut c, raw.auth);
    let prefix_cache = prefix::prefix_cache(&mut c, raw.prefix_cache);
    let autopilot = autopilot::validate(&mut c, raw.autopilot);
    let courses = prefix::courses(&mut c, raw.courses);
    let config = Config {
        listen,
        upstream,
        classify,
        admission,
        lanes,
        server,
        fields,
        promotion,
        telemetry,
        quota,
        jobs,
        auth,
        prefix_cache,
        autopilot,
        courses,
    };
    cross_checks(&mut c, &config);
    let issues = c.into_issues();
    if issues.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(issues))
    }
}

impl Config {
    /// The rules between sections, again, for a configuration put together from two files: a
    /// reload keeps the running values of what it cannot change live (`admission.policy`,
    /// `jobs`, `quota`, ...), and the new file's other values must hold with them. The new
    /// file alone may pass (its lanes under its own policy) where the merge does not (the
    /// same lanes under the running one).
    pub fn cross_checked(&self) -> Result<(), ConfigError> {
        let mut c = Checker::default();
        cross_checks(&mut c, self);
        let issues = c.into_issues();
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(issues))
        }
    }
}

/// Rules that involve more than one section. A request that passes classification must always
/// be admittable, so every budget must hold the largest request that can reach it.
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
    // Tenants exist only with [auth]: without it a request has none.
    if !config.auth.enabled {
        if !config.auth.tenants.is_empty() {
            c.fail(
                "auth.tenants",
                "needs auth.enabled = true: without [auth] no request has a tenant, so these \
                 budgets would never be charged",
            );
        }
        for (id, course) in &config.courses {
            if course.tenants.is_some() {
                c.fail(
                    format!("courses.{id}.tenants"),
                    "needs auth.enabled = true: without [auth] no request has a tenant, so \
                     the course would be refused to every request",
                );
            }
        }
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
    if config.jobs.divert_large_after.is_some() && !config.jobs.enabled {
        c.fail("jobs.divert_large_after_ms", "needs jobs.enabled = true");
    }
    if let Some(after) = config.jobs.divert_large_after {
        // A review waits in the large lane's queue (the one queue under fifo): one that gives
        // up first, or one nobody waits in, never lets a wait reach the diversion.
        let (queue, name) = match config.admission.policy {
            Policy::Fifo => (config.admission.fifo.queue, "admission.fifo"),
            _ => (config.lanes.large.queue, "lanes.large"),
        };
        let unlimited = config.admission.policy == Policy::Fifo
            && config.admission.fifo.max_concurrency.is_none();
        if queue.len == 0 || after >= queue.timeout || unlimited {
            c.fail(
                "jobs.divert_large_after_ms",
                format!(
                    "must be < {name}.queue_timeout_ms, with {name}.queue_len > 0 (and under \
                     fifo a max_concurrency): a review that waits this long in its queue \
                     becomes a job, and one timed out or refused first, or never waiting, \
                     never does"
                ),
            );
        }
    }
    if config.autopilot.enabled {
        // Settings the autopilot would clamp or ignore: refused, so the file says what runs.
        let large = &config.lanes.large;
        let most_seats = large.ceiling.get().max(large.max_concurrency.get());
        if config.admission.policy == Policy::Fifo {
            c.fail(
                "autopilot.enabled",
                "must be false with admission.policy = \"fifo\" (no lanes to pace)",
            );
        }
        if config.autopilot.min_large_seats > most_seats {
            c.fail(
                "autopilot.min_large_seats",
                format!("must be <= lanes.large.ceiling ({most_seats}): the seats it may pace"),
            );
        }
        let budget = config.admission.prefill_budget_tokens;
        if let Some(floor) = config.autopilot.min_prefill_budget_tokens {
            if budget > 0 && floor > budget {
                c.fail(
                    "autopilot.min_prefill_budget_tokens",
                    format!(
                        "must be <= admission.prefill_budget_tokens ({budget}): the budget it \
                         may pace"
                    ),
                );
            }
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
    if config.admission.policy == Policy::Lanes {
        // A lane below its reservation always gets a seat, so reservations beyond `seats`
        // would run more requests than the engine has seats (3 with seats = 2, measured).
        let seats = config.admission.seats.get();
        let reserved: u64 = Lane::ALL
            .iter()
            .map(|l| u64::from(config.lanes.get(*l).max_concurrency.get()))
            .sum();
        if reserved > u64::from(seats) {
            c.fail(
                "admission.seats",
                format!(
                    "must be >= the lanes' reservations, lanes.*.max_concurrency ({reserved} in \
                     all): a lane below its reservation always gets a seat"
                ),
            );
        }
    }
    if config.lanes.large.mid_stream_limit.is_some() {
        c.fail(
            "lanes.large.mid_stream_limit",
            "must be 0: the large lane is the last, nothing to move a request to \
             (upstream.max_model_len bounds it)",
        );
    }
    // Port 0 asks the system for a port: two such listeners never share one.
    if config.server.admin_listen == Some(config.listen) && config.listen.port() != 0 {
        c.fail(
            "server.admin_listen",
            "must differ from listen (the admin routes get a listener of their own)",
        );
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
