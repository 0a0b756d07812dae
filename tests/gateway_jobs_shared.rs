//! Background jobs in the shared store (issue 16, `quota.backend = "redis"`), end to end with a
//! real `redis-server` started by the test and the simulator. The behaviours both stores share
//! are written once in `tests/jobs/cases.rs` and run here on Redis (and in `gateway_jobs.rs`
//! in process); below, what only a shared store does: two replicas answer for each other's
//! jobs (status, events, cancel), a gateway process killed with SIGKILL mid-job loses the job
//! to the other replica, which runs it again and completes it once, expired results leave
//! nothing in Redis, a job never passes an interactive large request waiting on another
//! replica, a large `/answer` that waits too long becomes a job any replica reads, and tenants
//! take turns in the fleet's queue.

mod common;
mod jobs;
mod redis_common;

use std::time::Duration;

use common::process::GatewayProcess;
use common::{client, eventually, json, sse, words};
use jobs::{
    done, events, forgotten, job, job_until, on_redis, parse, parse_complete, question,
    quota_drains, receiver, redis_conn, spawn_post, start, submit_ok, text, Backend, FAST, SECRET,
    SLOW,
};
use redis_common::RedisServer;
use serde_json::json;
use tutor_gateway::config::{Config, RequestLogSink, WebhookPattern};
use tutor_gateway::lane::Lane;
use tutor_gateway::server::Gateway;
use vllm_sim::{SimArgs, SimServer};

jobs::backend_cases!(Backend::Redis);

/// Requests the simulator's engine works on now.
fn running(sim: &SimServer) -> usize {
    sim.engine.snapshot().running
}

async fn sim(flags: &[&str]) -> SimServer {
    vllm_sim::start(&SimArgs::for_test(flags)).await.unwrap()
}

/// The shipped config on `redis` in front of `sim`: 10 s leases renewed every 100 ms.
fn config(sim: &SimServer, redis: &RedisServer) -> Config {
    let mut c = Config::default();
    c.upstream.base_url = sim.url();
    c.telemetry.request_log = RequestLogSink::Off;
    on_redis(&mut c, redis);
    c
}

/// A gateway on `config`, once it has its first connection to Redis (a request waits only 2 s
/// for it, which a loaded machine can exceed).
async fn gateway(config: Config) -> Gateway {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = tutor_gateway::server::start(config, listener).unwrap();
    common::redis_ready(&gw).await;
    gw
}

/// Two replicas on one Redis in front of one simulator.
struct Fleet {
    redis: RedisServer,
    sim: SimServer,
    a: Gateway,
    b: Gateway,
}

/// A [`Fleet`] of `config`s `tweak`ed, the simulator with `flags`.
async fn fleet(flags: &[&str], tweak: impl Fn(&mut Config)) -> Fleet {
    let redis = RedisServer::start();
    let sim = sim(flags).await;
    let mut c = config(&sim, &redis);
    tweak(&mut c);
    let a = gateway(c.clone()).await;
    let b = gateway(c).await;
    Fleet { redis, sim, a, b }
}

impl Fleet {
    async fn shutdown(self) {
        self.a.shutdown().await;
        self.b.shutdown().await;
        self.sim.shutdown().await;
    }
}

/// Large lane: one seat, fleet-wide.
fn one_seat(c: &mut Config) {
    c.lanes.large.max_concurrency = 1.try_into().unwrap();
    c.lanes.large.ceiling = 1.try_into().unwrap();
}

#[tokio::test]
async fn two_replicas_answer_for_each_others_jobs() {
    let f = fleet(FAST, |_| {}).await;
    let (a, b) = (&f.a, &f.b);
    let id = submit_ok(&a.url(), &question(24)).await;
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
        let evs = events(&base, &id, None).await;
        assert_eq!(text(&evs), answer["text"].as_str().unwrap());
        assert_eq!(evs.last().unwrap().event, "done");
        assert_eq!(evs.iter().filter(|e| e.event == "done").count(), 1);
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
    quota_drains(&f.redis).await;
    f.shutdown().await;
}

#[tokio::test]
async fn a_job_running_on_one_replica_is_cancelled_from_the_other() {
    let f = fleet(SLOW, |_| {}).await;
    let (a, b, sim) = (&f.a, &f.b, &f.sim);
    let id = submit_ok(&a.url(), &question(2_000)).await;
    job_until(&b.url(), &id, "streaming", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    assert!(running(sim) >= 1, "the engine works on the job");
    let resp = client()
        .delete(format!("{}/jobs/{id}", b.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v = json(&resp.text().await.unwrap());
    assert_eq!(v["status"], "cancelled", "{v}");
    // Aborted, not left to finish (its 2,000 tokens take about 10 s, inside the wait).
    eventually("the engine aborts the cancelled job", || {
        let e = sim.engine.snapshot();
        e.aborted >= 1 && e.running == 0
    })
    .await;
    quota_drains(&f.redis).await;
    // The other replica sees it cancelled; DELETE of a job that ended, from either replica,
    // drops its result and forgets it.
    assert_eq!(job(&a.url(), &id).await["status"], "cancelled");
    let again = client()
        .delete(format!("{}/jobs/{id}", a.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(json(&again.text().await.unwrap())["status"], "expired");
    let finished = submit_ok(&a.url(), &question(3)).await;
    done(&a.url(), &finished).await;
    let late = client()
        .delete(format!("{}/jobs/{finished}", b.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 200);
    let v = json(&late.text().await.unwrap());
    assert_eq!(v["status"], "expired", "{v}");
    assert!(v.get("answer").is_none(), "the result is gone: {v}");
    for id in [&id, &finished] {
        let resp = client()
            .get(format!("{}/jobs/{id}", a.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "the job is forgotten");
    }
    f.shutdown().await;
}

/// A gateway process on `redis` in front of `sim`, started from the built binary (killed on
/// drop, also when the test fails).
async fn process(sim: &SimServer, redis: &RedisServer, hook_origin: &str) -> GatewayProcess {
    let rest = format!(
        "[telemetry]\nrequest_log = \"off\"\n\
         [classify]\ntokenizer = \"heuristic\"\n\
         [upstream]\nbase_url = \"{}\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\nlease_ttl_ms = 1000\nheartbeat_ms = 100\n\
         [jobs]\nwebhook_allow = [\"{hook_origin}/hooks/*\"]\nwebhook_secret = \"{SECRET}\"\n",
        sim.url(),
        redis.url()
    );
    GatewayProcess::start("jobs-kill", &rest, &[]).await
}

#[tokio::test]
async fn a_job_whose_gateway_is_killed_runs_again_on_the_other_and_completes_once() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let r = receiver(vec![]).await;
    let origin = r.origin().to_owned();
    let mut p = process(&sim, &redis, &origin).await;
    // Only the process runs at first: the job starts there.
    let mut body = question(400);
    body["notify"] = json!(r.url);
    let id = submit_ok(&p.url, &body).await;
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
    while parse_complete(&seen)
        .iter()
        .filter(|e| e.event == "token")
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
    let last_id = parse_complete(&seen)
        .iter()
        .rev()
        .find_map(|e| e.id.clone())
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
    let evs = events(&b.url(), &id, None).await;
    assert_eq!(text(&evs), answer["text"].as_str().unwrap());
    assert!(!evs.iter().any(|e| e.data.contains("restarted")));
    assert_eq!(evs.iter().filter(|e| e.event == "done").count(), 1);
    // The client that followed the dead process resumes on B with its last id (of the first
    // run): it is told the job restarted, then gets the second run's text whole, ids 2.n.
    let resumed = client()
        .get(format!("{}/jobs/{id}/events", b.url()))
        .header("last-event-id", &last_id)
        .send()
        .await
        .unwrap();
    let resumed = parse(&resumed.text().await.unwrap());
    let restart = resumed
        .iter()
        .position(|e| e.event == "status" && json(&e.data)["restarted"] == true)
        .expect("a restarted status event");
    assert!(
        !resumed[..restart].iter().any(|e| e.event == "token"),
        "no piece of the lost run after the restart is announced"
    );
    for e in resumed[restart..].iter().filter(|e| e.event == "token") {
        assert!(e.id.as_deref().unwrap().starts_with("2."), "{:?}", e.id);
    }
    assert_eq!(text(&resumed[restart..]), answer["text"].as_str().unwrap());
    assert_eq!(resumed.last().unwrap().event, "done");
    // Completed once: one webhook, carrying the done status.
    let v = job_until(&b.url(), &id, "delivered", |v| {
        v["webhook"]["delivered"] == true
    })
    .await;
    assert_eq!(v["webhook"]["attempts"].as_array().unwrap().len(), 1);
    let bodies = r.bodies();
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
    let id = submit_ok(&p.url, &question(2_000)).await;
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

/// The large lane has one seat fleet-wide. Replica A runs an interactive review; replica B's
/// interactive review waits for the seat; a job submitted meanwhile must not take the seat
/// when A's review ends: B's review gets it, and the job runs after.
#[tokio::test]
async fn a_job_never_passes_an_interactive_large_request_waiting_on_another_replica() {
    let f = fleet(SLOW, one_seat).await;
    let (a, b, sim) = (&f.a, &f.b, &f.sim);
    // A long interactive review: large by its output budget. A's runs some 10 s and B's 5 s, so
    // each still holds the seat while the test looks, on a loaded machine too.
    let review_body = |out: u32| json!({"prompt": words(8000, "repo"), "max_output_tokens": out});
    let first = spawn_post(format!("{}/answer", a.url()), review_body(2000));
    eventually("A's review holds the seat", || running(sim) == 1).await;
    let (admitted_tx, admitted) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn({
        let url = format!("{}/answer", b.url());
        let body = review_body(1000);
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
    let id = submit_ok(&a.url(), &question(5)).await;
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
    done(&a.url(), &id).await;
    quota_drains(&f.redis).await;
    f.shutdown().await;
}

#[tokio::test]
async fn a_large_answer_that_waits_too_long_becomes_a_shared_job() {
    let f = fleet(SLOW, |c| {
        one_seat(c);
        c.jobs.divert_large_after = Some(Duration::from_millis(200));
    })
    .await;
    let (a, b, sim) = (&f.a, &f.b, &f.sim);
    let body = |out: u32| json!({"prompt": words(8000, "repo"), "max_output_tokens": out});
    // The first holds the seat some 10 s: the second waits past the deadline on any machine.
    let first = spawn_post(format!("{}/answer", a.url()), body(2000));
    eventually("the first review holds the seat", || running(sim) == 1).await;
    // The second waits past the divert deadline and becomes a job, on the other replica.
    let second = client()
        .post(format!("{}/answer", b.url()))
        .json(&body(200))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    let evs = sse(&second.text().await.unwrap());
    assert_eq!(evs.len(), 1, "one job event, then the end: {evs:?}");
    assert_eq!(evs[0].0, "job");
    let id = json(&evs[0].1)["id"].as_str().unwrap().to_owned();
    // Readable from the replica it was not diverted on, and it completes.
    let v = done(&a.url(), &id).await;
    assert_eq!(v["answer"]["usage"]["output_tokens"], 200);
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    quota_drains(&f.redis).await;
    f.shutdown().await;
}

#[tokio::test]
async fn a_replica_that_shuts_down_hands_its_running_job_to_the_other() {
    // Pre-emptible jobs (the default) are handed over with their text and continued; others
    // start over. The simulator's text is a function of the request: both end with the same.
    let mut texts = Vec::new();
    for preempt in [true, false] {
        let redis = RedisServer::start();
        let sim = sim(SLOW).await;
        let config = || {
            let mut c = config(&sim, &redis);
            c.jobs.preempt = preempt;
            c
        };
        let a = gateway(config()).await;
        // Some 10 s of answer: still running on A when B is up and A shuts down.
        let id = submit_ok(&a.url(), &question(2000)).await;
        job_until(&a.url(), &id, "streaming on A", |v| {
            v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= 3
        })
        .await;
        let b = gateway(config()).await;
        // A graceful shutdown does not cancel the job: it goes back to the queue, and B runs it.
        a.shutdown().await;
        let v = job_until(&b.url(), &id, "done on B", |v| v["status"] == "done").await;
        // B ended it: its run is counted there.
        let b_runs = tutor_testkit::metric(
            &tutor_testkit::metrics_text(&b.url()).await,
            "tutor_gateway_job_run_seconds_count",
        );
        assert_eq!(b_runs, 1.0, "preempt {preempt}: {v}");
        // Each output token counted once, either way.
        assert_eq!(v["answer"]["usage"]["output_tokens"], 2000, "{v}");
        // Continued: still its first run. Started over: a second one.
        assert_eq!(v["runs"], if preempt { 1 } else { 2 }, "{v}");
        texts.push(v["answer"]["text"].as_str().unwrap().to_owned());
        quota_drains(&redis).await;
        b.shutdown().await;
        sim.shutdown().await;
    }
    assert_eq!(
        texts[0], texts[1],
        "the continued answer is the whole answer"
    );
}

/// `POST {base}/jobs` with `key`: a review of `out` tokens, accepted; its id.
async fn submit_as(base: String, key: &str, out: u32) -> String {
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
}

/// `GET {base}/jobs/{id}` with `key`.
async fn status(base: String, id: String, key: &str) -> serde_json::Value {
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
}

#[tokio::test]
async fn tenants_take_turns_in_the_shared_job_queue() {
    const KEY: &str = "sk-tutor-cs101-0123456789";
    const OTHER: &str = "sk-tutor-school-2-abcdef";
    let f = fleet(SLOW, |c| {
        // Jobs on the large lane's one seat only (not pre-emptible): the others queue.
        one_seat(c);
        c.jobs.preempt = false;
        common::with_keys(c, &[(KEY, "cs101"), (OTHER, "school-2")]);
    })
    .await;
    let (a, b) = (&f.a, &f.b);
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
    let cancel = |base: String, id: String| async move {
        let resp = client()
            .delete(format!("{base}/jobs/{id}"))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    };
    // cs101 cancels its four queued jobs: the turns they never used are its own again, as in
    // process. Its next job goes ahead of school-2's second one (after its first), not behind
    // the cancelled four.
    for id in &theirs {
        cancel(b.url(), id.clone()).await;
    }
    let seconds = [
        submit_as(b.url(), OTHER, 5).await,
        submit_as(a.url(), OTHER, 5).await,
    ];
    let again = submit_as(a.url(), KEY, 5).await;
    let place = |id: String, key| {
        let base = b.url();
        async move { status(base, id, key).await["position"].as_u64().unwrap() }
    };
    let (again, behind) = (
        place(again, KEY).await,
        place(seconds[1].clone(), OTHER).await,
    );
    assert!(
        again < behind,
        "cs101's next job at {again}, school-2's at {behind}"
    );
    cancel(b.url(), first).await;
    f.shutdown().await;
}

/// Schools whose turns are equal (each one job, none served yet) are served oldest first, as in
/// process: the fleet's queue orders equal turns by job id, and ids sort by when they were made
/// (they were random: five schools' jobs came out in any order).
#[tokio::test]
async fn equal_turns_are_served_oldest_first_in_the_shared_job_queue() {
    let keys: Vec<(String, String)> = (0..6)
        .map(|i| {
            (
                format!("sk-tutor-school-{i}-0123456789"),
                format!("school-{i}"),
            )
        })
        .collect();
    let f = fleet(SLOW, |c| {
        one_seat(c);
        c.jobs.preempt = false;
        let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, t)| (k.as_str(), t.as_str())).collect();
        common::with_keys(c, &pairs);
    })
    .await;
    let (a, b) = (&f.a, &f.b);
    // School 0's job takes the fleet's only large seat.
    let holder = submit_as(a.url(), &keys[0].0, 2_000).await;
    let mut running = false;
    for _ in 0..1000 {
        if status(a.url(), holder.clone(), &keys[0].0).await["status"] == "running" {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(running, "school 0's job starts");
    // Schools 1 to 5, one job each, in that order, on either replica.
    let mut queued = Vec::new();
    for (i, (key, _)) in keys.iter().enumerate().skip(1) {
        let base = if i % 2 == 0 { a.url() } else { b.url() };
        queued.push(submit_as(base, key, 5).await);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for (place, (id, (key, tenant))) in queued.iter().zip(&keys[1..]).enumerate() {
        let v = status(b.url(), id.clone(), key).await;
        assert_eq!(v["position"], place, "{tenant}: {v}");
    }
    let cancel = client()
        .delete(format!("{}/jobs/{holder}", a.url()))
        .bearer_auth(&keys[0].0)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    f.shutdown().await;
}

/// (The expiry itself is a shared behaviour, in `cases.rs`.)
#[tokio::test]
async fn an_expired_and_forgotten_job_leaves_nothing_in_redis() {
    let h = start(Backend::Redis, FAST, |c| {
        // Long enough that a loaded machine still sees "done" before it expires (a stall of
        // a few seconds), short enough that it is forgotten within `forgotten`'s 30 s.
        c.jobs.result_ttl = Duration::from_secs(8);
    })
    .await;
    let id = submit_ok(&h.base(), &question(4)).await;
    done(&h.base(), &id).await;
    assert!(
        forgotten(&h.base(), &id).await,
        "the id is forgotten after another TTL"
    );
    // Nothing of it is left in Redis, and the byte count is back to zero.
    let mut conn = redis_conn(h.redis.as_ref().unwrap()).await;
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
    h.shutdown().await;
}

/// Students poll their reviews' status: each poll reads the fields it shows, never the stored
/// request (up to `server.max_body_bytes`) out of the Redis every replica's admission shares.
#[tokio::test]
async fn polling_a_jobs_status_does_not_read_its_stored_request() {
    // The running job goes silent after 10 tokens (its stream stays open): no piece of its
    // text, nor their announcements, is in the bytes measured below.
    let flags: Vec<&str> = SLOW
        .iter()
        .copied()
        .chain(["--stall-after-tokens", "10"])
        .collect();
    let h = start(Backend::Redis, &flags, |c| {
        jobs::large_seats_only(c, 1);
    })
    .await;
    let base = h.base();
    let running = submit_ok(&base, &question(4000)).await;
    job_until(&base, &running, "running", |v| v["status"] == "running").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A 40 KB request, queued behind it.
    let body = json!({"prompt": words(10_000, "review"), "max_output_tokens": 3});
    let queued = submit_ok(&base, &body).await;
    let conn = redis_conn(h.redis.as_ref().unwrap()).await;
    let sent = |mut conn: redis::aio::MultiplexedConnection| async move {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut conn)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let before = sent(conn.clone()).await;
    for _ in 0..5 {
        assert_eq!(job(&base, &queued).await["status"], "queued");
    }
    let polled = sent(conn).await - before;
    // Each poll read the whole record before: 200 KB for five.
    assert!(
        polled < 40_000,
        "five polls took {polled} bytes out of Redis"
    );
    assert_eq!(jobs::cancel(&base, &running).await.status(), 200);
    done(&base, &queued).await;
    h.drained().await;
    h.shutdown().await;
}

/// A queued job whose record was deleted from outside Redis (an operator's purge, an eviction)
/// can never run; at the head of the fleet's queue it held every job behind it back, with
/// nothing logged. It is dropped from the queue, and the next job runs.
#[tokio::test]
async fn a_queued_job_whose_record_is_gone_does_not_hold_the_queue() {
    let h = start(Backend::Redis, SLOW, |c| {
        jobs::large_seats_only(c, 1);
    })
    .await;
    let base = h.base();
    let running = submit_ok(&base, &question(4000)).await;
    job_until(&base, &running, "running", |v| v["status"] == "running").await;
    let gone = submit_ok(&base, &question(3)).await;
    let next = submit_ok(&base, &question(3)).await;
    let mut conn = redis_conn(h.redis.as_ref().unwrap()).await;
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!("tg:v2:{{quota}}:job:{gone}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the record's key");
    assert_eq!(jobs::cancel(&base, &running).await.status(), 200);
    let v = done(&base, &next).await;
    assert_eq!(v["status"], "done", "{v}");
    h.shutdown().await;
}

/// A webhook's URL read back from Redis is checked again against the delivering replica's
/// `jobs.webhook_allow`, as at submission: that replica may allow less than the one that took
/// the job (a rollout), and the URL is only as trusted as Redis's writers. One rewritten in
/// Redis to a path the allow-list does not hold is not posted to; the job itself is done.
#[tokio::test]
async fn a_webhook_url_changed_in_redis_is_checked_again_before_it_is_posted() {
    let redis = RedisServer::start();
    let sim = sim(SLOW).await;
    let r = receiver(vec![]).await;
    let mut c = config(&sim, &redis);
    jobs::allow(&mut c, &r);
    let gw = gateway(c).await;
    let mut body = question(200);
    body["notify"] = json!(r.url);
    let id = submit_ok(&gw.url(), &body).await;
    job_until(&gw.url(), &id, "running", |v| v["status"] == "running").await;
    let elsewhere = format!("{}/elsewhere/hooks/tutor", r.origin());
    let mut conn = redis_conn(&redis).await;
    let _: () = redis::cmd("HSET")
        .arg(format!("tg:v2:{{quota}}:job:{id}"))
        .arg("notify")
        .arg(&elsewhere)
        .query_async(&mut conn)
        .await
        .unwrap();
    let v = done(&gw.url(), &id).await;
    assert_eq!(v["status"], "done", "{v}");
    // Delivered within a few round trips had it been sent: a second is plenty, and a machine
    // slow enough to deliver later only makes this test weaker, never red.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let v = job(&gw.url(), &id).await;
    assert!(
        v["webhook"]["attempts"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "nothing was posted to a URL off the allow-list: {v}"
    );
    assert!(r.bodies().is_empty());
    gw.shutdown().await;
    sim.shutdown().await;
}
