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

/// SplitMix64: a tiny deterministic generator, so every run builds the same texts from a seed.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// One of `items`, drawn evenly.
    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
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
    fn splitmix_is_the_reference_sequence() {
        // SplitMix64 from seed 0: the first output of the reference implementation.
        assert_eq!(SplitMix64(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut rng = SplitMix64(7);
        assert!((0..100).all(|_| rng.below(3) < 3));
        assert_eq!(SplitMix64(5).pick(&["only"]), "only");
    }

    #[test]
    fn shuffling_keeps_the_value() {
        use rand::SeedableRng;
        let v = serde_json::json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}, "f": "g"});
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        assert_eq!(shuffled(&v, &mut rng), v, "same keys and values, any order");
    }
}
