//! `compare A B`: side by side per class, the M7 verdict (average output tokens/s up while p95
//! TTFT at least doubles = regression for interactive tutoring) and per-class SLO checks.
//!
//! Like with like: two runs whose prefix-cache hit ratios differ by more than
//! [`Rules::max_cached_ratio_gap`] are not compared (a second run that replays the first one's
//! prompts is served from its cache and looks much faster) unless
//! [`Rules::allow_cache_mismatch`]; durations under 10 ms print in milliseconds and no ratio is
//! built on them.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::report::{ordered, ratio, s, secs, TINY_S};
use crate::stats::{ClassStats, Results};

/// Default of [`Rules::max_cached_ratio_gap`].
pub const MAX_CACHED_RATIO_GAP: f64 = 0.10;

/// What `compare` checks.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Classes whose p95 TTFT the M7 rule watches (interactive ones). Empty: every class.
    pub interactive: Vec<String>,
    /// p95 TTFT SLO per class, seconds.
    pub slo_p95_ttft_s: BTreeMap<String, f64>,
    /// Largest difference between the runs' cached-token ratios (prompt tokens served from
    /// the prefix cache / prompt tokens) that still compares like with like.
    pub max_cached_ratio_gap: f64,
    /// Compare anyway when the gap is larger (with a warning).
    pub allow_cache_mismatch: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            interactive: vec!["small".into()],
            slo_p95_ttft_s: BTreeMap::from([("small".to_string(), 2.0)]),
            max_cached_ratio_gap: MAX_CACHED_RATIO_GAP,
            allow_cache_mismatch: false,
        }
    }
}

/// The outcome of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// M7: B's output tokens/s above A's while some watched class's p95 TTFT at least doubled.
    pub regression: bool,
    /// Why, one line per watched class that doubled.
    pub reasons: Vec<String>,
    /// (run, class, p95, SLO) for every SLO miss; run is "A" or "B".
    pub slo_misses: Vec<(String, String, f64, f64)>,
    /// The Markdown table and verdict.
    pub text: String,
    /// Set when the runs' cached-token ratios differ by more than the rules allow: why.
    pub cache_mismatch: Option<String>,
    /// The comparison was refused (a cache mismatch without `allow_cache_mismatch`): `text`
    /// holds only the reason, and nothing else of the verdict means anything.
    pub refused: bool,
}

/// Why `a` and `b` do not compare like with like as to their prefix caches, if they do not;
/// and notes on what could not be checked.
fn cache_check(a: &Results, b: &Results, rules: &Rules) -> (Option<String>, Vec<String>) {
    let mut notes = vec![];
    if a.seed == b.seed && a.salt == b.salt {
        notes.push(format!(
            "A and B sent the same prompt text (seed {}, {}): a long-lived engine serves the \
             second run's prompts from the first one's prefix cache.",
            a.seed,
            a.salt.map_or("no salt".into(), |x| format!("salt {x:#x}"))
        ));
    }
    let (Some(ca), Some(cb)) = (a.prefix_cache, b.prefix_cache) else {
        let missing: Vec<&str> = [("A", a), ("B", b)]
            .iter()
            .filter(|(_, r)| r.prefix_cache.is_none())
            .map(|(n, _)| *n)
            .collect();
        notes.push(format!(
            "prefix cache not checked: {} reported no prompt tokens (a results.json from \
             before tutor-load recorded them, or a target without usage).",
            missing.join(" and ")
        ));
        return (None, notes);
    };
    let line = format!(
        "cached-token ratio A {:.1}% ({} of {} prompt tokens), B {:.1}% ({} of {})",
        ca.cached_ratio * 100.0,
        ca.cached_tokens,
        ca.prompt_tokens,
        cb.cached_ratio * 100.0,
        cb.cached_tokens,
        cb.prompt_tokens
    );
    if ca.cached_tokens == 0 && cb.cached_tokens == 0 {
        notes.push(format!(
            "{line}: no cached tokens in either run. With vLLM that can mean it runs without \
             --enable-prompt-tokens-details, and the check sees nothing."
        ));
    }
    let gap = (ca.cached_ratio - cb.cached_ratio).abs();
    if gap > rules.max_cached_ratio_gap {
        let why = format!(
            "{line}: they differ by {:.1} points, more than {:.1} (--max-cached-ratio-gap). \
             The run with more cache hits skipped prefill for those tokens, so its TTFT is not \
             comparable. Run both against a fresh engine, or with fresh salts (the default; \
             not --replay nor the same --salt), or pass --allow-cache-mismatch.",
            gap * 100.0,
            rules.max_cached_ratio_gap * 100.0
        );
        return (Some(why), notes);
    }
    notes.push(format!(
        "{line}: within {:.1} points.",
        rules.max_cached_ratio_gap * 100.0
    ));
    (None, notes)
}

/// The smallest share of a watched class's requests failed or refused that counts as a
/// regression when it doubles: below it, a handful of errors in a short run.
const MIN_FAILED_SHARE: f64 = 0.01;

/// The share of `c`'s requests that failed (refused included) or were still running at the
/// hard deadline.
fn failed_share(c: &ClassStats) -> f64 {
    if c.requests == 0 {
        return 0.0;
    }
    (c.errors + c.cut) as f64 / c.requests as f64
}

/// Compares baseline `a` with candidate `b`.
pub fn compare(a: &Results, b: &Results, rules: &Rules) -> Verdict {
    let mut o = String::new();
    let (cache_mismatch, cache_notes) = cache_check(a, b, rules);
    if let Some(why) = &cache_mismatch {
        if !rules.allow_cache_mismatch {
            return Verdict {
                regression: false,
                reasons: vec![],
                slo_misses: vec![],
                text: format!("REFUSED: A and B do not compare like with like. {why}\n"),
                cache_mismatch,
                refused: true,
            };
        }
        let _ = writeln!(
            o,
            "**WARNING: cache mismatch (compared anyway, --allow-cache-mismatch).** {why}\n"
        );
    }
    let _ = writeln!(o, "| class | A req | B req | A err | B err | A TTFT p50 | B TTFT p50 | A p95 | B p95 | B/A p95 | A p99 | B p99 | A e2e p95 | B e2e p95 | A tok/s | B tok/s |");
    o.push_str(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let tp_up = b.output_tokens_per_s > a.output_tokens_per_s;
    let mut reasons = vec![];
    for (name, ca) in ordered(a) {
        let Some(cb) = b.classes.get(name) else {
            continue;
        };
        // The M7 ratio: a p95 under 10 ms counts as 10 ms (no doubling of noise), and B's
        // must be at least 10 ms to be a regression.
        let m7_ratio = match (ca.ttft_p95_s, cb.ttft_p95_s) {
            (Some(x), Some(y)) if y >= TINY_S => Some(y / x.max(TINY_S)),
            _ => None,
        };
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |",
            ca.requests, cb.requests, ca.errors, cb.errors, s(ca.ttft_p50_s), s(cb.ttft_p50_s),
            s(ca.ttft_p95_s), s(cb.ttft_p95_s), ratio(cb.ttft_p95_s, ca.ttft_p95_s),
            s(ca.ttft_p99_s), s(cb.ttft_p99_s), s(ca.e2e_p95_s), s(cb.e2e_p95_s),
            ca.output_tokens_per_s, cb.output_tokens_per_s
        );
        let watched = rules.interactive.is_empty() || rules.interactive.iter().any(|c| c == name);
        // A p95 over the requests that got a first token cannot show the ones refused or
        // failed: a change that sheds a watched class's requests would pass M7 by refusing
        // them. Their share doubling (and above 1%) is a regression of its own.
        let (share_a, share_b) = (failed_share(ca), failed_share(cb));
        if watched && share_b >= MIN_FAILED_SHARE && share_b >= 2.0 * share_a {
            reasons.push(format!(
                "{name}: {:.1}% of requests failed or were refused ({} of {}), against {:.1}% \
                 in A; the TTFT quantiles do not include them",
                share_b * 100.0,
                cb.errors + cb.cut,
                cb.requests,
                share_a * 100.0
            ));
        }
        if watched && tp_up && m7_ratio.is_some_and(|r| r >= 2.0) {
            let x = match ratio(cb.ttft_p95_s, ca.ttft_p95_s) {
                r if r.ends_with('x') => r,
                _ => "A under 10 ms".into(),
            };
            reasons.push(format!(
                "{name}: p95 TTFT {} -> {} ({x}) while output tokens/s rose {:.0} -> {:.0}",
                secs(ca.ttft_p95_s),
                secs(cb.ttft_p95_s),
                a.output_tokens_per_s,
                b.output_tokens_per_s
            ));
        }
    }
    let _ = writeln!(
        o,
        "| **total** | {} | {} | {} | {} | | | | | | | | | | **{:.0}** | **{:.0}** |",
        a.requests, b.requests, a.errors, b.errors, a.output_tokens_per_s, b.output_tokens_per_s
    );
    for (run, r) in [("A", a), ("B", b)] {
        if let Some(line) = crate::report::vs_floor_line(r) {
            let _ = writeln!(o, "\n{run}: {line}");
        }
    }
    let mut slo_misses = vec![];
    for (run, r) in [("A", a), ("B", b)] {
        for (class, &slo) in &rules.slo_p95_ttft_s {
            if let Some(p95) = r.classes.get(class).and_then(|c| c.ttft_p95_s) {
                if p95 > slo {
                    slo_misses.push((run.to_string(), class.clone(), p95, slo));
                }
            }
        }
    }
    let _ = writeln!(o, "\nSLO (p95 TTFT):");
    for (class, slo) in &rules.slo_p95_ttft_s {
        for (run, r) in [("A", a), ("B", b)] {
            let p95 = r.classes.get(class).and_then(|c| c.ttft_p95_s);
            let ok = p95.is_some_and(|p| p <= *slo);
            let _ = writeln!(
                o,
                "- {run} {class}: {} vs {slo} s: {}",
                secs(p95),
                if ok { "met" } else { "MISSED" }
            );
        }
    }
    let _ = writeln!(o, "\nPrefix cache:");
    for n in &cache_notes {
        let _ = writeln!(o, "- {n}");
    }
    if let Some(why) = &cache_mismatch {
        let _ = writeln!(o, "- **MISMATCH** (compared anyway): {why}");
    }
    let regression = !reasons.is_empty();
    if regression {
        let _ = writeln!(o, "\nVERDICT: REGRESSION (M7)");
        for r in &reasons {
            let _ = writeln!(o, "- {r}");
        }
    } else {
        let _ = writeln!(
            o,
            "\nVERDICT: no regression (M7: tokens/s up while a watched p95 TTFT doubles; nor \
             a watched class's failed or refused share doubling)"
        );
    }
    Verdict {
        regression,
        reasons,
        slo_misses,
        text: o,
        cache_mismatch,
        refused: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Api;
    use crate::scenario::Scenario;
    use crate::stats::PrefixCache;

    fn results(tok_s: f64, small_p95: f64, large_p95: f64) -> Results {
        let scenario = Scenario::parse(
            "name='t'\n[load]\nmode='closed'\n[[class]]\nname='small'\ninput_tokens=300\noutput_tokens=120\nconcurrency=1\n[[class]]\nname='large'\ninput_tokens=8000\noutput_tokens=500\nconcurrency=1\n",
        )
        .unwrap();
        let class = |p95: f64| ClassStats {
            requests: 100,
            ok: 100,
            ttft_p50_s: Some(p95 / 2.0),
            ttft_p95_s: Some(p95),
            ttft_p99_s: Some(p95 * 1.2),
            output_tokens_per_s: tok_s / 2.0,
            ..Default::default()
        };
        Results {
            scenario,
            target: "http://x".into(),
            api: Api::Answer,
            seed: 1,
            warmup_s: 0.0,
            warmup_requests: 0,
            duration_s: 60.0,
            wall_s: 60.0,
            requests: 200,
            errors: 0,
            errors_by_code: BTreeMap::new(),
            skipped: 0,
            output_tokens: (tok_s * 60.0) as u64,
            output_tokens_per_s: tok_s,
            classes: BTreeMap::from([
                ("small".into(), class(small_p95)),
                ("large".into(), class(large_p95)),
            ]),
            throughput_timeline: vec![],
            records: vec![],
            vs_floor: None,
            send_lag: None,
            salt: Some(tok_s as u64),
            prefix_cache: Some(PrefixCache {
                requests: 200,
                prompt_tokens: 100_000,
                cached_tokens: 20_000,
                cached_ratio: 0.2,
            }),
        }
    }

    fn cached(mut r: Results, ratio: f64) -> Results {
        let c = r.prefix_cache.as_mut().unwrap();
        c.cached_tokens = (ratio * c.prompt_tokens as f64) as u64;
        c.cached_ratio = ratio;
        r
    }

    #[test]
    fn runs_whose_cache_ratios_differ_beyond_the_gap_are_refused_unless_allowed() {
        // B replayed A's prompts: most of its prompt tokens came from the cache, its TTFT fell.
        let a = cached(results(1000.0, 0.8, 5.0), 0.05);
        let b = cached(results(1000.0, 0.1, 0.3), 0.90);
        let v = compare(&a, &b, &Rules::default());
        assert!(v.refused, "{}", v.text);
        assert!(v.text.starts_with("REFUSED"), "{}", v.text);
        assert!(v.text.contains("85.0 points") && v.text.contains("--allow-cache-mismatch"));
        assert!(
            !v.text.contains("VERDICT"),
            "no verdict on a refused comparison"
        );
        let allow = Rules {
            allow_cache_mismatch: true,
            ..Rules::default()
        };
        let v = compare(&a, &b, &allow);
        assert!(!v.refused && v.cache_mismatch.is_some());
        assert!(v.text.contains("WARNING: cache mismatch"), "{}", v.text);
        assert!(v.text.contains("VERDICT"), "{}", v.text);
        // Within the gap (0.05 vs 0.12): compared, no warning.
        let v = compare(
            &a,
            &cached(results(1000.0, 0.7, 5.0), 0.12),
            &Rules::default(),
        );
        assert!(!v.refused && v.cache_mismatch.is_none(), "{}", v.text);
        assert!(!v.text.contains("WARNING"), "{}", v.text);
        // A narrower gap refuses the same pair.
        let strict = Rules {
            max_cached_ratio_gap: 0.05,
            ..Rules::default()
        };
        let b = cached(results(1000.0, 0.7, 5.0), 0.12);
        assert!(compare(&a, &b, &strict).refused);
    }

    #[test]
    fn a_run_without_cache_figures_is_compared_with_a_note() {
        let a = results(1000.0, 0.8, 5.0);
        let mut b = cached(results(1000.0, 0.8, 5.0), 0.9);
        b.prefix_cache = None;
        let v = compare(&a, &b, &Rules::default());
        assert!(!v.refused, "{}", v.text);
        assert!(v.text.contains("not checked: B"), "{}", v.text);
    }

    #[test]
    fn tiny_ttfts_print_in_ms_and_build_no_ratio() {
        // A warm cache: 5 ms vs 20 ms is not "4.00x".
        let v = compare(
            &results(1000.0, 0.8, 0.005),
            &results(900.0, 0.8, 0.02),
            &Rules::default(),
        );
        let large = v.text.lines().find(|l| l.starts_with("| large")).unwrap();
        assert!(large.contains("| 5.0 ms |"), "{large}");
        assert!(large.contains("n/a (<10 ms)"), "{large}");
        assert!(!large.contains("4.00x"), "{large}");
        assert!(!v.text.contains("0.00"), "{}", v.text);
        // Two tiny p95s are never an M7 regression, whatever their ratio.
        let v = compare(
            &results(1000.0, 0.002, 5.0),
            &results(1100.0, 0.008, 5.0),
            &Rules::default(),
        );
        assert!(!v.regression, "{}", v.text);
        // From under 10 ms to 0.5 s with more tokens/s still is one.
        let v = compare(
            &results(1000.0, 0.004, 5.0),
            &results(1100.0, 0.5, 5.0),
            &Rules::default(),
        );
        assert!(v.regression, "{}", v.text);
        assert!(v.reasons[0].contains("4.0 ms -> 0.50 s"), "{:?}", v.reasons);
    }

    #[test]
    fn throughput_up_and_small_p95_doubled_is_a_regression() {
        let v = compare(
            &results(1000.0, 0.8, 5.0),
            &results(1100.0, 1.7, 5.0),
            &Rules::default(),
        );
        assert!(v.regression, "{}", v.text);
        assert!(v.text.contains("REGRESSION"));
        assert_eq!(v.reasons.len(), 1);
    }

    #[test]
    fn lower_ttft_at_similar_throughput_passes() {
        let v = compare(
            &results(1000.0, 6.0, 5.0),
            &results(980.0, 0.9, 14.0),
            &Rules::default(),
        );
        assert!(!v.regression, "{}", v.text);
        // A misses the 2 s SLO, B meets it.
        assert_eq!(v.slo_misses.len(), 1);
        assert_eq!(v.slo_misses[0].0, "A");
    }

    #[test]
    fn a_watched_class_refused_twice_as_often_is_a_regression_whatever_its_ttft() {
        // B sheds questions: its p95 over the served ones is lower, its tokens/s the same.
        let a = results(1000.0, 0.8, 5.0);
        let mut b = results(1000.0, 0.4, 5.0);
        let small = b.classes.get_mut("small").unwrap();
        (small.ok, small.errors) = (80, 20);
        let v = compare(&a, &b, &Rules::default());
        assert!(v.regression, "{}", v.text);
        assert!(v.reasons[0].contains("20.0%"), "{:?}", v.reasons);
        // The same refusals in an unwatched class (reviews) are not M7's.
        let mut b = results(1000.0, 0.4, 5.0);
        let large = b.classes.get_mut("large").unwrap();
        (large.ok, large.errors) = (80, 20);
        assert!(!compare(&a, &b, &Rules::default()).regression);
    }

    #[test]
    fn a_doubled_p95_without_a_throughput_gain_is_not_m7() {
        let v = compare(
            &results(1000.0, 0.5, 5.0),
            &results(900.0, 1.5, 5.0),
            &Rules::default(),
        );
        assert!(!v.regression);
    }
}
