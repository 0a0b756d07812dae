//! A borrow (a pre-emptible `/answer`'s or a job's take) whose reply never reaches the caller,
//! on a real `redis-server`: the script may still have taken a lease, which nothing would ever
//! renew or release; it went on holding a seat (and the prompt's prefill room) in Redis until
//! `quota.lease_ttl_ms`, and a later acquire asked it to leave and waited for nobody. The lease
//! is given back as soon as the call is given up.
//!
//! Also the other way round: a lease Redis lost, registered again by its replica as its
//! request ends, whose release reached Redis before the registration.

use std::sync::Arc;
use std::time::Duration;

use super::tests::redis_common::{
    client_line, expire_lease, leases, pause_writes, paused_script, RedisServer,
};
use super::RedisAdmission;
use crate::admission::preempt::Preemptible;
use crate::admission::Ask;
use crate::config::Config;
use crate::lane::Lane::Large;
use crate::telemetry::Metrics;

/// A lease lifetime far longer than the test: only a release can bring the seat back.
fn config(redis: &RedisServer) -> Config {
    config_beating(redis, 2_000)
}

/// [`config`] with a heartbeat every `heartbeat_ms`.
fn config_beating(redis: &RedisServer, heartbeat_ms: u64) -> Config {
    Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\nlease_ttl_ms = 120000\n\
         heartbeat_ms = {heartbeat_ms}\n",
        redis.url()
    ))
    .unwrap()
}

/// Polls until Redis holds no lease (bounded: a hang fails, nothing is timed).
async fn until_no_lease(conn: &mut redis::aio::MultiplexedConnection, what: &str) {
    for _ in 0..3_000 {
        if leases(conn).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a lease is still held in Redis: {what}");
}

#[tokio::test]
async fn a_borrow_given_up_before_its_reply_leaves_no_lease_behind() {
    let redis = RedisServer::start();
    let metrics = Metrics::new();
    let admission = RedisAdmission::from_config(&config(&redis), metrics.quota().clone()).unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let handle: Arc<Preemptible> = Preemptible::new(true);
    // Once connected (an acquire waits for the first connection), and back to no lease.
    drop(admission.acquire(Ask::new(Large, 100)).await.unwrap());
    until_no_lease(&mut conn, "the first acquire's guard was dropped").await;

    // Answered, a borrow takes an idle large seat; its guard gives it back.
    let guard = admission
        .borrow(Large, 1_000, 800, &handle)
        .await
        .expect("an idle large seat is lent");
    assert_eq!(leases(&mut conn).await, 1);
    drop(guard);
    until_no_lease(&mut conn, "an answered borrow's guard was dropped").await;

    // Redis holds writes; the caller gives up (its client went away) once its script waits
    // there, sent and not yet run.
    pause_writes(&mut conn).await;
    {
        let borrow = admission.borrow(Large, 1_000, 800, &handle);
        tokio::pin!(borrow);
        tokio::select! {
            _ = &mut borrow => panic!("a borrow was answered while Redis held writes"),
            _ = paused_script(&mut conn) => {}
        }
    }
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The script ran once Redis went on, and took its lease; it is given back, long before
    // its lifetime.
    until_no_lease(&mut conn, "a borrow given up before its reply").await;
    admission.shutdown().await;
}

/// A lease Redis lost (a restart without persistence, a flush) is registered again by the
/// replica that holds it (`Shared::adopt_fallback`, from the beat) while its request ends. The
/// request's release can reach Redis first: here the registration is sent again behind it
/// because Redis had forgotten the script (`NOSCRIPT`); a reconnect does the same. The
/// registered lease then belonged to no one and held its seat until `quota.lease_ttl_ms` (here
/// two minutes). It is released again once the registration's reply is read.
#[tokio::test]
async fn a_lost_lease_registered_again_as_its_request_ends_is_not_left_behind() {
    let redis = RedisServer::start();
    let metrics = Metrics::new();
    let admission = RedisAdmission::from_config(&config(&redis), metrics.quota().clone()).unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let guard = admission.acquire(Ask::new(Large, 100)).await.unwrap();
    let id = {
        let held = admission.shared.held();
        assert_eq!(held.len(), 1);
        held.keys().next().unwrap().clone()
    };
    // Redis forgets its scripts and loses the lease (the release script, run here, is known
    // again from then on; the registration's is not).
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let scripts = &admission.shared.scripts;
    assert!(scripts
        .release(&mut conn, &admission.shared.keys, &id)
        .await
        .unwrap());
    assert_eq!(leases(&mut conn).await, 0);

    // Redis takes no write for now: the registration waits.
    pause_writes(&mut conn).await;
    let adopting = tokio::spawn({
        let shared = admission.shared.clone();
        let lost = vec![id.clone()];
        async move { shared.adopt_fallback(&lost).await }
    });
    let line = paused_script(&mut conn).await;
    // The request ends: its release goes out behind the registration.
    drop(guard);
    let mut behind = false;
    for _ in 0..3_000 {
        let now = client_line(&mut conn, &line).await.unwrap_or_default();
        if !now.contains(" qbuf=0 ") {
            behind = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(behind, "the release was never sent");
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The registration is refused (unknown script), the release runs (nothing to give back),
    // the registration is sent again and registers the lease.
    adopting.await.unwrap();
    until_no_lease(
        &mut conn,
        "a lost lease registered again as its request ended",
    )
    .await;
    admission.shutdown().await;
}

/// A replica whose heartbeat stalled past the lease TTL (its process paused, its machine
/// starved) finds its running request's lease reaped. The request runs on, so the lease is
/// registered again at that beat. Before, it was left out (its seat free for another request)
/// until the beat after, which then warned, wrongly, that Redis's clock had run ahead.
#[tokio::test]
async fn a_lease_reaped_after_a_late_renewal_is_counted_again_at_that_beat() {
    let redis = RedisServer::start();
    let metrics = Metrics::new();
    // The background heartbeat beats once at the start, then not within the test: the test
    // beats by hand.
    let config = config_beating(&redis, 40_000);
    let admission = RedisAdmission::from_config(&config, metrics.quota().clone()).unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let guard = admission.acquire(Ask::new(Large, 100)).await.unwrap();
    assert_eq!(leases(&mut conn).await, 1);
    let held: Vec<String> = redis::cmd("ZRANGE")
        .arg(&admission.shared.keys.expiry)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // The last renewal was longer ago than the TTL by this replica's clock, and Redis's
    // expiry for the lease has passed: the renewal's own reap takes it.
    let ttl = Duration::from_millis(admission.shared.ttl_ms);
    let late = std::time::Instant::now()
        .checked_sub(ttl + Duration::from_secs(1))
        .expect("the machine has run longer than the TTL");
    expire_lease(&mut conn, &admission.shared.keys.expiry, &held[0]).await;
    let mut lost = Vec::new();
    let started = std::time::Instant::now();
    assert!(super::tasks::beat(&admission.shared, &mut Vec::new(), &mut lost).await);
    assert_eq!(lost.len(), 1, "the renewal found the lease gone");
    super::tasks::after_renewal(&admission.shared, &lost, false, started, &mut Some(late)).await;
    assert_eq!(
        leases(&mut conn).await,
        1,
        "the running request is counted again"
    );
    drop(guard);
    until_no_lease(&mut conn, "the request ended").await;
}

/// A lost lease registered again while its request's first token arrives: the first token's
/// give-back of the prefill room reached Redis before the registration (a no-op there: the
/// lease was gone), and the registration counted the room again. It is given back after the
/// reply; it was held in Redis's `prefill:tokens` until the request ended, and every long
/// prompt of the fleet waited for room that nobody used.
#[tokio::test]
async fn a_lost_lease_registered_as_its_first_token_came_gives_its_prefill_back() {
    let redis = RedisServer::start();
    let config = config_beating(&redis, 40_000);
    let admission = RedisAdmission::from_config(&config, Metrics::new().quota().clone()).unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let guard = admission
        .acquire(Ask {
            prefill: 8_000,
            ..Ask::new(Large, 9_000)
        })
        .await
        .unwrap();
    let shared = admission.shared.clone();
    let prefill = |conn: &mut redis::aio::MultiplexedConnection| {
        let (mut conn, key) = (conn.clone(), shared.keys.usage.clone());
        async move {
            redis::cmd("HGET")
                .arg(key)
                .arg("prefill:tokens")
                .query_async::<Option<i64>>(&mut conn)
                .await
                .unwrap()
                .unwrap_or(0)
        }
    };
    assert_eq!(prefill(&mut conn).await, 8_000);
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(&shared.keys.expiry)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Redis's clock says the lease expired: the renewal's reap takes it, room and all.
    expire_lease(&mut conn, &shared.keys.expiry, &ids[0]).await;
    let mut lost = Vec::new();
    assert!(super::tasks::beat(&shared, &mut Vec::new(), &mut lost).await);
    assert_eq!(lost, ids);
    assert_eq!(prefill(&mut conn).await, 0);
    // While the registration is out, the first token: its give-back already ran in Redis.
    let (held, id) = (shared.clone(), ids[0].clone());
    crate::faults::on(crate::faults::Point::Adopting, &shared.replica, move || {
        if let Some(h) = held.held().get_mut(&id) {
            h.prefill = 0;
        }
    });
    assert!(shared.adopt_fallback(&lost).await);
    for _ in 0..3_000 {
        if prefill(&mut conn).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(prefill(&mut conn).await, 0, "the room is given back");
    assert_eq!(leases(&mut conn).await, 1, "the request is counted");
    drop(guard);
    until_no_lease(&mut conn, "the request ended").await;
}
