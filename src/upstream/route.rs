//! Which replica a request goes to: a pure function of the replicas' state and the request's
//! routing key, so it is tested without a network.
//!
//! The score, for [`RoutingPolicy::Affinity`] and a request whose prompt has a stable prefix
//! (its fingerprint is the key):
//!
//! 1. Candidates: the healthy replicas below their `max_num_seqs`; if all of those are at their
//!    cap, the healthy ones (vLLM queues the excess: an ejected replica with room is no
//!    better, it was ejected for failing); if no replica is healthy, every replica below its
//!    cap, else every one (reason `no_healthy`).
//! 2. Rank the candidates by weighted rendezvous hashing of (key, replica name): the top one
//!    is where this prefix was sent before, so where vLLM has it cached; the ranking changes
//!    only for the keys of a replica that comes or goes.
//! 3. Bounded load: take the first in rank whose load after this request stays within
//!    `ceil((1 + ε) × w × (total + 1) / Σw)` requests (ε = `balance_factor`, `w` its weight,
//!    `total` the requests in flight on the candidates). Reason `affinity` when that is the
//!    top-ranked replica, `load` when the top ones were too busy.
//!
//! Without a key (no system prompt, no tools), and for [`RoutingPolicy::LeastLoaded`]: the
//! candidate with the fewest requests in flight per weight, ties broken in turn
//! (`least_loaded`). [`RoutingPolicy::RoundRobin`]: each candidate in turn, `w` turns each
//! (`round_robin`).

use crate::config::RoutingPolicy;

/// One replica as routing sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Requests in flight on it now.
    pub in_flight: u32,
    /// Its weight (≥ 1).
    pub weight: u32,
    /// Its `max_num_seqs`, if capped.
    pub cap: Option<u32>,
    /// Whether it takes traffic.
    pub healthy: bool,
    /// A stable hash of its name (the rendezvous seed).
    pub seed: u64,
    /// Excluded (the replica a failed first try went to).
    pub excluded: bool,
}

/// Where a request goes and why (`reason` is a `tutor_gateway_replica_routed_total` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Index into the candidates.
    pub index: usize,
    /// `affinity`, `load`, `least_loaded`, `round_robin` or `no_healthy`.
    pub reason: &'static str,
}

/// Picks a replica (see the module doc). `key` is the request's routing key (a hash of its
/// prefix fingerprint), `turn` a counter that advances per request. `None` when every
/// candidate is excluded.
pub fn pick(
    policy: RoutingPolicy,
    balance_factor: f64,
    key: Option<u64>,
    turn: u64,
    replicas: &[Candidate],
) -> Option<Route> {
    let open = |c: &Candidate| !c.excluded && c.cap.is_none_or(|cap| c.in_flight < cap);
    let mut pool: Vec<usize> = (0..replicas.len())
        .filter(|&i| open(&replicas[i]) && replicas[i].healthy)
        .collect();
    let mut fallback = None;
    if pool.is_empty() {
        // Every healthy replica at its cap: the healthy ones queue it inside vLLM.
        pool = (0..replicas.len())
            .filter(|&i| !replicas[i].excluded && replicas[i].healthy)
            .collect();
    }
    if pool.is_empty() {
        // None healthy: the ones below their cap, else any.
        fallback = Some("no_healthy");
        pool = (0..replicas.len())
            .filter(|&i| open(&replicas[i]))
            .collect();
        if pool.is_empty() {
            pool = (0..replicas.len())
                .filter(|&i| !replicas[i].excluded)
                .collect();
        }
    }
    if pool.is_empty() {
        return None;
    }
    let route = match (policy, key) {
        (RoutingPolicy::RoundRobin, _) => round_robin(&pool, replicas, turn),
        (RoutingPolicy::Affinity, Some(key)) => {
            bounded_affinity(&pool, replicas, key, balance_factor)
        }
        _ => least_loaded(&pool, replicas, turn),
    };
    Some(Route {
        reason: fallback.unwrap_or(route.reason),
        ..route
    })
}

fn round_robin(pool: &[usize], replicas: &[Candidate], turn: u64) -> Route {
    let total: u64 = pool.iter().map(|&i| u64::from(replicas[i].weight)).sum();
    let mut slot = turn % total.max(1);
    for &i in pool {
        let w = u64::from(replicas[i].weight);
        if slot < w {
            return Route {
                index: i,
                reason: "round_robin",
            };
        }
        slot -= w;
    }
    Route {
        index: pool[0],
        reason: "round_robin",
    }
}

fn least_loaded(pool: &[usize], replicas: &[Candidate], turn: u64) -> Route {
    // Compare (in_flight + 1) / weight without floats: a/wa < b/wb  <=>  a*wb < b*wa.
    let load = |i: usize| {
        (
            u64::from(replicas[i].in_flight) + 1,
            u64::from(replicas[i].weight),
        )
    };
    let n = pool.len();
    let start = (turn % n as u64) as usize;
    let mut best = pool[start];
    for k in 1..n {
        let i = pool[(start + k) % n];
        let ((a, wa), (b, wb)) = (load(i), load(best));
        if a * wb < b * wa {
            best = i;
        }
    }
    Route {
        index: best,
        reason: "least_loaded",
    }
}

fn bounded_affinity(pool: &[usize], replicas: &[Candidate], key: u64, eps: f64) -> Route {
    let mut ranked: Vec<(f64, usize)> = pool
        .iter()
        .map(|&i| (rendezvous_score(key, &replicas[i]), i))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let total: u64 = pool.iter().map(|&i| u64::from(replicas[i].in_flight)).sum();
    let weights: u64 = pool.iter().map(|&i| u64::from(replicas[i].weight)).sum();
    let fits = |i: usize| {
        let c = &replicas[i];
        let bound =
            ((1.0 + eps) * f64::from(c.weight) * (total + 1) as f64 / weights as f64).ceil();
        f64::from(c.in_flight + 1) <= bound
    };
    for (rank, &(_, i)) in ranked.iter().enumerate() {
        if fits(i) {
            return Route {
                index: i,
                reason: if rank == 0 { "affinity" } else { "load" },
            };
        }
    }
    // Unreachable in practice (the least loaded always fits the bound); stay total anyway.
    Route {
        reason: "load",
        ..least_loaded(pool, replicas, key)
    }
}

/// Weighted rendezvous score of `key` on `c`: `-w / ln(u)`, `u` in (0, 1) drawn from the hash
/// of (key, replica): the highest score wins, and each replica wins `w / Σw` of the keys.
fn rendezvous_score(key: u64, c: &Candidate) -> f64 {
    let h = mix(key ^ mix(c.seed));
    // 53 random bits -> (0, 1).
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(c.weight) / u.ln()
}

/// SplitMix64's finalizer: a fixed, well-mixed 64-bit permutation (the same in every build
/// and every replica of the gateway, so they all route a prefix the same way).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable 64-bit hash of `text` (FNV-1a, then [`mix`]).
pub fn hash_str(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(name: &str, in_flight: u32) -> Candidate {
        Candidate {
            in_flight,
            weight: 1,
            cap: None,
            healthy: true,
            seed: hash_str(name),
            excluded: false,
        }
    }

    fn three() -> Vec<Candidate> {
        vec![replica("a", 0), replica("b", 0), replica("c", 0)]
    }

    #[test]
    fn a_prefix_keeps_its_replica_while_loads_are_even() {
        let r = three();
        for k in 0..200u64 {
            let key = hash_str(&format!("course-{k}"));
            let first = pick(RoutingPolicy::Affinity, 0.25, Some(key), k, &r).unwrap();
            assert_eq!(first.reason, "affinity");
            for turn in 0..5 {
                let again = pick(RoutingPolicy::Affinity, 0.25, Some(key), turn, &r).unwrap();
                assert_eq!(again.index, first.index);
            }
        }
    }

    #[test]
    fn keys_spread_by_weight() {
        let mut r = three();
        r[2].weight = 2;
        let mut wins = [0u32; 3];
        for k in 0..8000u64 {
            let route = pick(RoutingPolicy::Affinity, 0.25, Some(mix(k)), 0, &r).unwrap();
            wins[route.index] += 1;
        }
        // Expected 2000 / 2000 / 4000; allow a generous margin (the hash is fixed: no flake).
        assert!(wins[0] > 1700 && wins[0] < 2300, "{wins:?}");
        assert!(wins[1] > 1700 && wins[1] < 2300, "{wins:?}");
        assert!(wins[2] > 3600 && wins[2] < 4400, "{wins:?}");
    }

    #[test]
    fn a_busy_home_replica_spills_to_the_next_in_rank() {
        let key = hash_str("course-7");
        let r = three();
        let home = pick(RoutingPolicy::Affinity, 0.25, Some(key), 0, &r)
            .unwrap()
            .index;
        let mut busy = three();
        busy[home].in_flight = 10;
        let spill = pick(RoutingPolicy::Affinity, 0.25, Some(key), 0, &busy).unwrap();
        assert_ne!(spill.index, home);
        assert_eq!(spill.reason, "load");
        // Within the bound it stays home: 3 in flight on it, 11 / 3 × 1.25 average allows 5.
        let mut some = three();
        some[home].in_flight = 3;
        some[(home + 1) % 3].in_flight = 4;
        some[(home + 2) % 3].in_flight = 3;
        let stay = pick(RoutingPolicy::Affinity, 0.25, Some(key), 0, &some).unwrap();
        assert_eq!((stay.index, stay.reason), (home, "affinity"));
    }

    #[test]
    fn no_replica_takes_more_than_the_bound_under_one_hot_key() {
        let mut r = three();
        let key = hash_str("the one course everybody takes");
        for turn in 0..300 {
            let route = pick(RoutingPolicy::Affinity, 0.25, Some(key), turn, &r).unwrap();
            r[route.index].in_flight += 1;
            let total: u32 = r.iter().map(|c| c.in_flight).sum();
            let bound = (1.25 * f64::from(total) / 3.0).ceil() as u32;
            assert!(r.iter().all(|c| c.in_flight <= bound.max(1)), "{r:?}");
        }
    }

    #[test]
    fn ejected_and_full_replicas_are_skipped_and_none_healthy_still_routes() {
        let mut r = three();
        r[0].healthy = false;
        r[1].cap = Some(2);
        r[1].in_flight = 2;
        for k in 0..50u64 {
            let route = pick(RoutingPolicy::Affinity, 0.25, Some(mix(k)), k, &r).unwrap();
            assert_eq!(route.index, 2);
        }
        for c in &mut r {
            c.healthy = false;
        }
        let route = pick(RoutingPolicy::LeastLoaded, 0.25, None, 0, &r).unwrap();
        assert_eq!(route.reason, "no_healthy");
        assert_ne!(
            route.index, 1,
            "a replica at its cap is not chosen while another is open"
        );
        for c in &mut r {
            c.excluded = true;
        }
        assert_eq!(pick(RoutingPolicy::LeastLoaded, 0.25, None, 0, &r), None);
    }

    /// A healthy replica at its cap takes the request (vLLM queues it) before an ejected one
    /// with room: that one was ejected for failing (refusing, or hanging until the first-token
    /// timeout).
    #[test]
    fn a_healthy_replica_at_its_cap_goes_before_an_ejected_one_with_room() {
        let mut r = three();
        r.truncate(2);
        r[0].cap = Some(5);
        r[0].in_flight = 5;
        r[1].cap = Some(5);
        r[1].healthy = false;
        for policy in [RoutingPolicy::Affinity, RoutingPolicy::LeastLoaded] {
            for k in 0..20u64 {
                let route = pick(policy, 0.25, Some(mix(k)), k, &r).unwrap();
                assert_eq!(route.index, 0, "{policy:?}");
                assert_ne!(route.reason, "no_healthy");
            }
        }
    }

    #[test]
    fn least_loaded_and_round_robin() {
        let mut r = three();
        r[0].in_flight = 2;
        r[1].in_flight = 1;
        r[2].in_flight = 3;
        let route = pick(RoutingPolicy::LeastLoaded, 0.25, None, 5, &r).unwrap();
        assert_eq!((route.index, route.reason), (1, "least_loaded"));
        // No key under affinity: least loaded too.
        let route = pick(RoutingPolicy::Affinity, 0.25, None, 5, &r).unwrap();
        assert_eq!(route.index, 1);
        let order: Vec<usize> = (0..6)
            .map(|t| {
                pick(RoutingPolicy::RoundRobin, 0.25, Some(1), t, &r)
                    .unwrap()
                    .index
            })
            .collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
    }
}
