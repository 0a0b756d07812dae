//! The prefill budget against the simulator: long prompts wait for prefill room (holding no
//! seat), short prompts never do, and the prefill reservation comes back at the first token or
//! when the request ends (here: the client leaving during prefill). Holds are structural (an
//! engine whose first token or next token takes ten minutes), never wall-clock. Each test runs
//! with the in-process quota and with the shared quota in a real `redis-server`.

mod common;
mod redis_common;

use std::time::Duration;

use common::*;
use redis_common::RedisServer;
use serde_json::json;
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl};

fn body(words_n: usize, salt: &str) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": words(words_n, salt)}], "max_tokens": 64,
           "stream": true})
}

/// A 12288-token prefill budget, and timeouts that never end a held request; the quota in
/// `redis` when given.
fn tweak(redis: Option<&RedisServer>) -> impl FnOnce(&mut Config) + '_ {
    move |c| {
        c.admission.prefill_budget_tokens = 12_288;
        c.upstream.first_token_timeout = Duration::from_secs(3_600);
        c.upstream.idle_timeout = Duration::from_secs(3_600);
        c.upstream.total_timeout = Duration::from_secs(3_600);
        if let Some(r) = redis {
            c.quota.backend = QuotaBackend::Redis;
            c.quota.redis_url = RedisUrl::new(r.url());
        }
    }
}

/// Runs `case` with the local quota, then with the quota in a fresh `redis-server`.
macro_rules! both_backends {
    ($case:ident, $local:ident, $redis:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $local() {
            $case(None).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $redis() {
            let server = RedisServer::start();
            $case(Some(&server)).await;
        }
    };
}

/// Starts a streaming request; the task ends when the response headers came (admitted).
fn send(url: &str, body: serde_json::Value) -> tokio::task::JoinHandle<reqwest::Response> {
    let (url, http) = (url.to_owned(), client());
    tokio::spawn(async move { http.post(url).json(&body).send().await.unwrap() })
}

fn snapshot(h: &Harness) -> tutor_gateway::telemetry::AdmissionSnapshot {
    h.gw.state.admission().snapshot()
}

both_backends!(
    waits_without_a_seat_and_gets_room_on_a_disconnect,
    a_long_prompt_waits_for_prefill_room_without_a_seat_and_gets_it_on_a_disconnect,
    the_same_with_the_quota_in_redis
);

async fn waits_without_a_seat_and_gets_room_on_a_disconnect(redis: Option<&RedisServer>) {
    // The engine's first token takes ten minutes: every admitted request stays in prefill.
    let held = ["--profile", "fixed", "--fixed-ttft-ms", "600000"];
    let h = harness(&held, tweak(redis)).await;
    if redis.is_some() {
        redis_ready(&h.gw).await;
    }
    let url = h.url("/v1/chat/completions");
    let first = send(&url, body(7_000, "first")).await.unwrap();
    let in_prefill = snapshot(&h).prefill_tokens;
    assert!(in_prefill > 6_144, "a long prompt: {in_prefill} tokens");
    // A second long prompt does not fit next to it: it waits in its lane's queue, no seat.
    let second = send(&url, body(7_000, "second"));
    eventually("the second long prompt queued", || {
        snapshot(&h).queue_depth() == 1
    })
    .await;
    let s = snapshot(&h);
    assert_eq!((s.in_flight(), s.prefill_tokens), (1, in_prefill), "{s:?}");
    // A short question does not wait for prefill room; it is counted.
    let short = send(&url, body(20, "short")).await.unwrap();
    let s = snapshot(&h);
    assert_eq!((s.in_flight(), s.queue_depth()), (2, 1), "{s:?}");
    assert!(s.prefill_tokens > in_prefill);
    let text = h.metrics_text().await;
    assert_eq!(
        metric(&text, "tutor_gateway_prefill_tokens_in_flight"),
        s.prefill_tokens as f64
    );
    // The first client leaves during its prefill: its room goes to the waiting long prompt.
    drop(first);
    let second = second.await.unwrap();
    let s = snapshot(&h);
    assert_eq!((s.in_flight(), s.queue_depth()), (2, 0), "{s:?}");
    let text = h.metrics_text().await;
    assert_eq!(
        family_total(&text, "tutor_gateway_prefill_wait_seconds_count"),
        2.0,
        "every long prompt under the budget is observed once (the first with 0 s)"
    );
    assert!(family_total(&text, "tutor_gateway_prefill_wait_seconds_sum") > 0.0);
    drop((second, short));
    eventually("everything given back, prefill included", || h.idle()).await;
    h.shutdown().await;
}

both_backends!(
    room_at_the_first_token,
    prefill_room_comes_back_at_the_first_token_while_the_seat_stays,
    the_room_comes_back_at_the_first_token_with_the_quota_in_redis_too
);

async fn room_at_the_first_token(redis: Option<&RedisServer>) {
    // The first token comes at once, the second in ten minutes: requests stay in decode.
    let decode_held = flags("--profile fixed --fixed-ttft-ms 1 --fixed-itl-ms 600000");
    let h = harness(&decode_held, tweak(redis)).await;
    if redis.is_some() {
        redis_ready(&h.gw).await;
    }
    let url = h.url("/v1/chat/completions");
    let mut first = send(&url, body(7_000, "first")).await.unwrap();
    // Only the first token releases the room: read it.
    let chunk = first.chunk().await.unwrap().expect("a first chunk");
    assert!(!chunk.is_empty());
    // The second long prompt gets its prefill room although the first still holds its seat.
    let mut second = send(&url, body(7_000, "second")).await.unwrap();
    second.chunk().await.unwrap().expect("a first chunk");
    eventually("both in decode, no prefill in flight", || {
        let s = snapshot(&h);
        s.in_flight() == 2 && s.prefill_tokens == 0 && s.queue_depth() == 0
    })
    .await;
    drop((first, second));
    eventually("everything given back", || h.idle()).await;
    h.shutdown().await;
}
