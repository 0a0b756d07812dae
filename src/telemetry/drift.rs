//! Drift detection (M19): the same prompt fingerprint suddenly costing much more prefill.
//!
//! Per fingerprint, a running profile (EWMA, weight [`ALPHA`]) of prefill milliseconds per
//! uncached prompt token (`uncached = input - cached`, at least 1). Once a profile has
//! `min_samples` samples, a request whose value is above `factor` times the profile is drift
//! (eviction, another replica without the blocks, a tokenizer mismatch, an overloaded engine).
//! Drift samples do not update the profile, so one spike does not hide the next; a lasting
//! change keeps counting, and is logged at most once per fingerprint per `log_window`.
//! At most [`MAX_PROFILES`] fingerprints are tracked; when full, the profiles start over.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// EWMA weight of a new sample.
pub const ALPHA: f64 = 0.2;
/// Most fingerprints profiled at once.
pub const MAX_PROFILES: usize = 4096;

/// The drift rule.
#[derive(Debug, Clone, Copy)]
pub struct DriftRule {
    /// Drift when observed > factor x profile.
    pub factor: f64,
    /// Samples a profile needs before it is compared.
    pub min_samples: u32,
    /// At most one log line per fingerprint per window.
    pub log_window: Duration,
}

/// What one sample showed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftVerdict {
    /// Prefill ms per uncached token the profile expected.
    pub expected_ms_per_token: f64,
    /// Prefill ms per uncached token of this request.
    pub observed_ms_per_token: f64,
    /// Whether this request is the one to log in its window.
    pub log: bool,
}

#[derive(Debug, Clone, Copy)]
struct Profile {
    ewma: f64,
    samples: u32,
    last_logged: Option<Instant>,
}

/// Per-fingerprint prefill profiles.
#[derive(Debug)]
pub struct DriftDetector {
    rule: DriftRule,
    profiles: HashMap<String, Profile>,
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

    /// Adds one request's sample; `Some` when it is drift.
    pub fn observe(
        &mut self,
        fingerprint: &str,
        prefill_ms: f64,
        uncached_tokens: u32,
        now: Instant,
    ) -> Option<DriftVerdict> {
        if !prefill_ms.is_finite() || prefill_ms < 0.0 {
            return None;
        }
        let value = prefill_ms / f64::from(uncached_tokens.max(1));
        if !self.profiles.contains_key(fingerprint) && self.profiles.len() >= MAX_PROFILES {
            self.profiles.clear();
        }
        let p = self
            .profiles
            .entry(fingerprint.to_owned())
            .or_insert(Profile {
                ewma: value,
                samples: 0,
                last_logged: None,
            });
        if p.samples >= self.rule.min_samples && value > self.rule.factor * p.ewma {
            let log = p
                .last_logged
                .is_none_or(|t| now.duration_since(t) >= self.rule.log_window);
            if log {
                p.last_logged = Some(now);
            }
            return Some(DriftVerdict {
                expected_ms_per_token: p.ewma,
                observed_ms_per_token: value,
                log,
            });
        }
        p.ewma = if p.samples == 0 {
            value
        } else {
            ALPHA * value + (1.0 - ALPHA) * p.ewma
        };
        p.samples += 1;
        None
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

    #[test]
    fn flags_a_jump_after_the_profile_is_warm_and_logs_once_per_window() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        // Before 5 samples nothing is compared, even a big jump.
        for _ in 0..4 {
            assert_eq!(d.observe("fp", 10.0, 100, t0), None);
        }
        assert_eq!(d.observe("fp", 100.0, 100, t0), None);
        // Profile now ~0.1*0.8 + 1.0*0.2 = 0.28 ms/token. Within 3x: fine.
        assert_eq!(d.observe("fp", 50.0, 100, t0), None);
        let v = d.observe("fp", 500.0, 100, t0).expect("drift");
        assert!(v.log);
        assert!((v.observed_ms_per_token - 5.0).abs() < 1e-9);
        assert!(v.expected_ms_per_token < 1.0);
        // Counted again, but not logged again within the window; another fingerprint is apart.
        assert!(!d.observe("fp", 500.0, 100, t0).unwrap().log);
        assert_eq!(d.observe("other", 500.0, 100, t0), None);
        let later = t0 + Duration::from_secs(61);
        assert!(d.observe("fp", 500.0, 100, later).unwrap().log);
    }

    #[test]
    fn per_uncached_token_so_more_uncached_tokens_are_not_drift() {
        let mut d = DriftDetector::new(rule());
        let t0 = Instant::now();
        for _ in 0..6 {
            d.observe("fp", 10.0, 100, t0);
        }
        // Ten times the prefill for ten times the uncached tokens: the same cost per token.
        assert_eq!(d.observe("fp", 100.0, 1000, t0), None);
    }
}
