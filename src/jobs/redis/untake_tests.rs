//! A take whose reply is lost, against a real `redis-server`: the take script may have started
//! the job under its lease's id while no run on any replica holds it (Redis slower than the
//! call's timeout, a dropped connection). The job stayed "running" until its runner lease
//! lapsed, then the beat counted a lost run against `jobs.max_attempts` (three such takes
//! failed a job with `runner_lost`) and a handed-back job's text started over. It now goes back
//! to the queue as it was, at once.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::retry_tests::{running_job, JOB, TEXT};
use super::run;
use super::store::RedisStore;
use super::text_bytes_tests::end;
use crate::admission::redis::tests::redis_common::{
    client_line, leases, pause_writes, paused_script, RedisServer,
};
use crate::admission::Ask;
use crate::config::Config;
use crate::jobs::backend::Take;
use crate::jobs::context::Context;
use crate::lane::Lane::Large;
use crate::pipeline::AppState;

const KEY: &str = "tg:v2:{quota}:job:lost";
const QUEUE: &str = "tg:v2:{quota}:jobs:queue";
const RUNNING: &str = "tg:v2:{quota}:jobs:running";

/// A job store on `redis` whose runner leases (and seats) last far longer than the test: only
/// the untake can bring the job back in time. Nothing runs in the background (no beat, no
/// scheduler): the test takes by hand.
pub(super) async fn store(redis: &RedisServer) -> Arc<RedisStore> {
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\nlease_ttl_ms = 120000\n\
         heartbeat_ms = 30000\n",
        redis.url()
    ))
    .unwrap();
    let tasks = TaskTracker::new();
    // The gateway's state as the server builds it (not through `server`: jobs sit below it).
    let state = AppState::for_tests(config, tasks.clone());
    let admission = state.admission().shared().unwrap().clone();
    // Once connected (a take is never sent before the first connection).
    drop(admission.acquire(Ask::new(Large, 100)).await.unwrap());
    let ctx = Arc::new(Context {
        http: None,
        webhook_permits: crate::jobs::webhook::permits(),
        config: state.config().jobs.clone(),
        state,
        stop: CancellationToken::new(),
        tasks,
        wake: Notify::new(),
        resuming: AtomicUsize::new(0),
        keys: None,
        engine_pause: std::sync::Mutex::default(),
    });
    Arc::new(RedisStore::new(ctx, admission))
}

async fn field(conn: &mut redis::aio::MultiplexedConnection, key: &str, name: &str) -> String {
    let v: Option<String> = redis::cmd("HGET")
        .arg(key)
        .arg(name)
        .query_async(conn)
        .await
        .unwrap();
    v.unwrap_or_default()
}

#[tokio::test]
async fn a_take_whose_reply_is_lost_gives_the_job_back_as_it_was() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // A queued job, never run.
    let _: () = redis::cmd("HSET")
        .arg(KEY)
        .arg(&[
            ("status", "queued"),
            ("work", "600"),
            ("prefill", "400"),
            ("tag", "1"),
            ("submitted_ms", "1"),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(QUEUE)
        .arg(1)
        .arg("lost")
        .query_async(&mut conn)
        .await
        .unwrap();

    // The first acquire's lease is given back (no other script is on its way).
    for _ in 0..3_000 {
        if leases(&mut conn).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Redis knows the take script (it ran before: a take given up otherwise would only have
    // been told it was not loaded).
    let _: String = store
        .scripts
        .take
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .unwrap();
    // The heartbeat's first renewal has run (it writes `:beat`): on a busy machine it could
    // otherwise come late and be the script found waiting below, while the take, given up
    // before it was sent, never reached Redis.
    for _ in 0..3_000 {
        let beat: bool = redis::cmd("EXISTS")
            .arg("tg:v2:{quota}:beat")
            .query_async(&mut conn)
            .await
            .unwrap();
        if beat {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Redis takes no write for now: the take reads the queue's head, then its script waits.
    // The take is given up there (the gateway shutting down; a reply slower than the call's
    // timeout is given up the same way), and the script runs once Redis goes on: it starts
    // the job, its reply read by nobody.
    pause_writes(&mut conn).await;
    let taking = tokio::spawn({
        let store = store.clone();
        async move { matches!(run::take(&store).await, Take::Started(_)) }
    });
    let client = paused_script(&mut conn).await;
    taking.abort();
    // Given up here, or (on a machine too busy to get here within the call's 500 ms timeout)
    // by the call itself: either way no reply reached the take.
    let _ = taking.await;
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();

    // The script runs, unless the take was given up past the call's own timeout (a busy
    // machine): its connection was then dropped with the script unrun, nothing to undo.
    let mut ran = None;
    for _ in 0..3_000 {
        if !field(&mut conn, KEY, "started_ms").await.is_empty() {
            ran = Some(true);
            break;
        }
        let gone = client_line(&mut conn, &client).await.is_none();
        if gone && field(&mut conn, KEY, "started_ms").await.is_empty() {
            ran = Some(false);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ran = ran.expect("the take's script neither ran nor was dropped");

    // Back in the queue as it was: no run, its attempt given back, its seat given back.
    let mut back = false;
    for _ in 0..3_000 {
        let status = field(&mut conn, KEY, "status").await;
        let seat = leases(&mut conn).await;
        if status == "queued" && seat == 0 {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        back,
        "the job is still {} under a run nobody holds",
        field(&mut conn, KEY, "status").await
    );
    assert_eq!(field(&mut conn, KEY, "runner").await, "");
    if ran {
        assert_eq!(field(&mut conn, KEY, "attempt").await, "0");
    } else {
        eprintln!("the take was given up too late to start the job: nothing was undone");
        assert_eq!(field(&mut conn, KEY, "attempt").await, "");
    }
    let queued: Option<f64> = redis::cmd("ZSCORE")
        .arg(QUEUE)
        .arg("lost")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, Some(1.0), "at its place in the queue");
    let running: Option<f64> = redis::cmd("ZSCORE")
        .arg(RUNNING)
        .arg("lost")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(running, None);

    // And the next take starts it, as its first run (tried again while the quota is
    // degraded from the pause's failed calls: a busy machine may fail one more).
    let mut started = false;
    for _ in 0..300 {
        if matches!(run::take(&store).await, Take::Started(_)) {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started, "the job is taken again");
    assert_eq!(field(&mut conn, KEY, "attempt").await, "1");
    assert_eq!(field(&mut conn, KEY, "status").await, "running");
}

/// The end script's `untaken` for the run `token`.
async fn untake(conn: &mut redis::aio::MultiplexedConnection, token: &str) -> String {
    end(conn, (token, "untaken", ""), 0).await
}

#[tokio::test]
async fn an_untaken_handed_back_job_keeps_its_text_and_a_cancelled_one_ends() {
    let redis = RedisServer::start();
    // A job handed back with its text, taken again (resumed: the take kept its run number).
    let mut conn = running_job(&redis).await;
    let _: () = redis::cmd("HSET")
        .arg(JOB)
        .arg(&[
            ("progress", r#"{"preempted":1}"#),
            ("attempt", "1"),
            ("handed", "1"),
            ("tag", "7"),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(TEXT)
        .arg(&["Hello", " world"])
        .query_async(&mut conn)
        .await
        .unwrap();

    // Another run's untake changes nothing.
    assert_eq!(untake(&mut conn, "run-b").await, "");
    assert_eq!(field(&mut conn, JOB, "status").await, "running");

    assert_eq!(untake(&mut conn, "run-a").await, "queued");
    assert_eq!(field(&mut conn, JOB, "status").await, "queued");
    assert_eq!(
        field(&mut conn, JOB, "progress").await,
        r#"{"preempted":1}"#
    );
    assert_eq!(field(&mut conn, JOB, "attempt").await, "1");
    let text: Vec<String> = redis::cmd("LRANGE")
        .arg(TEXT)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        text,
        ["Hello", " world"],
        "its text is kept for the next run"
    );
    // Sent again (its reply lost too): the same answer, applied once.
    assert_eq!(untake(&mut conn, "run-a").await, "queued");
    assert_eq!(field(&mut conn, JOB, "attempt").await, "1");

    // Taken again by run-c, its cancel asked meanwhile: nothing will run it, so it ends.
    let _: () = redis::cmd("HSET")
        .arg(JOB)
        .arg(&[("status", "running"), ("runner", "run-c"), ("cancel", "1")])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(untake(&mut conn, "run-c").await, "cancelled");
    assert_eq!(field(&mut conn, JOB, "status").await, "cancelled");
}
