//! What a prompt prefix usually finds in vLLM's prefix cache: per prefix (its discount key,
//! `crate::prompt::discount_key`: the fingerprint and what else decides a hit), a running
//! average (EWMA, weight [`ALPHA`]) of the prompt tokens vLLM reported cached
//! (`usage.prompt_tokens_details.cached_tokens`). Admission leaves these tokens out of a
//! request's prefill reservation (`admission.prefill_discount_cached`): a course prefix the
//! engine already holds costs next to no prefill.
//!
//! A fingerprint counts only after [`WARM_SAMPLES`] measurements, so one lucky hit discounts
//! nothing. An eviction shows at once: a request that found less cached than the average pulls
//! the average down to its own count (the discount errs towards reserving too much, never
//! towards flooding the engine). At most [`MAX_FINGERPRINTS`] are tracked; when full, the
//! averages start over.
//!
//! A request's sample counts at most its prefix's own tokens (its leading system messages,
//! tools and template kwargs as rendered, plus [`NEXT_HEADER`] for the next message's header,
//! which every request of the prefix renders alike): what vLLM found cached beyond them (a
//! long user message sent again, a session's history, a resumed job's or a pieced prompt's
//! own earlier work) belongs to that request alone. Learnt whole, it let requests with the
//! same prefix and a new long message in reserve next to no prefill.

use std::collections::HashMap;

/// EWMA weight of a new sample that is not below the average.
pub const ALPHA: f64 = 0.2;
/// Measurements a fingerprint needs before it discounts anything.
pub const WARM_SAMPLES: u32 = 3;
/// Most fingerprints tracked at once.
pub const MAX_FINGERPRINTS: usize = 4096;
/// Tokens allowed past a prefix's own for the next message's header, which every request of
/// the prefix renders alike.
pub const NEXT_HEADER: u32 = 32;

#[derive(Debug, Clone, Copy)]
struct Average {
    cached: f64,
    samples: u32,
}

/// Per-fingerprint cached prompt tokens.
#[derive(Debug, Default)]
pub struct CachedPrefixes {
    by_fingerprint: HashMap<String, Average>,
    /// Each prefix's own tokens (see the module doc), counted once.
    sizes: HashMap<String, u32>,
}

impl CachedPrefixes {
    /// Adds one request's measurement: `cached` of its prompt tokens came from the cache.
    pub fn observe(&mut self, fingerprint: &str, cached: u32) {
        if !self.by_fingerprint.contains_key(fingerprint)
            && self.by_fingerprint.len() >= MAX_FINGERPRINTS
        {
            self.by_fingerprint.clear();
        }
        let cached = f64::from(cached);
        let a = self
            .by_fingerprint
            .entry(fingerprint.to_owned())
            .or_insert(Average { cached, samples: 0 });
        a.cached = if a.samples == 0 || cached < a.cached {
            cached
        } else {
            ALPHA * cached + (1.0 - ALPHA) * a.cached
        };
        a.samples = a.samples.saturating_add(1);
    }

    /// Forgets every average (the prefixes' own sizes stay: they are the prompts', not the
    /// cache's).
    pub fn forget(&mut self) {
        self.by_fingerprint.clear();
    }

    /// The tokens of prefix `fingerprint` itself, when counted already.
    pub fn size(&self, fingerprint: &str) -> Option<u32> {
        self.sizes.get(fingerprint).copied()
    }

    /// Keeps the tokens of prefix `fingerprint` itself.
    pub fn set_size(&mut self, fingerprint: &str, tokens: u32) {
        if !self.sizes.contains_key(fingerprint) && self.sizes.len() >= MAX_FINGERPRINTS {
            self.sizes.clear();
        }
        self.sizes.insert(fingerprint.to_owned(), tokens);
    }

    /// The prompt tokens a request with `fingerprint` can expect to find cached (0 until
    /// [`WARM_SAMPLES`] measurements).
    pub fn expected(&self, fingerprint: &str) -> u32 {
        match self.by_fingerprint.get(fingerprint) {
            Some(a) if a.samples >= WARM_SAMPLES => a.cached.floor() as u32,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discounts_only_once_warm_and_follows_an_eviction_down_at_once() {
        let mut c = CachedPrefixes::default();
        c.observe("fp", 0);
        assert_eq!(c.expected("fp"), 0);
        c.observe("fp", 2_000);
        c.observe("fp", 2_000);
        // Warm (3 samples): 0 -> 2000 -> 400 -> 720 by the EWMA upwards.
        assert_eq!(c.expected("fp"), 720);
        for _ in 0..30 {
            c.observe("fp", 2_000);
        }
        assert!((1_990..=2_000).contains(&c.expected("fp")), "converges");
        // Evicted: the next request found nothing cached; no discount from now on.
        c.observe("fp", 0);
        assert_eq!(c.expected("fp"), 0);
        assert_eq!(c.expected("unknown"), 0);
    }

    /// Forgotten (the engine failed and may be back cold), a prefix discounts nothing until
    /// it is warm again.
    #[test]
    fn a_forgotten_prefix_discounts_again_only_once_warm() {
        let mut c = CachedPrefixes::default();
        for _ in 0..10 {
            c.observe("fp", 2_000);
        }
        assert_eq!(c.expected("fp"), 2_000);
        c.forget();
        assert_eq!(c.expected("fp"), 0);
        c.observe("fp", 2_000);
        c.observe("fp", 2_000);
        assert_eq!(c.expected("fp"), 0);
        c.observe("fp", 2_000);
        assert!(c.expected("fp") > 0);
    }

    #[test]
    fn stays_bounded() {
        let mut c = CachedPrefixes::default();
        for i in 0..(MAX_FINGERPRINTS + 10) {
            c.observe(&format!("fp{i}"), 100);
        }
        assert!(c.by_fingerprint.len() <= MAX_FINGERPRINTS);
    }
}
