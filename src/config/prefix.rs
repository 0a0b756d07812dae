//! `[prefix_cache]` and `[courses.<id>]`: canonical prompts and the prefix-cache view (M17-M20).
//!
//! A course's stable parts (`version`, `instructions`, `rubric`, `safety`, `tools`) are checked
//! for placeholders ([`find_placeholder`]): a course whose prefix would differ per
//! student or per request is refused, with the dotted path of the offending key.
//!
//! Owns [`RawPrefixCache`], [`RawCourse`] and [`PrefixCacheConfig`], their defaults and
//! validation; the checked course is [`CourseConfig`] (its prompt, `crate::prompt::Course`, is
//! built from it by the prompt layer). A course's `focus*` keys (M11)
//! are not part of its prefix: they become its [`FocusSettings`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::check::Checker;
use super::course::{self as focus, CourseConfig, FocusMode, FocusSettings};
use super::placeholders::find_placeholder;

/// Default `prefix_cache.canonicalize_tools`.
const CANONICALIZE_TOOLS: bool = true;
/// Most `prefix_cache.fingerprint_labels`.
const MAX_FINGERPRINT_LABELS: u32 = 1000;
/// Default `prefix_cache.fingerprint_labels`.
const FINGERPRINT_LABELS: u32 = 20;
/// Default `prefix_cache.fingerprint_labels_per_tenant` (0: a quarter of the labels).
const FINGERPRINT_LABELS_PER_TENANT: u32 = 0;
/// Default `prefix_cache.label_after_requests`.
const LABEL_AFTER_REQUESTS: u32 = 3;
/// Default `prefix_cache.drift_factor_percent`.
const DRIFT_FACTOR_PERCENT: u32 = 300;
/// Default `prefix_cache.drift_min_samples`.
const DRIFT_MIN_SAMPLES: u32 = 5;
/// Default `prefix_cache.drift_log_window_ms`.
const DRIFT_LOG_WINDOW_MS: u64 = 300_000;
/// Ceilings of the drift keys.
const MAX_DRIFT_FACTOR_PERCENT: u32 = 10_000;
const MAX_DRIFT_MIN_SAMPLES: u32 = 10_000;
const MAX_DRIFT_LOG_WINDOW_MS: u64 = 86_400_000;

/// `[prefix_cache]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrefixCache {
    /// Rewrite `/v1` `tools` as canonical JSON before forwarding.
    pub canonicalize_tools: Option<bool>,
    /// Fingerprints with their own label in the per-fingerprint metrics (the rest: `other`).
    pub fingerprint_labels: Option<u32>,
    /// Of those, the most one tenant's requests may take (0: a quarter, at least one).
    pub fingerprint_labels_per_tenant: Option<u32>,
    /// Requests a fingerprint needs before it may take a label.
    pub label_after_requests: Option<u32>,
    /// Drift: cached tokens below the profile divided by this, or prefill per uncached token
    /// above the profile times this, percent.
    pub drift_factor_percent: Option<u32>,
    /// Drift: samples a (replica, fingerprint) profile needs before it is compared.
    pub drift_min_samples: Option<u32>,
    /// Drift: at most one log line per replica and fingerprint per this window, ms.
    pub drift_log_window_ms: Option<u64>,
}

/// `[courses.<id>]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCourse {
    /// Version of the course prompt, part of the stable prefix.
    pub version: Option<String>,
    /// Stable system instructions.
    pub instructions: Option<String>,
    /// Grading rubric.
    pub rubric: Option<String>,
    /// Safety rules.
    pub safety: Option<String>,
    /// Tool schemas: a JSON array, as text.
    pub tools: Option<String>,
    /// `"auto"` or `"off"`: focus the student's code on its stack trace (M11).
    pub focus: Option<String>,
    /// Called definitions are added while the focused code stays within this many tokens.
    pub focus_token_target: Option<u32>,
    /// Levels of calls followed from the frame's function.
    pub focus_depth: Option<u32>,
    /// Code larger than this many bytes is sent whole, not parsed.
    pub focus_max_bytes: Option<u64>,
    /// Parsing that takes longer than this many ms is given up (the code is sent whole).
    pub focus_timeout_ms: Option<u64>,
    /// The tenants (`[auth]`) whose requests may name this course; absent: every tenant.
    pub tenants: Option<Vec<String>>,
}

/// Prefix-cache discipline for `/v1`, the per-fingerprint metrics and drift detection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Rewrite `/v1/chat/completions` `tools` as canonical JSON before forwarding.
    pub canonicalize_tools: bool,
    /// Fingerprints that get their own label; every other one is `other` (N + 1 series).
    pub fingerprint_labels: u32,
    /// Of those, the most one tenant's requests may take (`[auth]` on), so one school's
    /// made-up prompts cannot take every label from the others: the file's value, or a quarter
    /// of `fingerprint_labels` (at least one) when it says 0.
    pub fingerprint_labels_per_tenant: u32,
    /// Requests a fingerprint needs before it may take one of the labels.
    pub label_after_requests: u32,
    /// Drift when a request's cached tokens fall below its (replica, fingerprint) profile
    /// divided by this, or its engine prefill per uncached token rises above the profile times
    /// this (a run of requests), in percent (see [`crate::telemetry::drift`]).
    pub drift_factor_percent: u32,
    /// Samples before a (replica, fingerprint) profile is compared.
    pub drift_min_samples: u32,
    /// At most one drift log line per replica and fingerprint per window.
    pub drift_log_window: Duration,
}

/// Validates `[prefix_cache]`.
pub(super) fn prefix_cache(c: &mut Checker, raw: RawPrefixCache) -> PrefixCacheConfig {
    let drift_factor_percent = raw.drift_factor_percent.unwrap_or(DRIFT_FACTOR_PERCENT);
    if drift_factor_percent <= 100 {
        c.fail(
            "prefix_cache.drift_factor_percent",
            "must be > 100 (a factor above 1)",
        );
    }
    // Past these a profile never drifts (a factor of a hundred; a fingerprint's ten thousandth
    // request) and the log never speaks again: drift detection silently off.
    c.at_most(
        "prefix_cache.drift_factor_percent",
        drift_factor_percent.into(),
        MAX_DRIFT_FACTOR_PERCENT.into(),
        "10000 (a factor of 100)",
    );
    let drift_min_samples = raw.drift_min_samples.unwrap_or(DRIFT_MIN_SAMPLES);
    if drift_min_samples == 0 {
        c.fail("prefix_cache.drift_min_samples", "must be > 0");
    }
    c.at_most(
        "prefix_cache.drift_min_samples",
        drift_min_samples.into(),
        MAX_DRIFT_MIN_SAMPLES.into(),
        "10000",
    );
    if let Some(ms) = raw.drift_log_window_ms {
        c.at_most(
            "prefix_cache.drift_log_window_ms",
            ms,
            MAX_DRIFT_LOG_WINDOW_MS,
            "86400000 (a day)",
        );
    }
    let label_after_requests = raw.label_after_requests.unwrap_or(LABEL_AFTER_REQUESTS);
    if label_after_requests == 0 {
        c.fail("prefix_cache.label_after_requests", "must be > 0");
    }
    // The key bounds the families' series (each label a series per family and replica): past a
    // thousand it bounds nothing a Prometheus should hold.
    let fingerprint_labels = raw.fingerprint_labels.unwrap_or(FINGERPRINT_LABELS);
    if fingerprint_labels > MAX_FINGERPRINT_LABELS {
        c.fail(
            "prefix_cache.fingerprint_labels",
            format!("must be at most {MAX_FINGERPRINT_LABELS} (it bounds the metrics' series)"),
        );
    }
    let per_tenant = raw
        .fingerprint_labels_per_tenant
        .unwrap_or(FINGERPRINT_LABELS_PER_TENANT);
    if per_tenant > fingerprint_labels {
        c.fail(
            "prefix_cache.fingerprint_labels_per_tenant",
            "must be at most prefix_cache.fingerprint_labels",
        );
    }
    let fingerprint_labels_per_tenant = match per_tenant {
        0 => (fingerprint_labels / 4).max(1),
        n => n,
    };
    PrefixCacheConfig {
        canonicalize_tools: raw.canonicalize_tools.unwrap_or(CANONICALIZE_TOOLS),
        fingerprint_labels,
        fingerprint_labels_per_tenant,
        label_after_requests,
        drift_factor_percent,
        drift_min_samples,
        drift_log_window: c.ms(
            "prefix_cache.drift_log_window_ms",
            raw.drift_log_window_ms,
            DRIFT_LOG_WINDOW_MS,
        ),
    }
}

/// Validates `[courses.<id>]` (the prompt layer builds each one's stable prefix from it).
pub(super) fn courses(
    c: &mut Checker,
    raw: BTreeMap<String, RawCourse>,
) -> BTreeMap<String, CourseConfig> {
    let mut out = BTreeMap::new();
    for (id, course) in raw {
        let path = format!("courses.{id}");
        if id.is_empty()
            || !id
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            c.fail(&path, "course ids are letters, digits, `_` and `-`");
            continue;
        }
        let mut ok = true;
        let mut text = |key: &str, value: &Option<String>, required: bool| {
            let v = value.clone().unwrap_or_default();
            if required && v.trim().is_empty() {
                c.fail(format!("{path}.{key}"), "is required");
                ok = false;
            } else if let Some(kind) = find_placeholder(&v) {
                c.fail(
                    format!("{path}.{key}"),
                    format!(
                        "contains {kind}: the stable prefix must be the same for every student \
                         and request (put per-request material in the request)"
                    ),
                );
                ok = false;
            }
            v
        };
        let version = text("version", &course.version, true);
        let instructions = text("instructions", &course.instructions, true);
        let rubric = text("rubric", &course.rubric, false);
        let safety = text("safety", &course.safety, false);
        let tools_text = text("tools", &course.tools, false);
        let tools = if tools_text.trim().is_empty() {
            None
        } else {
            match serde_json::from_str::<Value>(&tools_text) {
                Ok(v @ Value::Array(_)) => Some(v),
                _ => {
                    c.fail(
                        format!("{path}.tools"),
                        "must be a JSON array of tool schemas",
                    );
                    ok = false;
                    None
                }
            }
        };
        let focus = course_focus(c, &path, &course);
        let tenants = course.tenants.clone();
        if let Some(t) = &tenants {
            if t.is_empty() {
                c.fail(
                    format!("{path}.tenants"),
                    "must name at least one tenant (leave it out for every tenant)",
                );
                ok = false;
            } else if !t.iter().all(|name| super::auth::tenant_ok(name)) {
                c.fail(
                    format!("{path}.tenants"),
                    "tenant names are 1 to 64 letters, digits, `_` or `-`",
                );
                ok = false;
            }
        }
        if ok {
            let checked = CourseConfig::new(&id, &version, &instructions, &rubric, &safety, tools)
                .with_focus(focus)
                .for_tenants(tenants);
            out.insert(id, checked);
        }
    }
    out
}

/// Most `focus_depth`.
const MAX_FOCUS_DEPTH: u32 = 5;
/// Longest `focus_timeout_ms`.
const MAX_FOCUS_TIMEOUT_MS: u64 = 10_000;

/// `focus`, `focus_token_target`, `focus_depth`, `focus_max_bytes`, `focus_timeout_ms` of
/// `[courses.<id>]` (at `path`).
fn course_focus(c: &mut Checker, path: &str, raw: &RawCourse) -> FocusSettings {
    let d = FocusSettings::default();
    let mode = match raw.focus.as_deref() {
        None | Some("auto") => FocusMode::Auto,
        Some("off") => FocusMode::Off,
        Some(_) => {
            c.fail(format!("{path}.focus"), "must be \"auto\" or \"off\"");
            FocusMode::Auto
        }
    };
    let depth = raw.focus_depth.unwrap_or(d.depth);
    if depth > MAX_FOCUS_DEPTH {
        c.fail(
            format!("{path}.focus_depth"),
            format!("must be at most {MAX_FOCUS_DEPTH}"),
        );
    }
    let timeout_ms = raw.focus_timeout_ms.unwrap_or(focus::TIMEOUT_MS);
    if timeout_ms > MAX_FOCUS_TIMEOUT_MS {
        c.fail(
            format!("{path}.focus_timeout_ms"),
            format!("must be at most {MAX_FOCUS_TIMEOUT_MS}"),
        );
    }
    FocusSettings {
        whole_parse: false,
        mode,
        token_target: c
            .u32(
                &format!("{path}.focus_token_target"),
                raw.focus_token_target,
                d.token_target,
            )
            .get(),
        depth,
        max_bytes: usize::try_from(
            c.u64(
                &format!("{path}.focus_max_bytes"),
                raw.focus_max_bytes,
                d.max_bytes as u64,
            )
            .get(),
        )
        .unwrap_or(usize::MAX),
        timeout: c.ms(
            &format!("{path}.focus_timeout_ms"),
            Some(timeout_ms),
            focus::TIMEOUT_MS,
        ),
    }
}
