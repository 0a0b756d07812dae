//! What a job's text counts against `jobs.max_bytes` in the shared store, against a real
//! `redis-server`: a pre-empted (or handed-back) run's text counts from the moment the job goes
//! back to the queue with it, each run that continues it adds only its own, and all of it goes
//! when the job's text starts over. The run that ended a job used to be the only one counted:
//! a job pre-empted three times kept up to three runs' text uncounted.

use super::retry_tests::{call, running_job, JOB, TEXT};
use super::store::Scripts;
use crate::admission::redis::tests::redis_common::RedisServer;

/// `KEYS[10]` of [`call`]: the store's counts.
const META: &str = "tg:v2:{quota}:unused:10";

/// Runs the end script for the run `token`: the job goes `to`, with `result`, its run having
/// streamed `text_bytes`.
pub(super) async fn end(
    conn: &mut redis::aio::MultiplexedConnection,
    (token, to, result): (&str, &str, &str),
    text_bytes: u64,
) -> String {
    let scripts = Scripts::default();
    call(&scripts.end)
        .arg(token)
        .arg(to)
        .arg(result)
        .arg(text_bytes)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// The job's own count and the store's.
async fn counted(conn: &mut redis::aio::MultiplexedConnection) -> (i64, i64) {
    let read = |key: &'static str| {
        let mut conn = conn.clone();
        async move {
            let n: Option<i64> = redis::cmd("HGET")
                .arg(key)
                .arg("bytes")
                .query_async(&mut conn)
                .await
                .unwrap();
            n.unwrap_or(0)
        }
    };
    (read(JOB).await, read(META).await)
}

/// The run `token` takes the queued job.
async fn take(conn: &mut redis::aio::MultiplexedConnection, token: &str) {
    let _: () = redis::cmd("HSET")
        .arg(JOB)
        .arg("runner")
        .arg(token)
        .arg("status")
        .arg("running")
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pre_empted_runs_text_counts_until_the_job_starts_over() {
    let redis = RedisServer::start();
    let mut conn = running_job(&redis).await;
    // The job keeps its 100-byte request.
    let _: () = redis::cmd("HSET")
        .arg(JOB)
        .arg("bytes")
        .arg(100)
        .arg("tag")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(META)
        .arg("bytes")
        .arg(100)
        .query_async(&mut conn)
        .await
        .unwrap();

    // Pre-empted after 40 bytes of text, then again after 25 more: the job keeps them all.
    let preempted = (r#"{"preempted":1}"#, r#"{"preempted":2}"#);
    assert_eq!(
        end(&mut conn, ("run-a", "queued", preempted.0), 40).await,
        "queued"
    );
    assert_eq!(counted(&mut conn).await, (140, 140));
    take(&mut conn, "run-b").await;
    end(&mut conn, ("run-b", "queued", preempted.1), 25).await;
    assert_eq!(counted(&mut conn).await, (165, 165));

    // Handed back with no progress to keep (its continuation could not go on): the text starts
    // over, and what it counted goes with it.
    let _: () = redis::cmd("RPUSH")
        .arg(TEXT)
        .arg("sixty-five bytes of text")
        .query_async(&mut conn)
        .await
        .unwrap();
    take(&mut conn, "run-c").await;
    assert_eq!(end(&mut conn, ("run-c", "queued", ""), 0).await, "queued");
    assert_eq!(counted(&mut conn).await, (100, 100));
    let left: u32 = redis::cmd("EXISTS")
        .arg(TEXT)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0);

    // Run again from the start and answered whole: 70 bytes.
    take(&mut conn, "run-d").await;
    assert_eq!(
        end(&mut conn, ("run-d", "done", r#"{"text":"x"}"#), 70).await,
        "done"
    );
    assert_eq!(counted(&mut conn).await, (170, 170));
}
