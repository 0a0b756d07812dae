//! Per-fingerprint prefix-cache metrics with bounded cardinality, and drift (M18, M19).
//!
//! - `tutor_gateway_prefix_cache_fingerprint_queries_total{fingerprint}`: prompt tokens;
//! - `tutor_gateway_prefix_cache_fingerprint_hits_total{fingerprint}`: of those, cached tokens;
//! - `tutor_gateway_prefix_cache_drift_total{replica,fingerprint,signal}`: requests flagged by
//!   [`super::drift`], by the replica that served them and the signal (`cached_tokens`,
//!   `prefill`).
//!
//! `replica` is the name of the `[[upstream.replicas]]` entry that served the request (at most
//! [`MAX_REPLICAS`] names; beyond that, `other`; `none` for a request without one). Each
//! replica's two `fingerprint="other"` drift series exist from its first request on.
//! `fingerprint` is the 16-hex prompt fingerprint or `other`. The configured courses'
//! fingerprints (`[courses]`) have their own labels from the start, so made-up system prompts
//! cannot take every label before a course is seen; besides them at most `labels`
//! fingerprints get their own label, first come first served among those seen in
//! `label_after` requests, and keep it for the life of the process (a counter cannot move to
//! another label); everything else is `other`. With tenants (`[auth]`), one tenant's requests
//! take at most `fingerprint_labels_per_tenant` of them, so one school's made-up system
//! prompts cannot leave every other school's prompts in `other`. So each family has at most `labels + 1`
//! series, plus one per configured course. Requests counted before their
//! fingerprint took a label stay in `other`. Only hashes are labels, never prompt text (M20).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{IntCounterVec, Registry};

use super::registered::counter_vec;
use tokio::time::Instant;

use super::cached_prefix::CachedPrefixes;
use super::drift::{DriftDetector, DriftRule, DriftSample, DriftVerdict, Signal};
use crate::config::{PrefixCacheConfig, MAX_REPLICAS};

/// The label of every fingerprint (or replica) without its own.
pub const OTHER: &str = "other";
/// The replica label of a request that was not served by a named replica.
pub const NO_REPLICA: &str = "none";
/// Most fingerprints waiting for a label that are counted at once (cleared when full).
const MAX_CANDIDATES: usize = 4096;

#[derive(Debug)]
struct Labels {
    max: usize,
    /// The most one tenant's requests may take.
    per_tenant: usize,
    after: u32,
    /// Labels each tenant's requests took.
    taken_by: HashMap<String, usize>,
    /// The configured courses' fingerprints: labelled whatever `max` says.
    courses: HashSet<String>,
    labelled: HashSet<String>,
    candidates: HashMap<String, u32>,
}

impl Labels {
    fn label_for<'a>(&mut self, fp: &'a str, tenant: Option<&str>) -> &'a str {
        if self.labelled.contains(fp) || self.courses.contains(fp) {
            return fp;
        }
        if self.labelled.len() >= self.max {
            return OTHER;
        }
        let taken = tenant.map_or(0, |t| self.taken_by.get(t).copied().unwrap_or(0));
        if taken >= self.per_tenant {
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
            if let Some(t) = tenant {
                *self.taken_by.entry(t.to_owned()).or_insert(0) += 1;
            }
            return fp;
        }
        OTHER
    }
}

#[derive(Debug)]
struct Inner {
    labels: Labels,
    /// Replica names with their own label (at most [`MAX_REPLICAS`]).
    replicas: HashSet<String>,
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
        let family =
            |name: &str, help: &str, labels: &[&str]| counter_vec(registry, name, help, labels);
        let counter = |name: &str, help: &str| {
            let c = family(name, help, &["fingerprint"]);
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
        let drift = family(
            "tutor_gateway_prefix_cache_drift_total",
            "Requests that lost their fingerprint's prefix-cache benefit on the replica that served them: far fewer cached tokens (signal cached_tokens) or a run of far costlier prefills per uncached token (signal prefill) than that replica's profile.",
            &["replica", "fingerprint", "signal"],
        );
        let defaults = crate::config::Config::default().prefix_cache;
        let inner = Inner {
            labels: Labels {
                max: defaults.fingerprint_labels as usize,
                per_tenant: defaults.fingerprint_labels_per_tenant as usize,
                after: defaults.label_after_requests,
                taken_by: HashMap::new(),
                courses: HashSet::new(),
                labelled: HashSet::new(),
                candidates: HashMap::new(),
            },
            replicas: HashSet::new(),
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
    pub fn configure(&self, c: &PrefixCacheConfig, courses: impl IntoIterator<Item = String>) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        // A course a reload removed keeps its label (its counters stay).
        inner.labels.courses.extend(courses);
        inner.labels.max = c.fingerprint_labels as usize;
        inner.labels.per_tenant = c.fingerprint_labels_per_tenant as usize;
        inner.labels.after = c.label_after_requests;
        inner.drift.set_rule(rule_of(c));
    }

    /// Records one request with usage, served by `replica`: its prompt and cached tokens
    /// under its fingerprint's label, and the sample against the (replica, fingerprint)
    /// profile (see [`super::drift`]). Returns the drift verdict, when it is drift.
    pub fn observe(
        &self,
        replica: &str,
        fingerprint: &str,
        sample: DriftSample,
    ) -> Option<DriftVerdict> {
        let cached = sample.cached_tokens;
        self.observe_as(replica, fingerprint, fingerprint, None, (sample, cached))
    }

    /// [`PrefixMetrics::observe`], the drift profile kept under `profile` (one per exact prefix
    /// as vLLM caches it: the discount key, which tells tenants' salts apart, so one tenant's
    /// first request does not read as another's prefix lost) and labelled by `fingerprint`,
    /// a label `tenant`'s requests may take only within their share. `cached`: the cached
    /// tokens vLLM reported, counted as hits (the sample's may stop at the prefix's own).
    pub fn observe_as(
        &self,
        replica: &str,
        fingerprint: &str,
        profile: &str,
        tenant: Option<&str>,
        (sample, cached): (DriftSample, u32),
    ) -> Option<DriftVerdict> {
        let (label, replica_label, first_of_replica, verdict) = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let label = inner.labels.label_for(fingerprint, tenant).to_owned();
            let (replica_label, first) = if inner.replicas.contains(replica) {
                (replica.to_owned(), false)
            } else if inner.replicas.len() < MAX_REPLICAS {
                inner.replicas.insert(replica.to_owned());
                (replica.to_owned(), true)
            } else {
                (OTHER.to_owned(), false)
            };
            let verdict = inner
                .drift
                .observe(replica, profile, sample, Instant::now());
            (label, replica_label, first, verdict)
        };
        if first_of_replica {
            for signal in Signal::ALL {
                self.drift
                    .with_label_values(&[replica_label.as_str(), OTHER, signal.as_str()]);
            }
        }
        let l = [label.as_str()];
        self.queries
            .with_label_values(&l)
            .inc_by(u64::from(sample.prompt_tokens));
        self.hits.with_label_values(&l).inc_by(u64::from(cached));
        if let Some(v) = &verdict {
            self.drift
                .with_label_values(&[replica_label.as_str(), label.as_str(), v.signal.as_str()])
                .inc();
        }
        verdict
    }

    /// Drift requests counted so far, all replicas, fingerprints and signals together.
    pub fn drift_total(&self) -> u64 {
        use prometheus::core::Collector;
        self.drift
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// The prompt tokens a request with `fingerprint` can expect to find in vLLM's prefix cache,
    /// from the requests measured so far (see [`super::cached_prefix`]).
    pub fn expected_cached(&self, key: &str) -> u32 {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.cached.expected(key)
    }

    /// The tokens of the prefix under discount key `key` itself, when counted already (see
    /// [`super::cached_prefix`]).
    pub fn prefix_tokens(&self, key: &str) -> Option<u32> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.cached.size(key)
    }

    /// Keeps the tokens of the prefix under discount key `key` itself.
    pub fn set_prefix_tokens(&self, key: &str, tokens: u32) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.cached.set_size(key, tokens);
    }

    /// Records that a request under discount key `key` (`crate::prompt::discount_key`) found
    /// `cached` prompt tokens of its prefix in vLLM's prefix cache (at most the prefix's own
    /// tokens: see [`super::cached_prefix`]).
    pub fn observe_cached(&self, key: &str, cached: u32) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.cached.observe(key, cached);
    }

    /// Forgets what every prefix found cached (the engine failed: its cache may be empty now);
    /// each discounts again after [`super::cached_prefix::WARM_SAMPLES`] new measurements.
    pub fn forget_cached(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.cached.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample(prompt: u32, cached: u32) -> DriftSample {
        DriftSample {
            prompt_tokens: prompt,
            cached_tokens: cached,
            engine_prefill_ms: None,
        }
    }

    #[test]
    fn never_more_than_n_plus_one_series() {
        let registry = Registry::new();
        let m = PrefixMetrics::register(&registry);
        let mut c = PrefixCacheConfig {
            canonicalize_tools: true,
            fingerprint_labels: 3,
            fingerprint_labels_per_tenant: 3,
            label_after_requests: 2,
            drift_factor_percent: 300,
            drift_min_samples: 5,
            drift_log_window: Duration::from_secs(1),
        };
        m.configure(&c, []);
        for i in 0..50 {
            for _ in 0..3 {
                m.observe("replica-0", &format!("{i:016x}"), sample(100, 50));
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
        m.configure(&c, []);
    }

    /// A client sending made-up system prompts fills every label slot; a configured course
    /// seen afterwards still has its own label, never `other`.
    #[test]
    fn a_configured_course_keeps_its_label_whatever_clients_send() {
        let registry = Registry::new();
        let m = PrefixMetrics::register(&registry);
        let c = PrefixCacheConfig {
            fingerprint_labels: 3,
            label_after_requests: 2,
            ..crate::config::Config::default().prefix_cache
        };
        m.configure(&c, ["c0c0c0c0c0c0c0c0".to_owned()]);
        for i in 0..20 {
            for _ in 0..3 {
                m.observe("replica-0", &format!("{i:016x}"), sample(100, 50));
            }
        }
        m.observe("replica-0", "c0c0c0c0c0c0c0c0", sample(100, 50));
        assert_eq!(
            m.queries.with_label_values(&["c0c0c0c0c0c0c0c0"]).get(),
            100
        );
        for family in registry.gather() {
            assert!(family.get_metric().len() <= 5, "{}", family.name());
        }
    }

    /// One tenant sending made-up system prompts takes at most its share of the labels; another
    /// tenant's prompt seen afterwards still gets one.
    #[test]
    fn one_tenant_takes_at_most_its_share_of_the_labels() {
        let registry = Registry::new();
        let m = PrefixMetrics::register(&registry);
        let c = PrefixCacheConfig {
            fingerprint_labels: 8,
            fingerprint_labels_per_tenant: 2,
            label_after_requests: 2,
            ..crate::config::Config::default().prefix_cache
        };
        m.configure(&c, []);
        let seen = |fp: &str, tenant: &str| {
            for _ in 0..3 {
                m.observe_as("replica-0", fp, fp, Some(tenant), (sample(100, 50), 50));
            }
        };
        for i in 0..20 {
            seen(&format!("{i:016x}"), "greedy");
        }
        seen("b0b0b0b0b0b0b0b0", "modest");
        let labelled: Vec<String> = registry
            .gather()
            .into_iter()
            .find(|f| f.name() == "tutor_gateway_prefix_cache_fingerprint_queries_total")
            .unwrap()
            .get_metric()
            .iter()
            .map(|m| m.get_label()[0].value().to_owned())
            .filter(|l| l != OTHER)
            .collect();
        assert_eq!(labelled.len(), 3, "{labelled:?}");
        assert!(
            labelled.contains(&"b0b0b0b0b0b0b0b0".to_owned()),
            "{labelled:?}"
        );
        // Without a tenant (no [auth]) the share does not apply.
        for i in 100..110 {
            let fp = format!("{i:016x}");
            for _ in 0..2 {
                m.observe("replica-0", &fp, sample(100, 50));
            }
        }
        let series = registry
            .gather()
            .into_iter()
            .find(|f| f.name() == "tutor_gateway_prefix_cache_fingerprint_queries_total")
            .unwrap()
            .get_metric()
            .len();
        assert_eq!(series, 8 + 1, "every label taken, plus other");
    }

    #[test]
    fn drift_is_counted_under_the_replica_and_fingerprint_labels_and_logged_once() {
        let m = PrefixMetrics::register(&Registry::new());
        let c = PrefixCacheConfig {
            label_after_requests: 1,
            ..crate::config::Config::default().prefix_cache
        };
        m.configure(&c, []);
        // A course: 900 of 1,000 tokens cached, five times on replica-0.
        for _ in 0..5 {
            assert_eq!(m.observe("replica-0", "abcd", sample(1000, 900)), None);
        }
        // Evicted on replica-0: nothing cached.
        let v = m
            .observe("replica-0", "abcd", sample(1000, 0))
            .expect("drift");
        assert!(v.log && v.signal == Signal::CachedTokens && v.expected == 900.0);
        assert!(!m.observe("replica-0", "abcd", sample(1000, 0)).unwrap().log);
        let count =
            |r: &str, fp: &str, s: Signal| m.drift.with_label_values(&[r, fp, s.as_str()]).get();
        assert_eq!(count("replica-0", "abcd", Signal::CachedTokens), 2);
        assert_eq!(count("replica-0", "abcd", Signal::Prefill), 0);
        // The same miss on a replica that never held the prefix is no drift.
        assert_eq!(m.observe("replica-1", "abcd", sample(1000, 0)), None);
        assert_eq!(count("replica-1", "abcd", Signal::CachedTokens), 0);
    }

    #[test]
    fn replica_labels_are_bounded() {
        let registry = Registry::new();
        let m = PrefixMetrics::register(&registry);
        for i in 0..(MAX_REPLICAS + 20) {
            m.observe(&format!("r{i}"), "abcd", sample(100, 0));
        }
        let drift = registry
            .gather()
            .into_iter()
            .find(|f| f.name() == "tutor_gateway_prefix_cache_drift_total")
            .expect("drift family");
        // Two signals per labelled replica, zeros from each replica's first request.
        assert_eq!(drift.get_metric().len(), 2 * MAX_REPLICAS);
    }
}
