//! The jobs scripts a run retries, against a real `redis-server`: a call whose reply was lost
//! (Redis slower than the call's timeout) and is sent again does what the first did, once. A
//! batch of pieces was appended twice (a job's text then held a stretch of its answer twice),
//! and a run's end sent again answered "not yours" (the job's webhook was never sent).

use super::store::Scripts;
use crate::admission::redis::tests::redis_common::RedisServer;

pub(super) const JOB: &str = "tg:v2:{quota}:job:j1";
pub(super) const TEXT: &str = "tg:v2:{quota}:job:j1:text";

/// A call of `script` on job `j1`: its twelve keys (the job's record and text where the
/// scripts read them) and the keys' base, the first two arguments every jobs script takes.
pub(super) fn call(script: &redis::Script) -> redis::ScriptInvocation<'_> {
    let mut call = script.prepare_invoke();
    for i in 1..=12 {
        call.key(match i {
            11 => JOB.to_owned(),
            12 => TEXT.to_owned(),
            _ => format!("tg:v2:{{quota}}:unused:{i}"),
        });
    }
    call.arg("tg:v2:{quota}").arg("j1");
    call
}

/// A connection to `redis`, where job `j1` runs under the run `run-a`.
pub(super) async fn running_job(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(JOB)
        .arg("runner")
        .arg("run-a")
        .arg("status")
        .arg("running")
        .query_async(&mut conn)
        .await
        .unwrap();
    conn
}

async fn push(
    conn: &mut redis::aio::MultiplexedConnection,
    token: &str,
    seq: u64,
    pieces: &[&str],
) -> i64 {
    let scripts = Scripts::default();
    let mut call = call(&scripts.push);
    call.arg(token).arg(seq);
    for p in pieces {
        call.arg(*p);
    }
    call.invoke_async(conn).await.unwrap()
}

#[tokio::test]
async fn a_batch_sent_again_after_a_lost_reply_is_kept_once() {
    let redis = RedisServer::start();
    let mut conn = running_job(&redis).await;
    assert_eq!(push(&mut conn, "run-a", 1, &[" The", " loop"]).await, 2);
    // The reply to that call was lost; the writer sends the same batch again.
    assert_eq!(push(&mut conn, "run-a", 1, &[" The", " loop"]).await, 2);
    assert_eq!(push(&mut conn, "run-a", 2, &[" ends"]).await, 3);
    let text: Vec<String> = redis::cmd("LRANGE")
        .arg(TEXT)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(text.concat(), " The loop ends");
    // The next run of the job numbers its batches from 1 again: its first is kept.
    let _: () = redis::cmd("HSET")
        .arg(JOB)
        .arg("runner")
        .arg("run-b")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(push(&mut conn, "run-b", 1, &[" here"]).await, 4);
    // A run that no longer owns the job writes nothing.
    assert_eq!(push(&mut conn, "run-a", 3, &[" late"]).await, -1);
}

async fn end(conn: &mut redis::aio::MultiplexedConnection, token: &str, to: &str) -> String {
    let scripts = Scripts::default();
    call(&scripts.end)
        .arg(token)
        .arg(to)
        .arg(r#"{"text":"x"}"#)
        .arg(10)
        .invoke_async(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_end_sent_again_after_a_lost_reply_answers_what_the_first_did() {
    let redis = RedisServer::start();
    let mut conn = running_job(&redis).await;
    assert_eq!(end(&mut conn, "run-a", "done").await, "done");
    // The reply was lost; the run sends its end again: the job is done, by this run.
    assert_eq!(end(&mut conn, "run-a", "done").await, "done");
    // Another run's end is refused: the job ended once.
    assert_eq!(end(&mut conn, "run-b", "failed").await, "");
    let status: String = redis::cmd("HGET")
        .arg(JOB)
        .arg("status")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(status, "done");
}
