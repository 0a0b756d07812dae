//! Small helpers the benchmarks share: knobs from the environment, quantiles, and JSON with its
//! keys shuffled (what a client that does not canonicalize its tools sends).

use std::str::FromStr;

use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{Map, Value};

/// The environment variable `name` parsed as `T`, or `default` when unset or unparsable.
pub fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `q` quantile (0..=1) of `v` by [`tutor_wire::stats::quantile`] (nearest rank), sorting
/// it in place; NaN when `v` is empty (printed as such).
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    tutor_wire::stats::quantile(v, q).unwrap_or(f64::NAN)
}

/// The smallest `n` in `low + 1..=high` for which `enough(n)` holds, by bisection: `enough`
/// must be monotone, hold at `high` and not at `low` (unless `low` is 0).
pub fn smallest_enough(
    mut low: usize,
    mut high: usize,
    mut enough: impl FnMut(usize) -> bool,
) -> usize {
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if enough(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    high
}

/// The same JSON with every object's keys in a random order.
pub fn shuffled(v: &Value, rng: &mut impl Rng) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.shuffle(rng);
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), shuffled(&m[k], rng)))
                    .collect::<Map<_, _>>(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| shuffled(x, rng)).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_and_nan_when_empty() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&mut v, 0.5), 3.0);
        assert_eq!(quantile(&mut v, 1.0), 5.0);
        assert!(quantile(&mut [], 0.5).is_nan());
    }

    #[test]
    fn bisection_finds_the_first_enough() {
        assert_eq!(smallest_enough(0, 100, |n| n * n >= 50), 8);
        assert_eq!(smallest_enough(0, 1, |_| true), 1);
        assert_eq!(smallest_enough(4, 9, |n| n >= 9), 9);
    }

    #[test]
    fn shuffling_keeps_the_value() {
        use rand::SeedableRng;
        let v = serde_json::json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}, "f": "g"});
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        assert_eq!(shuffled(&v, &mut rng), v, "same keys and values, any order");
    }
}
