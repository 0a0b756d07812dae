//! What the jobs tests share: a gateway and simulator on either backend ([`Backend`]), the
//! `/jobs` round trips, the event-stream reader, a webhook receiver, and the behaviours both
//! backends must show (`cases.rs`), run by `gateway_jobs.rs` (in process) and
//! `gateway_jobs_shared.rs` (Redis) through [`backend_cases!`].
#![allow(dead_code, missing_docs, unused_imports)]

pub mod cases;

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl, WebhookPattern};

use super::common::{client, harness, json, metric, Harness};
use super::redis_common::RedisServer;

/// Every answer runs to its `max_output_tokens` (the simulator's drawn lengths never stop it
/// earlier), so counts are exact.
pub const FAST: &[&str] = &[
    "--speed",
    "50",
    "--profile",
    "tiny-test",
    "--mean-output-tokens",
    "1000000",
];
/// Real time (about 5 ms a token): a long answer is still streaming when the test acts on it.
pub const SLOW: &[&str] = &[
    "--speed",
    "1",
    "--profile",
    "tiny-test",
    "--mean-output-tokens",
    "1000000",
];
pub const SECRET: &str = "a-test-secret-of-32-bytes-length";
/// The shared quota's usage hash.
pub const USAGE: &str = "tg:v2:{quota}:usage";

/// Where the gateway keeps its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// In process (`quota.backend = "local"`).
    Local,
    /// In a `redis-server` the test starts (`quota.backend = "redis"`).
    Redis,
}

/// The quota (and so the jobs) on `redis`: 10 s leases renewed every 100 ms (a loaded machine
/// that delayed a heartbeat past a 1 s lease saw a replica's seats reaped and taken twice; the
/// test of a killed replica's leases runs its own process with 1 s).
pub fn on_redis(c: &mut Config, redis: &RedisServer) {
    c.quota.backend = QuotaBackend::Redis;
    c.quota.redis_url = RedisUrl::new(redis.url());
    c.quota.lease_ttl = Duration::from_secs(10);
    c.quota.heartbeat = Duration::from_millis(100);
}

/// Jobs on the large lane's `seats` only, never borrowing (`jobs.preempt` off): the rules of
/// jobs that wait for an idle large seat. Pre-emptible jobs (the default) are tested in
/// `gateway_preempt.rs`.
pub fn large_seats_only(c: &mut Config, seats: u32) {
    super::common::set_lane(c, tutor_gateway::lane::Lane::Large, seats);
    c.jobs.preempt = false;
}

/// A gateway and simulator ([`Harness`]) on one backend.
pub struct JobsHarness {
    pub h: Harness,
    pub backend: Backend,
    /// The Redis of the Redis backend (stopped after the gateway).
    pub redis: Option<RedisServer>,
}

impl Deref for JobsHarness {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.h
    }
}

/// A simulator with `sim_flags` and a gateway on `backend` in front of it, `tweak`ed.
pub async fn start(
    backend: Backend,
    sim_flags: &[&str],
    tweak: impl FnOnce(&mut Config),
) -> JobsHarness {
    let redis = (backend == Backend::Redis).then(RedisServer::start);
    let h = harness(sim_flags, |c| {
        if let Some(redis) = &redis {
            on_redis(c, redis);
        }
        tweak(c);
    })
    .await;
    if redis.is_some() {
        // The replica's first connection to Redis: on a loaded machine it can come later than
        // the two seconds a request waits for it (which then gets 503, "retry shortly").
        super::common::redis_ready(&h.gw).await;
    }
    JobsHarness { h, backend, redis }
}

impl JobsHarness {
    /// The gateway's base URL.
    pub fn base(&self) -> String {
        self.h.gw.url()
    }

    /// Waits until every seat and token is back: in this gateway, and in the shared quota.
    pub async fn drained(&self) {
        super::common::eventually("every seat and token back", || self.h.idle()).await;
        if let Some(redis) = &self.redis {
            quota_drains(redis).await;
        }
    }

    /// Waits until `series` reads `value` in the gateway's scrape (the Redis backend sets the
    /// job gauge at its beat, and a run's histograms after its end is written), then asserts it.
    pub async fn metric_reaches(&self, series: &str, value: f64) {
        // 30 s: a loaded machine can be slow to run the beat that sets it.
        for _ in 0..3000 {
            let m = self.h.metrics_text().await;
            if tutor_testkit::metric_or_zero(&m, series) == value {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            metric(&self.h.metrics_text().await, series),
            value,
            "{series}"
        );
    }

    pub async fn shutdown(self) {
        self.h.shutdown().await;
        drop(self.redis);
    }
}

pub fn question(words_out: u32) -> Value {
    json!({"prompt": "review this repository's error handling", "max_output_tokens": words_out})
}

/// `POST {base}/jobs`: the status and the answer's JSON.
pub async fn submit(base: &str, body: &Value) -> (StatusCode, Value) {
    let resp = client()
        .post(format!("{base}/jobs"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, json(&resp.text().await.unwrap()))
}

/// Submits `body`, expecting 202; the job's id.
pub async fn submit_ok(base: &str, body: &Value) -> String {
    let (status, v) = submit(base, body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// POSTs `body` to `url` in a task of its own: the whole answer, when awaited.
pub fn spawn_post(url: String, body: Value) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move { super::common::post_text(url, &body).await })
}

/// `GET {base}/jobs/{id}`, expecting 200.
pub async fn job(base: &str, id: &str) -> Value {
    let resp = client()
        .get(format!("{base}/jobs/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    json(&resp.text().await.unwrap())
}

/// Polls the job on `base` until `pred` holds (30 s at most).
pub async fn job_until(base: &str, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..3000 {
        let v = job(base, id).await;
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("job {id} never became {what}: {}", job(base, id).await);
}

/// Whether `GET {base}/jobs/{id}` answers 404 within 30 s (an expired id is forgotten).
pub async fn forgotten(base: &str, id: &str) -> bool {
    let url = format!("{base}/jobs/{id}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if client().get(&url).send().await.unwrap().status() == 404 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

pub async fn done(base: &str, id: &str) -> Value {
    job_until(base, id, "done", |v| v["status"] == "done").await
}

/// `DELETE {base}/jobs/{id}`.
pub async fn cancel(base: &str, id: &str) -> reqwest::Response {
    client()
        .delete(format!("{base}/jobs/{id}"))
        .send()
        .await
        .unwrap()
}

/// An error answer's status and `error.code`.
pub async fn error_code(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let v = json(&resp.text().await.unwrap());
    (
        status,
        v["error"]["code"].as_str().unwrap_or_default().to_owned(),
    )
}

/// `tutor_gateway_webhook_deliveries_total{outcome}` in the scrape `m`.
pub fn deliveries(m: &str, outcome: &str) -> f64 {
    metric(
        m,
        &format!("tutor_gateway_webhook_deliveries_total{{outcome=\"{outcome}\"}}"),
    )
}

/// One event of a job's stream.
#[derive(Debug)]
pub struct Ev {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// A whole SSE body as events (comment lines skipped).
pub fn parse(body: &str) -> Vec<Ev> {
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

/// The complete events of the start of a stream (up to its last blank line).
pub fn parse_complete(partial: &str) -> Vec<Ev> {
    parse(&partial[..partial.rfind("\n\n").unwrap_or(0)])
}

/// The text of the `token` events.
pub fn text(events: &[Ev]) -> String {
    events
        .iter()
        .filter(|e| e.event == "token")
        .map(|e| json(&e.data)["text"].as_str().unwrap().to_owned())
        .collect()
}

/// The text of the `token` events, and their ids (plain numbers: the first run's).
pub fn tokens(events: &[Ev]) -> (String, Vec<u64>) {
    let ids = events
        .iter()
        .filter(|e| e.event == "token")
        .map(|e| {
            e.id.as_deref()
                .expect("token events carry ids")
                .parse()
                .unwrap()
        })
        .collect();
    (text(events), ids)
}

/// `GET {base}/jobs/{id}/events` to its end, with `Last-Event-ID` when given.
pub async fn events(base: &str, id: &str, last_event_id: Option<&str>) -> Vec<Ev> {
    let mut req = client().get(format!("{base}/jobs/{id}/events"));
    if let Some(last) = last_event_id {
        req = req.header("last-event-id", last);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    parse(&resp.text().await.unwrap())
}

/// A webhook receiver on 127.0.0.1 answering with `statuses` in turn (200 after the list), and
/// keeping every request's headers and body.
pub struct Receiver {
    pub url: String,
    pub got: Arc<Mutex<Vec<(HeaderMap, String)>>>,
}

pub async fn receiver(statuses: Vec<u16>) -> Receiver {
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

impl Receiver {
    /// `http://127.0.0.1:<port>`.
    pub fn origin(&self) -> &str {
        self.url.trim_end_matches("/hooks/tutor")
    }

    /// The bodies received so far.
    pub fn bodies(&self) -> Vec<String> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }
}

/// Allows the receiver's origin under `/hooks/` (its port is only known once it listens).
pub fn allow(c: &mut Config, r: &Receiver) {
    c.jobs.webhook_allow = vec![WebhookPattern::parse(&format!("{}/hooks/*", r.origin())).unwrap()];
    c.jobs.webhook_secret = Some(SECRET.into());
    c.jobs.webhook_backoff = Duration::from_millis(20);
}

pub fn verify(headers: &HeaderMap, body: &str) {
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

pub async fn redis_conn(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub use super::redis_common::quota_drains;

/// One `#[tokio::test]` per behaviour of `cases.rs`, on `$backend`.
macro_rules! backend_cases {
    ($backend:expr) => {
        $crate::jobs::backend_cases!(@ $backend;
            a_job_is_submitted_runs_and_its_answer_is_readable,
            a_courses_tool_call_reaches_the_student_and_the_job,
            bad_jobs_get_the_same_errors_as_answer_and_nothing_is_queued,
            events_attached_late_get_all_the_text_and_last_event_id_resumes,
            cancel_while_queued_and_while_running_aborts_and_gives_everything_back,
            jobs_wait_for_interactive_large_requests_and_never_borrow,
            a_finished_job_is_posted_to_its_webhook_signed,
            a_webhook_names_its_jobs_tenant_under_the_signature,
            a_webhook_is_retried_until_the_receiver_takes_it,
            a_webhook_outside_the_allow_list_is_refused,
            a_job_cancelled_while_queued_still_gets_its_webhook,
            results_expire_after_their_ttl_and_are_then_forgotten,
            the_job_store_is_bounded,
            one_tenant_cannot_fill_the_job_store,
            a_tenant_frees_its_room_by_deleting_a_finished_job,
            a_job_no_store_of_its_size_could_keep_is_too_large_not_full,
            a_course_job_counts_its_courses_prefix_against_the_store,
            a_large_answer_that_waits_too_long_becomes_a_job,
            a_review_predicted_to_wait_too_long_becomes_a_job_on_arrival,
            an_unreachable_webhook_is_given_up_after_its_attempts,
            a_webhook_is_not_retried_past_its_jobs_result,
            a_webhook_is_not_retried_after_a_delete_drops_its_result,
            queued_jobs_wait_out_an_engine_outage_and_the_cut_run_goes_on_from_its_text,
            a_job_the_engine_cuts_past_its_retries_fails_with_the_reason,
            jobs_are_refused_clearly_where_they_are_switched_off,
            jobs_max_running_keeps_large_seats_for_interactive_reviews,
            jobs_under_max_running_follow_each_other_with_nothing_else_happening,
            a_jobs_output_is_not_counted_in_its_session,
            a_queued_job_a_reload_made_too_large_fails_and_the_next_one_runs,
        );
    };
    (@ $backend:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                $crate::jobs::cases::$case($backend).await;
            }
        )*
    };
}
pub(crate) use backend_cases;
