//! The fallback (`quota.on_redis_down = "fail_open"`) of a request that was already waiting in
//! its Redis line when Redis went away, on a real `redis-server`.

use std::time::{Duration, Instant};

use super::tests::redis_common::{expire_lease, RedisServer};
use super::RedisAdmission;
use crate::admission::{AdmissionError, Ask};
use crate::config::Config;
use crate::lane::Lane::Small;
use crate::telemetry::Metrics;

/// The small lane's queue timeout here.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the request has waited in its Redis line when Redis goes away.
const WAITED_IN_REDIS: Duration = Duration::from_secs(4);

/// A request waits for the small lane's one seat; Redis goes away 4 s into its 10 s queue
/// timeout; the request moves to the fallback's queue, where there is no room either (the
/// fallback counts the seat this replica still holds). It waits its queue timeout in all, not
/// its 4 s plus a fresh queue timeout in the fallback's queue.
///
/// What the test tells apart: with a fresh timeout the wait ends no earlier than the outage
/// plus the whole timeout; the assertion is that it ends before that, so it holds however late
/// a loaded machine runs the timer, up to the 4 s the request had already waited.
#[tokio::test]
async fn a_request_waiting_when_redis_goes_away_waits_its_queue_timeout_in_all() {
    let mut redis = RedisServer::start();
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\non_redis_down = \"fail_open\"\n\
         heartbeat_ms = 500\nlease_ttl_ms = 5000\n\
         [lanes.small]\nmax_concurrency = 1\nceiling = 1\nborrow = false\nqueue_timeout_ms = {}\n",
        redis.url(),
        QUEUE_TIMEOUT.as_millis()
    ))
    .unwrap();
    let admission = RedisAdmission::from_config(&config, Metrics::new().quota().clone()).unwrap();
    let seat = admission.acquire(Ask::new(Small, 100)).await.unwrap();

    let started = Instant::now();
    let waiter = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Small, 100)).await })
    };
    tokio::time::sleep(WAITED_IN_REDIS).await;
    assert!(!waiter.is_finished(), "the seat is held: the request waits");
    redis.stop();
    let down = started.elapsed();
    // It leaves its Redis line for the fallback's queue (bounded poll: a hang fails).
    let small = Small.index();
    let mut moved = false;
    for _ in 0..2_000 {
        moved = admission.shared.queues[small].waiting() == 0
            && admission.snapshot().lane(Small).queue_depth == 1;
        if moved || waiter.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(moved, "the request never moved to the fallback's queue");

    let outcome = waiter.await.unwrap();
    let ended = started.elapsed();
    assert!(
        matches!(outcome, Err(AdmissionError::Timeout { lane: Small, .. })),
        "the fallback has no room either (it counts the seat held): {outcome:?}"
    );
    assert!(
        ended < down + QUEUE_TIMEOUT,
        "waited {ended:?}: Redis went away after {down:?}, and the fallback started a new \
         {QUEUE_TIMEOUT:?} queue timeout"
    );
    drop(seat);
    admission.shutdown().await;
}

/// A request the fallback admitted, registered in Redis once Redis was back (whatever the
/// limits: it already ran), grows past its lane while the larger lane is full in Redis: the
/// move is refused and the request stays where the fleet counts it. The fallback's own lanes
/// had room, and the move was granted there: the request ran in the large lane while the fleet
/// counted it in the small one (other replicas admitted past the large lane's limits).
#[tokio::test]
async fn a_registered_fallback_request_moves_only_when_redis_has_room() {
    let mut redis = RedisServer::start();
    let config = |url: String| {
        Config::from_toml_str(&format!(
            "[classify]\ntokenizer = \"heuristic\"\n\
             [quota]\nbackend = \"redis\"\nredis_url = \"{url}\"\non_redis_down = \"fail_open\"\n\
             heartbeat_ms = 100\nlease_ttl_ms = 10000\n\
             [lanes.large]\nmax_concurrency = 1\nceiling = 1\nborrow = false\n"
        ))
        .unwrap()
    };
    let metrics = Metrics::new();
    let admission =
        RedisAdmission::from_config(&config(redis.url()), metrics.quota().clone()).unwrap();
    drop(admission.acquire(Ask::new(Small, 100)).await.unwrap());
    redis.stop();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !admission.degraded() {
        assert!(Instant::now() < deadline, "the replica falls back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut guard = admission.acquire(Ask::new(Small, 100)).await.unwrap();
    redis.restart();
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let leases = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("HVALS")
                .arg("tg:v2:{quota}:leases")
                .query_async::<Vec<String>>(&mut conn)
                .await
                .unwrap()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while admission.degraded() || leases(&mut conn).await.len() != 1 {
        assert!(
            Instant::now() < deadline,
            "the fallback's request is registered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another replica takes the large lane's one seat.
    let other =
        RedisAdmission::from_config(&config(redis.url()), Metrics::new().quota().clone()).unwrap();
    let large = other
        .acquire(Ask::new(crate::lane::Lane::Large, 100))
        .await
        .unwrap();

    assert_ne!(
        guard.promote(crate::lane::Lane::Large, 5_000).await,
        crate::admission::Move::Done
    );
    assert_eq!(guard.lane(), Small);
    let values = leases(&mut conn).await;
    assert_eq!(
        values.iter().filter(|v| v.starts_with("small")).count(),
        1,
        "{values:?}"
    );
    // Once the seat is free, the move goes through, in Redis too.
    drop(large);
    let deadline = Instant::now() + Duration::from_secs(30);
    while guard.promote(crate::lane::Lane::Large, 5_000).await != crate::admission::Move::Done {
        assert!(
            Instant::now() < deadline,
            "the move goes through once there is room"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(leases(&mut conn)
        .await
        .iter()
        .any(|v| v.starts_with("large")));
    drop(guard);
    other.shutdown().await;
    admission.shutdown().await;
}

/// A lease Redis grants while the replica goes degraded (three calls elsewhere timed out on a
/// loaded machine while this one was out): the fallback had counted the replica's leases as
/// they were when it went degraded, so the late one ran uncounted and the fallback admitted its
/// whole share beside it (the engine saw the large lane's limit plus a share plus that lease).
/// The fallback counts it: with a share of 2, one more request gets in, not two.
#[tokio::test]
async fn a_lease_granted_as_the_replica_goes_degraded_is_counted_by_its_fallback() {
    use super::tests::redis_common::{pause_writes, paused_script};
    use crate::lane::Lane::Large;
    let redis = RedisServer::start();
    // No beat during the test (it would find Redis well and leave the fallback); the large
    // lane's 4 seats, 2 a replica on the fallback; a short queue timeout: a request the
    // fallback has no room for is refused, not kept waiting.
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\non_redis_down = \"fail_open\"\n\
         expected_replicas = 2\nheartbeat_ms = 180000\nlease_ttl_ms = 600000\n\
         [lanes.large]\nmax_concurrency = 4\nceiling = 4\nborrow = false\nqueue_timeout_ms = 300\n",
        redis.url()
    ))
    .unwrap();
    let admission = RedisAdmission::from_config(&config, Metrics::new().quota().clone()).unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // Once connected (an acquire waits for the first connection).
    drop(admission.acquire(Ask::new(Large, 100)).await.unwrap());

    // Redis holds writes; the acquire's script waits there; the replica goes degraded; Redis
    // goes on and grants the lease. Only the heartbeat takes the replica out of degraded: its
    // start-up beat, when the pause held it too, may do so meanwhile; then the round proves
    // nothing and is run again (the next beat is minutes away).
    for _ in 0..20 {
        pause_writes(&mut conn).await;
        let granted = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.acquire(Ask::new(Large, 100)).await })
        };
        paused_script(&mut conn).await;
        admission.shared.set_degraded(true);
        let _: () = redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query_async(&mut conn)
            .await
            .unwrap();
        // Granted by Redis, or (a reply later than the call's timeout on a loaded machine) by
        // the fallback: counted by the fallback either way.
        let first = granted.await.unwrap().expect("the request is admitted");
        if !admission.shared.degraded() {
            drop(first);
            continue;
        }
        let second = admission.acquire(Ask::new(Large, 100)).await;
        let third = admission.acquire(Ask::new(Large, 100)).await;
        if !admission.shared.degraded() {
            drop((first, second, third));
            continue;
        }
        let second = second.expect("the fallback's share has room for one more");
        assert!(
            matches!(third, Err(AdmissionError::Timeout { lane: Large, .. })),
            "the fallback admitted a third request beside a share of 2: {third:?}"
        );
        drop((first, second));
        admission.shutdown().await;
        return;
    }
    panic!("the replica never stayed degraded for a round");
}

/// A replica on its fallback (the large lane's 4 seats, 2 for its share there), with its beat
/// stopped: the tests below leave the fallback as the beat does ([`super::Shared::back_on_redis`]).
async fn degraded(
    redis: &RedisServer,
    queue_timeout_ms: u64,
) -> (RedisAdmission, redis::aio::MultiplexedConnection) {
    use super::tests::redis_common::leases;
    use crate::lane::Lane::Large;
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\non_redis_down = \"fail_open\"\n\
         expected_replicas = 2\nheartbeat_ms = 180000\nlease_ttl_ms = 600000\n\
         [lanes.large]\nmax_concurrency = 4\nceiling = 4\nborrow = false\n\
         queue_timeout_ms = {queue_timeout_ms}\n",
        redis.url()
    ))
    .unwrap();
    let admission = RedisAdmission::from_config(&config, Metrics::new().quota().clone()).unwrap();
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Once connected (an acquire waits for the first connection), its lease given back (the
    // release goes out in the background), and past the start-up beat (it could take the
    // replica off the fallback, or fail on paused writes and drop the connection; the next is
    // minutes away), then on the fallback.
    drop(admission.acquire(Ask::new(Large, 100)).await.unwrap());
    for _ in 0..3_000 {
        if admission
            .shared
            .beats
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
            && leases(&mut conn).await == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        admission
            .shared
            .beats
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
    );
    assert_eq!(leases(&mut conn).await, 0);
    admission.shared.set_degraded(true);
    (admission, conn)
}

/// Leaves the fallback as a beat that found Redis well does, again until it has (a call can
/// time out on a loaded machine).
async fn leave(admission: &RedisAdmission) {
    for _ in 0..20 {
        if admission.shared.back_on_redis(&[]).await {
            assert!(!admission.degraded());
            return;
        }
    }
    panic!("Redis is well, and the replica never left its fallback");
}

/// The ids of the leases Redis holds, and how many of them Redis granted itself (the others
/// are fallback admissions registered, `<replica>:f<n>`).
async fn lease_ids(conn: &mut redis::aio::MultiplexedConnection) -> (Vec<String>, usize) {
    let ids: Vec<String> = redis::cmd("HKEYS")
        .arg("tg:v2:{quota}:leases")
        .query_async(conn)
        .await
        .unwrap();
    let granted = ids
        .iter()
        .filter(|id| !id.rsplit(':').next().unwrap_or("").starts_with('f'))
        .count();
    (ids, granted)
}

/// A request waiting in the fallback's queue when the replica leaves the fallback asks Redis
/// and is admitted there, counted like every other. It waited for a fallback seat while Redis
/// had room (until its queue timeout, with long requests in those seats), and when a seat came
/// the fallback admitted it beside Redis's admissions, counted nowhere in the fleet.
#[tokio::test]
async fn a_request_waiting_in_the_fallback_when_redis_comes_back_is_admitted_by_redis() {
    use crate::lane::Lane::Large;
    let redis = RedisServer::start();
    let (admission, mut conn) = degraded(&redis, 20_000).await;
    let first = admission.acquire(Ask::new(Large, 100)).await.unwrap();
    let second = admission.acquire(Ask::new(Large, 100)).await.unwrap();
    let waiter = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Large, 100)).await })
    };
    let mut waiting = false;
    for _ in 0..2_000 {
        waiting = admission.snapshot().lane(Large).queue_depth == 1;
        if waiting || waiter.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        waiting,
        "the fallback is full: the third request waits in its queue"
    );

    leave(&admission).await;
    // (The waiter may be in Redis already: the fallback's own are counted.)
    let (ids, granted) = lease_ids(&mut conn).await;
    assert_eq!(
        ids.len() - granted,
        2,
        "the fallback's two are registered: {ids:?}"
    );
    // Redis has room for it (4 seats): admitted while the fallback's two still run.
    let third = waiter.await.unwrap().expect("admitted by Redis");
    let (ids, granted) = lease_ids(&mut conn).await;
    assert!(
        ids.len() == 3 && granted == 1,
        "three requests run and Redis counts each, the waiter by a lease of its own: {ids:?}"
    );
    drop((first, second, third));
    admission.shutdown().await;
}

/// A replica leaves its fallback only once the requests the fallback admitted are registered
/// in Redis: not when the registration fails (it left anyway, and Redis admitted against counts
/// that missed them), and not with one the fallback admitted while the registration's call was
/// out left out of it (it ran unregistered until the next beat): that one waits for the call
/// and then goes to Redis.
#[tokio::test]
async fn a_replica_leaves_its_fallback_only_once_what_it_admitted_is_registered() {
    use super::tests::redis_common::{leases, pause_writes, paused_script};
    use crate::lane::Lane::Large;
    let redis = RedisServer::start();
    let (admission, mut conn) = degraded(&redis, 20_000).await;
    let first = admission.acquire(Ask::new(Large, 100)).await.unwrap();

    // Writes held past the call's timeout: the registration fails, the replica stays degraded.
    pause_writes(&mut conn).await;
    assert!(!admission.shared.back_on_redis(&[]).await);
    assert!(admission.degraded(), "left the fallback unregistered");
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();

    // A request arrives while a registration is out: it is not in that call, and it waits for
    // the call's outcome. (When the call times out on a loaded machine, it is booked on the
    // fallback and registered by the next: counted in Redis either way.)
    let timeouts = admission.shared.metrics.errors("timeout");
    pause_writes(&mut conn).await;
    let leaving = tokio::spawn({
        let shared = admission.shared.clone();
        async move { shared.back_on_redis(&[]).await }
    });
    paused_script(&mut conn).await;
    let late = {
        let admission = admission.clone();
        tokio::spawn(async move { admission.acquire(Ask::new(Large, 100)).await })
    };
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let left_at_once = leaving.await.unwrap();
    if admission.shared.metrics.errors("timeout") == timeouts {
        assert!(
            left_at_once,
            "the registration went through, yet the replica stayed on its fallback: the \
             request booked while it was out was left out of it"
        );
    } else {
        leave(&admission).await;
    }
    let late = late.await.unwrap().expect("admitted");
    if admission.degraded() {
        leave(&admission).await;
    }
    assert_eq!(
        leases(&mut conn).await,
        2,
        "both requests are counted in Redis once the replica left"
    );
    drop((first, late));
    admission.shutdown().await;
}

/// A request the fallback admitted in one outage, registered in Redis since, still holds its
/// fallback seat: in the next outage the fallback counts it once, not once more as a Redis
/// lease the replica holds (its share then let one request fewer in).
#[tokio::test]
async fn a_fallback_admission_is_counted_once_in_the_next_outage() {
    use crate::lane::Lane::Large;
    let redis = RedisServer::start();
    let (admission, _conn) = degraded(&redis, 300).await;
    let first = admission.acquire(Ask::new(Large, 100)).await.unwrap();
    leave(&admission).await;
    admission.shared.set_degraded(true);
    // The share is 2: the first and one more.
    let second = admission.acquire(Ask::new(Large, 100)).await;
    let third = admission.acquire(Ask::new(Large, 100)).await;
    assert!(
        second.is_ok(),
        "the fallback counted the first request twice: {second:?}"
    );
    assert!(
        matches!(third, Err(AdmissionError::Timeout { lane: Large, .. })),
        "{third:?}"
    );
    drop((first, second));
    admission.shutdown().await;
}

/// A job's borrowed (pre-emptible) lease, a small-lane seat with its large-lane tokens, is
/// counted by the fallback as the fallback counts its own borrowed seats when Redis goes away:
/// the seat in the small lane, the tokens in the large lane. Counted as a small-lane request
/// of that many tokens, it filled the small lane's token share and refused every question
/// until the job ended.
#[tokio::test]
async fn a_borrowed_lease_is_counted_by_the_fallback_where_its_seat_and_tokens_are() {
    use crate::admission::preempt::Preemptible;
    use crate::lane::Lane::{Large, Medium};
    let redis = RedisServer::start();
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\non_redis_down = \"fail_open\"\n\
         heartbeat_ms = 180000\nlease_ttl_ms = 600000\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\nborrow = false\n\
         [lanes.medium]\nmax_concurrency = 1\nceiling = 1\nborrow = false\n",
        redis.url()
    ))
    .unwrap();
    let admission = RedisAdmission::from_config(&config, Metrics::new().quota().clone()).unwrap();
    // The large and medium seats taken: a borrower of the large lane gets a small seat.
    let large = admission.acquire(Ask::new(Large, 100)).await.unwrap();
    let medium = admission.acquire(Ask::new(Medium, 100)).await.unwrap();
    let handle = Preemptible::new(true);
    let mut borrowed = None;
    // (A loaded machine's first call can time out: asked again.)
    for _ in 0..20 {
        borrowed = admission.borrow(Large, 9_000, 0, &handle).await;
        if borrowed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let borrowed = borrowed.expect("an idle small seat is borrowed");
    admission.shared.set_degraded(true);
    let fallback = admission.shared.fallback.as_ref().unwrap().snapshot();
    assert_eq!(fallback.lane(Small).in_flight, 1, "its seat is a small one");
    assert_eq!(
        fallback.lane(Small).reserved_tokens,
        0,
        "its tokens are not the small lane's"
    );
    assert_eq!(fallback.lane(Large).reserved_tokens, 9_100);
    drop((large, medium, borrowed));
    let fallback = admission.shared.fallback.as_ref().unwrap().snapshot();
    assert!(fallback.is_idle(), "all given back: {fallback:?}");
    admission.shutdown().await;
}

/// A request the fallback admitted, registered in Redis when the replica left the fallback and
/// then moved there (Redis had room; the fallback's own record kept its first lane), whose
/// lease Redis later lost (reaped, here): it is registered again where it runs. It was then
/// "moved back" to the lane its fallback record named, so Redis counted its seat in the lane it
/// had left until it ended.
#[tokio::test]
async fn a_fallback_lease_moved_on_redis_and_lost_is_registered_where_it_runs() {
    use crate::admission::Move;
    use crate::lane::Lane::Large;
    let redis = RedisServer::start();
    let (admission, mut conn) = degraded(&redis, 300).await;
    let guard = admission.acquire(Ask::new(Small, 100)).await.unwrap();
    leave(&admission).await;
    let (ids, granted) = lease_ids(&mut conn).await;
    assert_eq!(
        (ids.len(), granted),
        (1, 0),
        "the fallback's lease, registered"
    );
    let id = ids[0].clone();
    let shared = &admission.shared;
    assert_eq!(
        shared.promote(&id, Small, 100, (Large, 100), false).await,
        Move::Done
    );
    // Redis's clock says the lease expired: the renewal's reap takes it.
    expire_lease(&mut conn, &shared.keys.expiry, &id).await;
    let mut lost = Vec::new();
    assert!(super::tasks::beat(shared, &mut Vec::new(), &mut lost).await);
    assert_eq!(lost, vec![id.clone()]);
    assert!(shared.adopt_fallback(&lost).await);
    let value: String = redis::cmd("HGET")
        .arg(&shared.keys.leases)
        .arg(&id)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(value.starts_with("large"), "registered as {value}");
    drop(guard);
    admission.shutdown().await;
}
