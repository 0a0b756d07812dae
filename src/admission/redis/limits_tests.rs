//! The shared limits record across reloads and `tutor-gateway limits push` (issue 32, item 2),
//! against a real `redis-server`: a reload that changes no limit writes nothing, a pushed
//! record is not reverted by a reload unless forced, and the record says who wrote it.

use std::collections::HashMap;
use std::time::Duration;

use super::tests::redis_common::RedisServer;
use super::{push_limits, RedisAdmission};
use crate::admission::LimitsChange;
use crate::config::Config;

fn config(redis: &RedisServer, small: u32) -> Config {
    Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [lanes.small]\nmax_concurrency = {small}\nceiling = {small}\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\nheartbeat_ms = 100\n",
        redis.url()
    ))
    .unwrap()
}

async fn record(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, String> {
    redis::AsyncCommands::hgetall(conn, "tg:v2:{quota}:limits")
        .await
        .unwrap()
}

/// Polls the record until `done` holds (bounded: a hang fails, nothing is timed).
async fn until(
    conn: &mut redis::aio::MultiplexedConnection,
    what: &str,
    done: impl Fn(&HashMap<String, String>) -> bool,
) -> HashMap<String, String> {
    for _ in 0..3_000 {
        let r = record(conn).await;
        if done(&r) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}: {:?}", record(conn).await);
}

fn version(r: &HashMap<String, String>) -> u64 {
    r.get("version").and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A replica on `redis` with small = 32, once it wrote its record: a connection to Redis, its
/// file, its metrics, the replica and the record.
async fn started(
    redis: &RedisServer,
) -> (
    redis::aio::MultiplexedConnection,
    Config,
    crate::telemetry::Metrics,
    RedisAdmission,
    HashMap<String, String>,
) {
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let file = config(redis, 32);
    let metrics = crate::telemetry::Metrics::new();
    let a = RedisAdmission::from_config(&file, metrics.quota().clone()).unwrap();
    let record = until(&mut conn, "the replica writes its record", |r| {
        version(r) >= 1
    })
    .await;
    (conn, file, metrics, a, record)
}

#[tokio::test]
async fn a_pushed_record_outlives_reloads_until_one_is_forced() {
    let redis = RedisServer::start();
    let (mut conn, file, metrics, a, started) = started(&redis).await;
    assert!(started["origin"].starts_with("start "), "{started:?}");
    assert_eq!(started["small:max"], "32");

    // An operator pushes small = 20 for the whole fleet.
    let pushed = push_limits(&config(&redis, 20)).await.unwrap();
    let r = record(&mut conn).await;
    assert_eq!((version(&r), r["small:max"].as_str()), (pushed, "20"));
    assert!(r["origin"].starts_with("limits push"), "{r:?}");
    // The replica hears of it (announcement or heartbeat).
    for _ in 0..3_000 {
        if metrics.quota().limits_version() == pushed && a.shared.limits_origin() == r["origin"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metrics.quota().limits_version(), pushed);

    // A reload of the unchanged file writes nothing (it used to revert small to 32).
    assert_eq!(a.set_limits(&file, false), LimitsChange::Unchanged);
    // A reload whose file changed a limit does not revert the push either, and says why.
    let changed = config(&redis, 24);
    let kept = a.set_limits(&changed, false);
    assert!(
        matches!(&kept, LimitsChange::KeptPushed { version, origin }
            if *version == pushed && origin.starts_with("limits push")),
        "{kept:?}"
    );
    assert!(kept.describe().contains("force"), "{}", kept.describe());
    // Several heartbeats later the pushed record still stands.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = record(&mut conn).await;
    assert_eq!((version(&r), r["small:max"].as_str()), (pushed, "20"));

    // Forced, the file's limits replace the push, as a new version that names the replica.
    assert_eq!(a.set_limits(&changed, true), LimitsChange::Pushing);
    let forced = until(&mut conn, "the forced reload is written", |r| {
        version(r) > pushed
    })
    .await;
    assert_eq!(forced["small:max"], "24");
    assert!(forced["origin"].ends_with("(forced)"), "{forced:?}");
    // From then on the file's reloads are written again, when they change something.
    for _ in 0..3_000 {
        if metrics.quota().limits_version() == version(&forced) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        a.set_limits(&config(&redis, 26), false),
        LimitsChange::Pushing
    );
    let r = until(&mut conn, "the next reload is written", |r| {
        version(r) > version(&forced)
    })
    .await;
    assert_eq!(r["small:max"], "26");
    assert!(r["origin"].starts_with("reload "), "{r:?}");
    a.shutdown().await;
}

/// A replica that starts never replaces the record in force, so one whose file changed a
/// limit (a rollout of a new config, a new build that adds fields) ran the old limits without
/// a word. It says so now: a warning and `tutor_gateway_quota_limits_differ`, 1 where its file
/// differs (also where the record lacks a field an older build did not write), 0 where not.
#[tokio::test]
async fn a_replica_that_starts_under_other_limits_says_so() {
    let redis = RedisServer::start();
    let (mut conn, _file, metrics, a, first) = started(&redis).await;
    assert!(!metrics.quota().limits_differ(), "it wrote its own");
    let start = |small: u32| {
        let redis = &redis;
        async move {
            let metrics = crate::telemetry::Metrics::new();
            let b = RedisAdmission::from_config(&config(redis, small), metrics.quota().clone())
                .unwrap();
            for _ in 0..3_000 {
                if metrics.quota().limits_version() > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(metrics.quota().limits_version() > 0, "never saw the record");
            let differ = metrics.quota().limits_differ();
            b.shutdown().await;
            differ
        }
    };
    assert!(start(20).await, "small = 20 against the record's 32");
    assert!(!start(32).await, "the same limits");
    // A record an older build wrote, without the pre-emption fields.
    let _: () = redis::AsyncCommands::hdel(&mut conn, "tg:v2:{quota}:limits", "preempt_cooldown")
        .await
        .unwrap();
    assert!(start(32).await, "a field the record lacks");
    // The record itself is never replaced by a start.
    let r = record(&mut conn).await;
    assert_eq!(version(&r), version(&first));
    a.shutdown().await;
}

/// Once the record in force is replaced by this replica's own limits (`limits push` of its
/// file, as its warning says to do), it stops saying they differ at its next beat: the gauge
/// stayed 1, and its alert firing, until the replica restarted.
#[tokio::test]
async fn a_replica_whose_limits_are_pushed_stops_saying_they_differ() {
    let redis = RedisServer::start();
    let (_conn, _file, _metrics, a, _first) = started(&redis).await;
    let metrics = crate::telemetry::Metrics::new();
    let b = RedisAdmission::from_config(&config(&redis, 20), metrics.quota().clone()).unwrap();
    for _ in 0..3_000 {
        if metrics.quota().limits_version() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        metrics.quota().limits_differ(),
        "small = 20 against the record's 32"
    );
    push_limits(&config(&redis, 20)).await.unwrap();
    for _ in 0..3_000 {
        if !metrics.quota().limits_differ() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !metrics.quota().limits_differ(),
        "the pushed record is its own"
    );
    b.shutdown().await;
    a.shutdown().await;
}

/// A replica that starts under an autopilot leader's paced record does not say its file
/// differs: paced values differ from every file by design, and the alert would have had the
/// operator push the file, which stops the autopilot's publishing.
#[tokio::test]
async fn a_replica_starting_under_an_autopilots_record_does_not_say_it_differs() {
    let redis = RedisServer::start();
    let (_conn, file, _metrics, a, _) = started(&redis).await;
    let mut paced = file.clone();
    paced.admission.prefill_budget_tokens = 4_096;
    assert!(a.publish_paced(&paced).await.is_some());
    let metrics = crate::telemetry::Metrics::new();
    let b = RedisAdmission::from_config(&config(&redis, 32), metrics.quota().clone()).unwrap();
    for _ in 0..3_000 {
        if metrics.quota().limits_version() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(metrics.quota().limits_version() > 0, "never saw the record");
    assert!(
        !metrics.quota().limits_differ(),
        "a paced record is not a difference"
    );
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test]
async fn the_knobs_an_autopilot_publishes_are_what_every_replica_reads_back() {
    let redis = RedisServer::start();
    let (_conn, file, _metrics, a, _) = started(&redis).await;
    // A leader's paced values: a tighter prefill budget and large lane, a wider small
    // reservation (the autopilot's three knobs).
    let mut paced = file.clone();
    paced.admission.prefill_budget_tokens = 4_096;
    paced.lanes.large.ceiling = std::num::NonZeroU32::new(3).unwrap();
    paced.lanes.large.max_concurrency = std::num::NonZeroU32::new(3).unwrap();
    paced.lanes.small.max_concurrency = std::num::NonZeroU32::new(49).unwrap();
    paced.lanes.small.ceiling = std::num::NonZeroU32::new(96).unwrap();
    assert!(a.publish_paced(&paced).await.is_some());
    let knobs = a.shared_knobs().await.expect("a record in force");
    assert_eq!(
        (knobs.prefill_budget, knobs.large_seats, knobs.small_seats),
        (4_096, 3, 49)
    );
    a.shutdown().await;
}

/// A reload that lowers a lane's budget below a waiting request's reservation: the request
/// leaves its line with `TooLarge`, as it would be refused on arrival, and the one behind it is
/// admitted once the seat frees. It used to stay at the head of its line, holding up everyone
/// behind it until its queue timeout (60 s here).
#[tokio::test]
async fn a_waiter_a_reload_makes_too_large_leaves_its_line_and_the_line_goes_on() {
    use crate::admission::{AdmissionError, Ask};
    use crate::lane::Lane::Small;

    let redis = RedisServer::start();
    let small = |budget: u32| {
        Config::from_toml_str(&format!(
            "[classify]\ntokenizer = \"heuristic\"\nsmall_max_work = {}\n\
             [lanes.small]\nmax_concurrency = 1\nceiling = 1\nborrow = false\n\
             max_tokens_in_flight = {budget}\nqueue_timeout_ms = 60000\n\
             [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\nheartbeat_ms = 100\n",
            budget.min(1200),
            redis.url()
        ))
        .unwrap()
    };
    let metrics = crate::telemetry::Metrics::new();
    let a = RedisAdmission::from_config(&small(4000), metrics.quota().clone()).unwrap();
    let seat = a.acquire(Ask::new(Small, 500)).await.unwrap();
    let wait = |tokens: u32| {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, tokens)).await.map(|g| g.tokens()) })
    };
    let waiting = |n: u32| {
        let a = a.clone();
        async move {
            for _ in 0..3_000 {
                if a.snapshot().lane(Small).queue_depth == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("never {n} waiting");
        }
    };
    let too_large = wait(1000);
    waiting(1).await;
    let behind = wait(300);
    waiting(2).await;

    a.set_limits(&small(600), false);
    let refused = tokio::time::timeout(Duration::from_secs(30), too_large)
        .await
        .expect("it left its line long before its queue timeout")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            refused,
            AdmissionError::TooLarge {
                lane: Small,
                tokens: 1000,
                limit: 600
            }
        ),
        "{refused}"
    );
    drop(seat);
    let admitted = tokio::time::timeout(Duration::from_secs(30), behind)
        .await
        .expect("the one behind is admitted once the seat frees");
    assert_eq!(admitted.unwrap().unwrap(), 300);
    a.shutdown().await;
}

/// A request that fits this replica's file but never the shared record (pushed lower, or
/// another replica's reload) is refused at once with `TooLarge`, as its file's own limits refuse
/// one: it used to wait at the head of its line for the whole queue timeout (a minute for
/// reviews), holding back every request behind it, then got 503 `queue_timeout`.
#[tokio::test]
async fn a_request_the_shared_record_can_never_fit_is_refused_at_once() {
    use crate::admission::{AdmissionError, Ask};
    use crate::lane::Lane;
    let redis = RedisServer::start();
    let (_conn, file, metrics, a, _) = started(&redis).await;
    let mut lower = file.clone();
    lower.lanes.large.max_tokens_in_flight = std::num::NonZeroU64::new(8_192).unwrap();
    let pushed = push_limits(&lower).await.unwrap();
    for _ in 0..3_000 {
        if metrics.quota().limits_version() == pushed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The file's large budget is far above 15,000 tokens; the record's is 8,192.
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        a.acquire(Ask::new(Lane::Large, 15_000)),
    )
    .await
    .expect("refused, not left waiting");
    match refused {
        Err(AdmissionError::TooLarge {
            lane,
            tokens,
            limit,
        }) => {
            assert_eq!((lane, tokens, limit), (Lane::Large, 15_000, 8_192));
        }
        other => panic!("{other:?}"),
    }
    // One that fits the record is taken.
    let guard = a.acquire(Ask::new(Lane::Large, 8_000)).await.unwrap();
    drop(guard);
}
