//! The workspace's one quantile: nearest rank (the smallest value with at least `q` of the
//! sample at or below it), as the load tool's reports, the step summaries and the benches
//! print it; and its one seeded generator ([`SplitMix`]), for the simulator's draws, the load
//! tool's arrivals and the tests' generated texts.

/// The `q` quantile (0..=1) of values already sorted ascending, by nearest rank: the value at
/// rank `ceil(q * n)` (at least the first); `None` when there are none.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n.max(1));
    sorted.get(rank - 1).copied()
}

/// [`nearest_rank`] of `v` after sorting it in place (NaN sorts last); `None` when empty.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    nearest_rank(v, q)
}

/// A small, fast, seedable generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A number in `0..n` (`n` > 0; the plain remainder, slightly uneven for huge `n`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// One of `items` (not empty), drawn by [`SplitMix::below`].
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.95), Some(95.0));
        assert_eq!(quantile(&mut v, 0.5), Some(50.0));
        assert_eq!(quantile(&mut [3.0], 0.99), Some(3.0));
        assert_eq!(quantile(&mut [], 0.5), None);
        let mut odd = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&mut odd, 0.5), Some(3.0));
        assert_eq!(quantile(&mut odd, 1.0), Some(5.0));
        assert_eq!(quantile(&mut odd, 0.0), Some(1.0), "q = 0 is the minimum");
    }

    #[test]
    fn splitmix_is_the_reference_sequence_and_draws_in_range() {
        // SplitMix64 from seed 0: the first output of the reference implementation.
        assert_eq!(SplitMix::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut rng = SplitMix::new(7);
        assert!((0..100).all(|_| rng.below(3) < 3));
        assert_eq!(rng.pick(&["only"]), "only");
    }

    #[test]
    fn any_sorted_copy_type() {
        let d = [1u64, 2, 3, 4];
        assert_eq!(nearest_rank(&d, 0.99), Some(4));
        assert_eq!(nearest_rank(&d, 0.25), Some(1));
        assert_eq!(nearest_rank::<u64>(&[], 0.5), None);
    }
}
