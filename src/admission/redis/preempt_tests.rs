//! Pre-emption across replicas (`jobs.preempt`, `quota_common_v2.lua`'s `ask_borrowers`) on a
//! real `redis-server`: which borrower a refused acquire asks to leave, that one already asked
//! counts as gone, that a borrower in its prefill grace is spared, that "pressure" asks one at
//! a time, and that a borrower's leaving (release or expiry) leaves nothing behind.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::keys::Keys;
use super::scripts::{AcquireArgs, LaneRecord, LimitsRecord, LimitsWrite, Scripts, Verdict};
use super::tests::redis_common::RedisServer;
use crate::admission::budget::PrefillLimit;
use crate::lane::Lane;

struct Fixture {
    _server: RedisServer,
    conn: MultiplexedConnection,
    keys: Keys,
    scripts: Scripts,
}

/// Strict limits: small 2 seats, medium 2, large 2; 100k tokens per lane and in all; no
/// prefill budget; the given prefill grace.
async fn fixture(grace: u32) -> Fixture {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = Keys::new("tg:test");
    let scripts = Scripts::default();
    let record = LimitsRecord {
        work_conserving: false,
        seats: 6,
        global_tokens: 100_000,
        prefill: PrefillLimit {
            budget: 0,
            long_prompt: 2_048,
        },
        lanes: [LaneRecord {
            max: 2,
            ceiling: 2,
            tokens: 100_000,
            lend: false,
            borrow: false,
        }; 3],
        preempt_grace: grace,
        preempt_cooldown_ms: 0,
    };
    scripts
        .limits(&mut conn, &keys, LimitsWrite::Force, &record, "test")
        .await
        .unwrap();
    Fixture {
        _server: server,
        conn,
        keys,
        scripts,
    }
}

impl Fixture {
    /// Registers a borrower `id` holding a seat of `seat` (its tokens in large), still
    /// prefilling `prefill` tokens, taken at `since` (server ms).
    async fn borrower(&mut self, id: &str, seat: Lane, prefill: u32, since: u64) {
        let field = format!("{}@large", seat.as_str());
        let leases = [(id.to_owned(), field, 1_000, prefill)];
        self.scripts
            .adopt(&mut self.conn, &self.keys, 60_000, &leases)
            .await
            .unwrap();
        let _: () = redis::cmd("ZADD")
            .arg(format!("{}:borrowers", self.keys.base))
            .arg(since)
            .arg(id)
            .query_async(&mut self.conn)
            .await
            .unwrap();
    }

    /// An interactive lease `id` of `lane` (holding its seat to the end).
    async fn interactive(&mut self, id: &str, lane: Lane) {
        let leases = [(id.to_owned(), lane.as_str().to_owned(), 100, 0)];
        self.scripts
            .adopt(&mut self.conn, &self.keys, 60_000, &leases)
            .await
            .unwrap();
    }

    /// An acquire of `lane`: its verdict, and whether it asked a borrower to leave.
    async fn acquire(&mut self, id: &str, lane: Lane) -> (Verdict, bool) {
        let ask = AcquireArgs {
            id,
            lane,
            tokens: 100,
            prompt: 10,
            ttl_ms: 60_000,
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
        (r.verdict, r.asked)
    }

    /// The borrowers asked to leave, and why (`<lane> <reason>`).
    async fn asked(&mut self) -> Vec<(String, String)> {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(format!("{}:asked", self.keys.base))
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let mut out: Vec<(String, String)> = all
            .into_iter()
            .map(|(id, v)| {
                let why: Vec<&str> = v.split(' ').take(2).collect();
                (id, why.join(" "))
            })
            .collect();
        out.sort();
        out
    }

    async fn release(&mut self, id: &str) {
        assert!(self
            .scripts
            .release(&mut self.conn, &self.keys, id)
            .await
            .unwrap());
    }

    async fn exists(&mut self, suffix: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(format!("{}{suffix}", self.keys.base))
            .query_async::<u32>(&mut self.conn)
            .await
            .unwrap()
            == 1
    }
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test]
async fn the_youngest_borrower_whose_leaving_lets_the_request_in_is_asked_and_only_once() {
    let mut f = fixture(0).await;
    // Small's two seats: an old and a young borrower; medium's: the youngest of all.
    f.borrower("old", Lane::Small, 0, 1_000).await;
    f.borrower("young", Lane::Small, 0, 2_000).await;
    f.borrower("youngest", Lane::Medium, 0, 3_000).await;
    // A borrowed seat's tokens count in the large lane.
    let mut conn = f.conn.clone();
    let large: i64 = redis::AsyncCommands::hget(&mut conn, &f.keys.usage, "large:tokens")
        .await
        .unwrap();
    assert_eq!(large, 3_000);
    // A small request: the youngest on a small seat leaves (medium's would not let it in).
    assert_eq!(
        f.acquire("q1", Lane::Small).await,
        (Verdict::LaneFull, true)
    );
    assert_eq!(f.asked().await, owned(&[("young", "small seat")]));
    // Asked already: its seat counts as free, so a request trying again asks no one more.
    assert_eq!(
        f.acquire("q1", Lane::Small).await,
        (Verdict::LaneFull, false)
    );
    assert_eq!(f.asked().await.len(), 1);
    // It leaves: the request gets its seat; nothing of the borrower stays.
    f.release("young").await;
    assert_eq!(
        f.acquire("q1", Lane::Small).await,
        (Verdict::Granted, false)
    );
    assert_eq!(f.asked().await, Vec::new());
    // The next small request finds small's seats taken by q1 and "old": "old" is asked.
    assert_eq!(
        f.acquire("q2", Lane::Small).await,
        (Verdict::LaneFull, true)
    );
    assert_eq!(f.asked().await, owned(&[("old", "small seat")]));
    f.release("old").await;
    f.release("youngest").await;
    assert!(!f.exists(":borrowers").await && !f.exists(":asked").await);
}

#[tokio::test]
async fn a_borrower_near_the_end_of_its_prefill_is_spared() {
    // Spared while at most 3,000 prefill tokens are left (no rate measured yet: its whole
    // prompt is left).
    let mut f = fixture(3_000).await;
    f.borrower("long", Lane::Small, 8_000, 1_000).await;
    f.borrower("near", Lane::Small, 2_500, 2_000).await;
    // "near" is the youngest, but within its grace: "long" leaves instead.
    assert_eq!(f.acquire("q", Lane::Small).await, (Verdict::LaneFull, true));
    assert_eq!(f.asked().await, owned(&[("long", "small seat")]));
    f.release("long").await;
    // Its first token: no prefill left to spare it for.
    f.scripts
        .prefill_done(&mut f.conn, &f.keys, &[("near", None)])
        .await
        .unwrap();
    f.interactive("other", Lane::Small).await;
    assert_eq!(
        f.acquire("q2", Lane::Small).await,
        (Verdict::LaneFull, true)
    );
    assert_eq!(f.asked().await, owned(&[("near", "small seat")]));
}

#[tokio::test]
async fn a_borrower_in_its_grace_is_waited_for_and_no_other_is_asked_under_pressure() {
    let mut f = fixture(3_000).await;
    // Small's seats: an interactive request and a job still prefilling within its grace; a job
    // past its prefill borrows medium's seat.
    f.interactive("s1", Lane::Small).await;
    f.borrower("near", Lane::Small, 2_500, 1_000).await;
    f.borrower("past", Lane::Medium, 0, 2_000).await;
    // Only "near" would let it in: the request waits for its first token and asks nobody
    // ("past" leaving would not give it a seat).
    assert_eq!(
        f.acquire("q", Lane::Small).await,
        (Verdict::LaneFull, false)
    );
    assert_eq!(f.asked().await, owned(&[]));
    f.scripts
        .prefill_done(&mut f.conn, &f.keys, &[("near", None)])
        .await
        .unwrap();
    assert_eq!(f.acquire("q", Lane::Small).await, (Verdict::LaneFull, true));
    assert_eq!(f.asked().await, owned(&[("near", "small seat")]));
}

#[tokio::test]
async fn a_request_no_borrower_can_let_in_asks_one_at_a_time_under_pressure() {
    let mut f = fixture(0).await;
    // Small is full of interactive requests; jobs borrow medium's seats.
    f.interactive("s1", Lane::Small).await;
    f.interactive("s2", Lane::Small).await;
    f.borrower("j1", Lane::Medium, 0, 1_000).await;
    f.borrower("j2", Lane::Medium, 0, 2_000).await;
    // No job's leaving gives small a seat, but the engine's time is what it waits for: the
    // youngest leaves, reason "pressure".
    assert_eq!(f.acquire("q", Lane::Small).await, (Verdict::LaneFull, true));
    assert_eq!(f.asked().await, owned(&[("j2", "small pressure")]));
    // While one is leaving under pressure, no second is asked.
    assert_eq!(
        f.acquire("q", Lane::Small).await,
        (Verdict::LaneFull, false)
    );
    f.release("j2").await;
    assert_eq!(f.acquire("q", Lane::Small).await, (Verdict::LaneFull, true));
    assert_eq!(f.asked().await, owned(&[("j1", "small pressure")]));
    // An expired borrower leaves nothing behind either.
    let _: () = redis::cmd("ZADD")
        .arg(&f.keys.expiry)
        .arg(0)
        .arg("j1")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    f.acquire("q", Lane::Small).await;
    assert!(!f.exists(":borrowers").await && !f.exists(":asked").await);
}

impl Fixture {
    /// `quota_borrow_v2.lua` for a lease `id` of `lane` (100 tokens, a 10-token prompt): its
    /// status, and the seat's lane when taken.
    async fn borrow(&mut self, id: &str, lane: Lane) -> (i64, Option<Lane>) {
        let mut call = self.keys.with_keys(&self.scripts.borrow);
        call.arg(id).arg(lane.as_str()).arg(100).arg(60_000).arg(10);
        let reply: Vec<i64> = call.invoke_async(&mut self.conn).await.unwrap();
        let seat = (reply[0] == 1).then(|| Lane::ALL[usize::try_from(reply[4]).unwrap()]);
        (reply[0], seat)
    }
}

/// A pre-emptible `/answer` (`jobs.preempt_answers`) borrows as a job does: an idle seat of its
/// lane, else of a lane below, listed as a borrower that a refused acquire asks to leave; none
/// while any replica has a request waiting, nor within the cool-down after one was refused.
#[tokio::test]
async fn an_answer_borrows_an_idle_seat_only_while_nobody_waits_and_not_in_the_cooldown() {
    let mut f = fixture(0).await;
    f.interactive("large-1", Lane::Large).await;
    f.interactive("large-2", Lane::Large).await;
    assert_eq!(
        f.borrow("answer-1", Lane::Large).await,
        (1, Some(Lane::Medium)),
        "large's seats are taken: medium's idle one"
    );
    // The same call sent again (its reply was lost): the same seat, counted once.
    assert_eq!(
        f.borrow("answer-1", Lane::Large).await,
        (1, Some(Lane::Medium))
    );
    let mut conn = f.conn.clone();
    let medium: i64 = redis::AsyncCommands::hget(&mut conn, &f.keys.usage, "medium:n")
        .await
        .unwrap();
    assert_eq!(medium, 1);
    assert!(f.exists(":borrowers").await);
    // A medium request finds medium full (the borrower holds one of two): it gets the other,
    // then the next one asks the borrower to leave.
    f.interactive("medium-1", Lane::Medium).await;
    assert_eq!(
        f.acquire("medium-2", Lane::Medium).await,
        (Verdict::LaneFull, true)
    );
    assert_eq!(f.asked().await, [("answer-1".into(), "medium seat".into())]);
    f.release("answer-1").await;
    // While a request is marked waiting on some replica, nothing borrows.
    let (s, _): (u64, u64) = redis::cmd("TIME").query_async(&mut f.conn).await.unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(&f.keys.waiting_large)
        .arg((s + 30) * 1_000)
        .arg("other-replica medium")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(f.borrow("answer-2", Lane::Large).await, (-11, None));
    let _: () = redis::cmd("DEL")
        .arg(&f.keys.waiting_large)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    // Within the cool-down after a refused acquire, nothing borrows either.
    let _: () = redis::cmd("HSET")
        .arg(&f.keys.limits)
        .arg("preempt_cooldown")
        .arg(600_000)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    f.interactive("medium-2", Lane::Medium).await;
    f.interactive("small-1", Lane::Small).await;
    f.interactive("small-2", Lane::Small).await;
    assert_eq!(
        f.acquire("small-3", Lane::Small).await,
        (Verdict::LaneFull, false)
    );
    for id in ["medium-2", "small-2"] {
        f.release(id).await;
    }
    assert_eq!(
        f.borrow("answer-3", Lane::Large).await,
        (-11, None),
        "cooling"
    );
    let _: () = redis::cmd("HSET")
        .arg(&f.keys.limits)
        .arg("preempt_cooldown")
        .arg(0)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(
        f.borrow("answer-3", Lane::Small).await,
        (1, Some(Lane::Small)),
        "a small answer borrows only small's seat"
    );
    f.release("answer-3").await;
    assert!(!f.exists(":borrowers").await, "nothing left behind");
}

#[tokio::test]
async fn a_borrower_registered_again_after_redis_lost_it_can_still_be_asked_to_leave() {
    let mut f = fixture(0).await;
    // The replica that holds a borrowed small seat registers it again (Redis lost its data):
    // only its lease's field says it is pre-emptible.
    let leases = [("lost".to_owned(), "small@large".to_owned(), 1_000, 0)];
    f.scripts
        .adopt(&mut f.conn, &f.keys, 60_000, &leases)
        .await
        .unwrap();
    f.interactive("s1", Lane::Small).await;
    // A small request finds both seats taken: the borrower is asked to leave, as before.
    assert_eq!(f.acquire("q", Lane::Small).await, (Verdict::LaneFull, true));
    assert_eq!(f.asked().await, owned(&[("lost", "small seat")]));
    f.release("lost").await;
    f.release("s1").await;
    assert!(!f.exists(":borrowers").await && !f.exists(":asked").await);
}

#[tokio::test]
async fn a_borrowers_prefill_rate_is_timed_to_its_first_token_not_to_the_give_back() {
    let mut f = fixture(3_000).await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut f.conn).await.unwrap();
    let now_ms = now.0 * 1_000 + now.1 / 1_000;
    let rate = |f: &mut Fixture| {
        let mut conn = f.conn.clone();
        let key = format!("{}:preempt", f.keys.base);
        async move {
            redis::AsyncCommands::hget::<_, _, Option<u64>>(&mut conn, key, "rate")
                .await
                .unwrap()
        }
    };
    // A give-back of unknown age, or one that says the first token came before the borrow,
    // teaches nothing.
    f.borrower("unknown", Lane::Small, 8_000, now_ms - 100_000)
        .await;
    f.borrower("odd", Lane::Medium, 8_000, now_ms - 100_000)
        .await;
    let ids = [("unknown", None), ("odd", Some(Duration::from_secs(200)))];
    let given = f.scripts.prefill_done(&mut f.conn, &f.keys, &ids).await;
    assert_eq!(given.unwrap(), 16_000);
    assert_eq!(rate(&mut f).await, None);
    // Borrowed 100 s ago, its first token 90 s ago (the give-back waited behind a failed
    // call): 8,000 tokens in about 10 s, not in 100 s.
    f.release("unknown").await;
    f.borrower("late", Lane::Small, 8_000, now_ms - 100_000)
        .await;
    let ids = [("late", Some(Duration::from_secs(90)))];
    f.scripts
        .prefill_done(&mut f.conn, &f.keys, &ids)
        .await
        .unwrap();
    let learnt = rate(&mut f).await.expect("a rate learnt");
    assert!(learnt > 400 && learnt <= 800, "{learnt} tokens/s");
}

#[tokio::test]
async fn a_cool_down_marked_before_the_clock_was_set_back_lasts_one_cool_down() {
    let mut f = fixture(0).await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut f.conn).await.unwrap();
    let now_ms = now.0 * 1_000 + now.1 / 1_000;
    // A 50 ms cool-down, last started an hour ahead of the server's clock (set back since).
    for (key, field, value) in [
        (f.keys.limits.clone(), "preempt_cooldown", 50),
        (
            format!("{}:preempt", f.keys.base),
            "waited",
            now_ms + 3_600_000,
        ),
    ] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg(field)
            .arg(value)
            .query_async(&mut f.conn)
            .await
            .unwrap();
    }
    assert_eq!(f.borrow("job", Lane::Large).await, (-11, None), "cooling");
    // Once a cool-down has passed since the clock step, work borrows again (not in an hour).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(f.borrow("job", Lane::Large).await.0, 1);
    f.release("job").await;
}

/// A borrower whose request ends before its first token (pre-empted or cut in its prefill)
/// teaches no prefill rate: its guard gave the room back through the first-token path, timed
/// to its end, so a cut after a second of an 8,000-token prefill read as 8,000 tokens a
/// second, and the grace spared borrowers that were far from their first token.
#[tokio::test]
async fn a_borrower_cut_in_its_prefill_teaches_no_prefill_rate() {
    use super::shared::LeaseRelease;
    use super::RedisAdmission;
    use crate::admission::{Ask, LaneGuard};
    use crate::config::Config;
    use crate::telemetry::Metrics;
    let redis = RedisServer::start();
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
        redis.url()
    ))
    .unwrap();
    let admission = RedisAdmission::from_config(&config, Metrics::new().quota().clone()).unwrap();
    drop(admission.acquire(Ask::new(Lane::Small, 100)).await.unwrap());
    let shared = admission.shared.clone();
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = now.0 * 1_000 + now.1 / 1_000;
    // Borrowed a second ago, 8,000 prompt tokens still prefilling.
    let leases = [("b1".to_owned(), "small@large".to_owned(), 9_000, 8_000)];
    shared
        .scripts
        .adopt(&mut conn, &shared.keys, 60_000, &leases)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(format!("{}:borrowers", shared.keys.base))
        .arg(now_ms - 1_000)
        .arg("b1")
        .query_async(&mut conn)
        .await
        .unwrap();
    shared.hold_as("b1", Lane::Small, 9_000, 8_000, Some(Lane::Large));
    let guard = LaneGuard::new(
        Box::new(LeaseRelease {
            shared: shared.clone(),
            id: "b1".to_owned(),
            service: None,
        }),
        Lane::Small,
        9_000,
        Duration::ZERO,
    )
    .with_prefill(8_000, None);
    drop(guard);
    // Its release (sent after anything its drop sent first, in order) has landed.
    let leases_key = shared.keys.leases.clone();
    for _ in 0..3_000 {
        let held: bool = redis::cmd("HEXISTS")
            .arg(&leases_key)
            .arg("b1")
            .query_async(&mut conn)
            .await
            .unwrap();
        if !held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate: Option<u64> = redis::cmd("HGET")
        .arg(format!("{}:preempt", shared.keys.base))
        .arg("rate")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(rate, None, "a rate learnt from a prefill that was cut");
    let prefill: Option<i64> = redis::cmd("HGET")
        .arg(&shared.keys.usage)
        .arg("prefill:tokens")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(prefill.unwrap_or(0), 0, "its prefill room is back");
    admission.shutdown().await;
}
