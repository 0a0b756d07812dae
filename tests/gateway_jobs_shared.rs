//! Background jobs in the shared store (issue 16, `quota.backend = "redis"`), end to end with a
//! real `redis-server` started by the test and the simulator: two replicas answer for each
//! other's jobs (status, events, cancel), a gateway process killed with SIGKILL mid-job loses
//! the job to the other replica, which runs it again and completes it once, results expire,
//! a job never passes an interactive large request waiting on another replica, and a large
//! `/answer` that waits too long becomes a shared job.

mod common;
mod redis_common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use common::{client, eventually, json, sse, words};
use redis_common::RedisServer;
use serde_json::{json, Value};
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl, RequestLogSink, WebhookPattern};
use tutor_gateway::lane::Lane;
use tutor_gateway::server::Gateway;
use vllm_sim::{SimArgs, SimServer};

/// Every answer runs to its `max_output_tokens`, so counts are exact.
const FAST: &[&str] = &[
    "--speed",
    "50",
    "--profile",
    "tiny-test",
    "--mean-output-tokens",
    "1000000",
];
/// Real time (about 5 ms a token): a long answer is still streaming when the test acts on it.
const SLOW: &[&str] = &[
    "--speed",
    "1",
    "--profile",
    "tiny-test",
    "--mean-output-tokens",
    "1000000",
];
const SECRET: &str = "a-test-secret-of-32-bytes-length";
const USAGE: &str = "tg:v2:{quota}:usage";

/// Requests the simulator's engine works on now.
fn running(sim: &SimServer) -> usize {
    sim.engine.snapshot().running
}

async fn sim(flags: &[&str]) -> SimServer {
    vllm_sim::start(&SimArgs::for_test(flags)).await.unwrap()
}

/// The shipped config on `redis` in front of `sim`: 1 s leases renewed every 100 ms.
fn config(sim: &SimServer, redis: &RedisServer) -> Config {
    let mut c = Config::default();
    c.upstream.base_url = sim.url();
    c.telemetry.request_log = RequestLogSink::Off;
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

fn review(max_output_tokens: u32) -> Value {
    json!({"prompt": "review this repository's error handling",
           "max_output_tokens": max_output_tokens})
}

async fn submit(base: &str, body: &Value) -> String {
    let resp = client()
        .post(format!("{base}/jobs"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let v = json(&resp.text().await.unwrap());
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

async fn job(base: &str, id: &str) -> Value {
    let resp = client()
        .get(format!("{base}/jobs/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    json(&resp.text().await.unwrap())
}

/// Polls the job on `base` until `pred` holds (30 s at most).
async fn job_until(base: &str, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..3000 {
        let v = job(base, id).await;
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("job {id} never became {what}: {}", job(base, id).await);
}

/// The `(event, data)` pairs and the token text of a job's whole event stream on `base`.
async fn events(base: &str, id: &str) -> (Vec<(String, String)>, String) {
    let resp = client()
        .get(format!("{base}/jobs/{id}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let evs = sse(&resp.text().await.unwrap());
    let text = evs
        .iter()
        .filter(|(e, _)| e == "token")
        .map(|(_, d)| json(d)["text"].as_str().unwrap().to_owned())
        .collect();
    (evs, text)
}

/// `(id, event, data)` of each event in an SSE text (comments skipped).
fn parse_with_ids(body: &str) -> Vec<(Option<String>, String, String)> {
    body.split("\n\n")
        .filter(|block| block.lines().any(|l| !l.starts_with(':') && !l.is_empty()))
        .filter(|block| block.contains("event: "))
        .map(|block| {
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_owned());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = v.to_owned();
                }
            }
            (id, event, data)
        })
        .collect()
}

async fn redis_conn(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Waits until the shared quota holds no seat and no token (every lease given back or reaped).
async fn quota_drains(redis: &RedisServer) {
    let mut conn = redis_conn(redis).await;
    for _ in 0..1000 {
        let usage: HashMap<String, i64> = redis::cmd("HGETALL")
            .arg(USAGE)
            .query_async(&mut conn)
            .await
            .unwrap();
        if usage.values().all(|v| *v == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the shared quota never drained");
}

/// A webhook receiver on 127.0.0.1 (always 200), keeping every body.
async fn receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks/tutor", listener.local_addr().unwrap());
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hooks/tutor",
        axum::routing::post(move |body: String| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(body);
                StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

#[tokio::test]
async fn two_replicas_answer_for_each_others_jobs() {
    let redis = RedisServer::start();
    let sim = sim(FAST).await;
    let a = gateway(config(&sim, &redis)).await;
    let b = gateway(config(&sim, &redis)).await;
    let id = submit(&a.url(), &review(24)).await;
    // Read on the other replica: the same job, to the end.
    let on_b = job_until(&b.url(), &id, "done", |v| v["status"] == "done").await;
    let on_a = job(&a.url(), &id).await;
    assert_eq!(on_a, on_b, "both replicas read one record");
    assert_eq!(on_b["lane"], "large");
    assert_eq!(on_b["runs"], 1);
    let answer = &on_b["answer"];
    assert_eq!(answer["usage"]["output_tokens"], 24, "{on_b}");
    assert_eq!(answer["finish_reason"], "length");
    // The events, attached late on either replica, carry the whole text once.
    for base in [a.url(), b.url()] {
        let (evs, text) = events(&base, &id).await;
        assert_eq!(text, answer["text"].as_str().unwrap());
        assert_eq!(evs.last().unwrap().0, "done");
        assert_eq!(evs.iter().filter(|(e, _)| e == "done").count(), 1);
    }
    // A job id nobody submitted is 404 on both.
    for base in [a.url(), b.url()] {
        let resp = client()
            .get(format!("{base}/jobs/0123456789abcdef0123456789abcdef"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
    }
    quota_drains(&redis).await;
    a.shutdown().await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_job_running_on_one_replica_is_cancelled_from_the_other() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let a = gateway(config(&sim, &redis)).await;
    let b = gateway(config(&sim, &redis)).await;
    let id = submit(&a.url(), &review(2_000)).await;
    job_until(&b.url(), &id, "streaming", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    assert!(running(&sim) >= 1, "the engine works on the job");
    let resp = client()
        .delete(format!("{}/jobs/{id}", b.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v = json(&resp.text().await.unwrap());
    assert_eq!(v["status"], "cancelled", "{v}");
    eventually("the engine stops the cancelled job", || running(&sim) == 0).await;
    quota_drains(&redis).await;
    // Cancelling a job that ended otherwise is a 409; a cancelled one stays cancelled.
    assert_eq!(job(&a.url(), &id).await["status"], "cancelled");
    let again = client()
        .delete(format!("{}/jobs/{id}", a.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    let done = submit(&a.url(), &review(3)).await;
    job_until(&a.url(), &done, "done", |v| v["status"] == "done").await;
    let late = client()
        .delete(format!("{}/jobs/{done}", b.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 409);
    a.shutdown().await;
    b.shutdown().await;
    sim.shutdown().await;
}

/// A gateway process on `redis` in front of `sim`, started from the built binary.
struct Process {
    child: Child,
    url: String,
    _dir: tempdir::Dir,
}

mod tempdir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn process(sim: &SimServer, redis: &RedisServer, hook_origin: &str) -> Process {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("tg-jobs-kill-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:{port}\"\n\
             [telemetry]\nrequest_log = \"off\"\n\
             [classify]\ntokenizer = \"heuristic\"\n\
             [upstream]\nbase_url = \"{}\"\n\
             [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\nlease_ttl_ms = 1000\nheartbeat_ms = 100\n\
             [jobs]\nwebhook_allow = [\"{hook_origin}/hooks/*\"]\nwebhook_secret = \"{SECRET}\"\n",
            sim.url(),
            redis.url()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the gateway binary starts");
    // Killed on drop, also when the test fails.
    let p = Process {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: tempdir::Dir(dir),
    };
    for _ in 0..500 {
        if let Ok(r) = client().get(format!("{}/healthz", p.url)).send().await {
            if r.status().is_success() {
                return p;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the gateway process did not come up on {}", p.url);
}

impl Process {
    /// SIGKILL: no shutdown, no release, no hand-back.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test]
async fn a_job_whose_gateway_is_killed_runs_again_on_the_other_and_completes_once() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let (hook, got) = receiver().await;
    let origin = hook.trim_end_matches("/hooks/tutor").to_owned();
    let mut p = process(&sim, &redis, &origin).await;
    // Only the process runs at first: the job starts there.
    let body = json!({"prompt": "review this repository's error handling",
                      "max_output_tokens": 400, "notify": hook});
    let id = submit(&p.url, &body).await;
    job_until(&p.url, &id, "streaming", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= 5
    })
    .await;
    // A client follows the job on the process and has a few pieces when it dies.
    let mut following = client()
        .get(format!("{}/jobs/{id}/events", p.url))
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while parse_with_ids(&seen)
        .iter()
        .filter(|e| e.1 == "token")
        .count()
        < 3
    {
        let chunk = following
            .chunk()
            .await
            .unwrap()
            .expect("the stream goes on");
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let last_id = parse_with_ids(&seen)
        .iter()
        .rev()
        .find_map(|e| e.0.clone())
        .unwrap();
    assert!(
        !last_id.contains('.'),
        "the first run's ids are plain: {last_id}"
    );
    p.kill();
    // The other replica comes up, finds the runner lease expired, and runs the job again.
    let mut c = config(&sim, &redis);
    c.jobs.webhook_allow = vec![WebhookPattern::parse(&format!("{origin}/hooks/*")).unwrap()];
    c.jobs.webhook_secret = Some(SECRET.into());
    let b = gateway(c).await;
    let v = job_until(&b.url(), &id, "done again", |v| v["status"] == "done").await;
    assert_eq!(v["runs"], 2, "one run was lost with its gateway: {v}");
    let answer = &v["answer"];
    assert_eq!(
        answer["usage"]["output_tokens"], 400,
        "the text is the second run's alone"
    );
    let (evs, text) = events(&b.url(), &id).await;
    assert_eq!(text, answer["text"].as_str().unwrap());
    assert!(!evs.iter().any(|(_, d)| d.contains("restarted")));
    assert_eq!(evs.iter().filter(|(e, _)| e == "done").count(), 1);
    // The client that followed the dead process resumes on B with its last id (of the first
    // run): it is told the job restarted, then gets the second run's text whole, ids 2.n.
    let resumed = client()
        .get(format!("{}/jobs/{id}/events", b.url()))
        .header("last-event-id", &last_id)
        .send()
        .await
        .unwrap();
    let resumed = parse_with_ids(&resumed.text().await.unwrap());
    let restart = resumed
        .iter()
        .position(|e| e.1 == "status" && json(&e.2)["restarted"] == true)
        .expect("a restarted status event");
    assert!(
        !resumed[..restart].iter().any(|e| e.1 == "token"),
        "no piece of the lost run after the restart is announced"
    );
    let mut again = String::new();
    for (eid, event, data) in &resumed[restart..] {
        if event == "token" {
            assert!(eid.as_deref().unwrap().starts_with("2."), "{eid:?}");
            again.push_str(json(data)["text"].as_str().unwrap());
        }
    }
    assert_eq!(again, answer["text"].as_str().unwrap());
    assert_eq!(resumed.last().unwrap().1, "done");
    // Completed once: one webhook, carrying the done status.
    let v = job_until(&b.url(), &id, "delivered", |v| {
        v["webhook"]["delivered"] == true
    })
    .await;
    assert_eq!(v["webhook"]["attempts"].as_array().unwrap().len(), 1);
    let bodies = got.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1, "one delivery");
    assert_eq!(json(&bodies[0])["status"], "done");
    // The killed process's seat was reaped; nothing is left held.
    quota_drains(&redis).await;
    eventually("the engine is idle", || running(&sim) == 0).await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_job_that_keeps_losing_its_gateway_fails_after_max_attempts() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let mut p = process(&sim, &redis, "http://127.0.0.1:9").await;
    let id = submit(&p.url, &review(2_000)).await;
    job_until(&p.url, &id, "running", |v| v["status"] == "running").await;
    p.kill();
    // A replica that allows a single run: the lost run was the last one.
    let mut c = config(&sim, &redis);
    c.jobs.max_attempts = 1;
    let b = gateway(c).await;
    let v = job_until(&b.url(), &id, "failed", |v| v["status"] == "failed").await;
    assert_eq!(v["error"]["code"], "runner_lost", "{v}");
    assert_eq!(v["runs"], 1);
    quota_drains(&redis).await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn shared_results_expire_and_are_then_forgotten() {
    let redis = RedisServer::start();
    let sim = sim(FAST).await;
    let mut c = config(&sim, &redis);
    c.jobs.result_ttl = Duration::from_millis(400);
    let a = gateway(c).await;
    let id = submit(&a.url(), &review(4)).await;
    let done = job_until(&a.url(), &id, "done", |v| v["status"] == "done").await;
    assert!(!done["answer"]["text"].as_str().unwrap().is_empty());
    let expired = job_until(&a.url(), &id, "expired", |v| v["status"] == "expired").await;
    assert!(
        expired.get("answer").is_none(),
        "the result is gone: {expired}"
    );
    let mut forgotten = false;
    for _ in 0..500 {
        let resp = client()
            .get(format!("{}/jobs/{id}", a.url()))
            .send()
            .await
            .unwrap();
        if resp.status() == 404 {
            forgotten = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(forgotten, "the id is forgotten after another TTL");
    // Nothing of it is left in Redis, and the byte count is back to zero.
    let mut conn = redis_conn(&redis).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("tg:v2:{{quota}}:job:{id}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    let bytes: Option<i64> = redis::cmd("HGET")
        .arg("tg:v2:{quota}:jobs:meta")
        .arg("bytes")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(bytes.unwrap_or(0), 0);
    a.shutdown().await;
    sim.shutdown().await;
}

/// The large lane has one seat fleet-wide. Replica A runs an interactive review; replica B's
/// interactive review waits for the seat; a job submitted meanwhile must not take the seat
/// when A's review ends: B's review gets it, and the job runs after.
#[tokio::test]
async fn a_job_never_passes_an_interactive_large_request_waiting_on_another_replica() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let one_seat = |c: &mut Config| {
        c.lanes.large.max_concurrency = 1.try_into().unwrap();
        c.lanes.large.ceiling = 1.try_into().unwrap();
    };
    let mut ca = config(&sim, &redis);
    one_seat(&mut ca);
    let cb = ca.clone();
    let a = gateway(ca).await;
    let b = gateway(cb).await;
    // A long interactive review: large by its output budget.
    let review_body = json!({"prompt": words(8000, "repo"), "max_output_tokens": 300});
    let first = client()
        .post(format!("{}/answer", a.url()))
        .json(&review_body)
        .send()
        .await
        .unwrap();
    let first = tokio::spawn(async move { first.text().await.unwrap() });
    eventually("A's review holds the seat", || running(&sim) == 1).await;
    let (admitted_tx, admitted) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn({
        let url = format!("{}/answer", b.url());
        let body = review_body.clone();
        async move {
            use futures::StreamExt;
            let resp = client().post(url).json(&body).send().await.unwrap();
            let mut stream = resp.bytes_stream();
            let mut text = String::new();
            let mut admitted_tx = Some(admitted_tx);
            while let Some(chunk) = stream.next().await {
                text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
                if text.contains("event: token") {
                    // B's review streams: it was admitted (and keeps reading to its end).
                    if let Some(tx) = admitted_tx.take() {
                        let _ = tx.send(());
                    }
                }
            }
            text
        }
    });
    eventually("B's review waits", || {
        b.state.admission().snapshot().lane(Lane::Large).queue_depth == 1
    })
    .await;
    let id = submit(&a.url(), &review(5)).await;
    assert_eq!(job(&a.url(), &id).await["status"], "queued");
    admitted.await.expect("B's review streams");
    // B's review holds the seat now; the job is still queued behind it.
    assert_eq!(
        job(&b.url(), &id).await["status"],
        "queued",
        "the job did not take the seat B's review waited for"
    );
    assert_eq!(sse(&second.await.unwrap()).last().unwrap().0, "done");
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    job_until(&a.url(), &id, "done", |v| v["status"] == "done").await;
    quota_drains(&redis).await;
    a.shutdown().await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_large_answer_that_waits_too_long_becomes_a_shared_job() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let mut c = config(&sim, &redis);
    c.lanes.large.max_concurrency = 1.try_into().unwrap();
    c.lanes.large.ceiling = 1.try_into().unwrap();
    c.jobs.divert_large_after = Some(Duration::from_millis(200));
    let a = gateway(c.clone()).await;
    let b = gateway(c).await;
    let body = json!({"prompt": words(8000, "repo"), "max_output_tokens": 200});
    let first = client()
        .post(format!("{}/answer", a.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let first = tokio::spawn(async move { first.text().await.unwrap() });
    eventually("the first review holds the seat", || running(&sim) == 1).await;
    // The second waits past the divert deadline and becomes a job, on the other replica.
    let second = client()
        .post(format!("{}/answer", b.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    let evs = sse(&second.text().await.unwrap());
    assert_eq!(evs.len(), 1, "one job event, then the end: {evs:?}");
    assert_eq!(evs[0].0, "job");
    let id = json(&evs[0].1)["id"].as_str().unwrap().to_owned();
    // Readable from the replica it was not diverted on, and it completes.
    let v = job_until(&a.url(), &id, "done", |v| v["status"] == "done").await;
    assert_eq!(v["answer"]["usage"]["output_tokens"], 200);
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    quota_drains(&redis).await;
    a.shutdown().await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_replica_that_shuts_down_hands_its_running_job_to_the_other() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let a = gateway(config(&sim, &redis)).await;
    let id = submit(&a.url(), &review(600)).await;
    job_until(&a.url(), &id, "streaming on A", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    let b = gateway(config(&sim, &redis)).await;
    // A graceful shutdown does not cancel the job: it goes back to the queue, and B runs it.
    a.shutdown().await;
    let v = job_until(&b.url(), &id, "done on B", |v| v["status"] == "done").await;
    assert_eq!(v["runs"], 2, "{v}");
    assert_eq!(v["answer"]["usage"]["output_tokens"], 600);
    quota_drains(&redis).await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn tenants_take_turns_in_the_shared_job_queue() {
    const KEY: &str = "sk-tutor-cs101-0123456789";
    const OTHER: &str = "sk-tutor-school-2-abcdef";
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let mut c = config(&sim, &redis);
    c.lanes.large.max_concurrency = 1.try_into().unwrap();
    c.lanes.large.ceiling = 1.try_into().unwrap();
    c.auth.enabled = true;
    c.auth.keys = [(KEY, "cs101"), (OTHER, "school-2")]
        .into_iter()
        .map(|(key, tenant)| tutor_gateway::config::KeyEntry {
            sha256: tutor_gateway::sign::sha256_hex(key.as_bytes()),
            tenant: tenant.into(),
        })
        .collect();
    let a = gateway(c.clone()).await;
    let b = gateway(c).await;
    let submit_as = |base: String, key: &'static str, out: u32| async move {
        let resp = client()
            .post(format!("{base}/jobs"))
            .bearer_auth(key)
            .json(&json!({"prompt": "review my repository", "max_output_tokens": out}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        json(&resp.text().await.unwrap())["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let status = |base: String, id: String, key: &'static str| async move {
        json(
            &client()
                .get(format!("{base}/jobs/{id}"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
    };
    // cs101's first job takes the fleet's only large seat; four more of its jobs queue, on
    // both replicas.
    let first = submit_as(a.url(), KEY, 2_000).await;
    let mut running = false;
    for _ in 0..1000 {
        if status(a.url(), first.clone(), KEY).await["status"] == "running" {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(running, "cs101's first job starts");
    let mut theirs = Vec::new();
    for i in 0..4 {
        let base = if i % 2 == 0 { a.url() } else { b.url() };
        theirs.push(submit_as(base, KEY, 5).await);
    }
    // school-2's one job, submitted last, is next in line: position 0.
    let other = submit_as(b.url(), OTHER, 5).await;
    let v = status(a.url(), other.clone(), OTHER).await;
    assert_eq!(v["status"], "queued", "{v}");
    assert_eq!(
        v["position"], 0,
        "school-2 is not behind cs101's burst: {v}"
    );
    let last = status(b.url(), theirs[3].clone(), KEY).await;
    assert_eq!(last["position"], 4, "{last}");
    // Another tenant's job is not found for cs101.
    let hidden = client()
        .get(format!("{}/jobs/{other}", a.url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(hidden.status(), 404);
    let cancel = client()
        .delete(format!("{}/jobs/{first}", b.url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    a.shutdown().await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_shared_job_cancelled_while_queued_still_gets_its_webhook() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let (hook, got) = receiver().await;
    let origin = hook.trim_end_matches("/hooks/tutor").to_owned();
    let mut c = config(&sim, &redis);
    c.lanes.large.max_concurrency = 1.try_into().unwrap();
    c.lanes.large.ceiling = 1.try_into().unwrap();
    c.jobs.webhook_allow = vec![WebhookPattern::parse(&format!("{origin}/hooks/*")).unwrap()];
    c.jobs.webhook_secret = Some(SECRET.into());
    let a = gateway(c).await;
    // The first job holds the only large seat; the second waits.
    let first = submit(&a.url(), &review(2_000)).await;
    job_until(&a.url(), &first, "running", |v| v["status"] == "running").await;
    let body = json!({"prompt": "review this repository's error handling",
                      "max_output_tokens": 5, "notify": hook});
    let second = submit(&a.url(), &body).await;
    let resp = client()
        .delete(format!("{}/jobs/{second}", a.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v = job_until(&a.url(), &second, "notified", |v| {
        v["webhook"]["delivered"] == true
    })
    .await;
    assert_eq!(v["status"], "cancelled");
    assert_eq!(json(&got.lock().unwrap()[0])["status"], "cancelled");
    let resp = client()
        .delete(format!("{}/jobs/{first}", a.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    quota_drains(&redis).await;
    a.shutdown().await;
    sim.shutdown().await;
}
