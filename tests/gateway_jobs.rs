//! Background jobs end to end (issue 16): submit, run out of idle large-lane capacity, read the
//! result, follow the events (late, and resuming with `Last-Event-ID`), cancel while queued and
//! while running (the engine aborts, every counter returns to zero), signed webhooks with
//! retries, the webhook allow-list, and result expiry (in process; the shared store in Redis:
//! `gateway_jobs_shared.rs`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use common::*;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tutor_gateway::config::{Config, WebhookPattern};
use tutor_gateway::lane::Lane;

/// Every answer runs to its `max_output_tokens` (the simulator's drawn lengths never stop it
/// earlier), so counts are exact.
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

async fn submit(h: &Harness, body: &Value) -> (StatusCode, Value) {
    let resp = client()
        .post(h.url("/jobs"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, json(&resp.text().await.unwrap()))
}

/// Submits `body`, expecting 202; the job's id.
async fn submit_ok(h: &Harness, body: &Value) -> String {
    let (status, v) = submit(h, body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// `tutor_gateway_webhook_deliveries_total{outcome}` in the scrape `m`.
fn deliveries(m: &str, outcome: &str) -> f64 {
    metric(
        m,
        &format!("tutor_gateway_webhook_deliveries_total{{outcome=\"{outcome}\"}}"),
    )
}

/// An error answer's status and `error.code`.
async fn error_code(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let v = json(&resp.text().await.unwrap());
    (
        status,
        v["error"]["code"].as_str().unwrap_or_default().to_owned(),
    )
}

async fn job(h: &Harness, id: &str) -> Value {
    let resp = client()
        .get(h.url(&format!("/jobs/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    json(&resp.text().await.unwrap())
}

/// Polls the job until `pred` holds (10 s at most).
async fn job_until(h: &Harness, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..1000 {
        let v = job(h, id).await;
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("job {id} never became {what}: {}", job(h, id).await);
}

async fn done(h: &Harness, id: &str) -> Value {
    job_until(h, id, "done", |v| v["status"] == "done").await
}

fn question(words_out: u32) -> Value {
    json!({"prompt": "review this repository's error handling", "max_output_tokens": words_out})
}

/// One event of a job's stream.
struct Ev {
    id: Option<String>,
    event: String,
    data: String,
}

/// A whole SSE body as events (comment lines skipped).
fn parse(body: &str) -> Vec<Ev> {
    body.split("\n\n")
        .filter(|block| block.lines().any(|l| !l.starts_with(':')))
        .map(|block| {
            let mut ev = Ev {
                id: None,
                event: "message".into(),
                data: String::new(),
            };
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    ev.id = Some(v.to_owned());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    ev.event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    ev.data = v.to_owned();
                } else {
                    assert!(line.starts_with(':'), "unexpected SSE line {line:?}");
                }
            }
            ev
        })
        .collect()
}

/// The text of the `token` events, and their ids.
fn tokens(events: &[Ev]) -> (String, Vec<u64>) {
    let mut text = String::new();
    let mut ids = Vec::new();
    for e in events.iter().filter(|e| e.event == "token") {
        text.push_str(json(&e.data)["text"].as_str().unwrap());
        ids.push(
            e.id.as_deref()
                .expect("token events carry ids")
                .parse()
                .unwrap(),
        );
    }
    (text, ids)
}

async fn events(h: &Harness, id: &str, last_event_id: Option<&str>) -> Vec<Ev> {
    let mut req = client().get(h.url(&format!("/jobs/{id}/events")));
    if let Some(last) = last_event_id {
        req = req.header("last-event-id", last);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    parse(&resp.text().await.unwrap())
}

#[tokio::test]
async fn a_job_is_submitted_runs_and_its_answer_is_readable() {
    let h = harness(FAST, |_| {}).await;
    let (status, sub) = submit(&h, &question(12)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{sub}");
    let id = sub["id"].as_str().unwrap();
    assert_eq!(sub["status_url"], format!("/jobs/{id}"));
    assert_eq!(sub["events_url"], format!("/jobs/{id}/events"));
    let v = done(&h, id).await;
    assert_eq!(v["lane"], "large", "jobs run in the large lane: {v}");
    let answer = &v["answer"];
    assert_eq!(
        answer["text"].as_str().unwrap().split_whitespace().count(),
        12
    );
    assert_eq!(answer["usage"]["output_tokens"], 12);
    assert_eq!(answer["finish_reason"], "length");
    assert!(
        answer["timings"]["time_to_first_token_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(v["started_at"].as_f64().unwrap() >= v["submitted_at"].as_f64().unwrap());
    eventually("every seat and token back", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_jobs{status=\"done\"}"), 1.0);
    assert_eq!(metric(&m, "tutor_gateway_jobs{status=\"queued\"}"), 0.0);
    assert_eq!(metric(&m, "tutor_gateway_job_wait_seconds_count"), 1.0);
    assert_eq!(metric(&m, "tutor_gateway_job_run_seconds_count"), 1.0);
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_requests_total{lane=\"large\",outcome=\"ok\",route=\"job\"}"
        ),
        1.0
    );
    // An unknown id is a 404 in the gateway's error shape.
    assert_eq!(
        error_code(client().get(h.url("/jobs/nope")).send().await.unwrap()).await,
        (404, "job_not_found".into())
    );
    h.shutdown().await;
}

#[tokio::test]
async fn bad_jobs_get_the_same_errors_as_answer_and_nothing_is_queued() {
    let h = harness(FAST, |_| {}).await;
    for (body, param) in [
        (json!({"max_output_tokens": 5}), Value::Null),
        (json!({"prompt": "x", "notify": 5}), json!("notify")),
        (
            json!({"prompt": "x", "notify": "http://127.0.0.1:9/hook"}),
            json!("notify"),
        ),
        (json!({"prompt": "x", "stream": true}), Value::Null),
    ] {
        let (status, v) = submit(&h, &body).await;
        assert_eq!(status, 400, "{body} -> {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let resp = client()
        .post(h.url("/jobs"))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let m = h.metrics_text().await;
    assert_eq!(family_total(&m, "tutor_gateway_jobs"), 0.0);
    h.shutdown().await;
}

#[tokio::test]
async fn events_attached_late_get_all_the_text_and_last_event_id_resumes() {
    let h = harness(SLOW, |_| {}).await;
    let id = submit_ok(&h, &question(60)).await;
    // Attach while it runs, after some text was produced: the pieces so far come first.
    job_until(&h, &id, "running with text", |v| {
        v["output_pieces"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    let live = events(&h, &id, None).await;
    let v = done(&h, &id).await;
    let text = v["answer"]["text"].as_str().unwrap();
    let (streamed, ids) = tokens(&live);
    assert_eq!(streamed, text, "a late attach sees every piece");
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(live.last().unwrap().event, "done");
    assert_eq!(
        json(&live.last().unwrap().data)["usage"]["output_tokens"],
        60
    );
    // After the end: the whole text again; with Last-Event-ID only what followed that piece.
    let (again, _) = tokens(&events(&h, &id, None).await);
    assert_eq!(again, text);
    let resumed = events(&h, &id, Some("5")).await;
    let (rest, rest_ids) = tokens(&resumed);
    assert_eq!(rest_ids.first(), Some(&6));
    let first_five: String = {
        let (all, _) = tokens(&live);
        all[..all.len() - rest.len()].to_owned()
    };
    assert_eq!(format!("{first_five}{rest}"), text);
    // The last event's id is `end`; a reconnect carrying it is told to stop.
    assert_eq!(live.last().unwrap().id.as_deref(), Some("end"));
    let resp = client()
        .get(h.url(&format!("/jobs/{id}/events")))
        .header("last-event-id", "end")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let resp = client()
        .get(h.url(&format!("/jobs/{id}/events")))
        .header("last-event-id", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    h.shutdown().await;
}

#[tokio::test]
async fn cancel_while_queued_and_while_running_aborts_and_gives_everything_back() {
    let h = harness(SLOW, |c| set_lane(c, Lane::Large, 1)).await;
    let first = submit_ok(&h, &question(2000)).await;
    job_until(&h, &first, "running", |v| v["status"] == "running").await;
    // The large lane's only seat is taken: the second job waits, first in line.
    let second = submit_ok(&h, &question(20)).await;
    let v = job(&h, &second).await;
    assert_eq!(v["status"], "queued");
    assert_eq!(v["position"], 0);
    let url = |id: &str| h.url(&format!("/jobs/{id}"));
    let cancelled = json(
        &client()
            .delete(url(&second))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(cancelled["status"], "cancelled");
    // Running: the stream is dropped, the engine aborts the request.
    job_until(&h, &first, "streaming", |v| {
        v["output_pieces"].as_u64().unwrap_or(0) > 0
    })
    .await;
    let resp = client().delete(url(&first)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(json(&resp.text().await.unwrap())["status"], "cancelled");
    eventually("the engine aborted the running job", || {
        h.sim_aborted() >= 1
    })
    .await;
    eventually("the engine runs nothing", || h.sim_running() == 0).await;
    eventually("every seat and token back", || h.idle()).await;
    // Cancelling again is fine; the queued one never ran.
    assert_eq!(
        client().delete(url(&first)).send().await.unwrap().status(),
        200
    );
    assert!(job(&h, &second).await["started_at"].is_null());
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_jobs{status=\"cancelled\"}"), 2.0);
    assert_eq!(metric(&m, "tutor_gateway_jobs{status=\"running\"}"), 0.0);
    // A job that finished cannot be cancelled.
    let third = submit_ok(&h, &question(3)).await;
    done(&h, &third).await;
    assert_eq!(
        error_code(client().delete(url(&third)).send().await.unwrap()).await,
        (409, "job_finished".into())
    );
    h.shutdown().await;
}

#[tokio::test]
async fn jobs_wait_for_interactive_large_requests_and_never_borrow() {
    let h = harness(SLOW, |c| set_lane(c, Lane::Large, 1)).await;
    // An interactive large request holds the lane's only seat.
    let big = json!({"prompt": words(8000, "repo"), "max_output_tokens": 400});
    let interactive = tokio::spawn({
        let url = h.url("/answer");
        async move {
            client()
                .post(url)
                .json(&big)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    eventually("the interactive request holds the seat", || {
        h.in_flight(Lane::Large) == 1
    })
    .await;
    let id = submit_ok(&h, &question(5)).await;
    // Small and medium seats are idle, but a job never takes them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(job(&h, &id).await["status"], "queued");
    assert_eq!(h.in_flight(Lane::Small) + h.in_flight(Lane::Medium), 0);
    let events = sse(&interactive.await.unwrap());
    assert_eq!(events.last().unwrap().0, "done");
    // The seat came back: the job starts without being asked.
    done(&h, &id).await;
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

/// A webhook receiver on 127.0.0.1 answering with `statuses` in turn (200 after the list), and
/// keeping every request's headers and body.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<(HeaderMap, String)>>>,
}

async fn receiver(statuses: Vec<u16>) -> Receiver {
    let got: Arc<Mutex<Vec<(HeaderMap, String)>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks/tutor", listener.local_addr().unwrap());
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hooks/tutor",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let seen = seen.clone();
            let statuses = statuses.clone();
            async move {
                let mut seen = seen.lock().unwrap();
                let n = seen.len();
                seen.push((headers, body));
                StatusCode::from_u16(statuses.get(n).copied().unwrap_or(200)).unwrap()
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Receiver { url, got }
}

/// Allows the receiver's origin under `/hooks/` (its port is only known once it listens).
fn allow(c: &mut Config, r: &Receiver) {
    let origin = r.url.trim_end_matches("/hooks/tutor");
    c.jobs.webhook_allow = vec![WebhookPattern::parse(&format!("{origin}/hooks/*")).unwrap()];
    c.jobs.webhook_secret = Some(SECRET.into());
    c.jobs.webhook_backoff = Duration::from_millis(20);
}

fn verify(headers: &HeaderMap, body: &str) {
    let sig = headers["x-tutor-signature"].to_str().unwrap();
    let (t, v1) = sig
        .strip_prefix("t=")
        .and_then(|s| s.split_once(",v1="))
        .unwrap_or_else(|| panic!("signature header shape: {sig}"));
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        v1, expected,
        "the signature is HMAC-SHA256 of \"<t>.<body>\""
    );
}

#[tokio::test]
async fn a_finished_job_is_posted_to_its_webhook_signed() {
    let r = receiver(vec![]).await;
    let h = harness(FAST, |c| allow(c, &r)).await;
    let mut body = question(8);
    body["notify"] = json!(r.url);
    let id = submit_ok(&h, &body).await;
    let v = job_until(&h, &id, "delivered", |v| v["webhook"]["delivered"] == true).await;
    assert_eq!(v["webhook"]["attempts"][0]["status"], 200);
    let got = r.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let (headers, posted) = &got[0];
    verify(headers, posted);
    assert_eq!(headers["x-tutor-job-id"], id.as_str());
    let posted = json(posted);
    assert_eq!(posted["id"], id.as_str());
    assert_eq!(posted["status"], "done");
    assert_eq!(posted["answer"]["usage"]["output_tokens"], 8);
    let m = h.metrics_text().await;
    assert_eq!(deliveries(&m, "delivered"), 1.0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_webhook_is_retried_until_the_receiver_takes_it() {
    let r = receiver(vec![500, 503]).await;
    let h = harness(FAST, |c| allow(c, &r)).await;
    let mut body = question(4);
    body["notify"] = json!(r.url);
    let id = submit_ok(&h, &body).await;
    let v = job_until(&h, &id, "delivered", |v| v["webhook"]["delivered"] == true).await;
    let statuses: Vec<_> = v["webhook"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [500, 503, 200]);
    let got = r.got.lock().unwrap().clone();
    assert_eq!(got.len(), 3);
    for (headers, posted) in &got {
        verify(headers, posted);
    }
    let m = h.metrics_text().await;
    assert_eq!(deliveries(&m, "retried"), 2.0);
    assert_eq!(deliveries(&m, "delivered"), 1.0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_webhook_outside_the_allow_list_is_refused() {
    let r = receiver(vec![]).await;
    let h = harness(FAST, |c| allow(c, &r)).await;
    let origin = r.url.trim_end_matches("/hooks/tutor").to_owned();
    for url in [
        "http://169.254.169.254/latest/meta-data".to_owned(),
        format!("{origin}/admin"),
        r.url.replace("http://", "http://user:pw@"),
        r.url.replace("http://", "https://"),
        format!("{origin}/hooks/..%2Fadmin"),
        "not a url".to_owned(),
    ] {
        let mut body = question(4);
        body["notify"] = json!(url);
        let (status, v) = submit(&h, &body).await;
        assert_eq!(status, 400, "{url} -> {v}");
        assert_eq!(v["error"]["param"], "notify");
        assert!(
            !v["error"]["message"].as_str().unwrap().contains(&origin),
            "the URL is not echoed: {v}"
        );
    }
    assert!(r.got.lock().unwrap().is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn results_expire_after_their_ttl_and_are_then_forgotten() {
    let h = harness(FAST, |c| {
        c.jobs.result_ttl = Duration::from_millis(300);
        c.jobs.max_jobs = 1;
    })
    .await;
    let id = submit_ok(&h, &question(3)).await;
    done(&h, &id).await;
    let v = job_until(&h, &id, "expired", |v| v["status"] == "expired").await;
    assert!(v.get("answer").is_none(), "the result is gone: {v}");
    let events = events(&h, &id, None).await;
    assert_eq!(events.len(), 1);
    assert_eq!(json(&events[0].data)["status"], "expired");
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_jobs{status=\"expired\"}"), 1.0);
    // An expired job no longer counts against jobs.max_jobs (1 here).
    let next = submit_ok(&h, &question(3)).await;
    done(&h, &next).await;
    let url = h.url(&format!("/jobs/{id}"));
    for _ in 0..500 {
        if client().get(&url).send().await.unwrap().status() == 404 {
            h.shutdown().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the expired job was never forgotten");
}

#[tokio::test]
async fn the_job_store_is_bounded() {
    let h = harness(SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.max_jobs = 2;
    })
    .await;
    for _ in 0..2 {
        assert_eq!(submit(&h, &question(2000)).await.0, 202);
    }
    let resp = client()
        .post(h.url("/jobs"))
        .json(&question(3))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(
        json(&resp.text().await.unwrap())["error"]["code"],
        "jobs_full"
    );
    h.shutdown().await;
    // Shutting down cancelled the running job and gave everything back.
}

#[tokio::test]
async fn a_large_answer_that_waits_too_long_becomes_a_job() {
    let h = harness(SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.divert_large_after = Some(Duration::from_millis(150));
    })
    .await;
    let big = |salt: &str| json!({"prompt": words(5500, salt), "max_output_tokens": 300});
    // The first large request takes the only seat (it never waits, so it is not diverted).
    let first = tokio::spawn({
        let (url, body) = (h.url("/answer"), big("first"));
        async move {
            client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    eventually("the first holds the seat", || h.in_flight(Lane::Large) == 1).await;
    let resp = client()
        .post(h.url("/answer"))
        .json(&big("second"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let events = parse(&body);
    assert_eq!(
        events.len(),
        1,
        "one `job` event, then the stream ends: {body}"
    );
    assert_eq!(events[0].event, "job");
    let job_event = json(&events[0].data);
    let id = job_event["id"].as_str().unwrap().to_owned();
    assert!(body.starts_with(&format!("id: job:{id}\n")), "{body}");
    assert_eq!(job_event["status_url"], format!("/jobs/{id}"));
    assert_eq!(h.queued(Lane::Large), 0, "it left the interactive queue");
    // A browser EventSource reconnects with Last-Event-ID: it is told to stop (204), and no
    // new generation starts.
    let again = client()
        .get(h.url("/answer"))
        .query(&[("prompt", "again")])
        .header("last-event-id", format!("job:{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 204);
    // The job runs once the interactive request is done, and ends with the whole answer.
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    let v = done(&h, &id).await;
    assert_eq!(v["answer"]["usage"]["output_tokens"], 300);
    eventually("every seat and token back", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_requests_total{lane=\"large\",outcome=\"ok\",route=\"answer\"}"
        ),
        2.0,
        "the diverted request is counted once, when its job ended"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_webhook_is_given_up_after_its_attempts() {
    // Nothing listens there (the port was just free); https, as real receivers are.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let h = harness(FAST, |c| {
        c.jobs.webhook_allow =
            vec![WebhookPattern::parse(&format!("https://127.0.0.1:{port}/*")).unwrap()];
        c.jobs.webhook_secret = Some(SECRET.into());
        c.jobs.webhook_backoff = Duration::from_millis(10);
        c.jobs.webhook_attempts = 2;
    })
    .await;
    let mut body = question(3);
    body["notify"] = json!(format!("https://127.0.0.1:{port}/done"));
    let id = submit_ok(&h, &body).await;
    let v = job_until(&h, &id, "given up", |v| v["webhook"]["delivered"] == false).await;
    let attempts = v["webhook"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert!(attempts
        .iter()
        .all(|a| a["status"].is_null() && a["error"] == "connect"));
    let m = h.metrics_text().await;
    assert_eq!(deliveries(&m, "retried"), 1.0);
    assert_eq!(deliveries(&m, "failed"), 1.0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_job_whose_engine_is_unreachable_fails_with_the_reason_and_gives_everything_back() {
    let h = harness(FAST, |c| {
        // Nothing listens there: the job is accepted (its size needs no engine), then fails.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        c.upstream.base_url = format!("http://127.0.0.1:{port}");
    })
    .await;
    let id = submit_ok(&h, &question(5)).await;
    let v = job_until(&h, &id, "failed", |v| v["status"] == "failed").await;
    assert_eq!(v["error"]["code"], "upstream_unavailable", "{v}");
    let events = events(&h, &id, None).await;
    assert_eq!(events.last().unwrap().event, "error");
    eventually("every seat and token back", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_jobs{status=\"failed\"}"), 1.0);
    h.shutdown().await;
}

#[tokio::test]
async fn jobs_are_refused_clearly_where_they_are_switched_off() {
    let h = harness(FAST, |c| c.jobs.enabled = false).await;
    let resp = client()
        .post(h.url("/jobs"))
        .json(&question(3))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 501);
    assert_eq!(
        json(&resp.text().await.unwrap())["error"]["code"],
        "jobs_unavailable"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn jobs_max_running_keeps_large_seats_for_interactive_reviews() {
    let h = harness(SLOW, |c| {
        set_lane(c, Lane::Large, 3);
        c.jobs.max_running = 1;
    })
    .await;
    let first = submit_ok(&h, &question(2000)).await;
    job_until(&h, &first, "running", |v| v["status"] == "running").await;
    let second = submit_ok(&h, &question(5)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        job(&h, &second).await["status"],
        "queued",
        "one job at a time"
    );
    assert_eq!(h.in_flight(Lane::Large), 1, "two large seats stay free");
    // An interactive review takes one of them at once.
    let resp = client()
        .post(h.url("/answer"))
        .json(&json!({"prompt": words(5500, "review"), "max_output_tokens": 5}))
        .send()
        .await
        .unwrap();
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(json(&events[0].1)["queue_wait_ms"], 0.0);
    assert_eq!(events.last().unwrap().0, "done");
    client()
        .delete(h.url(&format!("/jobs/{first}")))
        .send()
        .await
        .unwrap();
    done(&h, &second).await;
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_large_answer_keeps_its_place_when_no_job_can_be_taken() {
    let h = harness(SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.divert_large_after = Some(Duration::from_millis(100));
        c.jobs.max_jobs = 1;
    })
    .await;
    let big = |salt: &str| json!({"prompt": words(5500, salt), "max_output_tokens": 300});
    let first = tokio::spawn({
        let (url, body) = (h.url("/answer"), big("first"));
        async move {
            client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    eventually("the first holds the seat", || h.in_flight(Lane::Large) == 1).await;
    // The job store is full (one queued job), so the next large answer cannot become a job:
    // it keeps waiting in the queue and is answered there.
    let queued = submit_ok(&h, &question(5)).await;
    let resp = client()
        .post(h.url("/answer"))
        .json(&big("second"))
        .send()
        .await
        .unwrap();
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events[0].0, "meta", "answered, not diverted");
    assert!(json(&events[0].1)["queue_wait_ms"].as_f64().unwrap() > 100.0);
    assert_eq!(events.last().unwrap().0, "done");
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    done(&h, &queued).await;
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}
