//! The [`Backend`] contract, one scenario run through `&dyn Backend` against both backends (the
//! in-process one and the Redis one on a real `redis-server`): the same asks get the same
//! answers (seats up to the limit, a queue place, `QueueFull`, `TooLarge`), a freed seat goes to
//! the waiter, and every seat and token comes back.

use std::time::Duration;

use super::redis::tests::redis_common::RedisServer;
use super::*;
use crate::config::Config;
use crate::lane::Lane::{Large, Small};

const LIMITS: &str = "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\n\
     seats = 4\nmax_tokens_in_flight = 100000\n\
     [lanes.small]\nmax_concurrency = 2\nceiling = 2\nqueue_len = 1\nqueue_timeout_ms = 60000\n\
     max_tokens_in_flight = 1200\n\
     [lanes.medium]\nmax_concurrency = 1\nceiling = 1\n\
     [lanes.large]\nmax_concurrency = 1\nceiling = 1\n";

/// Polls `done` (bounded: a hang fails, nothing is timed).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..3_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

async fn the_contract_holds(backend: &'static dyn Backend, name: &str) {
    assert_eq!(backend.health(), AdmissionHealth::Ok, "{name}");
    assert_eq!(backend.policy(), Policy::Lanes, "{name}");
    // More work than the lane's whole budget can never fit.
    let err = backend.acquire(Ask::new(Small, 5_000)).await.unwrap_err();
    assert!(
        matches!(err, AdmissionError::TooLarge { lane: Small, .. }),
        "{name}: {err:?}"
    );
    // Two seats, then a queue place, then a full queue.
    let first = backend.acquire(Ask::new(Small, 300)).await.unwrap();
    let second = backend
        .acquire(Ask::new(Small, 300).for_tenant(Some("t")))
        .await
        .unwrap();
    assert_eq!(backend.snapshot().lane(Small).in_flight, 2, "{name}");
    assert_eq!(
        backend.snapshot().lane(Small).reserved_tokens,
        600,
        "{name}"
    );
    let waiter = tokio::spawn(backend.acquire(Ask::new(Small, 300)));
    until("the third is in the queue", || {
        backend.snapshot().lane(Small).queue_depth == 1
    })
    .await;
    let err = backend.acquire(Ask::new(Small, 300)).await.unwrap_err();
    assert!(
        matches!(err, AdmissionError::QueueFull { lane: Small, .. }),
        "{name}: {err:?}"
    );
    // Another lane is not held back by small's queue.
    let large = backend.acquire(Ask::new(Large, 2_000)).await.unwrap();
    assert_eq!(large.lane(), Large);
    assert!(backend.snapshot().lane(Small).in_flight <= 2, "{name}");
    // The freed seat goes to the waiter.
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter is admitted")
        .unwrap()
        .unwrap();
    assert_eq!(third.lane(), Small);
    assert!(backend.snapshot().lane(Small).in_flight <= 2, "{name}");
    drop((second, third, large));
    until("every seat and token is back", || {
        backend.snapshot().is_idle()
    })
    .await;
}

#[tokio::test]
async fn the_local_backend_keeps_the_contract() {
    let config = Config::from_toml_str(LIMITS).unwrap();
    let local: &'static LocalAdmission = Box::leak(Box::new(LocalAdmission::from_config(&config)));
    the_contract_holds(local, "local").await;
}

#[tokio::test]
async fn the_redis_backend_keeps_the_contract() {
    let server = RedisServer::start();
    let toml = format!(
        "{LIMITS}[quota]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
        server.url()
    );
    let config = Config::from_toml_str(&toml).unwrap();
    let metrics = crate::telemetry::Metrics::new();
    let redis: &'static RedisAdmission = Box::leak(Box::new(
        RedisAdmission::from_config(&config, metrics.quota().clone()).unwrap(),
    ));
    the_contract_holds(redis, "redis").await;
    // Redis's own counters come back to zero too (the releases run in the background).
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let usage_key = redis.keys().usage.clone();
    for _ in 0..3_000 {
        let usage: std::collections::HashMap<String, i64> =
            ::redis::AsyncCommands::hgetall(&mut conn, &usage_key)
                .await
                .unwrap();
        if usage.values().all(|v| *v == 0) {
            redis.shutdown().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("Redis's usage never came back to zero");
}
