//! A quota Redis that may evict keys (a `maxmemory` under a policy other than `noeviction`)
//! loses leases, counters and job records without a word, and the fleet's counts stay wrong
//! until someone deletes keys by hand. The replica says so in a warning when it connects.

use super::tests::redis_common::RedisServer;
use super::RedisAdmission;
use crate::admission::Ask;
use crate::config::Config;
use crate::lane::Lane::Small;
use crate::telemetry::Metrics;

/// What a replica logs at warn level when it connects to `redis` set to `policy` under a 1 GB
/// `maxmemory`.
async fn warned_on_connect(policy: &str) -> String {
    let redis = RedisServer::start();
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for (name, value) in [("maxmemory", "1gb"), ("maxmemory-policy", policy)] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // This test's runtime has one thread: the replica's heartbeat logs on it.
    let (captured, _guard) = tutor_testkit::capture_logs(tracing::Level::WARN);
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n[quota]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
        redis.url()
    ))
    .unwrap();
    let metrics = Metrics::new();
    let admission = RedisAdmission::from_config(&config, metrics.quota().clone()).unwrap();
    // Admitted through Redis: the replica has connected (and checked).
    drop(admission.acquire(Ask::new(Small, 10)).await.unwrap());
    admission.shutdown().await;
    captured.text()
}

#[tokio::test]
async fn a_quota_redis_that_may_evict_keys_is_warned_about_and_noeviction_is_not() {
    let warned = warned_on_connect("allkeys-lru").await;
    assert!(
        warned.contains("maxmemory-policy allkeys-lru") && warned.contains("noeviction"),
        "no warning names the eviction policy: {warned}"
    );
    let warned = warned_on_connect("noeviction").await;
    assert!(
        !warned.contains("may evict"),
        "a Redis under noeviction was warned about: {warned}"
    );
}
