//! One table of admission decisions, checked against both backends (issue 18, item 2): the
//! in-process rule ([`Limits::fits`], `budget.rs`) and the Redis acquire script (its `fits`,
//! `lua/quota_common_v2.lua`) must agree on every case: seats, reserved shares, ceilings,
//! lending, borrowing (policy `lanes`), hard caps (policy `strict`), and the lane and global
//! token budgets.

use std::num::{NonZeroU32, NonZeroU64};

use super::budget::{Limits, Usage};
use super::redis::scripts::{AcquireArgs, LimitsRecord, LimitsWrite, Scripts, Verdict};
use super::redis::tests::redis_common::RedisServer;
use super::redis::Keys;
use crate::config::{Config, Policy};
use crate::lane::Lane;

/// A small deterministic generator (no dependency, same cases every run).
struct Cases(u64);

impl Cases {
    fn next(&mut self, below: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % u64::from(below.max(1))) as u32
    }
}

/// A config with drawn lane shares, ceilings, lending, borrowing, seats and budgets.
fn drawn_config(g: &mut Cases, policy: Policy) -> Config {
    let mut c = Config::default();
    c.admission.policy = policy;
    for lane in [&mut c.lanes.small, &mut c.lanes.medium, &mut c.lanes.large] {
        let share = 1 + g.next(4);
        lane.max_concurrency = NonZeroU32::new(share).unwrap();
        lane.ceiling = NonZeroU32::new(share + g.next(4)).unwrap();
        lane.lend = g.next(2) == 1;
        lane.borrow = g.next(2) == 1;
        lane.max_tokens_in_flight = NonZeroU64::new(u64::from(1_000 + g.next(4) * 500)).unwrap();
    }
    c.admission.seats = NonZeroU32::new(3 + g.next(10)).unwrap();
    c.admission.max_tokens_in_flight = NonZeroU64::new(u64::from(2_000 + g.next(6) * 500)).unwrap();
    c
}

#[tokio::test]
async fn both_backends_decide_alike() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = Keys::new("tg:decide");
    let scripts = Scripts::default();
    let mut g = Cases(17);
    let (mut granted, mut refused) = (0, 0);
    for case in 0..400 {
        let policy = if case % 4 == 3 {
            Policy::Strict
        } else {
            Policy::Lanes
        };
        let config = drawn_config(&mut g, policy);
        let limits = Limits::from_config(&config);
        let mut usage = [Usage::default(); 3];
        for u in &mut usage {
            u.in_flight = g.next(6);
            u.tokens = u64::from(g.next(5) * 300);
        }
        let lane = Lane::ALL[g.next(3) as usize];
        let tokens = 1 + g.next(1_200);
        let expected = limits.fits(&usage, lane, tokens);
        // The same state in Redis: the usage counters, one lease standing for what they count
        // (with no lease at all a script drops counts as left behind), the record.
        let mut reset = redis::pipe();
        reset
            .atomic()
            .del(&keys.usage)
            .del(&keys.leases)
            .del(&keys.expiry)
            .hset(&keys.leases, "planted", "small 0 0")
            .zadd(&keys.expiry, "planted", 1_000_000_000_000_000u64);
        let global: u64 = usage.iter().map(|u| u.tokens).sum();
        for (l, u) in Lane::ALL.iter().zip(&usage) {
            reset.hset(&keys.usage, format!("{l}:n"), u.in_flight).hset(
                &keys.usage,
                format!("{l}:tokens"),
                u.tokens,
            );
        }
        reset.hset(&keys.usage, "global:tokens", global);
        let () = reset.query_async(&mut conn).await.unwrap();
        scripts
            .limits(
                &mut conn,
                &keys,
                LimitsWrite::Force,
                &LimitsRecord::from_config(&config),
                "test",
            )
            .await
            .unwrap();
        let id = format!("case-{case}");
        let ask = AcquireArgs {
            id: &id,
            lane,
            tokens,
            prompt: 0,
            ttl_ms: 60_000,
            wait_mark_ms: 0,
            replica: "test",
            others_waiting: false,
            behind: &[],
        };
        let reply = scripts.acquire(&mut conn, &keys, &ask).await.unwrap();
        assert_eq!(
            reply.verdict == Verdict::Granted,
            expected,
            "case {case}: {policy:?}, usage {usage:?}, {lane} asks {tokens} tokens, limits {:?}",
            LimitsRecord::from_config(&config)
        );
        if expected {
            granted += 1;
        } else {
            refused += 1;
        }
    }
    // The table exercises both answers (and so both paths of the seat rule).
    assert!(
        granted > 50 && refused > 50,
        "{granted} granted, {refused} refused"
    );
}
