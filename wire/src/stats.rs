//! The workspace's one quantile: nearest rank (the smallest value with at least `q` of the
//! sample at or below it), as the load tool's reports, the step summaries and the benches
//! print it.

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
    fn any_sorted_copy_type() {
        let d = [1u64, 2, 3, 4];
        assert_eq!(nearest_rank(&d, 0.99), Some(4));
        assert_eq!(nearest_rank(&d, 0.25), Some(1));
        assert_eq!(nearest_rank::<u64>(&[], 0.5), None);
    }
}
