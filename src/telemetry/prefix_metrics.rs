//! Per-fingerprint prefix-cache metrics with bounded cardinality, and drift (M18, M19).
//!
//! - `tutor_gateway_prefix_cache_fingerprint_queries_total{fingerprint}`: prompt tokens;
//! - `tutor_gateway_prefix_cache_fingerprint_hits_total{fingerprint}`: of those, cached tokens;
//! - `tutor_gateway_prefix_cache_drift_total{fingerprint}`: requests flagged by
//!   [`super::drift`].
//!
//! `fingerprint` is the 16-hex prompt fingerprint or `other`. At most `labels` fingerprints get
//! their own label, first come first served among those seen in `label_after` requests, and keep
//! it for the life of the process (a counter cannot move to another label); everything else is
//! `other`. So each family has at most `labels + 1` series. Requests counted before their
//! fingerprint took a label stay in `other`. Only hashes are labels, never prompt text (M20).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus::{IntCounterVec, Opts, Registry};
use tokio::time::Instant;

use super::cached_prefix::CachedPrefixes;
use super::drift::{DriftDetector, DriftRule, DriftVerdict};
use crate::config::PrefixCacheConfig;

/// The label of every fingerprint without its own.
pub const OTHER: &str = "other";
/// Most fingerprints waiting for a label that are counted at once (cleared when full).
const MAX_CANDIDATES: usize = 4096;

#[derive(Debug)]
struct Labels {
    max: usize,
    after: u32,
    labelled: HashSet<String>,
    candidates: HashMap<String, u32>,
}

impl Labels {
    fn label_for<'a>(&mut self, fp: &'a str) -> &'a str {
        if self.labelled.contains(fp) {
            return fp;
        }
        if self.labelled.len() >= self.max {
            return OTHER;
        }
        if !self.candidates.contains_key(fp) && self.candidates.len() >= MAX_CANDIDATES {
            self.candidates.clear();
        }
        let seen = self.candidates.entry(fp.to_owned()).or_insert(0);
        *seen += 1;
        if *seen >= self.after {
            self.candidates.remove(fp);
            self.labelled.insert(fp.to_owned());
            return fp;
        }
        OTHER
    }
}

#[derive(Debug)]
struct Inner {
    labels: Labels,
    drift: DriftDetector,
    cached: CachedPrefixes,
}

/// The per-fingerprint families and the drift detector.
#[derive(Debug, Clone)]
pub struct PrefixMetrics {
    queries: IntCounterVec,
    hits: IntCounterVec,
    drift: IntCounterVec,
    inner: Arc<Mutex<Inner>>,
}

fn rule_of(c: &PrefixCacheConfig) -> DriftRule {
    DriftRule {
        factor: f64::from(c.drift_factor_percent) / 100.0,
        min_samples: c.drift_min_samples,
        log_window: c.drift_log_window,
    }
}

impl PrefixMetrics {
    /// Registers the families in `registry`, with the built-in `[prefix_cache]` defaults until
    /// [`Self::configure`] is called.
    pub fn register(registry: &Registry) -> Self {
        let counter = |name: &str, help: &str| {
            let c =
                IntCounterVec::new(Opts::new(name, help), &["fingerprint"]).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
            c.with_label_values(&[OTHER]);
            c
        };
        let queries = counter(
            "tutor_gateway_prefix_cache_fingerprint_queries_total",
            "Prompt tokens by prompt fingerprint (top fingerprints; the rest as other).",
        );
        let hits = counter(
            "tutor_gateway_prefix_cache_fingerprint_hits_total",
            "Prompt tokens served from vLLM's prefix cache, by prompt fingerprint.",
        );
        let drift = counter(
            "tutor_gateway_prefix_cache_drift_total",
            "Requests whose prefill per uncached token jumped above their fingerprint's profile.",
        );
        let defaults = crate::config::Config::default().prefix_cache;
        let inner = Inner {
            labels: Labels {
                max: defaults.fingerprint_labels as usize,
                after: defaults.label_after_requests,
                labelled: HashSet::new(),
                candidates: HashMap::new(),
            },
            drift: DriftDetector::new(rule_of(&defaults)),
            cached: CachedPrefixes::default(),
        };
        Self {
            queries,
            hits,
            drift,
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    /// Applies the `[prefix_cache]` settings.
    pub fn configure(&self, c: &PrefixCacheConfig) {
        let mut inner = self.inner.lock().expect("prefix metrics lock");
        inner.labels.max = c.fingerprint_labels as usize;
        inner.labels.after = c.label_after_requests;
        inner.drift.set_rule(rule_of(c));
    }

    /// Records one request with usage: its prompt and cached tokens under its fingerprint's
    /// label, and its prefill (when measured) against the fingerprint's profile. Returns the
    /// drift verdict, when it is drift.
    pub fn observe(
        &self,
        fingerprint: &str,
        input_tokens: u32,
        cached_tokens: u32,
        prefill_ms: Option<f64>,
    ) -> Option<DriftVerdict> {
        let (label, verdict) = {
            let mut inner = self.inner.lock().expect("prefix metrics lock");
            let label = inner.labels.label_for(fingerprint).to_owned();
            let uncached = input_tokens.saturating_sub(cached_tokens);
            inner.cached.observe(fingerprint, cached_tokens);
            let verdict = prefill_ms.and_then(|ms| {
                inner
                    .drift
                    .observe(fingerprint, ms, uncached, Instant::now())
            });
            (label, verdict)
        };
        let l = [label.as_str()];
        self.queries
            .with_label_values(&l)
            .inc_by(u64::from(input_tokens));
        self.hits
            .with_label_values(&l)
            .inc_by(u64::from(cached_tokens));
        if verdict.is_some() {
            self.drift.with_label_values(&l).inc();
        }
        verdict
    }

    /// The prompt tokens a request with `fingerprint` can expect to find in vLLM's prefix cache,
    /// from the requests measured so far (see [`super::cached_prefix`]).
    pub fn expected_cached(&self, fingerprint: &str) -> u32 {
        let inner = self.inner.lock().expect("prefix metrics lock");
        inner.cached.expected(fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn never_more_than_n_plus_one_series() {
        let registry = Registry::new();
        let m = PrefixMetrics::register(&registry);
        let mut c = PrefixCacheConfig {
            canonicalize_tools: true,
            fingerprint_labels: 3,
            label_after_requests: 2,
            drift_factor_percent: 300,
            drift_min_samples: 5,
            drift_log_window: Duration::from_secs(1),
        };
        m.configure(&c);
        for i in 0..50 {
            for _ in 0..3 {
                m.observe(&format!("{i:016x}"), 100, 50, None);
            }
        }
        for family in registry.gather() {
            assert!(family.get_metric().len() <= 4, "{}", family.name());
        }
        // The first three fingerprints seen twice have labels; the rest are "other".
        assert_eq!(
            m.queries.with_label_values(&["0000000000000000"]).get(),
            200
        );
        assert_eq!(
            m.queries.with_label_values(&[OTHER]).get(),
            100 * (3 + 47 * 3)
        );
        c.fingerprint_labels = 0;
        m.configure(&c);
    }

    #[test]
    fn drift_is_counted_under_the_fingerprint_label_and_logged_once() {
        let m = PrefixMetrics::register(&Registry::new());
        // 5 samples of 0.1 ms per uncached token (1,000 tokens, 100 cached -> 900 uncached).
        for _ in 0..5 {
            assert_eq!(m.observe("abcd", 1000, 100, Some(90.0)), None);
        }
        // The same fingerprint now pays 1 ms per uncached token: 10x the profile.
        let v = m.observe("abcd", 1000, 100, Some(900.0)).expect("drift");
        assert!(v.log && (v.observed_ms_per_token - 1.0).abs() < 1e-9);
        assert!(!m.observe("abcd", 1000, 100, Some(900.0)).unwrap().log);
        assert_eq!(m.drift.with_label_values(&["abcd"]).get(), 2);
        // No prefill measured: no sample.
        assert_eq!(m.observe("abcd", 1000, 100, None), None);
    }
}
