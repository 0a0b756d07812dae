//! Runs lost with their gateway (`jobs_beat_v2.lua`), against a real `redis-server`: what
//! counts against `jobs.max_attempts`, and a beat after Redis's clock ran ahead.

use super::retry_tests::{running_job, JOB};
use super::store::Scripts;
use super::text_bytes_tests::end;
use crate::admission::redis::tests::redis_common::RedisServer;

/// The beat on job `j1`'s keys (its running set is `call`'s eighth key) with `max_attempts`:
/// the job's status after it.
async fn beat_lost(conn: &mut redis::aio::MultiplexedConnection, max_attempts: u32) -> String {
    let running = "tg:v2:{quota}:unused:8";
    let _: () = redis::cmd("ZADD")
        .arg(running)
        .arg(0)
        .arg("j1")
        .query_async(conn)
        .await
        .unwrap();
    let scripts = Scripts::default();
    let mut beat = scripts.beat.prepare_invoke();
    for i in 1..=12 {
        beat.key(format!("tg:v2:{{quota}}:unused:{i}"));
    }
    beat.arg("tg:v2:{quota}")
        .arg(60_000)
        .arg(max_attempts)
        .arg(3_600_000);
    let _: redis::Value = beat.invoke_async(conn).await.unwrap();
    redis::cmd("HGET")
        .arg(JOB)
        .arg("status")
        .query_async(conn)
        .await
        .unwrap()
}

/// A connection to `redis`, where job `j1` runs its first run under `run-a`.
async fn first_run(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    let mut conn = running_job(redis).await;
    let _: () = redis::cmd("HSET")
        .arg(JOB)
        .arg(&[("attempt", "1"), ("tag", "1"), ("submitted_ms", "1")])
        .query_async(&mut conn)
        .await
        .unwrap();
    conn
}

/// A job pre-empted twice (handed back with its text each time, resumed without a new run
/// number) whose runner is then lost has lost one run: with `jobs.max_attempts = 1` it fails.
/// Each hand-back used to count as a run given back, so every pre-emption bought the job one
/// more lost run than the limit allows.
#[tokio::test]
async fn a_resumed_job_lost_once_counts_one_lost_run() {
    let redis = RedisServer::start();
    let mut conn = first_run(&redis).await;
    for (run, next) in [("run-a", "run-b"), ("run-b", "run-c")] {
        let progress = r#"{"preempted":1,"generated":5}"#;
        assert_eq!(end(&mut conn, (run, "queued", progress), 0).await, "queued");
        // Taken again (as the take script resumes it: the run number stays).
        let _: () = redis::cmd("HSET")
            .arg(JOB)
            .arg(&[("status", "running"), ("runner", next)])
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert_eq!(beat_lost(&mut conn, 1).await, "failed");
}

/// Redis's clock runs ahead (an NTP step, a failover to a server whose clock is ahead): the
/// running job's runner lease has lapsed by that clock, but no replica beat for longer than a
/// lease either, so the beat renews it instead of taking the job from its live runner. A
/// lease that lapses while the replicas beat is swept as before.
#[tokio::test]
async fn a_beat_after_redis_clock_ran_ahead_keeps_the_running_jobs() {
    let redis = RedisServer::start();
    let mut conn = first_run(&redis).await;
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = s * 1_000 + us / 1_000;
    // The last beat of any replica was 100 s ago by the clock (the lease lasts 60 s).
    let _: () = redis::cmd("HSET")
        .arg("tg:v2:{quota}:unused:10")
        .arg("beat")
        .arg(now_ms - 100_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(beat_lost(&mut conn, 3).await, "running");
    // The replicas beat again; a lease that lapses now was lost.
    assert_eq!(beat_lost(&mut conn, 3).await, "queued");
}
