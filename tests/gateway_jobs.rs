//! Background jobs end to end (issue 16), in process: submit, run out of idle large-lane
//! capacity, read the result, follow the events (late, and resuming with `Last-Event-ID`),
//! cancel while queued and while running (the engine aborts, every counter returns to zero),
//! signed webhooks with retries, the webhook allow-list, and result expiry. Those behaviours
//! are written once in `tests/jobs/cases.rs` and run here on the in-process store, and in
//! `gateway_jobs_shared.rs` on the shared store in Redis; what only the in-process store does
//! is below.

mod common;
mod jobs;
mod redis_common;

use common::*;
use std::time::Duration;

use jobs::{done, question, spawn_post, start, submit_ok, Backend, SLOW};
use serde_json::json;
use tutor_gateway::lane::Lane;

jobs::backend_cases!(Backend::Local);

/// (In process only: the store's room is known at once, while a Redis replica knows it as of
/// its last beat.)
#[tokio::test]
async fn a_large_answer_keeps_its_place_when_no_job_can_be_taken() {
    let h = start(Backend::Local, SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.divert_large_after = Some(Duration::from_millis(100));
        c.jobs.max_jobs = 1;
    })
    .await;
    let big = |salt: &str, out: u32| json!({"prompt": words(5500, salt), "max_output_tokens": out});
    // The first holds the seat some 10 s: the second still waits for it on a loaded machine.
    let first = spawn_post(h.url("/answer"), big("first", 2000));
    eventually("the first holds the seat", || h.in_flight(Lane::Large) == 1).await;
    // The job store is full (one queued job), so the next large answer cannot become a job:
    // it keeps waiting in the queue and is answered there.
    let queued = submit_ok(&h.base(), &question(5)).await;
    let resp = client()
        .post(h.url("/answer"))
        .json(&big("second", 300))
        .send()
        .await
        .unwrap();
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events[0].0, "meta", "answered, not diverted");
    assert!(json(&events[0].1)["queue_wait_ms"].as_f64().unwrap() > 100.0);
    assert_eq!(events.last().unwrap().0, "done");
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    done(&h.base(), &queued).await;
    h.drained().await;
    h.shutdown().await;
}

/// A queued job keeps its request parsed, so the store counts it as `server.max_queued_bytes`
/// counts a waiting request (its bytes plus its parsed form's), not by its text: 1,800
/// one-letter messages are 58 KB of text and some 0.8 MB in memory. Counted by text, this store
/// of two such jobs took all eight offered.
#[tokio::test]
async fn a_queued_job_counts_its_parsed_form_against_the_store() {
    let messages: Vec<serde_json::Value> = (0..1800)
        .map(|_| json!({"role": "user", "content": "x"}))
        .collect();
    let body = json!({"messages": messages, "max_output_tokens": 5});
    let text = serde_json::to_vec(&body).unwrap();
    let config = tutor_gateway::config::Config::default();
    let held = tutor_gateway::pipeline::parse::held_bytes(&text, &config).unwrap();
    assert!(held > 10 * text.len(), "{held} vs {}", text.len());
    let h = start(Backend::Local, SLOW, |c| {
        jobs::large_seats_only(c, 1);
        c.jobs.max_bytes = (2 * held + held / 2) as u64;
    })
    .await;
    // A long job holds the only seat: the others queue behind it.
    let first = submit_ok(&h.base(), &question(3000)).await;
    let mut accepted = 0;
    for _ in 0..8 {
        let (status, v) = jobs::submit(&h.base(), &body).await;
        match status.as_u16() {
            202 => accepted += 1,
            429 => assert_eq!(v["error"]["code"], "jobs_full", "{v}"),
            other => panic!("{other}: {v}"),
        }
    }
    assert!(accepted >= 1, "a job that fits is taken");
    assert!(
        accepted * held <= 2 * held + held / 2,
        "{accepted} jobs of {held} bytes each kept in a store of {}",
        2 * held + held / 2
    );
    jobs::cancel(&h.base(), &first).await;
    h.shutdown().await;
}

/// A proxy named in the environment is not used for webhooks: it would resolve the receiver's
/// host itself, past the gateway's public-address check, and a sidecar's signed result would
/// leave the machine. (reqwest uses `HTTP_PROXY` and the like unless told not to.)
#[tokio::test]
async fn webhooks_never_go_through_a_proxy_from_the_environment() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&["--speed", "50"]))
        .await
        .unwrap();
    let r = jobs::receiver(vec![]).await;
    // A "proxy" that counts the connections it is offered.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let offered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = offered.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = proxy.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(conn);
        }
    });
    let rest = format!(
        "[telemetry]\nrequest_log = \"off\"\n\
         [classify]\ntokenizer = \"heuristic\"\n\
         [upstream]\nbase_url = \"{}\"\n\
         [jobs]\nwebhook_allow = [\"{}/hooks/*\"]\nwebhook_secret = \"{}\"\n\
         webhook_backoff_ms = 20\nwebhook_attempts = 3\n",
        sim.url(),
        r.origin(),
        jobs::SECRET
    );
    let env = [
        ("HTTP_PROXY", proxy_url.as_str()),
        ("HTTPS_PROXY", proxy_url.as_str()),
        ("ALL_PROXY", proxy_url.as_str()),
        ("http_proxy", proxy_url.as_str()),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
    ];
    let gw = common::process::GatewayProcess::start("jobs-proxy", &rest, &env).await;
    let mut body = question(5);
    body["notify"] = json!(r.url);
    let id = submit_ok(&gw.url, &body).await;
    done(&gw.url, &id).await;
    eventually("the receiver has the result", || !r.bodies().is_empty()).await;
    let status = jobs::job(&gw.url, &id).await;
    assert_eq!(status["webhook"]["delivered"], true, "{status}");
    assert_eq!(
        offered.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the proxy was offered the delivery"
    );
}

/// A finished job is counted against `jobs.max_bytes` with where each of its pieces ends (8
/// bytes a piece, kept to serve `Last-Event-ID`), not by its text alone: a piece is a token of
/// a few bytes, so counted by text an answer held about three times what it was counted.
/// The second job here fits beside the first's body and text, not beside its ends too.
#[tokio::test]
async fn a_finished_job_counts_where_its_pieces_end_against_the_store() {
    const STORE: usize = 60_000;
    let h = start(Backend::Local, jobs::FAST, |c| {
        c.jobs.max_bytes = STORE as u64;
    })
    .await;
    let config = tutor_gateway::config::Config::default();
    let held = |body: &serde_json::Value| {
        let text = serde_json::to_vec(body).unwrap();
        tutor_gateway::pipeline::parse::held_bytes(&text, &config).unwrap()
    };
    let first = question(3000);
    let id = submit_ok(&h.base(), &first).await;
    done(&h.base(), &id).await;
    let (text, ids) = jobs::tokens(&jobs::events(&h.base(), &id, None).await);
    let ends = 8 * ids.len();
    // What counting by text alone leaves of the store.
    let room = STORE - held(&first) - text.len();
    assert!(
        room > ends,
        "the test's store is too small: {room} left, {ends} of ends"
    );
    // A body of `room - ends / 2` bytes as held.
    let body = |prompt: &str| json!({"prompt": prompt, "max_output_tokens": 5});
    let prompt: String = words(room, "pad")
        .chars()
        .take(room - ends / 2 - held(&body("")))
        .collect();
    let second = body(&prompt);
    assert!(held(&second) > room - ends && held(&second) <= room);
    let (status, v) = jobs::submit(&h.base(), &second).await;
    assert_eq!(status.as_u16(), 429, "taken past the store's bytes: {v}");
    assert_eq!(v["error"]["code"], "jobs_full", "{v}");
    h.shutdown().await;
}

/// A large answer that reaches its divert deadline while the gateway drains is not made a job:
/// the in-process store had already cancelled its queued jobs and nothing would ever run a new
/// one (the client was told "job queued" and the job died with the process). It keeps its
/// place and ends with the drain.
#[tokio::test]
async fn a_large_answer_is_not_diverted_to_a_job_during_the_drain() {
    let h = start(Backend::Local, SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.divert_large_after = Some(Duration::from_secs(3));
        c.server.shutdown_grace = Duration::from_secs(7);
    })
    .await;
    // The first holds the seat past the drain's end (3,000 tokens at speed 1).
    let big = |salt: &str, out: u32| json!({"prompt": words(5500, salt), "max_output_tokens": out});
    let first = spawn_post(h.url("/answer"), big("first", 3_000));
    eventually("the first holds the seat", || h.in_flight(Lane::Large) == 1).await;
    let second = {
        let (url, body) = (h.url("/answer"), big("second", 300));
        tokio::spawn(async move {
            let resp = client().post(url).json(&body).send().await.unwrap();
            let id = resp.headers().get("x-request-id").cloned();
            (id, resp.text().await.unwrap())
        })
    };
    eventually("the second waits", || {
        h.gw.state
            .admission()
            .snapshot()
            .lane(Lane::Large)
            .queue_depth
            == 1
    })
    .await;
    // The drain begins before the second's deadline (3 s) and lasts past it (7 s).
    let log = h.log.clone();
    h.shutdown().await;
    let (request_id, answered) = second.await.unwrap();
    // Its answer had not begun: 503 `shutdown` ("retry: another replica will answer"), with a
    // request id as every answer.
    assert!(!answered.contains("event: job"), "not diverted: {answered}");
    assert_eq!(json(&answered)["error"]["code"], "shutdown", "{answered}");
    assert!(request_id.is_some(), "{answered}");
    // Both are logged as ended by the shutdown, not as their clients gone.
    let lines: Vec<serde_json::Value> = log.lock().unwrap().clone();
    let ended: Vec<_> = lines
        .iter()
        .filter(|l| l["route"] == "answer")
        .map(|l| (l["outcome"].clone(), l["error_code"].clone()))
        .collect();
    assert_eq!(
        ended,
        vec![(json!("cancelled"), json!("shutdown")); 2],
        "{lines:?}"
    );
    drop(first);
}

/// Under `admission.policy = "fifo"` without a `max_concurrency` every try for a seat
/// succeeds, so with `jobs.max_running = 0` every queued job (up to `jobs.max_jobs`) ran at once,
/// ahead of the questions in the engine's queue. The large lane's `max_concurrency` bounds them
/// there, as `jobs.max_running`'s doc says of its 0.
#[tokio::test]
async fn jobs_under_an_unbounded_fifo_run_no_more_at_once_than_the_large_lanes_seats() {
    let h = start(Backend::Local, SLOW, |c| {
        c.admission.policy = tutor_gateway::config::Policy::Fifo;
        c.admission.fifo.max_concurrency = None;
        set_lane(c, Lane::Large, 2);
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(submit_ok(&h.base(), &question(40)).await);
    }
    for id in &ids {
        assert_eq!(done(&h.base(), id).await["status"], "done");
    }
    let most = h.sim.engine.snapshot().max_running_seen;
    assert!((1..=2).contains(&most), "{most} jobs ran at once");
    h.drained().await;
    h.shutdown().await;
}

/// A job that is not pre-emptible (`jobs.preempt = false`) stays so across the runs the engine
/// cut: resumed after two cuts, it keeps the large lane's one seat against an interactive
/// review, which waits for it. (A resumed run used to get a pre-emptible seat from its second
/// cut on, and the review took it.) (In process: with Redis a cut job goes back to the queue.)
#[tokio::test]
async fn a_job_that_may_not_be_preempted_stays_so_after_the_engine_cut_it() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(SLOW))
        .await
        .unwrap();
    let engine = tutor_testkit::Outage::new(sim.addr.port()).await;
    let h = start(Backend::Local, SLOW, |c| {
        c.upstream.base_url = format!("http://127.0.0.1:{}", engine.port());
        c.jobs.preempt = false;
        set_lane(c, Lane::Large, 1);
    })
    .await;
    let base = h.base();
    let id = submit_ok(&base, &question(3000)).await;
    // Each cut lands on a running stream: the job has streamed two pieces past what it had
    // when the engine last cut it. (Counted from the pieces read before a cut, a loaded
    // machine's job could stream past that count before the cut landed; the second cut then
    // came while the job waited for the engine, cut nothing, and was never counted.)
    let mut seen = 0;
    for cut in 1..=2 {
        jobs::job_until(&base, &id, "streaming", |v| {
            v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= seen + 2
        })
        .await;
        engine.cut();
        h.metric_reaches("tutor_gateway_job_engine_cuts_total", f64::from(cut))
            .await;
        seen = jobs::job(&base, &id).await["output_pieces"]
            .as_u64()
            .unwrap();
        engine.restore();
    }
    jobs::job_until(&base, &id, "streaming again", |v| {
        v["output_pieces"].as_u64().unwrap_or(0) >= seen + 2
    })
    .await;
    // An interactive review for the large lane's one seat: it waits for the job.
    let review = spawn_post(
        h.url("/answer"),
        json!({"prompt": words(5500, "review"), "max_output_tokens": 5}),
    );
    let v = done(&base, &id).await;
    assert_eq!(v["preempted"].as_u64().unwrap_or(0), 0, "{v}");
    assert_eq!(v["answer"]["usage"]["output_tokens"], 3000, "{v}");
    let events = sse(&review.await.unwrap());
    assert_eq!(events.last().unwrap().0, "done", "{events:?}");
    h.drained().await;
    h.shutdown().await;
    sim.shutdown().await;
}
