//! `compare A B`: side by side per class, the M7 verdict (average output tokens/s up while p95
//! TTFT at least doubles = regression for interactive tutoring) and per-class SLO checks.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::report::{ordered, s};
use crate::stats::Results;

/// What `compare` checks.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Classes whose p95 TTFT the M7 rule watches (interactive ones). Empty: every class.
    pub interactive: Vec<String>,
    /// p95 TTFT SLO per class, seconds.
    pub slo_p95_ttft_s: BTreeMap<String, f64>,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            interactive: vec!["small".into()],
            slo_p95_ttft_s: BTreeMap::from([("small".to_string(), 2.0)]),
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
}

/// Compares baseline `a` with candidate `b`.
pub fn compare(a: &Results, b: &Results, rules: &Rules) -> Verdict {
    let mut o = String::new();
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
        let ratio = match (ca.ttft_p95_s, cb.ttft_p95_s) {
            (Some(x), Some(y)) if x > 0.0 => Some(y / x),
            _ => None,
        };
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |",
            ca.requests, cb.requests, ca.errors, cb.errors, s(ca.ttft_p50_s), s(cb.ttft_p50_s),
            s(ca.ttft_p95_s), s(cb.ttft_p95_s), ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            s(ca.ttft_p99_s), s(cb.ttft_p99_s), s(ca.e2e_p95_s), s(cb.e2e_p95_s),
            ca.output_tokens_per_s, cb.output_tokens_per_s
        );
        let watched = rules.interactive.is_empty() || rules.interactive.iter().any(|c| c == name);
        if watched && tp_up && ratio.is_some_and(|r| r >= 2.0) {
            reasons.push(format!(
                "{name}: p95 TTFT {} s -> {} s ({:.2}x) while output tokens/s rose {:.0} -> {:.0}",
                s(ca.ttft_p95_s),
                s(cb.ttft_p95_s),
                ratio.unwrap_or(0.0),
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
                "- {run} {class}: {} s vs {slo} s: {}",
                s(p95),
                if ok { "met" } else { "MISSED" }
            );
        }
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
            "\nVERDICT: no regression (M7: tokens/s up while a watched p95 TTFT doubles)"
        );
    }
    Verdict {
        regression,
        reasons,
        slo_misses,
        text: o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Api;
    use crate::scenario::Scenario;
    use crate::stats::ClassStats;

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
        }
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
    fn a_doubled_p95_without_a_throughput_gain_is_not_m7() {
        let v = compare(
            &results(1000.0, 0.5, 5.0),
            &results(900.0, 1.5, 5.0),
            &Rules::default(),
        );
        assert!(!v.regression);
    }
}
