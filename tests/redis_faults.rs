//! The shared quota under Redis's own failure modes, against a real `redis-server`: data lost
//! while replicas run (a restart without persistence, `FLUSHALL`), a Redis out of memory under
//! `noeviction`, a password changed under the gateway and back.

mod common;
mod redis_common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{eventually, flags};
use redis_common::RedisServer;
use serde_json::json;
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl, RequestLogSink};
use tutor_gateway::server::Gateway;
use vllm_sim::{SimArgs, SimServer};

/// A simulator whose answers stall after their first tokens (the connection stays open): each
/// stream holds its seat until the client goes away.
async fn stalling_sim() -> SimServer {
    let flags = flags("--speed 50 --profile tiny-test --stall-after-tokens 2");
    vllm_sim::start(&SimArgs::for_test(&flags)).await.unwrap()
}

async fn fast_sim() -> SimServer {
    let flags = flags("--speed 50 --profile tiny-test");
    vllm_sim::start(&SimArgs::for_test(&flags)).await.unwrap()
}

/// The shipped config on Redis at `url`, a 1 s lease TTL and a 100 ms beat.
fn config(sim: &SimServer, url: String) -> Config {
    let mut c = Config::default();
    c.upstream.base_url = sim.url();
    c.upstream.idle_timeout = Duration::from_secs(120);
    c.telemetry.request_log = RequestLogSink::Off;
    c.quota.backend = QuotaBackend::Redis;
    c.quota.redis_url = RedisUrl::new(url);
    c.quota.lease_ttl = Duration::from_millis(1_000);
    c.quota.heartbeat = Duration::from_millis(100);
    c
}

/// A gateway on `config`, once it has its first connection to Redis (a request waits only 2 s
/// for it, which a loaded machine can exceed). Every test here starts it with Redis up and the
/// right password.
async fn gateway(config: Config) -> Gateway {
    let gw = common::gateway(config).await.0;
    common::redis_ready(&gw).await;
    gw
}

async fn usage(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, i64> {
    redis::cmd("HGETALL")
        .arg("tg:v2:{quota}:usage")
        .query_async(conn)
        .await
        .unwrap()
}

/// A streamed question that stalls after its first tokens: its response, kept open.
async fn stalled_stream(http: &reqwest::Client, gw: &Gateway, salt: usize) -> reqwest::Response {
    let body = json!({"messages": [{"role": "user", "content": format!("what is a closure? {salt}")}],
                      "max_tokens": 100, "stream": true});
    let resp = http
        .post(format!("{}/v1/chat/completions", gw.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

/// Three streamed questions on `gw` that stall after their first tokens, once Redis counts
/// their seats; and a connection to `redis`.
async fn three_stalled_streams(
    gw: &Gateway,
    redis: &RedisServer,
) -> (Vec<reqwest::Response>, redis::aio::MultiplexedConnection) {
    let http = reqwest::Client::new();
    let mut streams = Vec::new();
    for i in 0..3 {
        streams.push(stalled_stream(&http, gw, i).await);
    }
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while small(&usage(&mut conn).await) != 3 {
        assert!(Instant::now() < deadline, "the streams hold their seats");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (streams, conn)
}

/// Small seats counted in `usage`.
fn small(usage: &HashMap<String, i64>) -> i64 {
    usage.get("small:n").copied().unwrap_or(0)
}

/// Waits until every counter in Redis is back at zero and `gw` is idle.
async fn every_count_back_to_zero(gw: &Gateway, conn: &mut redis::aio::MultiplexedConnection) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let u = usage(conn).await;
        if u.values().all(|v| *v == 0) {
            break;
        }
        assert!(Instant::now() < deadline, "every seat given back: {u:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually("the gateway is idle", || {
        gw.state.admission().snapshot().is_idle()
    })
    .await;
}

/// Redis loses its data while a replica runs three streams (`FLUSHALL`, as a restart without
/// persistence or a failover to an empty replica would): at its next renewal the replica sees
/// the data's new epoch and counts its streams there again, instead of leaving them uncounted
/// (their seats free for others) until they end. When they end every counter is back at zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_requests_are_counted_again_after_redis_lost_its_data() {
    let redis = RedisServer::start();
    let sim = stalling_sim().await;
    let gw = gateway(config(&sim, redis.url())).await;
    let (streams, mut conn) = three_stalled_streams(&gw, &redis).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while small(&usage(&mut conn).await) != 3 {
        assert!(
            Instant::now() < deadline,
            "the running streams are counted again: {:?}",
            usage(&mut conn).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let quota = gw.state.metrics().quota().clone();
    assert!(!quota.degraded(), "never fell back: Redis was up");
    drop(streams);
    every_count_back_to_zero(&gw, &mut conn).await;
    gw.shutdown().await;
}

/// A Redis out of memory under `noeviction` answers every write with `OOM`: the replica falls
/// back at once and serves (a release still went through there, and used to reset the
/// failures in a row, so it never fell back and requests waited out their queue timeout),
/// stays on its fallback while Redis is full (its heartbeats write too), and it is back on
/// Redis once Redis has room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_sends_the_replica_to_its_fallback_at_once() {
    let redis = RedisServer::start();
    let sim = fast_sim().await;
    let mut c = config(&sim, redis.url());
    c.lanes.small.queue.timeout = Duration::from_secs(60);
    let gw = gateway(c).await;
    let http = reqwest::Client::new();
    let ask = |i: usize| {
        let body = json!({"messages": [{"role": "user", "content": format!("what is a trait? {i}")}],
                          "max_tokens": 3});
        http.post(format!("{}/v1/chat/completions", gw.url()))
            .json(&body)
            .send()
    };
    assert_eq!(ask(0).await.unwrap().status(), 200);
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let set = |v: &'static str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(v)
            .clone()
    };
    let _: () = set("1").query_async(&mut conn).await.unwrap();
    let quota = gw.state.metrics().quota().clone();
    for i in 1..=4 {
        let resp = tokio::time::timeout(Duration::from_secs(30), ask(i))
            .await
            .expect("answered without waiting out the queue timeout")
            .unwrap();
        assert_eq!(resp.status(), 200, "served by the fallback");
    }
    assert!(quota.fallbacks_total() > 0, "served by the fallback");
    assert!(
        quota.errors("refused") > 0,
        "counted as Redis refusing writes"
    );
    // And it stays there while Redis refuses writes: every heartbeat writes, so a beat with no
    // lease to renew fails too (it used to succeed, and the replica flapped back onto a Redis
    // that refused its next acquire). Twenty beats' worth of looks, each must see it degraded.
    let fallbacks = quota.fallbacks_total();
    for _ in 0..20 {
        assert!(
            quota.degraded(),
            "stays on the fallback while Redis is full"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        quota.fallbacks_total(),
        fallbacks,
        "fell back once, never left"
    );
    let _: () = set("0").query_async(&mut conn).await.unwrap();
    eventually("back on Redis", || !quota.degraded()).await;
    assert_eq!(ask(9).await.unwrap().status(), 200);
    gw.shutdown().await;
}

/// A password changed under the running gateway (its reconnects fail authentication) and then
/// set back: the replica falls back meanwhile and is on Redis again once the password is
/// right, without a restart (its connection used to keep failing for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_wrong_password_the_replica_comes_back_once_it_is_right() {
    let redis = RedisServer::start();
    let url = |password: &str| format!("redis://:{password}@127.0.0.1:{}/0", redis.port);
    let mut admin = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let requirepass = |p: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(p)
            .clone()
    };
    let _: () = requirepass("right").query_async(&mut admin).await.unwrap();
    let sim = fast_sim().await;
    let gw = gateway(config(&sim, url("right"))).await;
    let quota = gw.state.metrics().quota().clone();
    eventually("on Redis", || !quota.degraded()).await;
    // The password changes and every connection is dropped: the gateway's reconnects fail.
    let wrong = redis::Client::open(url("right")).unwrap();
    let mut c = wrong.get_multiplexed_async_connection().await.unwrap();
    let _: () = requirepass("changed").query_async(&mut c).await.unwrap();
    let _: Result<(), _> = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut c)
        .await;
    eventually("fell back", || quota.degraded()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let changed = redis::Client::open(url("changed")).unwrap();
    let mut c = changed.get_multiplexed_async_connection().await.unwrap();
    let _: () = requirepass("right").query_async(&mut c).await.unwrap();
    eventually("back on Redis with the right password", || {
        !quota.degraded()
    })
    .await;
    gw.shutdown().await;
}

/// Redis's clock runs ahead (an NTP step forward, a failover to a server whose clock is
/// ahead), simulated by moving the replica's lease expiries into the past: the next script
/// reaps them, although the replica renewed them a beat ago. The replica registers its
/// running streams again instead of leaving their seats free for others until they end; when
/// they end every counter is back at zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_requests_are_counted_again_after_redis_reaped_them_early() {
    let redis = RedisServer::start();
    let sim = stalling_sim().await;
    let mut c = config(&sim, redis.url());
    // Half the TTL is far beyond a beat even on a loaded machine.
    c.quota.lease_ttl = Duration::from_secs(20);
    let gw = gateway(c).await;
    let (streams, mut conn) = three_stalled_streams(&gw, &redis).await;
    let leases: Vec<String> = redis::cmd("ZRANGE")
        .arg("tg:v2:{quota}:expiry")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(leases.len(), 3);
    let mut expired = redis::cmd("ZADD");
    expired.arg("tg:v2:{quota}:expiry").arg("XX");
    for id in &leases {
        expired.arg(1).arg(id);
    }
    let _: () = expired.query_async(&mut conn).await.unwrap();
    // Reaped at the next beat, registered again at once.
    let quota = gw.state.metrics().quota().clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while quota.errors("lease_lost") < 3 || small(&usage(&mut conn).await) != 3 {
        assert!(
            Instant::now() < deadline,
            "the running streams are counted again: {:?}",
            usage(&mut conn).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(streams);
    every_count_back_to_zero(&gw, &mut conn).await;
    gw.shutdown().await;
}
