//! The Redis-backed shared quota (M15) end to end: several gateways, one real `redis-server`
//! started by the test, one simulator.

mod common;
mod redis_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, words};
use redis_common::RedisServer;
use serde_json::json;
use tutor_gateway::admission::Admission;
use tutor_gateway::config::{Config, OnRedisDown, QuotaBackend, RedisUrl, RequestLogSink};
use tutor_gateway::lane::Lane;
use tutor_gateway::server::Gateway;
use tutor_gateway::telemetry::Metrics;
use vllm_sim::{SimArgs, SimServer};

const LIMITS: [(&str, i64, i64); 3] = [
    ("small", 32, 38_400),
    ("medium", 20, 100_000),
    ("large", 4, 65_536),
];
const GLOBAL_TOKENS: i64 = 196_608;

async fn sim() -> SimServer {
    let flags = [
        "--speed",
        "50",
        "--profile",
        "tiny-test",
        "--num-gpu-blocks",
        "8192",
    ];
    vllm_sim::start(&SimArgs::for_test(&flags)).await.unwrap()
}

/// The shipped config on `redis`, lanes re-cut for short test prompts (small <= 60 tokens of
/// work, medium <= 120, large above), the seed's large lane (4 seats) and global budget
/// ([`LIMITS`], [`GLOBAL_TOKENS`]), long queues, a 1 s lease TTL.
fn config(sim: &SimServer, redis: &RedisServer) -> Config {
    let mut c = Config::default();
    c.lanes.large.max_concurrency = 4.try_into().unwrap();
    c.lanes.large.ceiling = 4.try_into().unwrap();
    c.lanes.large.max_tokens_in_flight = 65_536.try_into().unwrap();
    c.admission.max_tokens_in_flight = (GLOBAL_TOKENS as u64).try_into().unwrap();
    c.upstream.base_url = sim.url();
    c.telemetry.request_log = RequestLogSink::Off;
    c.classify.small_max_work = 60.try_into().unwrap();
    c.classify.medium_max_work = 120.try_into().unwrap();
    for lane in [&mut c.lanes.small, &mut c.lanes.medium, &mut c.lanes.large] {
        lane.queue.len = 2_000;
        lane.queue.timeout = Duration::from_secs(60);
    }
    c.quota.backend = QuotaBackend::Redis;
    c.quota.redis_url = RedisUrl::new(redis.url());
    c.quota.lease_ttl = Duration::from_millis(1_000);
    c.quota.heartbeat = Duration::from_millis(100);
    c
}

async fn gateway(config: Config) -> Gateway {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    tutor_gateway::server::start(config, listener).unwrap()
}

/// A chat request of about `words_n` prompt tokens and `max_tokens` output.
fn body(words_n: usize, max_tokens: u32, salt: &str) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": words(words_n, salt)}],
           "max_tokens": max_tokens, "ignore_eos": true})
}

async fn post(client: &reqwest::Client, url: String, body: serde_json::Value) -> u16 {
    match client.post(url).json(&body).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let _ = r.bytes().await;
            status
        }
        Err(_) => 0,
    }
}

/// Usage counters and leases, read in one MULTI so they are consistent with each other.
async fn read_quota(
    conn: &mut redis::aio::MultiplexedConnection,
) -> (HashMap<String, i64>, HashMap<String, String>) {
    redis::pipe()
        .atomic()
        .hgetall("tg:v2:{quota}:usage")
        .hgetall("tg:v2:{quota}:leases")
        .query_async(conn)
        .await
        .unwrap()
}

/// Checks every limit on one reading; returns per-lane lease counts.
fn check(usage: &HashMap<String, i64>, leases: &HashMap<String, String>) -> [i64; 3] {
    let get = |k: &str| usage.get(k).copied().unwrap_or(0);
    let mut n = [0; 3];
    for (i, (lane, max_n, max_tokens)) in LIMITS.iter().enumerate() {
        n[i] = get(&format!("{lane}:n"));
        assert!(n[i] <= *max_n, "{lane} holds {} leases > {max_n}", n[i]);
        let tokens = get(&format!("{lane}:tokens"));
        assert!(
            tokens <= *max_tokens,
            "{lane} reserves {tokens} > {max_tokens}"
        );
        let from_leases = leases
            .values()
            .filter(|v| v.starts_with(&format!("{lane} ")))
            .count();
        assert_eq!(
            from_leases as i64, n[i],
            "{lane} counter equals its live leases"
        );
    }
    assert!(get("global:tokens") <= GLOBAL_TOKENS);
    n
}

async fn quota_is_empty(conn: &mut redis::aio::MultiplexedConnection) -> bool {
    let (usage, leases) = read_quota(conn).await;
    leases.is_empty() && usage.values().all(|v| *v == 0)
}

/// Waits until every counter is back to zero and no lease is left; the 30 s are only a guard
/// against a leak, never a measurement.
async fn quota_drains(conn: &mut redis::aio::MultiplexedConnection, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !quota_is_empty(conn).await {
        if Instant::now() > deadline {
            let (usage, leases) = read_quota(conn).await;
            panic!("{what}: usage {usage:?}, leases {leases:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_through_two_gateways_never_exceeds_a_shared_limit() {
    let redis = RedisServer::start();
    let sim = sim().await;
    let gws = [
        gateway(config(&sim, &redis)).await,
        gateway(config(&sim, &redis)).await,
    ];
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // The independent checker: reads Redis in a loop for the whole burst.
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (stop, mut conn) = (stop.clone(), conn.clone());
        tokio::spawn(async move {
            let mut readings = 0u64;
            loop {
                // Read before looking at `stop`: at least one reading, however the tasks run.
                let done = stop.load(Ordering::Acquire);
                let (usage, leases) = read_quota(&mut conn).await;
                check(&usage, &leases);
                readings += 1;
                if done {
                    break readings;
                }
            }
        })
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1_100)
        .build()
        .unwrap();
    let requests: Vec<_> = (0..1_000)
        .map(|i| {
            let (words_n, max_tokens) = match i % 20 {
                0 => (200, 4),    // large
                1..=4 => (80, 4), // medium
                _ => (10, 4),     // small
            };
            let url = format!("{}/v1/chat/completions", gws[i % 2].url());
            let b = body(words_n, max_tokens, &format!("r{i}"));
            let http = http.clone();
            tokio::spawn(async move { post(&http, url, b).await })
        })
        .collect();
    let mut statuses = HashMap::new();
    for r in requests {
        *statuses.entry(r.await.unwrap()).or_insert(0) += 1;
    }
    stop.store(true, Ordering::Release);
    let readings = checker.await.unwrap();
    assert_eq!(statuses.get(&200), Some(&1_000), "statuses: {statuses:?}");
    // Every reading passed `check` (no lane above its limits, counters equal to live leases).
    // How full the lanes got depends on scheduling; that a limit is reached is tested
    // deterministically by `the_large_limit_is_reached_and_the_rest_wait`.
    assert!(readings >= 1, "the checker read Redis");
    let seen = sim.engine.snapshot().max_running_seen;
    assert!(
        seen <= 56,
        "the engine saw {seen} requests at once > 32 + 20 + 4"
    );
    for gw in &gws {
        eventually("each gateway idle", || {
            gw.state.admission().snapshot().is_idle()
        })
        .await;
    }
    quota_drains(&mut conn, "every lease released").await;
    for gw in gws {
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_engine_never_sees_more_large_requests_than_the_shared_limit() {
    let redis = RedisServer::start();
    let sim = sim().await;
    let gws = [
        gateway(config(&sim, &redis)).await,
        gateway(config(&sim, &redis)).await,
    ];
    let http = reqwest::Client::new();
    let requests: Vec<_> = (0..40)
        .map(|i| {
            let url = format!("{}/v1/chat/completions", gws[i % 2].url());
            let (http, b) = (http.clone(), body(200, 64, &format!("l{i}")));
            tokio::spawn(async move { post(&http, url, b).await })
        })
        .collect();
    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
    let seen = sim.engine.snapshot().max_running_seen;
    assert!(
        (1..=4).contains(&seen),
        "two replicas, one large limit of 4: the engine saw {seen} at once"
    );
    for gw in &gws {
        eventually("each gateway idle", || {
            gw.state.admission().snapshot().is_idle()
        })
        .await;
    }
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    quota_drains(&mut conn, "every lease released").await;
    eventually("the engine is empty", || sim.engine.snapshot().running == 0).await;
    for gw in gws {
        gw.shutdown().await;
    }
}

/// Forty large requests through two replicas against an engine that answers the first token
/// after ten minutes: none can finish while the test runs, so the shared limit is reached
/// exactly, whatever the timing: four run in the engine and hold the four leases, the other
/// thirty-six wait in the gateways' queues. When the clients leave, everything goes back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_large_limit_is_reached_and_the_rest_wait() {
    let redis = RedisServer::start();
    let held = [
        "--profile",
        "fixed",
        "--fixed-ttft-ms",
        "600000",
        "--fixed-itl-ms",
        "600000",
    ];
    let sim = vllm_sim::start(&SimArgs::for_test(&held)).await.unwrap();
    let mut cfg = config(&sim, &redis);
    // Nothing but the clients may end a held request.
    cfg.upstream.first_token_timeout = Duration::from_secs(3_600);
    cfg.upstream.idle_timeout = Duration::from_secs(3_600);
    cfg.upstream.total_timeout = Duration::from_secs(3_600);
    let gws = [gateway(cfg.clone()).await, gateway(cfg).await];
    let http = reqwest::Client::new();
    let clients: Vec<_> = (0..40)
        .map(|i| {
            let url = format!("{}/v1/chat/completions", gws[i % 2].url());
            let (http, b) = (http.clone(), body(200, 64, &format!("h{i}")));
            tokio::spawn(async move { post(&http, url, b).await })
        })
        .collect();
    let lane = |gw: &Gateway| *gw.state.admission().snapshot().lane(Lane::Large);
    eventually("4 large requests in the engine, 36 queued", || {
        let queued: u32 = gws.iter().map(|gw| lane(gw).queue_depth).sum();
        sim.engine.snapshot().running == 4 && queued == 36
    })
    .await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (usage, leases) = read_quota(&mut conn).await;
    assert_eq!(check(&usage, &leases), [0, 0, 4], "usage {usage:?}");
    let in_flight: u32 = gws.iter().map(|gw| lane(gw).in_flight).sum();
    assert_eq!(
        in_flight, 4,
        "the replicas hold the four leases between them"
    );
    let engine = sim.engine.snapshot();
    assert_eq!(
        (engine.running, engine.max_running_seen),
        (4, 4),
        "{engine:?}"
    );
    assert!(
        clients.iter().all(|c| !c.is_finished()),
        "no request was answered or turned away"
    );

    // The clients leave: queued ones leave the queues, running ones are aborted in the engine.
    for c in &clients {
        c.abort();
    }
    for gw in &gws {
        eventually("each gateway idle", || {
            gw.state.admission().snapshot().is_idle()
        })
        .await;
    }
    quota_drains(&mut conn, "every lease released").await;
    eventually("the engine is empty", || sim.engine.snapshot().running == 0).await;
    assert_eq!(sim.engine.snapshot().max_running_seen, 4);
    for gw in gws {
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashed_replicas_capacity_comes_back_within_the_lease_ttl() {
    let redis = RedisServer::start();
    let sim = sim().await;
    let cfg = config(&sim, &redis);
    // Replica A takes the whole large lane, then dies without releasing (kill -9).
    let metrics = Metrics::new();
    let Admission::Redis(a) = Admission::build(&cfg, metrics.quota().clone()).unwrap() else {
        panic!("redis backend")
    };
    // Every lease expires at least one TTL after this instant (Redis stamps it on acquire).
    let before_acquire = Instant::now();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(a.acquire(Lane::Large, 300).await.unwrap());
    }
    a.abandon();
    drop(held);
    // Replica B's large request waits for the expired leases, then gets in. Without reaping
    // it would wait out the 60 s queue timeout and fail; the guard below is far shorter.
    let b = gateway(cfg.clone()).await;
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        post(
            &reqwest::Client::new(),
            format!("{}/v1/chat/completions", b.url()),
            body(200, 4, "after-crash"),
        ),
    )
    .await
    .expect("B got in once A's leases expired");
    let waited = before_acquire.elapsed();
    assert_eq!(status, 200);
    // A lower bound is structural: no lease can be reaped before it expires. (50 ms of slack
    // for Redis's millisecond clock against the monotonic one.)
    assert!(
        waited >= cfg.quota.lease_ttl - Duration::from_millis(50),
        "B got in before A's leases expired: {waited:?}"
    );
    assert!(
        b.state.metrics().quota().reaped_total() >= 4,
        "B reaped A's four leases"
    );
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    quota_drains(&mut conn, "B released its lease").await;
    b.shutdown().await;
}

async fn readyz(http: &reqwest::Client, gw: &Gateway) -> (u16, String) {
    let r = http
        .get(format!("{}/readyz", gw.url()))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap();
    (
        status,
        body["status"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_down_fails_open_and_the_gateway_returns_to_redis_when_it_is_back() {
    let mut redis = RedisServer::start();
    let sim = sim().await;
    let gw = gateway(config(&sim, &redis)).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (http, url, stop) = (http.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Acquire) {
                    statuses
                        .push(post(&http, url.clone(), body(10, 4, &format!("w{w}-{i}"))).await);
                    i += 1;
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(readyz(&http, &gw).await, (200, "ready".to_owned()));
    redis.stop();
    let quota = gw.state.metrics().quota().clone();
    eventually("degraded", || quota.degraded()).await;
    assert_eq!(readyz(&http, &gw).await, (200, "degraded".to_owned()));
    assert_eq!(
        post(&http, url.clone(), body(10, 4, "during-outage")).await,
        200,
        "admitted while Redis is down"
    );
    let metrics = tutor_testkit::metrics_text(&gw.url()).await;
    assert!(
        metrics.contains("tutor_gateway_quota_degraded 1"),
        "{metrics}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart();
    eventually("back on Redis", || !quota.degraded()).await;
    assert_eq!(readyz(&http, &gw).await, (200, "ready".to_owned()));
    // Requests go through Redis again.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // The workers keep sending; one of their leases shows up in Redis (30 s: only a guard).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (usage, _) = read_quota(&mut conn).await;
        if usage.get("small:n").copied().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "admissions are counted in Redis again"
        );
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Release);
    let mut statuses = Vec::new();
    for w in workers {
        statuses.extend(w.await.unwrap());
    }
    assert!(!statuses.is_empty(), "the workers sent requests");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every request succeeded under fail_open"
    );
    eventually("gateway idle", || gw.state.admission().snapshot().is_idle()).await;
    quota_drains(&mut conn, "nothing leaked in Redis").await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_with_503() {
    let mut redis = RedisServer::start();
    let sim = sim().await;
    let mut cfg = config(&sim, &redis);
    cfg.quota.on_redis_down = OnRedisDown::FailClosed;
    let gw = gateway(cfg).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    assert_eq!(post(&http, url.clone(), body(10, 4, "before")).await, 200);
    redis.stop();
    let quota = gw.state.metrics().quota().clone();
    eventually("degraded", || quota.degraded()).await;
    assert_eq!(post(&http, url.clone(), body(10, 4, "during")).await, 503);
    assert_eq!(readyz(&http, &gw).await.0, 503);
    redis.restart();
    eventually("back on Redis", || !quota.degraded()).await;
    assert_eq!(post(&http, url, body(10, 4, "after")).await, 200);
    gw.shutdown().await;
}

/// `rediss://` with a private CA (`quota.redis_ca_file`): the quota works over TLS; without the
/// CA the server's certificate is not trusted, and under `fail_closed` requests get 503.
#[tokio::test]
async fn the_shared_quota_speaks_tls_to_redis() {
    let redis = RedisServer::start_tls();
    let sim = sim().await;
    let mut c = config(&sim, &redis);
    c.quota.redis_ca_pem = Some(redis_common::test_ca());
    c.quota.on_redis_down = OnRedisDown::FailClosed;
    let gw = gateway(c.clone()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    assert_eq!(post(&client, url.clone(), body(20, 8, "tls")).await, 200);
    // The lease went through Redis, over TLS: the usage hash exists and is back to zero.
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    quota_drains(&mut conn, "after a request over TLS").await;
    let fields: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg("tg:v2:{quota}:usage")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(fields.contains_key("small:n"), "{fields:?}");
    gw.shutdown().await;
    // The same server, without its CA: not trusted, so no quota, so 503 (fail_closed).
    c.quota.redis_ca_pem = None;
    let untrusted = gateway(c).await;
    let url = format!("{}/v1/chat/completions", untrusted.url());
    assert_eq!(post(&client, url, body(20, 8, "tls-2")).await, 503);
    untrusted.shutdown().await;
    sim.shutdown().await;
}
