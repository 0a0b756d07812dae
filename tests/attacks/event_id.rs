//! Attack 6: `GET /jobs/{id}/events` with `Last-Event-ID: 9223372036854775808`. On the Redis
//! backend the id became a negative list index (`as isize`), so every read returned the whole
//! text again: megabytes for a 700-byte stream. A `Last-Event-ID` is now a bounded number (else
//! 400), on both backends, and resuming with the largest valid id sends a few hundred bytes.
//! Also: `GET /jobs/{id}/events` streams are bounded per tenant
//! (`jobs.max_event_streams_per_tenant`), so one client's long streams cannot fill
//! `server.max_requests_in_flight` for everyone.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl};

use crate::common::*;
use crate::redis_common::RedisServer;

/// Real time (about 5 ms a token): a long answer is still streaming when the test acts on it.
const SLOW: &str = "--speed 1 --profile tiny-test --mean-output-tokens 1000000";

/// The largest piece number a client may resume after.
const MAX_VALID_ID: &str = "1000000";

/// Ids that are not a bounded event id: past the bound, past `isize`/`usize`, negative,
/// signed, spaced, hex, exponent, fractional, garbage, and the same in `<run>.<n>` form.
const BAD_IDS: &[&str] = &[
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "1000001",
    "-1",
    "+5",
    "0x10",
    "1e3",
    "1.5.5",
    "0.5",
    "1.-1",
    "9223372036854775808.1",
    "1.9223372036854775808",
    "1.18446744073709551615",
    "yesterday",
    "５",
];

/// The most bytes a resumed stream with no pieces left to send may take: its status events and
/// the `done` event (a normal whole stream is under 1 KB here).
const RESUMED_BYTES: usize = 16 * 1024;

async fn submit(h: &Harness, tokens: u32) -> String {
    let resp = send(
        client()
            .post(h.url("/jobs"))
            .json(&json!({"prompt": "review this repository's error handling",
                      "max_output_tokens": tokens})),
    )
    .await;
    assert_eq!(resp.status(), 202);
    read_json(resp).await["id"].as_str().unwrap().to_owned()
}

async fn job(h: &Harness, id: &str) -> Value {
    let resp = send(client().get(h.url(&format!("/jobs/{id}")))).await;
    read_json(resp).await
}

/// Polls job `id` until `pred` holds (60 s at most: generous on a loaded machine).
async fn until(h: &Harness, id: &str, what: &str, pred: impl Fn(&Value) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v = job(h, id).await;
        if pred(&v) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {id} never became {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The status of `GET /jobs/{id}/events` with `last_event_id`, and the bytes of its body: read
/// to its end, or stopped once past `cap` (or after 60 s).
async fn resume(h: &Harness, id: &str, last_event_id: &str, cap: usize) -> (u16, usize, String) {
    let resp = send(
        client()
            .get(h.url(&format!("/jobs/{id}/events")))
            .header("last-event-id", last_event_id),
    )
    .await;
    let status = resp.status().as_u16();
    let mut body = resp.bytes_stream();
    let (mut bytes, mut head) = (0usize, Vec::new());
    let read = async {
        while let Some(Ok(chunk)) = body.next().await {
            bytes = bytes.saturating_add(chunk.len());
            if head.len() < 2048 {
                head.extend_from_slice(&chunk[..chunk.len().min(2048)]);
            }
            if bytes > cap {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(60), read).await;
    (status, bytes, String::from_utf8_lossy(&head).into_owned())
}

/// Every bad id gets 400 naming Last-Event-ID, while a job streams; the largest valid id
/// resumes a stream that sends only its status and end events.
async fn bad_ids_are_refused_and_the_largest_valid_one_is_cheap(h: &Harness) {
    // Long enough (about 5 ms a token) to still be streaming while the ids are tried.
    let id = submit(h, 2_000).await;
    until(h, &id, "streaming", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().is_some_and(|n| n >= 5)
    })
    .await;
    for bad in BAD_IDS {
        let (status, bytes, head) = resume(h, &id, bad, 1 << 20).await;
        assert_eq!(
            status, 400,
            "Last-Event-ID {bad:?}: {status}, {bytes} bytes: {head:.300}"
        );
        let v = json(&head);
        assert_eq!(v["error"]["param"], "last-event-id", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Last-Event-ID"),
            "{v}"
        );
    }
    // Still running: the resumed stream waits for pieces that will never come past the bound,
    // and ends with the job; only its status and end events are sent.
    let (status, bytes, head) = resume(h, &id, MAX_VALID_ID, RESUMED_BYTES).await;
    assert_eq!(status, 200, "{head:.300}");
    assert!(
        bytes <= RESUMED_BYTES,
        "a stream resumed after piece {MAX_VALID_ID} sent {bytes} bytes: {head:.300}"
    );
    assert!(
        head.contains("event: done"),
        "it ends with the job: {head:.300}"
    );
    assert!(!head.contains("event: token"), "{head:.300}");
}

#[tokio::test]
async fn a_huge_last_event_id_is_refused_in_process() {
    let h = harness(&flags(SLOW), |_| {}).await;
    bad_ids_are_refused_and_the_largest_valid_one_is_cheap(&h).await;
    eventually("every lane back to idle", || h.idle()).await;
    h.shutdown().await;
}

/// The shipped config with jobs in `redis`.
fn shared(c: &mut Config, redis: &RedisServer) {
    c.quota.backend = QuotaBackend::Redis;
    c.quota.redis_url = RedisUrl::new(redis.url());
    c.quota.lease_ttl = Duration::from_millis(1_000);
    c.quota.heartbeat = Duration::from_millis(100);
}

#[tokio::test]
async fn a_huge_last_event_id_is_refused_with_redis_jobs() {
    let redis = RedisServer::start();
    let h = harness(&flags(SLOW), |c| shared(c, &redis)).await;
    // Its first connection to Redis: a job submitted before it, past 2 s, gets 503.
    redis_ready(&h.gw).await;
    bad_ids_are_refused_and_the_largest_valid_one_is_cheap(&h).await;
    // A resume across runs is bounded the same way.
    let id = submit(&h, 3).await;
    until(&h, &id, "done", |v| v["status"] == "done").await;
    let (status, bytes, head) =
        resume(&h, &id, &format!("1000.{MAX_VALID_ID}"), RESUMED_BYTES).await;
    assert_eq!(status, 200, "{head:.300}");
    assert!(bytes <= RESUMED_BYTES, "{bytes} bytes: {head:.300}");
    assert_eq!(resume(&h, &id, "1001.1", 1 << 20).await.0, 400);
    h.shutdown().await;
}

/// The shipped config's `[jobs]` with `extra` lines (keys this test sets by name).
fn jobs_section(extra: &str) -> tutor_gateway::config::JobsConfig {
    Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n[jobs]\n{extra}"
    ))
    .expect("the [jobs] keys are known")
    .jobs
}

#[tokio::test]
async fn one_tenants_event_streams_cannot_fill_the_gateway() {
    const KEY: &str = "sk-attack-streams-0123456789";
    const OTHER: &str = "sk-attack-streams-abcdefghij";
    let h = harness(&flags(SLOW), |c| {
        c.jobs = jobs_section("max_event_streams_per_tenant = 3\n");
        c.server.max_requests_in_flight = 8;
        with_keys(c, &[(KEY, "cs101"), (OTHER, "school-2")]);
    })
    .await;
    let submit_as =
        |key: &'static str| {
            let url = h.url("/jobs");
            async move {
                let resp =
                    send(client().post(url).bearer_auth(key).json(
                        &json!({"prompt": "review my repository", "max_output_tokens": 4000}),
                    ))
                    .await;
                assert_eq!(resp.status(), 202);
                read_json(resp).await["id"].as_str().unwrap().to_owned()
            }
        };
    let open = |key: &'static str, id: String| {
        let url = h.url(&format!("/jobs/{id}/events"));
        async move { send(client().get(url).bearer_auth(key)).await }
    };
    let mine = submit_as(KEY).await;
    let theirs = submit_as(OTHER).await;
    // The attacker opens as many streams as the gateway has request slots.
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..8 {
        let resp = open(KEY, mine.clone()).await;
        match resp.status().as_u16() {
            200 => held.push(resp),
            status => refused.push((status, resp.text().await.unwrap())),
        }
    }
    assert!(held.len() <= 3, "{} streams held by one tenant", held.len());
    for (status, body) in &refused {
        assert_eq!(*status, 429, "{body}");
        assert_eq!(json(body)["error"]["code"], "too_many_streams", "{body}");
    }
    // An operator sees each refusal.
    assert_eq!(
        h.gw.state.metrics().refused_count("event_streams"),
        refused.len() as u64
    );
    // Another tenant still gets its stream, and its status.
    let other = open(OTHER, theirs.clone()).await;
    assert_eq!(other.status(), 200);
    let status = send(
        client()
            .get(h.url(&format!("/jobs/{theirs}")))
            .bearer_auth(OTHER),
    )
    .await;
    assert_eq!(status.status(), 200);
    // A closed stream gives its slot back.
    drop(held.pop());
    let mut reopened = None;
    for _ in 0..500 {
        let resp = open(KEY, mine.clone()).await;
        if resp.status() == 200 {
            reopened = Some(resp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        reopened.is_some(),
        "the closed stream's slot never came back"
    );
    drop((held, reopened, other));
    for (id, key) in [(&mine, KEY), (&theirs, OTHER)] {
        let _ = client()
            .delete(h.url(&format!("/jobs/{id}")))
            .bearer_auth(key)
            .send()
            .await;
    }
    eventually("every lane back to idle", || h.idle()).await;
    h.shutdown().await;
}
