//! The Lua scripts' edge cases against a real `redis-server` the tests start themselves.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::keys::Keys;
use super::scripts::{LaneQuota, Scripts, Verdict};
use crate::lane::Lane;

#[path = "../../../tests/redis_common/mod.rs"]
mod redis_common;
use redis_common::RedisServer;

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

impl Fixture {
    async fn acquire(
        &mut self,
        id: &str,
        lane: Lane,
        tokens: u32,
        ttl: u64,
        global: u64,
    ) -> (Verdict, u64) {
        let quota = if lane == Lane::Small {
            SMALL
        } else {
            LaneQuota {
                max_requests: 1,
                max_tokens: 5_000,
            }
        };
        let r = self
            .scripts
            .acquire(
                &mut self.conn,
                &self.keys,
                id,
                lane,
                tokens,
                ttl,
                quota,
                global,
            )
            .await
            .unwrap();
        (r.verdict, r.reaped)
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

#[tokio::test]
async fn move_succeeds_only_when_the_target_lane_has_room() {
    let mut f = fixture().await;
    let medium = LaneQuota {
        max_requests: 1,
        max_tokens: 5_000,
    };
    f.acquire("a", Lane::Small, 300, 10_000, 10_000).await;
    f.acquire("b", Lane::Small, 300, 10_000, 10_000).await;
    let moved = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "a", Lane::Medium, medium)
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
        .move_lease(&mut f.conn, &f.keys, "b", Lane::Medium, medium)
        .await
        .unwrap();
    assert_eq!(full.verdict, Verdict::LaneFull);
    assert_eq!(f.usage("small:n").await, 1);
    // No token room in the target.
    let tight = LaneQuota {
        max_requests: 5,
        max_tokens: 200,
    };
    let r = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "b", Lane::Large, tight)
        .await
        .unwrap();
    assert_eq!(r.verdict, Verdict::LaneTokens);
    // A released lease cannot move; releasing the moved one frees the medium lane.
    assert!(f.scripts.release(&mut f.conn, &f.keys, "a").await.unwrap());
    let gone = f
        .scripts
        .move_lease(&mut f.conn, &f.keys, "a", Lane::Small, SMALL)
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
