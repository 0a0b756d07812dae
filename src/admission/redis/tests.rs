//! The Lua scripts' edge cases against a real `redis-server` the tests start themselves.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::keys::Keys;
use super::scripts::{
    AcquireArgs, Behind, LaneRecord, LimitsRecord, LimitsWrite, Scripts, Verdict,
};
use crate::admission::budget::PrefillLimit;
use crate::lane::Lane;

#[path = "../../../tests/redis_common/mod.rs"]
pub(crate) mod redis_common;
use redis_common::RedisServer;

/// One lane's slots and token budget, for a strict limits record.
#[derive(Debug, Clone, Copy)]
struct LaneQuota {
    max_requests: u32,
    max_tokens: u64,
}

/// Medium's and large's limits unless a test says otherwise.
const OTHER: LaneQuota = LaneQuota {
    max_requests: 3,
    max_tokens: 50_000,
};

const SMALL: LaneQuota = LaneQuota {
    max_requests: 2,
    max_tokens: 1_000,
};

struct Fixture {
    _server: RedisServer,
    conn: MultiplexedConnection,
    keys: Keys,
    scripts: Scripts,
}

async fn fixture() -> Fixture {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    Fixture {
        _server: server,
        conn,
        keys: Keys::new("tg:test"),
        scripts: Scripts::default(),
    }
}

/// The prefill budget the prefill tests use: 12288 tokens, long prompts above 2048.
const PREFILL: PrefillLimit = PrefillLimit {
    budget: 12_288,
    long_prompt: 2_048,
};

/// No prefill budget (prompts are counted, nobody waits).
const NO_PREFILL_BUDGET: PrefillLimit = PrefillLimit {
    budget: 0,
    long_prompt: 2_048,
};

impl Fixture {
    async fn acquire(
        &mut self,
        id: &str,
        lane: Lane,
        tokens: u32,
        ttl: u64,
        global: u64,
    ) -> (Verdict, u64) {
        self.acquire_prompt(id, lane, tokens, 0, ttl, global, NO_PREFILL_BUDGET)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn acquire_prompt(
        &mut self,
        id: &str,
        lane: Lane,
        tokens: u32,
        prompt: u32,
        ttl: u64,
        global: u64,
        prefill: PrefillLimit,
    ) -> (Verdict, u64) {
        self.limits([SMALL, OTHER, OTHER], global, prefill).await;
        let ask = AcquireArgs {
            id,
            lane,
            tokens,
            prompt,
            ttl_ms: ttl,
            wait_mark_ms: 0,
            replica: "test",
            others_waiting: false,
            behind: &[],
        };
        let r = self
            .scripts
            .acquire(&mut self.conn, &self.keys, &ask)
            .await
            .unwrap();
        (r.verdict, r.reaped)
    }

    /// Writes a strict limits record (each lane's slots are its cap) with `lanes` in
    /// [`Lane::ALL`] order.
    async fn limits(&mut self, lanes: [LaneQuota; 3], global: u64, prefill: PrefillLimit) {
        let record = LimitsRecord {
            work_conserving: false,
            seats: 100,
            global_tokens: global,
            prefill,
            lanes: lanes.map(|q| LaneRecord {
                max: q.max_requests,
                ceiling: q.max_requests,
                tokens: q.max_tokens,
                lend: true,
                borrow: false,
            }),
            preempt_grace: 0,
            preempt_cooldown_ms: 0,
        };
        self.scripts
            .limits(
                &mut self.conn,
                &self.keys,
                LimitsWrite::Force,
                &record,
                "test",
            )
            .await
            .unwrap();
    }

    /// A long (`prompt` > 2048) or short prompt in the large lane under [`PREFILL`].
    async fn prompt(&mut self, id: &str, prompt: u32) -> Verdict {
        let tokens = prompt + 100;
        self.acquire_prompt(id, Lane::Large, tokens, prompt, 10_000, 100_000, PREFILL)
            .await
            .0
    }

    async fn prefill_done(&mut self, id: &str) -> u64 {
        self.scripts
            .prefill_done(&mut self.conn, &self.keys, &[(id, Some(Duration::ZERO))])
            .await
            .unwrap()
    }

    async fn usage(&mut self, field: &str) -> i64 {
        let v: Option<i64> = redis::cmd("HGET")
            .arg(&self.keys.usage)
            .arg(field)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        v.unwrap_or(0)
    }
}

#[tokio::test]
async fn acquire_checks_slots_lane_tokens_and_global_tokens() {
    let mut f = fixture().await;
    assert_eq!(
        f.acquire("a", Lane::Small, 600, 10_000, 10_000).await.0,
        Verdict::Granted
    );
    // Lane token budget: 600 + 500 > 1000.
    assert_eq!(
        f.acquire("b", Lane::Small, 500, 10_000, 10_000).await.0,
        Verdict::LaneTokens
    );
    // Global budget: 600 + 300 > 800.
    assert_eq!(
        f.acquire("b", Lane::Small, 300, 10_000, 800).await.0,
        Verdict::GlobalTokens
    );
    assert_eq!(
        f.acquire("b", Lane::Small, 300, 10_000, 10_000).await.0,
        Verdict::Granted
    );
    // Two slots taken.
    assert_eq!(
        f.acquire("c", Lane::Small, 1, 10_000, 10_000).await.0,
        Verdict::LaneFull
    );
    // A retried acquire of a held id is granted once, not twice.
    assert_eq!(
        f.acquire("a", Lane::Small, 600, 10_000, 10_000).await.0,
        Verdict::Granted
    );
    assert_eq!(f.usage("small:n").await, 2);
    assert_eq!(f.usage("small:tokens").await, 900);
    assert_eq!(f.usage("global:tokens").await, 900);
}

#[tokio::test]
async fn expired_leases_are_reaped_and_renewed_ones_are_not() {
    let mut f = fixture().await;
    // "short" lives 100 ms; "kept" 10 s, renewed for 10 s each round, so no pause of this
    // process can let it expire, while three 60 ms sleeps always outlast "short".
    f.acquire("short", Lane::Small, 100, 100, 10_000).await;
    f.acquire("kept", Lane::Small, 100, 10_000, 10_000).await;
    let mut reaped = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let r = f
            .scripts
            .renew(&mut f.conn, &f.keys, 10_000, &["kept".to_owned()])
            .await
            .unwrap();
        assert_eq!(r.renewed, 1);
        reaped += r.reaped;
    }
    // "short" expired and was reaped once (by a renew call); a new lease fits in its place.
    let (verdict, more) = f.acquire("new", Lane::Small, 100, 10_000, 10_000).await;
    assert_eq!((verdict, reaped + more), (Verdict::Granted, 1));
    assert_eq!(f.usage("small:n").await, 2);
    assert_eq!(f.usage("global:tokens").await, 200);
    let r = f
        .scripts
        .renew(
            &mut f.conn,
            &f.keys,
            100,
            &["short".to_owned(), "new".to_owned()],
        )
        .await
        .unwrap();
    assert_eq!((r.renewed, r.missing), (1, vec!["short".to_owned()]));
}

#[tokio::test]
async fn an_acquire_takes_those_behind_it_in_order_up_to_the_first_that_does_not_fit() {
    let mut f = fixture().await;
    let small = LaneQuota {
        max_requests: 4,
        max_tokens: 1_000,
    };
    f.limits([small, OTHER, OTHER], 10_000, NO_PREFILL_BUDGET)
        .await;
    let behind = |id: &str, tokens| Behind {
        id: id.to_owned(),
        tokens,
        prompt: 0,
    };
    // 100 + 300 fit; 700 more would not (1000 tokens); 10 would, but comes after it.
    let line = [behind("b1", 300), behind("b2", 700), behind("b3", 10)];
    let ask = |id, tokens, behind| AcquireArgs {
        id,
        lane: Lane::Small,
        tokens,
        prompt: 0,
        ttl_ms: 10_000,
        wait_mark_ms: 0,
        replica: "test",
        others_waiting: false,
        behind,
    };
    let r = f
        .scripts
        .acquire(&mut f.conn, &f.keys, &ask("h", 100, &line))
        .await
        .unwrap();
    assert_eq!((r.verdict, r.behind), (Verdict::Granted, 1));
    assert_eq!(f.usage("small:n").await, 2);
    assert_eq!(f.usage("small:tokens").await, 400);
    let held: Vec<bool> = redis::cmd("HMGET")
        .arg(&f.keys.leases)
        .arg(&["h", "b1", "b2", "b3"])
        .query_async::<Vec<Option<String>>>(&mut f.conn)
        .await
        .unwrap()
        .iter()
        .map(Option::is_some)
        .collect();
    assert_eq!(held, [true, true, false, false]);
    // The same call sent again (its reply was lost): the same grants, counted once.
    let r = f
        .scripts
        .acquire(&mut f.conn, &f.keys, &ask("h", 100, &line))
        .await
        .unwrap();
    assert_eq!((r.verdict, r.behind), (Verdict::Granted, 1));
    assert_eq!(f.usage("small:n").await, 2);
    assert_eq!(f.usage("small:tokens").await, 400);
    // A refused head takes nobody behind it, even one that would fit.
    let r = f
        .scripts
        .acquire(&mut f.conn, &f.keys, &ask("x", 700, &[behind("y", 1)]))
        .await
        .unwrap();
    assert_eq!((r.verdict, r.behind), (Verdict::LaneTokens, 0));
    assert_eq!(f.usage("small:n").await, 2);
    // One release call gives several back, once each.
    let given = f
        .scripts
        .release_all(&mut f.conn, &f.keys, &["h", "b1", "b2", "h"])
        .await
        .unwrap();
    assert_eq!(given, 2);
    for field in ["small:n", "small:tokens", "global:tokens"] {
        assert_eq!(f.usage(field).await, 0, "{field}");
    }
}

/// Counts left behind with no lease at all (a lease's key deleted or evicted from outside)
/// held seats for good; the next call finds no lease and drops them.
#[tokio::test]
async fn counts_left_without_any_lease_are_dropped() {
    let mut f = fixture().await;
    let _: () = redis::cmd("HSET")
        .arg(&f.keys.usage)
        .arg(&[
            ("small:n", "2"),
            ("small:tokens", "300"),
            ("global:tokens", "300"),
        ])
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(
        f.acquire("a", Lane::Small, 100, 10_000, 10_000).await.0,
        Verdict::Granted
    );
    assert_eq!(f.usage("small:n").await, 1);
    assert_eq!(f.usage("global:tokens").await, 100);
    assert!(f.scripts.release(&mut f.conn, &f.keys, "a").await.unwrap());
    for field in ["small:n", "small:tokens", "global:tokens"] {
        assert_eq!(f.usage(field).await, 0, "{field}");
    }
}

#[tokio::test]
async fn release_is_idempotent() {
    let mut f = fixture().await;
    f.acquire("a", Lane::Small, 100, 10_000, 10_000).await;
    assert!(f.scripts.release(&mut f.conn, &f.keys, "a").await.unwrap());
    assert!(!f.scripts.release(&mut f.conn, &f.keys, "a").await.unwrap());
    assert!(!f
        .scripts
        .release(&mut f.conn, &f.keys, "never")
        .await
        .unwrap());
    assert_eq!(f.usage("small:n").await, 0);
    assert_eq!(f.usage("small:tokens").await, 0);
    assert_eq!(f.usage("global:tokens").await, 0);
}

/// Growing a lease where it is needs tokens only, as in process: it keeps its seat, though the
/// lane holds more than its seats now (a reload lowered them, lent seats came back).
#[tokio::test]
async fn growing_a_lease_where_it_is_needs_tokens_not_a_fresh_seat() {
    let mut f = fixture().await;
    f.acquire("a", Lane::Small, 300, 10_000, 10_000).await;
    f.acquire("b", Lane::Small, 300, 10_000, 10_000).await;
    let one_seat = LaneQuota {
        max_requests: 1,
        max_tokens: 1_000,
    };
    f.limits([one_seat, OTHER, OTHER], 10_000, NO_PREFILL_BUDGET)
        .await;
    let grown = f
        .scripts
        .move_and_grow(&mut f.conn, &f.keys, "a", Lane::Small, 400, false)
        .await
        .unwrap();
    assert_eq!(grown.verdict, Verdict::Granted);
    assert_eq!(f.usage("small:n").await, 2);
    assert_eq!(f.usage("small:tokens").await, 700);
    assert_eq!(f.usage("global:tokens").await, 700);
    // Its tokens still bound it.
    let over = f
        .scripts
        .move_and_grow(&mut f.conn, &f.keys, "b", Lane::Small, 800, false)
        .await
        .unwrap();
    assert_eq!(over.verdict, Verdict::LaneTokens);
    assert_eq!(f.usage("small:tokens").await, 700);
}

#[tokio::test]
async fn move_succeeds_only_when_the_target_lane_has_room() {
    let mut f = fixture().await;
    let medium = LaneQuota {
        max_requests: 1,
        max_tokens: 5_000,
    };
    f.acquire("a", Lane::Small, 300, 10_000, 10_000).await;
    f.acquire("b", Lane::Small, 300, 10_000, 10_000).await;
    f.limits([SMALL, medium, OTHER], 10_000, NO_PREFILL_BUDGET)
        .await;
    let moved = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "a", Lane::Medium)
        .await
        .unwrap();
    assert_eq!(moved.verdict, Verdict::Granted);
    assert_eq!(f.usage("small:n").await, 1);
    assert_eq!(f.usage("medium:n").await, 1);
    assert_eq!(f.usage("medium:tokens").await, 300);
    assert_eq!(f.usage("global:tokens").await, 600);
    // Medium is full (one slot): b stays where it is.
    let full = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "b", Lane::Medium)
        .await
        .unwrap();
    assert_eq!(full.verdict, Verdict::LaneFull);
    assert_eq!(f.usage("small:n").await, 1);
    // No token room in the target.
    let tight = LaneQuota {
        max_requests: 5,
        max_tokens: 200,
    };
    f.limits([SMALL, medium, tight], 10_000, NO_PREFILL_BUDGET)
        .await;
    let r = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "b", Lane::Large)
        .await
        .unwrap();
    assert_eq!(r.verdict, Verdict::LaneTokens);
    // A released lease cannot move; releasing the moved one frees the medium lane.
    assert!(f.scripts.release(&mut f.conn, &f.keys, "a").await.unwrap());
    let gone = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "a", Lane::Small)
        .await
        .unwrap();
    assert_eq!(gone.verdict, Verdict::NoLease);
    assert_eq!(f.usage("medium:n").await, 0);
    assert_eq!(f.usage("medium:tokens").await, 0);
    assert_eq!(f.usage("global:tokens").await, 300);
}

#[tokio::test]
async fn scripts_reload_after_a_script_flush() {
    let mut f = fixture().await;
    f.acquire("a", Lane::Small, 1, 10_000, 10_000).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    // EVALSHA answers NOSCRIPT; the script is loaded again and the call succeeds.
    assert!(f.scripts.release(&mut f.conn, &f.keys, "a").await.unwrap());
}

#[tokio::test]
async fn a_long_prompt_needs_prefill_room_and_a_short_one_is_only_counted() {
    let mut f = fixture().await;
    assert_eq!(f.prompt("a", 8_000).await, Verdict::Granted);
    // 8000 + 6000 > 12288: no room, and nothing was taken.
    assert_eq!(f.prompt("b", 6_000).await, Verdict::PrefillFull);
    assert_eq!(f.usage("large:n").await, 1);
    assert_eq!(f.usage("global:tokens").await, 8_100);
    // A short prompt never waits for it, and is counted: 8000 + 2048.
    assert_eq!(f.prompt("short", 2_048).await, Verdict::Granted);
    assert_eq!(f.usage("prefill:tokens").await, 10_048);
    // The first token of "a" gives its room back (once); its slot and tokens stay.
    assert_eq!(f.prefill_done("a").await, 8_000);
    assert_eq!(f.prefill_done("a").await, 0);
    assert_eq!(f.usage("prefill:tokens").await, 2_048);
    assert_eq!(f.usage("large:n").await, 2);
    assert_eq!(f.prompt("b", 6_000).await, Verdict::Granted);
    assert_eq!(f.usage("prefill:tokens").await, 8_048);
    // Releasing after the first token does not give the room back twice; releasing a lease
    // still in prefill gives its room back with it.
    assert!(f.scripts.release(&mut f.conn, &f.keys, "a").await.unwrap());
    assert!(f.scripts.release(&mut f.conn, &f.keys, "b").await.unwrap());
    assert_eq!(f.usage("prefill:tokens").await, 2_048);
    assert!(f
        .scripts
        .release(&mut f.conn, &f.keys, "short")
        .await
        .unwrap());
    assert_eq!(f.usage("prefill:tokens").await, 0);
    assert_eq!(f.usage("global:tokens").await, 0);
    assert_eq!(f.prefill_done("short").await, 0, "a gone lease");
}

#[tokio::test]
async fn a_prompt_larger_than_the_budget_runs_only_alone() {
    let mut f = fixture().await;
    assert_eq!(f.prompt("short", 500).await, Verdict::Granted);
    assert_eq!(f.prompt("big", 14_000).await, Verdict::PrefillFull);
    f.prefill_done("short").await;
    assert_eq!(f.prompt("big", 14_000).await, Verdict::Granted);
    assert_eq!(f.prompt("next", 3_000).await, Verdict::PrefillFull);
    assert_eq!(f.usage("prefill:tokens").await, 14_000);
}

#[tokio::test]
async fn an_expired_lease_in_prefill_gives_its_room_back_and_a_move_keeps_it() {
    let mut f = fixture().await;
    f.acquire_prompt("gone", Lane::Large, 9_000, 8_000, 50, 100_000, PREFILL)
        .await;
    f.acquire_prompt("kept", Lane::Small, 600, 500, 10_000, 100_000, PREFILL)
        .await;
    assert_eq!(f.usage("prefill:tokens").await, 8_500);
    // A promotion moves the lease with its prefill reservation.
    let medium = LaneQuota {
        max_requests: 1,
        max_tokens: 5_000,
    };
    f.limits([SMALL, medium, OTHER], 100_000, PREFILL).await;
    let moved = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "kept", Lane::Medium)
        .await
        .unwrap();
    assert_eq!(moved.verdict, Verdict::Granted);
    tokio::time::sleep(Duration::from_millis(120)).await;
    // The next call reaps "gone" (its room comes back); "kept" still holds its 500.
    assert_eq!(f.prompt("long", 11_000).await, Verdict::Granted);
    assert_eq!(f.usage("prefill:tokens").await, 11_500);
    assert_eq!(f.prefill_done("kept").await, 500);
    assert_eq!(f.usage("prefill:tokens").await, 11_000);
}

/// The tenant budget script (`lua/tenant_budget_v2.lua`): a charge crossing the limit is the
/// last admitted; the next is refused with the limit, the use and a wait within the minute; a
/// settlement of a request that never ran gives its charge and its request back; `peek`
/// reads what is charged.
#[tokio::test]
async fn the_tenant_budget_script_charges_refuses_and_settles() {
    let mut f = fixture().await;
    let script = redis::Script::new(include_str!("../../../lua/tenant_budget_v2.lua"));
    let (minute, day) = (
        "tg:test:{quota}:tenant:x:minute",
        "tg:test:{quota}:tenant:x:day",
    );
    let charge = |tokens: u64| {
        let mut call = script.prepare_invoke();
        call.key(minute)
            .key(day)
            .arg("charge")
            .arg(3)
            .arg(1_000)
            .arg(0)
            .arg(tokens);
        call
    };
    let first: Vec<i64> = charge(600).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(first[0], 0, "{first:?}");
    let second: Vec<i64> = charge(600).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(
        second[0], 0,
        "under the limit when asked: admitted, {second:?}"
    );
    let refused: Vec<i64> = charge(1).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(&refused[..3], &[2, 1_200, 1_000], "tokens per minute");
    assert!((1..=60).contains(&refused[3]), "{refused:?}");
    // The second never reached the engine: its tokens and its request come back.
    let () = script
        .key(minute)
        .key(day)
        .arg("settle")
        .arg(second[1])
        .arg(second[2])
        .arg(-600)
        .arg("1")
        .invoke_async(&mut f.conn)
        .await
        .unwrap();
    let used: (u64, u64, u64) = script
        .key(minute)
        .key(day)
        .arg("peek")
        .invoke_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(used, (1, 600, 600));
    let again: Vec<i64> = charge(1).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(again[0], 0, "{again:?}");
    // Requests per minute: 2 counted, the limit 3; the third is admitted, the fourth refused.
    let third: Vec<i64> = charge(1).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(third[0], 0, "{third:?}");
    let fourth: Vec<i64> = charge(1).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(&fourth[..3], &[1, 3, 3], "requests per minute");
}

/// The tenant budget script's charge records: a cancel after the charge gives it back once
/// (its tokens, its request and the day's count); a cancel that arrives first keeps the charge
/// from running; a settled charge's record is gone.
#[tokio::test]
async fn a_tenant_charge_is_cancelled_once_whichever_comes_first() {
    let mut f = fixture().await;
    let script = redis::Script::new(include_str!("../../../lua/tenant_budget_v2.lua"));
    let (minute, day) = (
        "tg:test:{quota}:tenant:x:minute",
        "tg:test:{quota}:tenant:x:day",
    );
    let record = |id: &str| format!("tg:test:{{quota}}:tenant:x:charge:{id}");
    let charge = |id: &str, tokens: u64| {
        let mut call = script.prepare_invoke();
        call.key(minute)
            .key(day)
            .key(record(id))
            .arg("charge")
            .arg(10)
            .arg(10_000)
            .arg(0)
            .arg(tokens);
        call
    };
    let cancel = |id: &str| {
        let mut call = script.prepare_invoke();
        call.key(minute).key(day).key(record(id)).arg("cancel");
        call
    };
    let mut peek = script.prepare_invoke();
    peek.key(minute).key(day).arg("peek");

    let kept: Vec<i64> = charge("a", 100).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(kept[0], 0, "{kept:?}");
    let lost: Vec<i64> = charge("b", 700).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(lost[0], 0, "{lost:?}");
    let used: (u64, u64, u64) = peek.invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(used, (2, 800, 800));
    // Cancelled after it ran: given back, once.
    let given: i64 = cancel("b").invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(given, 1);
    let again: i64 = cancel("b").invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(again, 0, "a second cancel gives nothing back");
    let used: (u64, u64, u64) = peek.invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(used, (1, 100, 100));
    // Cancelled before it ran: the charge, arriving late, charges nothing.
    let given: i64 = cancel("c").invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(given, 0);
    let late: Vec<i64> = charge("c", 500).invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(late, vec![4]);
    let used: (u64, u64, u64) = peek.invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(used, (1, 100, 100));
    // Settled: its record says so (a settled charge is never cancelled, nor settled again).
    let () = script
        .key(minute)
        .key(day)
        .key(record("a"))
        .arg("settle")
        .arg(kept[1])
        .arg(kept[2])
        .arg(-40)
        .arg("0")
        .invoke_async(&mut f.conn)
        .await
        .unwrap();
    let marked: Option<String> = redis::cmd("GET")
        .arg(record("a"))
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(marked.as_deref(), Some("settled"));
    let given: i64 = cancel("a").invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(given, 0, "a settled charge is not given back");
    let used: (u64, u64, u64) = peek.invoke_async(&mut f.conn).await.unwrap();
    assert_eq!(used, (1, 60, 60));
}

/// Fleet fairness's heartbeat (`lua/fleet_service_v2.lua`): a tenant that starts waiting is
/// lifted to the least counter among those already waiting (never lowered); each replica sees
/// who waits in which line anywhere, and a head yields only to a tenant waiting in its own
/// line elsewhere that is behind by more than its cost; a replica that stops writing stops
/// counting (its entries expire).
#[tokio::test]
async fn the_fleet_heartbeat_lifts_a_tenant_that_starts_waiting_and_forgets_a_silent_replica() {
    use super::service::{field, FleetService, WAITING_COUNTS_FOR};
    use std::sync::Arc;
    let mut f = fixture().await;
    let base = "tg:test:{quota}";
    let () = redis::cmd("HSET")
        .arg(format!("{base}:service"))
        .arg(field("a"))
        .arg(5_000)
        .arg(field("b"))
        .arg(200)
        .arg(field("c"))
        .arg(9_000)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let (one, two) = (
        FleetService::new(base, "one"),
        FleetService::new(base, "two"),
    );
    let at = |line: &str, t: &str| (line.to_owned(), Arc::<str>::from(t));
    // A starts waiting on replica 1 while nobody waits: kept as it is.
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    assert_eq!(one.of("a"), 5_000.0);
    // B starts waiting on replica 2: its 200 were served while nobody else waited; lifted.
    two.refresh(&mut f.conn, &[at("large", "b")]).await.unwrap();
    assert_eq!(two.of("b"), 5_000.0);
    // C, ahead of everyone, is not lowered.
    two.refresh(&mut f.conn, &[at("large", "b"), at("large", "c")])
        .await
        .unwrap();
    assert_eq!(two.of("c"), 9_000.0);
    // A is served 3,000 more while both wait (no lift now).
    let () = redis::cmd("HINCRBYFLOAT")
        .arg(format!("{base}:service"))
        .arg(field("a"))
        .arg(3_000)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let here = [Arc::<str>::from("a")];
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    assert_eq!(one.of("a"), 8_000.0);
    assert!(
        !one.yields("small", "a", 100.0, || here.to_vec()),
        "B waits in another line"
    );
    two.refresh(
        &mut f.conn,
        &[at("large", "b"), at("large", "c"), at("small", "b")],
    )
    .await
    .unwrap();
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    assert_eq!(one.fleet_gap(), 4_000.0, "A, B and C wait: 9,000 - 5,000");
    assert!(
        one.yields("small", "a", 100.0, || here.to_vec()),
        "3,000 ahead of B"
    );
    assert!(
        !one.yields("small", "a", 3_000.0, || unreachable!(
            "nobody behind by more than its cost: this replica's line is not read"
        )),
        "within its own cost"
    );
    let both = [Arc::<str>::from("a"), Arc::<str>::from("b")];
    assert!(
        !one.yields("small", "a", 100.0, || both.to_vec()),
        "B waits here: the tags order them"
    );
    // A tenant that stopped waiting on a replica stops counting at that replica's next beat,
    // not two seconds later: B left replica 2's small line.
    two.refresh(&mut f.conn, &[at("large", "b"), at("large", "c")])
        .await
        .unwrap();
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    assert!(
        !one.yields("small", "a", 100.0, || here.to_vec()),
        "B waits in small nowhere now"
    );
    // Nor does a replica yield to its own tenants' entries, which lag its own line: D waited
    // in replica 1's small line, far behind A, and left it.
    one.refresh(&mut f.conn, &[at("small", "a"), at("small", "d")])
        .await
        .unwrap();
    assert!(
        !one.yields("small", "a", 100.0, || here.to_vec()),
        "D's entry is replica 1's own: its line says D is gone"
    );
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    assert!(!one.waiting_fields().contains(&field("d")));
    // An entry written before Redis's clock was set back counts no longer than one written now.
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut f.conn).await.unwrap();
    let () = redis::cmd("HSET")
        .arg(format!("{base}:waiting"))
        .arg("small|gone|0123456789abcdef")
        .arg((secs + 3_600) * 1_000)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    let until: u64 = redis::cmd("HGET")
        .arg(format!("{base}:waiting"))
        .arg("small|gone|0123456789abcdef")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert!(
        until <= (secs + 60) * 1_000,
        "brought back to now + its time: {until}"
    );
    // A replica whose beats fail forgets who waits where rather than yield to an old view.
    two.refresh(&mut f.conn, &[at("small", "b")]).await.unwrap();
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    assert!(one.yields("small", "a", 100.0, || here.to_vec()));
    one.forget_waiting();
    assert!(!one.yields("small", "a", 100.0, || here.to_vec()));
    two.refresh(&mut f.conn, &[at("large", "b"), at("large", "c")])
        .await
        .unwrap();
    // Replica 2 goes silent: its entries stop counting.
    tokio::time::sleep(WAITING_COUNTS_FOR + Duration::from_millis(200)).await;
    one.refresh(&mut f.conn, &[at("small", "a")]).await.unwrap();
    assert!(!one.yields("small", "a", 100.0, || here.to_vec()));
    assert_eq!(one.waiting_fields(), vec![field("a")]);
    assert_eq!(one.fleet_gap(), 0.0);
}

#[tokio::test]
async fn waiting_marks_past_their_time_are_dropped_by_the_next_mark() {
    let mut f = fixture().await;
    f.limits([SMALL, OTHER, OTHER], 100_000, NO_PREFILL_BUDGET)
        .await;
    // Replicas that died while their requests waited: their marks lapsed long ago (1 ms after
    // the epoch of Redis's clock), and nothing of theirs comes back to drop them. And one
    // marked an hour ahead of the clock (set back since): it would hold every job off for the
    // hour.
    let (s, _): (u64, u64) = redis::cmd("TIME").query_async(&mut f.conn).await.unwrap();
    let ahead = (s + 3_600) * 1_000;
    for (dead, until) in [("dead-1", 1), ("dead-2 small", 1), ("ahead", ahead)] {
        let _: () = redis::cmd("ZADD")
            .arg(&f.keys.waiting_large)
            .arg(until)
            .arg(dead)
            .query_async(&mut f.conn)
            .await
            .unwrap();
    }
    // A live replica's large request, refused: it marks, and the lapsed marks go.
    for i in 0..=OTHER.max_requests {
        let ask = AcquireArgs {
            id: &format!("l{i}"),
            lane: Lane::Large,
            tokens: 10,
            prompt: 0,
            ttl_ms: 10_000,
            wait_mark_ms: 1_000,
            replica: "live",
            others_waiting: false,
            behind: &[],
        };
        f.scripts.acquire(&mut f.conn, &f.keys, &ask).await.unwrap();
    }
    let marks: Vec<String> = redis::cmd("ZRANGE")
        .arg(&f.keys.waiting_large)
        .arg(0)
        .arg(-1)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(marks, ["live"]);
}

/// A call sent in the background for a request that ended (a tenant's settlement, a session's
/// output, a tenant's fleet service) is waited for by the shutdown: the process exit used to
/// drop it, leaving the tenant charged its whole reservation for the minute and the day.
#[tokio::test]
async fn a_shutdown_waits_for_the_calls_of_requests_that_ended() {
    let server = RedisServer::start();
    let admission = admission_on(&server);
    let (sent, on_its_way) = tokio::sync::oneshot::channel::<()>();
    admission.spawn_background(async move {
        let _ = on_its_way.await;
    });
    let mut shutdown = tokio::spawn({
        let admission = admission.clone();
        async move { admission.shutdown().await }
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(2), &mut shutdown)
            .await
            .is_err(),
        "the shutdown waits for the call on its way"
    );
    sent.send(()).unwrap();
    shutdown.await.unwrap();
}

/// The Redis quota on `server` with the shipped limits (the heuristic tokenizer), its metrics
/// its own.
pub(crate) fn admission_on(server: &RedisServer) -> super::RedisAdmission {
    let config = crate::config::Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n[quota]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
        server.url()
    ))
    .unwrap();
    let metrics = crate::telemetry::Metrics::new();
    super::RedisAdmission::from_config(&config, metrics.quota().clone()).unwrap()
}
