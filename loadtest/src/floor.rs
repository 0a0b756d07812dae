//! The floor: the same small clients with no large ones. Small TTFT under any admission policy
//! is read against it ("how far above what the engine gives small questions alone"), since no
//! policy can bring it lower.

use crate::scenario::Scenario;
use crate::stats::{Results, VsFloor};

/// The class measured against the floor.
pub const FLOOR_CLASS: &str = "small";

/// `scenario` with every class but [`FLOOR_CLASS`] at zero clients. Class indices (and so every
/// small client's seeded sizes, start offset and think times) are unchanged: the floor's small
/// clients send exactly what they send in the other presets.
pub fn floor_scenario(scenario: &Scenario) -> Scenario {
    let mut s = scenario.clone();
    for c in &mut s.classes {
        if c.name != FLOOR_CLASS {
            c.concurrency = 0;
            c.share = 0.0;
        }
    }
    s.name = format!("{} (floor: {FLOOR_CLASS} only)", scenario.name);
    s
}

/// `value / floor`, when both are known and the floor is positive.
pub fn ratio(value: Option<f64>, floor: Option<f64>) -> Option<f64> {
    match (value, floor) {
        (Some(v), Some(f)) if f > 0.0 => Some(v / f),
        _ => None,
    }
}

/// `r`'s [`FLOOR_CLASS`] TTFT quantiles against `floor`'s.
pub fn vs_floor(floor: &Results, r: &Results) -> VsFloor {
    let f = floor.classes.get(FLOOR_CLASS);
    let c = r.classes.get(FLOOR_CLASS);
    let (f50, f95, f99) = (
        f.and_then(|x| x.ttft_p50_s),
        f.and_then(|x| x.ttft_p95_s),
        f.and_then(|x| x.ttft_p99_s),
    );
    VsFloor {
        class: FLOOR_CLASS.into(),
        floor_ttft_p50_s: f50,
        floor_ttft_p95_s: f95,
        floor_ttft_p99_s: f99,
        ttft_p50_x: ratio(c.and_then(|x| x.ttft_p50_s), f50),
        ttft_p95_x: ratio(c.and_then(|x| x.ttft_p95_s), f95),
        ttft_p99_x: ratio(c.and_then(|x| x.ttft_p99_s), f99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::ClassStats;

    #[test]
    fn the_floor_has_no_large_clients() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let s = Scenario::load(&dir.join("defining-experiment.toml")).unwrap();
        let f = floor_scenario(&s);
        assert_eq!(f.classes.len(), s.classes.len());
        for c in &f.classes {
            if c.name == FLOOR_CLASS {
                assert_eq!(c.concurrency, 80);
            } else {
                assert_eq!(c.concurrency, 0, "{}", c.name);
            }
        }
        assert!(f.validate().is_ok());
        // Same small clients: same plans.
        let a = crate::draw::ClientPlan::new(&s, 0, 5, 42).next_step();
        let b = crate::draw::ClientPlan::new(&f, 0, 5, 42).next_step();
        assert_eq!(a, b);
    }

    #[test]
    fn ratios_to_the_floor() {
        let json = |p50: f64, p95: f64, p99: f64| {
            let mut r: Results = serde_json::from_value(serde_json::json!({
                "scenario": {"name": "t", "load": {"mode": "closed"},
                    "class": [{"name": "small", "input_tokens": 400, "output_tokens": 120,
                               "concurrency": 1}]},
                "target": "x", "api": "answer", "seed": 1, "duration_s": 1.0, "wall_s": 1.0,
                "requests": 1, "errors": 0, "errors_by_code": {}, "skipped": 0,
                "output_tokens": 0, "output_tokens_per_s": 0.0, "classes": {},
                "throughput_timeline": [], "records": []
            }))
            .unwrap();
            let c = ClassStats {
                ttft_p50_s: Some(p50),
                ttft_p95_s: Some(p95),
                ttft_p99_s: Some(p99),
                ..Default::default()
            };
            r.classes.insert("small".into(), c);
            r
        };
        let floor = json(0.2, 0.25, 0.4);
        let v = vs_floor(&floor, &json(0.3, 0.5, 0.4));
        assert_eq!(v.floor_ttft_p95_s, Some(0.25));
        assert!((v.ttft_p50_x.unwrap() - 1.5).abs() < 1e-9);
        assert!((v.ttft_p95_x.unwrap() - 2.0).abs() < 1e-9);
        assert!((v.ttft_p99_x.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(
            crate::report::with_ratio(Some(0.5), v.floor_ttft_p95_s, v.ttft_p95_x),
            "0.50 (2.00x)"
        );
        // On a floor (or a value) under 10 ms: milliseconds, and no ratio.
        let tiny = vs_floor(&json(0.004, 0.005, 0.006), &json(0.01, 0.02, 0.03));
        assert_eq!(
            crate::report::with_ratio(Some(0.02), tiny.floor_ttft_p95_s, tiny.ttft_p95_x),
            "0.02 (n/a (<10 ms))"
        );
        assert_eq!(crate::report::s(tiny.floor_ttft_p95_s), "5.0 ms");
        assert_eq!(crate::report::secs(Some(0.0042)), "4.2 ms");
        assert_eq!(crate::report::secs(Some(0.29)), "0.29 s");
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        // Against itself: 1x.
        assert_eq!(vs_floor(&floor, &floor).ttft_p95_x, Some(1.0));
    }
}
