//! Drift detection (M19): a prompt fingerprint losing, on one replica, the prefix-cache benefit
//! it had there. Drift means "fewer cached tokens, or a slower prefill per uncached token";
//! never "a busier engine".
//!
//! A profile is kept per (replica, fingerprint): each replica has its own cache, so a request
//! routed elsewhere is compared with that replica's own history. The gateway keys it by the
//! request's discount key (`prompt::discount_key`: the fingerprint with what else decides what
//! vLLM finds cached, a tenant's `cache_salt` among it), so one tenant's first request is not
//! taken for another's prefix lost; the metric's label stays the fingerprint. Per profile, over the last
//! [`WINDOW`] samples that were not drift (medians, so one outlier moves nothing):
//!
//! - the prompt tokens vLLM reported cached (`usage.prompt_tokens_details.cached_tokens`), and
//!   their share of the prompt;
//! - the prefill milliseconds per *uncached* prompt token (`input - cached`), where prefill is
//!   the engine's own split, `time_to_first_token_ms - queue_time_ms` of vLLM's per-request
//!   metrics (`--enable-per-request-metrics`). The gateway's admission-to-first-token time is
//!   never used: it includes waiting in the engine's queue, so load would look like eviction.
//!   Without per-request metrics only the cached-token signal is judged.
//!
//! vLLM leaves `prompt_tokens_details` out when nothing was cached (and always without
//! `--enable-prompt-tokens-details`), so an absent count is read as 0 cached tokens.
//!
//! A profile has a *prefix to lose* once it has `min_samples` samples and the median share of
//! its prompt served from the cache is at least [`PREFIX_SHARE`]. Only a profile with a prefix to
//! lose can drift, so prompts that never find cached tokens (no shared prefix) never alarm,
//! however busy the engine (a saturated engine slows prefill per token too: its steps carry
//! other requests' work). Without cached-token reporting nothing has a prefix to lose, and
//! nothing is judged. Two signals, factor `factor`:
//!
//! - **cached tokens**: a request found fewer than `median / factor` cached tokens (the prefix
//!   was evicted, or the bytes sent changed). Each such request counts.
//! - **prefill**: `min_samples` prefill samples, and [`PREFILL_RUN`] requests in a row paid more
//!   than `factor x median` per uncached token (requests with fewer than
//!   [`MIN_UNCACHED_TOKENS`] uncached tokens are not measured: their prefill is the step's fixed
//!   cost). A run, because timings are noisy and one slow step is not a lost cache.
//!
//! Drift samples do not update the profile, so a lasting change keeps counting; it is logged at
//! most once per (replica, fingerprint) per `log_window`. At most [`MAX_PROFILES`] profiles are
//! kept; when full, the profiles start over.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// Samples a profile's medians are taken over.
pub const WINDOW: usize = 16;
/// Most (replica, fingerprint) profiles kept at once.
pub const MAX_PROFILES: usize = 4096;
/// Slow prefills in a row that make prefill drift.
pub const PREFILL_RUN: u32 = 3;
/// Uncached tokens a request needs for its prefill cost per token to be measured.
pub const MIN_UNCACHED_TOKENS: u32 = 32;
/// Median share of the prompt served from the cache from which a profile has a prefix to lose.
pub const PREFIX_SHARE: f64 = 0.5;

/// The drift rule.
#[derive(Debug, Clone, Copy)]
pub struct DriftRule {
    /// Drift when cached tokens fall below median / factor, or prefill per uncached token
    /// rises above factor x median.
    pub factor: f64,
    /// Samples a profile needs before it is compared.
    pub min_samples: u32,
    /// At most one log line per (replica, fingerprint) per window.
    pub log_window: Duration,
}

/// What one finished request showed, as vLLM reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DriftSample {
    /// Prompt tokens (usage).
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache (0 when vLLM did not report any).
    pub cached_tokens: u32,
    /// The engine's prefill, `time_to_first_token_ms - queue_time_ms` of its per-request
    /// metrics; `None` when not reported (never the gateway's own timing).
    pub engine_prefill_ms: Option<f64>,
}

/// Which signal showed drift (the `signal` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Far fewer cached tokens than the profile.
    CachedTokens,
    /// A run of prefills far more expensive per uncached token than the profile.
    Prefill,
}

impl Signal {
    /// Every signal.
    pub const ALL: [Signal; 2] = [Signal::CachedTokens, Signal::Prefill];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CachedTokens => "cached_tokens",
            Self::Prefill => "prefill",
        }
    }
}

/// What one drift sample showed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftVerdict {
    /// The signal.
    pub signal: Signal,
    /// What the profile expected: cached tokens, or prefill ms per uncached token.
    pub expected: f64,
    /// What this request showed, in the same unit.
    pub observed: f64,
    /// Whether this request is the one to log in its window.
    pub log: bool,
}

/// The last [`WINDOW`] values and how many were ever added.
#[derive(Debug, Clone, Default)]
struct Window {
    values: VecDeque<f64>,
    samples: u32,
}

impl Window {
    fn push(&mut self, v: f64) {
        if self.values.len() == WINDOW {
            self.values.pop_front();
        }
        self.values.push_back(v);
        self.samples = self.samples.saturating_add(1);
    }

    /// The median, once `min_samples` values were added.
    fn median(&self, min_samples: u32) -> Option<f64> {
        if self.samples < min_samples || self.values.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.values.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }
}

#[derive(Debug, Clone, Default)]
struct Profile {
    cached: Window,
    share: Window,
    prefill: Window,
    slow_run: u32,
    last_logged: Option<Instant>,
}

/// Per-(replica, fingerprint) prefix-cache profiles.
#[derive(Debug)]
pub struct DriftDetector {
    rule: DriftRule,
    profiles: HashMap<(String, String), Profile>,
}

impl DriftDetector {
    /// An empty detector with `rule`.
    pub fn new(rule: DriftRule) -> Self {
        Self {
            rule,
            profiles: HashMap::new(),
        }
    }

    /// Replaces the rule (profiles are kept).
    pub fn set_rule(&mut self, rule: DriftRule) {
        self.rule = rule;
    }

    /// Adds one request served by `replica`; `Some` when it is drift.
    pub fn observe(
        &mut self,
        replica: &str,
        fingerprint: &str,
        s: DriftSample,
        now: Instant,
    ) -> Option<DriftVerdict> {
        if s.prompt_tokens == 0 {
            return None;
        }
        let key = (replica.to_owned(), fingerprint.to_owned());
        if !self.profiles.contains_key(&key) && self.profiles.len() >= MAX_PROFILES {
            self.profiles.clear();
        }
        let rule = self.rule;
        let p = self.profiles.entry(key).or_default();
        let prompt = s.prompt_tokens;
        let cached = s.cached_tokens.min(prompt);
        let prefix_to_lose = p
            .share
            .median(rule.min_samples)
            .is_some_and(|m| m >= PREFIX_SHARE);
        let mut found: Option<(Signal, f64, f64)> = None;
        let c = f64::from(cached);
        match p.cached.median(rule.min_samples) {
            Some(expected) if prefix_to_lose && c < expected / rule.factor => {
                found = Some((Signal::CachedTokens, expected, c));
            }
            _ => {
                p.cached.push(c);
                p.share.push(c / f64::from(prompt));
            }
        }
        let uncached = prompt - cached;
        let prefill = s
            .engine_prefill_ms
            .filter(|ms| ms.is_finite() && *ms >= 0.0);
        if let (None, Some(ms), true) = (found, prefill, uncached >= MIN_UNCACHED_TOKENS) {
            let value = ms / f64::from(uncached);
            match p.prefill.median(rule.min_samples) {
                Some(expected) if prefix_to_lose && value > rule.factor * expected => {
                    p.slow_run += 1;
                    if p.slow_run >= PREFILL_RUN {
                        found = Some((Signal::Prefill, expected, value));
                    }
                }
                _ => {
                    p.slow_run = 0;
                    p.prefill.push(value);
                }
            }
        }
        let (signal, expected, observed) = found?;
        let log = p
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= rule.log_window);
        if log {
            p.last_logged = Some(now);
        }
        Some(DriftVerdict {
            signal,
            expected,
            observed,
            log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> DriftRule {
        DriftRule {
            factor: 3.0,
            min_samples: 5,
            log_window: Duration::from_secs(60),
        }
    }

    fn sample(prompt: u32, cached: u32, prefill: Option<f64>) -> DriftSample {
        DriftSample {
            prompt_tokens: prompt,
            cached_tokens: cached,
            engine_prefill_ms: prefill,
        }
    }

    #[test]
    fn no_shared_prefix_never_alarms_however_busy_the_engine() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        // The defining experiment: one fingerprint (no system prompt), nothing cached. The
        // engine's prefill per token grows 100x as its batches fill up with other work.
        for i in 0..200u32 {
            let prefill = 0.05 * 400.0 * f64::from(1 + i / 2);
            assert_eq!(
                d.observe("r0", "fp", sample(400, 0, Some(prefill)), t0),
                None
            );
        }
        // A few cached tokens now and then (a shared first block) do not make a prefix to lose.
        for i in 0..50u32 {
            let cached = if i % 4 == 0 { 16 } else { 0 };
            let prefill = 20.0 * f64::from(1 + i);
            assert_eq!(
                d.observe("r0", "fp", sample(400, cached, Some(prefill)), t0),
                None
            );
        }
    }

    #[test]
    fn a_load_only_slowdown_is_not_drift() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        // A course: 1,800 of 2,000 tokens cached, 0.1 ms per uncached token of prefill.
        for _ in 0..10 {
            assert_eq!(
                d.observe("r0", "course", sample(2000, 1800, Some(20.0)), t0),
                None
            );
        }
        // Under load the engine queues it for seconds (time to first token 50x), but the
        // cached share and the engine's own prefill per uncached token are unchanged: these
        // are all the detector sees, so nothing is drift.
        for _ in 0..50 {
            assert_eq!(
                d.observe("r0", "course", sample(2000, 1800, Some(22.0)), t0),
                None
            );
        }
        // A slower prefill that is not a run (one slow step) is not drift either.
        assert_eq!(
            d.observe("r0", "course", sample(2000, 1800, Some(200.0)), t0),
            None
        );
        assert_eq!(
            d.observe("r0", "course", sample(2000, 1800, Some(20.0)), t0),
            None
        );
        assert_eq!(
            d.observe("r0", "course", sample(2000, 1800, Some(200.0)), t0),
            None
        );
        assert_eq!(
            d.observe("r0", "course", sample(2000, 1800, Some(200.0)), t0),
            None
        );
    }

    #[test]
    fn a_cached_share_collapse_is_drift_counted_each_time_logged_once_per_window() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        // Before 5 samples nothing is compared, even a collapse.
        d.observe("r0", "course", sample(2000, 0, Some(200.0)), t0);
        for _ in 0..3 {
            d.observe("r0", "course", sample(2000, 1800, Some(20.0)), t0);
        }
        assert_eq!(
            d.observe("r0", "course", sample(2000, 0, Some(200.0)), t0),
            None
        );
        d.observe("r0", "course", sample(2000, 1800, Some(20.0)), t0);
        // Median 1,800 cached now: a request that found nothing is drift.
        let v = d
            .observe("r0", "course", sample(2000, 0, Some(200.0)), t0)
            .expect("drift");
        assert_eq!(v.signal, Signal::CachedTokens);
        assert_eq!((v.expected, v.observed), (1800.0, 0.0));
        assert!(v.log);
        // Counted again, not logged again within the window; 700 of 1,800 is not "far fewer".
        let again = d.observe("r0", "course", sample(2000, 100, None), t0);
        assert!(!again.expect("drift").log);
        assert_eq!(d.observe("r0", "course", sample(2000, 700, None), t0), None);
        let later = t0 + Duration::from_secs(61);
        assert!(
            d.observe("r0", "course", sample(2000, 0, None), later)
                .unwrap()
                .log
        );
        // Drift samples did not move the profile: the course still hits.
        assert_eq!(
            d.observe("r0", "course", sample(2000, 1800, None), later),
            None
        );
    }

    #[test]
    fn profiles_are_per_replica() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        for _ in 0..6 {
            d.observe("r0", "course", sample(2000, 1800, Some(20.0)), t0);
        }
        // Another replica has never held the prefix: its first misses are no drift...
        for _ in 0..6 {
            assert_eq!(
                d.observe("r1", "course", sample(2000, 0, Some(200.0)), t0),
                None
            );
        }
        // ...while the same miss on the replica that held it is.
        let v = d.observe("r0", "course", sample(2000, 0, Some(200.0)), t0);
        assert_eq!(v.map(|v| v.signal), Some(Signal::CachedTokens));
    }

    #[test]
    fn a_run_of_costlier_prefills_per_uncached_token_is_drift() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        let obs = |d: &mut DriftDetector, prompt: u32, cached: u32, ms: f64| {
            d.observe("r0", "course", sample(prompt, cached, Some(ms)), t0)
        };
        // A course: 1,500 of 2,000 tokens cached, 0.02 ms per uncached token.
        for _ in 0..6 {
            assert_eq!(obs(&mut d, 2000, 1500, 10.0), None);
        }
        // Twice the uncached tokens (a longer question), twice the prefill: the same cost.
        assert_eq!(obs(&mut d, 2500, 1500, 20.0), None);
        // Cached tokens unchanged, but each uncached token costs 10x, three requests in a row
        // (cached blocks served from a slower tier, say).
        assert_eq!(obs(&mut d, 2000, 1500, 100.0), None);
        assert_eq!(obs(&mut d, 2000, 1500, 100.0), None);
        let v = obs(&mut d, 2000, 1500, 100.0).expect("drift");
        assert_eq!(v.signal, Signal::Prefill);
        assert!((v.observed - 0.2).abs() < 1e-9 && (v.expected - 0.02).abs() < 1e-9);
        // No per-request metrics: only the cached-token signal, which sees nothing wrong.
        assert_eq!(
            d.observe("r0", "course", sample(2000, 1500, None), t0),
            None
        );
    }

    #[test]
    fn without_cached_token_reporting_nothing_is_judged() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        // vLLM without --enable-prompt-tokens-details: every count reads 0. The prefill per
        // token falls and rises (a prefix cached, then evicted, or only load): no evidence
        // that a prefix was lost, so no alarm.
        for _ in 0..6 {
            assert_eq!(d.observe("r0", "fp", sample(1000, 0, Some(10.0)), t0), None);
        }
        for _ in 0..10 {
            assert_eq!(
                d.observe("r0", "fp", sample(1000, 0, Some(100.0)), t0),
                None
            );
        }
    }

    #[test]
    fn stays_bounded() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        for i in 0..(MAX_PROFILES + 10) {
            d.observe("r0", &format!("fp{i}"), sample(100, 0, None), t0);
        }
        assert!(d.profiles.len() <= MAX_PROFILES);
    }
}
