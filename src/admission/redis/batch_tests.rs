//! A burst waiting in a replica's line, admitted through the shared quota on a real
//! `redis-server` (issue 36, item 4): the line's head takes the leases of the waiters behind it
//! in its own script call (`quota.batch_max`), so a burst costs a round trip, not one per
//! request; the limits hold and every lease comes back either way.

use std::time::Duration;

use super::tests::redis_common::RedisServer;
use super::RedisAdmission;
use crate::admission::{Ask, LaneGuard};
use crate::config::Config;
use crate::lane::Lane::Small;
use crate::telemetry::Metrics;

/// Requests in the burst.
const BURST: usize = 20;

/// Acquire calls that granted, the leases they took, and the leases given back.
const CALLS: &str = "tutor_gateway_quota_leases_per_call_count{op=\"acquire\"}";
const TAKEN: &str = "tutor_gateway_quota_leases_per_call_sum{op=\"acquire\"}";
const GIVEN: &str = "tutor_gateway_quota_leases_per_call_sum{op=\"release\"}";

fn config(redis: &RedisServer, seats: u32, batch_max: u32) -> Config {
    Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [admission]\nseats = {}\nmax_tokens_in_flight = 1000000\n\
         [lanes.small]\nmax_concurrency = {seats}\nceiling = {seats}\nqueue_len = 64\n\
         queue_timeout_ms = 120000\nmax_tokens_in_flight = 1000000\n\
         [lanes.medium]\nmax_concurrency = 4\nceiling = 4\n\
         [lanes.large]\nmax_concurrency = 4\nceiling = 4\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\nbatch_max = {batch_max}\n",
        seats + 8,
        redis.url()
    ))
    .unwrap()
}

/// A sample of `metrics` (`name` with its labels, as the exposition writes it).
fn sample(metrics: &Metrics, admission: &RedisAdmission, name: &str) -> u64 {
    let text = metrics.render(&admission.snapshot());
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

async fn usage(conn: &mut redis::aio::MultiplexedConnection, field: &str) -> i64 {
    let v: Option<i64> = redis::AsyncCommands::hget(conn, "tg:v2:{quota}:usage", field)
        .await
        .unwrap();
    v.unwrap_or(0)
}

/// Polls `done` (bounded: a hang fails, nothing is timed).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..6_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

/// Fills the small lane's 2 seats, lines up [`BURST`] requests behind them, then widens the
/// lane to 32 seats (a reload): returns how many acquire calls granted the burst, after
/// checking the lane's count in Redis, the leases the calls say they took, and that everything
/// comes back.
async fn burst(batch_max: u32) -> u64 {
    let redis = RedisServer::start();
    let metrics = Metrics::new();
    let admission: &'static RedisAdmission = Box::leak(Box::new(
        RedisAdmission::from_config(&config(&redis, 2, batch_max), metrics.quota().clone())
            .unwrap(),
    ));
    let calls = || sample(&metrics, admission, CALLS);
    let taken = || sample(&metrics, admission, TAKEN);
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let full: Vec<LaneGuard> = vec![
        admission.acquire(Ask::new(Small, 100)).await.unwrap(),
        admission.acquire(Ask::new(Small, 100)).await.unwrap(),
    ];
    let waiters: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(admission.acquire(Ask::new(Small, 100))))
        .collect();
    until("the burst is in line", || {
        admission.snapshot().lane(Small).queue_depth == BURST as u32
    })
    .await;
    let before = calls();
    admission.set_limits(&config(&redis, 32, batch_max), false);
    let mut admitted = Vec::new();
    for waiter in waiters {
        admitted.push(
            waiter
                .await
                .unwrap()
                .expect("admitted once the lane widened"),
        );
    }
    let calls = calls() - before;
    // Redis counts every one of them, never more; so does the metric.
    assert_eq!(usage(&mut conn, "small:n").await, (BURST + 2) as i64);
    assert_eq!(taken(), (BURST + 2) as u64);
    drop((full, admitted));
    let mut back = false;
    for _ in 0..6_000 {
        if usage(&mut conn, "small:n").await == 0 && usage(&mut conn, "small:tokens").await == 0 {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back, "every lease came back (batch_max {batch_max})");
    until("the releases are counted", || {
        sample(&metrics, admission, GIVEN) == (BURST + 2) as u64
    })
    .await;
    assert!(admission.snapshot().is_idle());
    admission.shutdown().await;
    calls
}

#[tokio::test]
async fn a_burst_in_line_is_granted_by_one_call_not_one_per_request() {
    // One lease a call: each of the burst has its own.
    assert_eq!(burst(1).await, BURST as u64);
    // The head takes those behind it: the whole burst (all in line when the lane widened, and
    // within quota.batch_max) is granted by one call.
    assert_eq!(burst(32).await, 1);
}
