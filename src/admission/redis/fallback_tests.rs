//! The fallback (`quota.on_redis_down = "fail_open"`) of a request that was already waiting in
//! its Redis line when Redis went away, on a real `redis-server`.

use std::time::{Duration, Instant};

use super::tests::redis_common::RedisServer;
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
