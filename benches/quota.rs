//! Shared quota round trip: acquire + release of one lease against a local `redis-server` the
//! bench starts itself, through the gateway's `RedisAdmission` (Lua scripts, `EVALSHA`).
//! Reports p50/p99 of one acquire + release (release awaited through the admission's
//! background task, measured until the lane is free again) and operations per second for one
//! caller and for 32 concurrent callers.
//!
//! `cargo bench -p tutor-gateway --bench quota`

use std::time::{Duration, Instant};

use tutor_gateway::admission::{Admission, Ask, RedisAdmission};
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl};
use tutor_gateway::lane::Lane;
use tutor_gateway::telemetry::Metrics;
use tutor_wire::stats::nearest_rank;

#[path = "../tests/redis_common/mod.rs"]
mod redis_common;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    nearest_rank(sorted, p).expect("samples")
}

async fn round_trip(admission: &RedisAdmission) -> Duration {
    let started = Instant::now();
    let guard = admission
        .acquire(Ask::new(Lane::Small, 100))
        .await
        .expect("admitted");
    drop(guard);
    started.elapsed()
}

fn main() {
    let server = redis_common::RedisServer::start();
    let mut config = Config::default();
    config.quota.backend = QuotaBackend::Redis;
    config.quota.redis_url = RedisUrl::new(server.url());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let metrics = Metrics::new();
        let Admission::Redis(admission) = Admission::build(&config, metrics.quota().clone()).unwrap()
        else {
            unreachable!()
        };
        for _ in 0..500 {
            round_trip(&admission).await;
        }
        // Sequential: acquire (one EVALSHA) then release; wait until the lease is gone so each
        // sample includes the release's own round trip.
        let n = 5_000;
        let mut samples = Vec::with_capacity(n);
        let started = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            let guard = admission.acquire(Ask::new(Lane::Small, 100)).await.expect("admitted");
            drop(guard);
            while quota_in_use(&server.url()).await != 0 {}
            samples.push(t.elapsed());
        }
        let sequential = n as f64 / started.elapsed().as_secs_f64();
        samples.sort();
        println!(
            "quota acquire+release round trip (sequential, {n} ops): p50 {:?}  p99 {:?}  {:.0} ops/s",
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
            sequential
        );
        // Concurrent: 32 callers (the small lane's 32 slots), acquire + drop in a loop.
        let per = 1_000;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let a = admission.clone();
            tasks.push(tokio::spawn(async move {
                let mut s = Vec::with_capacity(per);
                for _ in 0..per {
                    s.push(round_trip(&a).await);
                }
                s
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let elapsed = started.elapsed();
        all.sort();
        println!(
            "quota acquire (+async release), 32 callers, {} ops: p50 {:?}  p99 {:?}  {:.0} ops/s",
            all.len(),
            percentile(&all, 0.5),
            percentile(&all, 0.99),
            all.len() as f64 / elapsed.as_secs_f64()
        );
        admission.shutdown().await;
    });
}

async fn quota_in_use(url: &str) -> i64 {
    thread_local! {
        static CONN: std::cell::RefCell<Option<redis::Connection>> = const { std::cell::RefCell::new(None) };
    }
    CONN.with(|c| {
        let mut c = c.borrow_mut();
        let conn =
            c.get_or_insert_with(|| redis::Client::open(url).unwrap().get_connection().unwrap());
        let n: Option<i64> = redis::cmd("HGET")
            .arg("tg:v2:{quota}:usage")
            .arg("small:n")
            .query(conn)
            .unwrap();
        n.unwrap_or(0)
    })
}
