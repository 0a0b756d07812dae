//! Attack 5: a `?token=` mints a new token, its key is revoked, and the tokens live on (on every
//! route, `/v1` included). A token names the key that minted it and dies with it within the key
//! file's reload interval; a token cannot mint tokens; a token works only on `GET /answer` and
//! `GET /jobs/{id}/events`.

use std::time::Duration;

use serde_json::json;
use tutor_gateway::config::Config;

use crate::common::*;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];
const KEY: &str = "sk-attack-cs101-0123456789";
const OTHER: &str = "sk-attack-school-2-abcdef";

/// A key file in the temp directory, removed on drop.
struct KeyFile(std::path::PathBuf);

impl KeyFile {
    fn new(name: &str, lines: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("tg-attack-keys-{name}-{}", std::process::id()));
        std::fs::write(&path, lines).unwrap();
        KeyFile(path)
    }

    fn rewrite(&self, lines: &str) {
        // Write aside and rename, as an operator's tooling would: never a half-written file.
        let aside = self.0.with_extension("new");
        std::fs::write(&aside, lines).unwrap();
        std::fs::rename(&aside, &self.0).unwrap();
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `POST /auth/token` with `key` as a bearer key or, with `as_token`, as `?token=`: the status
/// and the token when one was issued.
async fn mint(h: &Harness, credential: &str, as_token: bool) -> (u16, Option<String>) {
    let req = client().post(h.url("/auth/token"));
    let req = if as_token {
        req.query(&[("token", credential)])
    } else {
        req.bearer_auth(credential)
    };
    let resp = send(req).await;
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap();
    let token = (status == 200)
        .then(|| json(&body)["token"].as_str().map(str::to_owned))
        .flatten();
    (status, token)
}

/// `GET /answer?prompt=…&token=…`: the status (the stream is read to its end).
async fn answer_with(h: &Harness, token: &str) -> u16 {
    let resp = send(client().get(h.url("/answer")).query(&[
        ("prompt", "what is a closure?"),
        ("max_output_tokens", "2"),
        ("token", token),
    ]))
    .await;
    let status = resp.status().as_u16();
    let _ = resp.text().await;
    status
}

/// Auth on with `KEY` (tenant `cs101`) and `OTHER` (`school-2`); tokens live an hour.
fn two_keys(c: &mut Config) {
    with_keys(c, &[(KEY, "cs101"), (OTHER, "school-2")]);
    c.auth.token_ttl = Duration::from_secs(3_600);
}

#[tokio::test]
async fn revoking_a_key_revokes_every_token_it_minted_within_the_reload_interval() {
    let file = KeyFile::new(
        "revoke",
        &format!("{} cs101\n{} school-2\n", sha256(KEY), sha256(OTHER)),
    );
    let path = file.0.clone();
    let h = harness(FAST, |c| {
        c.auth.enabled = true;
        c.auth.keys_file = Some(path);
        c.auth.reload = Duration::from_millis(50);
        c.auth.token_ttl = Duration::from_secs(3_600);
    })
    .await;
    // The attacker's chain: tokens from the key, and whatever a token can mint in turn.
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let (status, token) = mint(&h, KEY, false).await;
        assert_eq!(status, 200);
        tokens.push(token.unwrap());
    }
    let mut last = tokens[0].clone();
    for _ in 0..2 {
        if let (_, Some(next)) = mint(&h, &last, true).await {
            tokens.push(next.clone());
            last = next;
        }
    }
    let (_, other) = mint(&h, OTHER, false).await;
    let other = other.unwrap();
    for token in &tokens {
        assert_eq!(answer_with(&h, token).await, 200, "valid before revocation");
    }
    // The key is revoked: its line leaves the file.
    file.rewrite(&format!("{} school-2\n", sha256(OTHER)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut alive = 0;
        for token in &tokens {
            if answer_with(&h, token).await != 401 {
                alive += 1;
            }
        }
        if alive == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{alive} of {} tokens of a revoked key still answer 30 s after it left the key file",
            tokens.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The refusal says why; the other key's token is not affected.
    let resp = send(
        client()
            .get(h.url("/answer"))
            .query(&[("prompt", "hi"), ("token", tokens[0].as_str())]),
    )
    .await;
    let body = read_json(resp).await;
    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("revoked"),
        "{body}"
    );
    assert_eq!(answer_with(&h, &other).await, 200);
    h.shutdown().await;
}

#[tokio::test]
async fn a_token_cannot_mint_tokens() {
    let h = harness(FAST, two_keys).await;
    let (_, token) = mint(&h, KEY, false).await;
    let token = token.unwrap();
    let (status, minted) = mint(&h, &token, true).await;
    assert!(
        matches!(status, 401 | 403) && minted.is_none(),
        "a token minted a token ({status})"
    );
    // A key still can.
    assert_eq!(mint(&h, KEY, false).await.0, 200);
    h.shutdown().await;
}

#[tokio::test]
async fn a_token_is_refused_on_v1_with_a_clear_message() {
    let h = harness(FAST, two_keys).await;
    let (_, token) = mint(&h, KEY, false).await;
    let token = token.unwrap();
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let body = if path.ends_with("chat/completions") {
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        } else {
            json!({"prompt": "hi", "max_tokens": 2})
        };
        let resp = send(
            client()
                .post(h.url(path))
                .query(&[("token", token.as_str())])
                .json(&body),
        )
        .await;
        assert_eq!(resp.status(), 401, "{path}");
        let body = read_json(resp).await;
        assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("GET /answer"),
            "the message names where a token works: {body}"
        );
    }
    // The same token still opens the browser's stream.
    assert_eq!(answer_with(&h, &token).await, 200);
    h.shutdown().await;
}

/// A key revoked while its requests are in: its running stream used to go on to its end
/// (up to `upstream.total_timeout_ms`), holding its seat and the engine, and its queued
/// request was still admitted. At the key file's next reload the stream ends with an error
/// event (`invalid_api_key`, the engine's work aborted, the seat back) and the queued request
/// gets 401 without reaching the engine, even when the seat the revoked stream gave back is
/// what admitted it; another key's requests go on.
#[tokio::test]
async fn revoking_a_key_ends_its_streams_and_its_waiting_requests() {
    let file = KeyFile::new(
        "revoke-running",
        &format!("{} cs101\n{} school-2\n", sha256(KEY), sha256(OTHER)),
    );
    let path = file.0.clone();
    // A quarter of real time (about 20 ms a token) and answers that run to their limit: the
    // stream (1,000 tokens, about 20 s) is running when revoked.
    let slow = [
        "--speed",
        "0.25",
        "--profile",
        "tiny-test",
        "--mean-output-tokens",
        "1000000",
    ];
    let h = harness(&slow, |c| {
        c.auth.enabled = true;
        c.auth.keys_file = Some(path);
        c.auth.reload = Duration::from_millis(50);
        set_lane(c, tutor_gateway::lane::Lane::Small, 1);
        // Never promoted: it holds the small lane's one seat until it ends.
        c.lanes.small.mid_stream_limit = None;
        c.lanes.small.queue.timeout = Duration::from_secs(120);
    })
    .await;
    let answer = |key: &str| {
        client()
            .get(h.url("/answer"))
            .query(&[
                ("prompt", "what is a closure?"),
                ("max_output_tokens", "1000"),
            ])
            .bearer_auth(key)
    };
    let resp = send(answer(KEY)).await;
    assert_eq!(resp.status(), 200);
    let mut running = Streamed::new(resp);
    running.until(|text| text.contains("event: token")).await;
    // The key's second request waits for the one seat.
    let waiting = tokio::spawn(answer(KEY).send());
    eventually("it waits", || {
        h.queued(tutor_gateway::lane::Lane::Small) == 1
    })
    .await;

    file.rewrite(&format!("{} school-2\n", sha256(OTHER)));
    let rest = running.rest().await;
    let (last, data) = sse(&rest).pop().expect("a last event");
    assert_eq!(last, "error", "{rest}");
    assert_eq!(json(&data)["code"], "invalid_api_key", "{data}");
    let refused = waiting.await.unwrap().unwrap();
    assert_eq!(refused.status(), 401);
    eventually("the engine's work was aborted", || h.sim_aborted() == 1).await;
    // The seat the revoked stream gave back went to the waiting request before the auth layer
    // heard of the revocation (about one run in six): it must be refused before the engine.
    assert_eq!(
        h.sim_requests().await.len(),
        1,
        "the waiting request of a revoked key reached the engine"
    );
    eventually("every seat back", || h.idle()).await;
    // Both were ended by the revocation, not given up by their clients: recorded with its
    // code, and not among the cancellations.
    eventually("both requests recorded", || {
        h.log.lock().unwrap().len() == 2
    })
    .await;
    let log = h.log.lock().unwrap().clone();
    for line in &log {
        assert_eq!(line["error_code"], "invalid_api_key", "{line}");
    }
    let m = h.metrics_text().await;
    assert_eq!(
        family_total(&m, "tutor_gateway_cancellations_total"),
        0.0,
        "{m}"
    );
    // The other key is served.
    let other = send(
        client()
            .get(h.url("/answer"))
            .query(&[("prompt", "hi"), ("max_output_tokens", "2")])
            .bearer_auth(OTHER),
    )
    .await;
    assert_eq!(other.status(), 200);
    let _ = other.text().await;
    h.shutdown().await;
}
