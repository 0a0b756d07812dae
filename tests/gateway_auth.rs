//! API keys and tenants (issue 17, item 1): no key, a bad key, a revoked key (removed from the
//! key file, then reloaded), a good key; EventSource tokens (issued, used, tampered, expired);
//! open routes stay open; the errors in the OpenAI shape.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];
const KEY: &str = "sk-tutor-cs101-0123456789";
const OTHER: &str = "sk-tutor-school-2-abcdef";

struct KeyFile(std::path::PathBuf);

impl KeyFile {
    fn new(lines: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "tutor-gateway-keys-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::write(&path, lines).unwrap();
        KeyFile(path)
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

async fn answer(h: &Harness, key: Option<&str>) -> (u16, String) {
    let mut req = client()
        .post(h.url("/answer"))
        .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 3}));
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let resp = send(req).await;
    (resp.status().as_u16(), resp.text().await.unwrap())
}

fn code(body: &str) -> Value {
    json(body)["error"]["code"].clone()
}

#[tokio::test]
async fn only_a_listed_key_gets_in_and_a_revoked_one_is_refused_after_reload() {
    let file = KeyFile::new(&format!(
        "# cs101\n{} cs101\n{} school-2\n",
        sha256(KEY),
        sha256(OTHER)
    ));
    let path = file.0.clone();
    let h = harness(FAST, |c| {
        c.auth.enabled = true;
        c.auth.keys_file = Some(path);
        c.auth.reload = Duration::from_millis(20);
    })
    .await;
    let (status, body) = answer(&h, None).await;
    assert_eq!(
        (status, code(&body)),
        (401, json!("invalid_api_key")),
        "{body}"
    );
    let (status, body) = answer(&h, Some("sk-not-a-key")).await;
    assert_eq!((status, code(&body)), (401, json!("invalid_api_key")));
    // An `EventSource` (a `GET` reading events, with an expired or wrong `?token=`) reads the
    // refusal as its stream's one `error` event; it is still counted as a denial.
    let resp = send(
        client()
            .get(h.url("/answer?prompt=hi&token=not-a-token"))
            .header("accept", "text/event-stream")
            .header("cache-control", "no-cache"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events.len(), 1, "{events:?}");
    let data = json(&events[0].1);
    assert_eq!(
        (data["code"].clone(), data["status"].clone()),
        (json!("invalid_api_key"), json!(401)),
        "{data}"
    );
    let (status, body) = answer(&h, Some(KEY)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sse(&body).last().unwrap().0, "done");
    // The request is its tenant's: the request log says whose (never the key).
    eventually("the request log line", || !h.log.lock().unwrap().is_empty()).await;
    let line = h.log.lock().unwrap().last().unwrap().clone();
    assert_eq!(line["tenant"], "cs101", "{line}");
    assert!(!line.to_string().contains(KEY));
    // The OpenAI shape on /v1, with a key an SDK sends the same way.
    let v1 = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})),
    )
    .await;
    // RFC 6750: the 401 names the scheme to use.
    assert_eq!(
        v1.headers()["www-authenticate"],
        "Bearer realm=\"tutor-gateway\""
    );
    let err = assert_error(v1, 401, "invalid_api_key").await;
    assert!(err["error"]["message"].as_str().unwrap().contains("Bearer"));
    // Operators see the three denials (none of them is a request of a lane).
    let denied = |text: &str| metric(text, "tutor_gateway_denied_total{reason=\"auth\"}");
    assert_eq!(denied(&h.metrics_text().await), 4.0);
    // Revoke OTHER: rewrite the file without it; the gateway re-reads it by itself.
    assert_eq!(answer(&h, Some(OTHER)).await.0, 200);
    std::thread::sleep(Duration::from_millis(20)); // a new modification time
    std::fs::write(&file.0, format!("{} cs101\n", sha256(KEY))).unwrap();
    // Polled for up to 30 s: a loaded machine can be slow to re-read the file.
    tutor_testkit::eventually("OTHER is revoked", || async {
        answer(&h, Some(OTHER)).await.0 == 401
    })
    .await;
    assert_eq!(answer(&h, Some(OTHER)).await.0, 401, "revoked");
    assert_eq!(answer(&h, Some(KEY)).await.0, 200, "still valid");
    // Open routes need no key.
    for path in ["/healthz", "/health", "/v1/models", "/metrics", "/readyz"] {
        let status = send(client().get(h.url(path))).await.status();
        assert_eq!(status, 200, "{path}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn an_eventsource_token_opens_the_stream_until_it_expires() {
    let h = harness(FAST, |c| {
        with_keys(c, &[(KEY, "cs101")]);
        c.auth.token_ttl = Duration::from_secs(3_600);
    })
    .await;
    let issued = send(client().post(h.url("/auth/token")).bearer_auth(KEY)).await;
    assert_eq!(issued.status(), 200);
    let issued = read_json(issued).await;
    assert_eq!(issued["tenant"], "cs101");
    let token = issued["token"].as_str().unwrap().to_owned();
    let get = |token: String| {
        client()
            .get(h.url("/answer"))
            .query(&[
                ("prompt", "what is a closure?"),
                ("max_output_tokens", "3"),
                ("token", token.as_str()),
            ])
            .send()
    };
    let ok = get(token.clone()).await.unwrap();
    assert_eq!(
        ok.status(),
        200,
        "the token is taken out before /answer reads its query"
    );
    assert_eq!(sse(&ok.text().await.unwrap()).last().unwrap().0, "done");
    // Tampered (another tenant, same signature) and garbage tokens.
    let forged = token.replacen("cs101", "school-2", 1);
    assert_eq!(get(forged).await.unwrap().status(), 401);
    assert_eq!(get("garbage".into()).await.unwrap().status(), 401);
    // A token without a key cannot be asked for.
    let no_key = send(client().post(h.url("/auth/token"))).await;
    assert_eq!(no_key.status(), 401);
    // A token sent as a key is refused, saying where a token goes.
    let as_key = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(&token)
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})),
    )
    .await;
    let err = assert_error(as_key, 401, "invalid_api_key").await;
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("?token="),
        "{err}"
    );
    h.shutdown().await;
    // A token past its expiry (1 ms of life) is refused.
    let h = harness(FAST, |c| {
        with_keys(c, &[(KEY, "cs101")]);
        c.auth.token_ttl = Duration::from_millis(1);
    })
    .await;
    let issued = send(client().post(h.url("/auth/token")).bearer_auth(KEY)).await;
    let token = read_json(issued).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let late = send(
        client()
            .get(h.url("/answer"))
            .query(&[("prompt", "hi"), ("token", token.as_str())]),
    )
    .await;
    assert_eq!(late.status(), 401);
    assert!(read_json(late).await["error"]["message"]
        .as_str()
        .unwrap()
        .contains("expired"));
    h.shutdown().await;
}

#[tokio::test]
async fn with_auth_off_nothing_changes() {
    let h = harness(FAST, |_| {}).await;
    assert_eq!(answer(&h, None).await.0, 200);
    let token = send(client().post(h.url("/auth/token"))).await;
    assert_eq!(token.status(), 400);
    h.shutdown().await;
}

#[tokio::test]
async fn a_job_is_visible_only_to_its_tenant() {
    let h = harness(FAST, |c| {
        with_keys(c, &[(KEY, "cs101"), (OTHER, "school-2")]);
    })
    .await;
    let submitted = send(
        client()
            .post(h.url("/jobs"))
            .bearer_auth(KEY)
            .json(&json!({"prompt": "review my repository", "max_output_tokens": 3})),
    )
    .await;
    assert_eq!(submitted.status(), 202);
    let id = read_json(submitted).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = h.url(&format!("/jobs/{id}"));
    let mine = send(client().get(&url).bearer_auth(KEY)).await;
    assert_eq!(mine.status(), 200);
    // Another tenant: as if the job did not exist, for reading, following and cancelling.
    for req in [
        client().get(&url),
        client().get(format!("{url}/events")),
        client().delete(&url),
    ] {
        let resp = send(req.bearer_auth(OTHER)).await;
        assert_eq!(resp.status(), 404);
        assert_eq!(code(&resp.text().await.unwrap()), json!("job_not_found"));
    }
    assert_eq!(send(client().get(&url)).await.status(), 401);
    h.shutdown().await;
}

#[tokio::test]
async fn tenants_take_turns_in_the_job_queue() {
    let slow = flags("--speed 1 --profile tiny-test --mean-output-tokens 1000000");
    let h = harness(&slow, |c| {
        // Jobs on the large lane's one seat only (not pre-emptible): the others queue.
        set_lane(c, tutor_gateway::lane::Lane::Large, 1);
        c.jobs.preempt = false;
        with_keys(c, &[(KEY, "cs101"), (OTHER, "school-2")]);
    })
    .await;
    let submit = |key: &'static str, out: u32| {
        client()
            .post(h.url("/jobs"))
            .bearer_auth(key)
            .json(&json!({"prompt": "review my repository", "max_output_tokens": out}))
            .send()
    };
    let mut ids = Vec::new();
    for out in [2000, 5, 5, 5, 5] {
        let resp = submit(KEY, out).await.unwrap();
        assert_eq!(resp.status(), 202);
        ids.push(read_json(resp).await["id"].as_str().unwrap().to_owned());
        if ids.len() == 1 {
            // The first takes the large lane's only seat before the others arrive.
            eventually("the first job runs", || {
                h.in_flight(tutor_gateway::lane::Lane::Large) == 1
            })
            .await;
        }
    }
    let resp = submit(OTHER, 5).await.unwrap();
    let theirs = read_json(resp).await["id"].as_str().unwrap().to_owned();
    let status = |id: &str, key: &'static str| {
        let url = h.url(&format!("/jobs/{id}"));
        async move { json(&send_text(client().get(url).bearer_auth(key)).await) }
    };
    // cs101's first job holds the large lane's only seat; its four others wait. school-2's
    // one job goes ahead of them: tenants take turns, each oldest first.
    let first = status(&ids[0], KEY).await;
    assert_eq!(first["status"], "running", "{first}");
    let v = status(&theirs, OTHER).await;
    assert_eq!(v["position"], 0, "{v}");
    let last = status(&ids[4], KEY).await;
    assert_eq!(last["position"], 4, "{last}");
    send(
        client()
            .delete(h.url(&format!("/jobs/{}", ids[0])))
            .bearer_auth(KEY),
    )
    .await;
    h.shutdown().await;
}

/// A second key of OTHER's tenant.
const SECOND: &str = "sk-tutor-school-2-second-key";

/// Both of school-2's keys, OTHER and SECOND.
fn both_keys() -> String {
    format!("{} school-2\n{} school-2\n", sha256(OTHER), sha256(SECOND))
}

/// A slow engine and a gateway reading the key file `file` every 20 ms, running one job at a
/// time (the large lane's one seat, no other lane's: the others wait).
async fn one_job_at_a_time(file: &KeyFile) -> Harness {
    let path = file.0.clone();
    let slow = flags("--speed 1 --profile tiny-test --mean-output-tokens 1000000");
    harness(&slow, |c| {
        c.auth.enabled = true;
        c.auth.keys_file = Some(path);
        c.auth.reload = Duration::from_millis(20);
        set_lane(c, tutor_gateway::lane::Lane::Large, 1);
        c.jobs.preempt = false;
    })
    .await
}

/// Submits a job of `tokens` output tokens with `key`; its id.
async fn submit_job(h: &Harness, key: &str, tokens: u32) -> String {
    let req = client()
        .post(h.url("/jobs"))
        .bearer_auth(key)
        .json(&json!({"prompt": "review my repository", "max_output_tokens": tokens}));
    let resp = send(req).await;
    assert_eq!(resp.status(), 202);
    read_json(resp).await["id"].as_str().unwrap().to_owned()
}

/// Job `id` as SECOND reads it (a revoked key reads nothing any more).
async fn job_status(h: &Harness, id: &str) -> Value {
    let req = client()
        .get(h.url(&format!("/jobs/{id}")))
        .bearer_auth(SECOND);
    read_json(send(req).await).await
}

/// A job lives longer than the request that submitted it: when its key is revoked, the
/// running one stops (its engine work aborted, its seat back) and a queued one never starts,
/// both failed with `invalid_api_key`; a job of another key of the same tenant goes on.
#[tokio::test]
async fn a_revoked_keys_jobs_stop_and_never_start() {
    let file = KeyFile::new(&both_keys());
    let h = one_job_at_a_time(&file).await;
    let submit = |key: &'static str, tokens: u32| submit_job(&h, key, tokens);
    let status = |id: String| {
        let h = &h;
        async move { job_status(h, &id).await }
    };
    let running = submit(OTHER, 4_000).await;
    tutor_testkit::eventually("the first job runs", || async {
        status(running.clone()).await["status"] == "running"
    })
    .await;
    let queued = submit(OTHER, 5).await;
    let kept = submit(SECOND, 5).await;
    assert_eq!(status(queued.clone()).await["status"], "queued");
    // Revoke OTHER: the file without its line.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&file.0, format!("{} school-2\n", sha256(SECOND))).unwrap();
    for id in [&running, &queued] {
        tutor_testkit::eventually("the revoked key's job ends", || async {
            status(id.clone()).await["status"] == "failed"
        })
        .await;
        let v = status(id.clone()).await;
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    }
    tutor_testkit::eventually("the other key's job is done", || async {
        status(kept.clone()).await["status"] == "done"
    })
    .await;
    eventually("the engine runs nothing", || {
        h.sim.engine.snapshot().running == 0
    })
    .await;
    assert!(
        h.sim_aborted() >= 1,
        "the running job's engine work was aborted"
    );
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

/// A job queued by a key that is then revoked and put back (a file reverted) never starts:
/// what a key submitted died with it. A job its key submits after it came back runs.
#[tokio::test]
async fn a_job_queued_before_its_key_was_revoked_and_put_back_never_starts() {
    let both = both_keys();
    let file = KeyFile::new(&both);
    let h = one_job_at_a_time(&file).await;
    let submit = |key: &'static str, tokens: u32| submit_job(&h, key, tokens);
    let status = |id: String| {
        let h = &h;
        async move { job_status(h, &id).await }
    };
    // SECOND's long job holds the seat; OTHER's waits behind it.
    let running = submit(SECOND, 10_000).await;
    tutor_testkit::eventually("the first job runs", || async {
        status(running.clone()).await["status"] == "running"
    })
    .await;
    let queued = submit(OTHER, 5).await;
    // OTHER revoked, then put back.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&file.0, format!("{} school-2\n", sha256(SECOND))).unwrap();
    tutor_testkit::eventually("OTHER is revoked", || async {
        answer(&h, Some(OTHER)).await.0 == 401
    })
    .await;
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&file.0, &both).unwrap();
    tutor_testkit::eventually("OTHER is back", || async {
        answer(&h, Some(OTHER)).await.0 == 200
    })
    .await;
    let after = submit(OTHER, 5).await;
    // The seat comes free: the job queued before the revocation does not start.
    let cancel = client()
        .delete(h.url(&format!("/jobs/{running}")))
        .bearer_auth(SECOND);
    assert!(send(cancel).await.status().is_success());
    tutor_testkit::eventually("the queued job ends", || async {
        status(queued.clone()).await["status"] == "failed"
    })
    .await;
    let v = status(queued).await;
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    tutor_testkit::eventually("the job submitted after runs", || async {
        status(after.clone()).await["status"] == "done"
    })
    .await;
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}
