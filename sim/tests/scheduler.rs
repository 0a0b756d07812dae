//! The engine model behaves like vLLM V1's scheduler: limits per step, chunked prefill,
//! preemption, aborts that free KV blocks, priority.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::Value;

async fn stream_to_end(url: String, body: Value) -> Vec<String> {
    let text = post_text(url, &body).await;
    sse_events(&text)
}

fn usage_of(events: &[String]) -> Value {
    let v: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    v["usage"].clone()
}

#[tokio::test]
async fn max_num_seqs_and_token_budget_are_never_exceeded() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --max-num-seqs 4 --max-num-batched-tokens 512",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            tokio::spawn(stream_to_end(
                url.clone(),
                chat_body(&words(300, &i.to_string()), 30, true),
            ))
        })
        .collect();
    for t in tasks {
        let events = t.await.unwrap();
        assert_eq!(usage_of(&events)["completion_tokens"], 30);
    }
    // Limits, not peaks: how many overlap depends on how the requests arrive. That the limit
    // is reached is `max_num_seqs_is_reached_and_the_rest_wait`.
    let e = engine(&s).await;
    let seen = e["max_running_seen"].as_u64().unwrap();
    assert!((1..=4).contains(&seen), "{e}");
    assert!(e["max_step_tokens_seen"].as_u64().unwrap() <= 512, "{e}");
    let steps: Vec<Value> =
        serde_json::from_value(get_json(format!("{}/debug/steps", s.url())).await).unwrap();
    assert!(steps.iter().all(|st| st["running"].as_u64().unwrap() <= 4));
    assert_eq!(
        (e["running"].as_u64(), e["waiting"].as_u64()),
        (Some(0), Some(0)),
        "{e}"
    );
    s.shutdown().await;
}

/// Counts the engine's running and waiting requests in `/debug/engine`.
async fn running_waiting(s: &vllm_sim::SimServer) -> (u64, u64) {
    let e = engine(s).await;
    (
        e["running"].as_u64().unwrap(),
        e["waiting"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn max_num_seqs_is_reached_and_the_rest_wait() {
    // 10,000 tokens each at real speed: about a minute per request, so none can finish while
    // the test looks; the engine must hold exactly 4 and queue the other 2, whatever the timing.
    let s = sim(&flags("--speed 1 --profile tiny-test --max-num-seqs 4")).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let clients: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(stream_to_end(
                url.clone(),
                chat_body(&format!("hold {i}"), 10_000, true),
            ))
        })
        .collect();
    eventually("4 running, 2 waiting", || async {
        running_waiting(&s).await == (4, 2)
    })
    .await;
    // `max_running_seen` counts steps once they are done; the held four keep stepping.
    eventually("a step ran with 4", || async {
        engine(&s).await["max_running_seen"] == 4
    })
    .await;
    // The clients leave: everything is aborted and every block comes back.
    for c in &clients {
        c.abort();
    }
    eventually("engine empty", || async {
        running_waiting(&s).await == (0, 0)
    })
    .await;
    let e = engine(&s).await;
    assert_eq!(e["max_running_seen"], 4, "{e}");
    assert_eq!(e["free_blocks"], e["num_gpu_blocks"], "{e}");
    s.shutdown().await;
}

#[tokio::test]
async fn a_long_prompt_is_prefilled_in_chunks_while_decodes_continue() {
    let s = sim(&flags(
        "--speed 1 --profile tiny-test --max-num-batched-tokens 1024",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    // A short request decoding a long answer (10,000 tokens at real speed: it is still decoding
    // when the long prefill is over, however slowly the long request arrives)...
    let short = tokio::spawn(stream_to_end(
        url.clone(),
        chat_body("explain loops", 10_000, true),
    ));
    eventually("short request decoding", || async {
        metric(&s, &format!("vllm:generation_tokens_total{}", labels())).await >= 5.0
    })
    .await;
    // ...then an 8,000-token repository review.
    let long = stream_to_end(url.clone(), chat_body(&words(8000, "review"), 5, true)).await;
    assert!(usage_of(&long)["prompt_tokens"].as_u64().unwrap() > 8000);
    short.abort();
    let steps: Vec<Value> =
        serde_json::from_value(get_json(format!("{}/debug/steps", s.url())).await).unwrap();
    let chunked: Vec<&Value> = steps
        .iter()
        .filter(|st| st["max_chunk"].as_u64().unwrap() > 100)
        .collect();
    assert!(
        chunked.len() >= 8,
        "8,000 tokens in chunks of at most 1,024: {}",
        chunked.len()
    );
    assert!(chunked
        .iter()
        .all(|st| st["prefill_tokens"].as_u64().unwrap() <= 1024));
    let mixed = chunked
        .iter()
        .filter(|st| st["decode_seqs"].as_u64().unwrap() >= 1)
        .count();
    assert!(
        mixed >= 7,
        "the short request kept decoding during the long prefill: {mixed}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn blocks_running_out_preempts_and_everything_still_finishes() {
    // 64 blocks x 16 = 1,024 tokens of KV; 8 requests of ~100 + 150 tokens need ~2,000.
    // At speed 2 each request decodes for at least ~0.4 s, so the eight overlap even when they
    // arrive slowly (at speed 50 they had ~15 ms).
    let s = sim(&flags(
        "--speed 2 --profile tiny-test --num-gpu-blocks 64 --max-model-len 1024",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(stream_to_end(
                url.clone(),
                chat_body(&words(100, &format!("p{i}")), 150, true),
            ))
        })
        .collect();
    for t in tasks {
        let events = t.await.unwrap();
        let usage = usage_of(&events);
        assert_eq!(
            usage["completion_tokens"], 150,
            "every request finishes in full"
        );
        let words: usize = events[..events.len() - 2]
            .iter()
            .map(|e| delta_words(e))
            .sum();
        assert_eq!(
            words, 150,
            "no token lost or repeated across preemption: {events:#?}"
        );
    }
    assert!(metric(&s, &format!("vllm:num_preemptions_total{}", labels())).await > 0.0);
    let e = engine(&s).await;
    assert_eq!(e["free_blocks"], 64, "all blocks back: {e}");
    s.shutdown().await;
}

/// A stream of 5,000 tokens. Its callers run the simulator at real speed (`--speed 1`, about
/// 25 s for it): it must still run while the test makes several round trips, which a loaded
/// machine can stretch to seconds; each test ends it early with an abort, never waits for it.
async fn start_long_stream(s: &vllm_sim::SimServer, id: &str) -> reqwest::Response {
    let resp = send(
        client()
            .post(format!("{}/v1/chat/completions", s.url()))
            .header("x-request-id", id)
            .json(&chat_body(&words(200, id), 5000, true)),
    )
    .await;
    assert_eq!(resp.status(), 200);
    resp
}

async fn assert_aborted_and_freed(s: &vllm_sim::SimServer) {
    let running = format!("vllm:num_requests_running{}", labels());
    let abort = format!(
        "vllm:request_success_total{{engine=\"0\",model_name=\"{MODEL}\",finished_reason=\"abort\"}}"
    );
    eventually("engine drops the aborted request", || async {
        metric(s, &running).await == 0.0
            && metric(s, &abort).await == 1.0
            && metric(s, &format!("vllm:kv_cache_usage_perc{}", labels())).await == 0.0
    })
    .await;
}

#[tokio::test]
async fn closing_the_connection_mid_stream_aborts_and_frees_blocks() {
    let s = sim(&["--speed", "1", "--profile", "tiny-test"]).await;
    let resp = start_long_stream(&s, "walk-away").await;
    let mut body = resp.bytes_stream();
    let mut seen = 0;
    while seen < 3 {
        seen += body.next().await.unwrap().unwrap().len().min(1);
    }
    assert_eq!(
        metric(&s, &format!("vllm:num_requests_running{}", labels())).await,
        1.0
    );
    drop(body);
    assert_aborted_and_freed(&s).await;
    s.shutdown().await;
}

#[tokio::test]
async fn closing_the_connection_of_a_non_streaming_request_aborts_it() {
    // vLLM aborts a request whose client disconnects whether it streams or not. Real speed: the
    // 5,000-token answer (about 25 s) still runs when the test drops its client.
    let s = sim(&["--speed", "1", "--profile", "tiny-test"]).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let waiting = tokio::spawn(async move {
        client()
            .post(url)
            .json(&chat_body(&words(50, "whole"), 5000, false))
            .send()
            .await
    });
    eventually("tokens flowing", || async {
        metric(&s, &format!("vllm:generation_tokens_total{}", labels())).await >= 3.0
    })
    .await;
    waiting.abort();
    assert_aborted_and_freed(&s).await;
    s.shutdown().await;
}

async fn post_abort(s: &vllm_sim::SimServer, path: &str, body: Value) -> (u16, String) {
    let r = send(client().post(format!("{}{path}", s.url())).json(&body)).await;
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn aborts(s: &vllm_sim::SimServer) -> Vec<Value> {
    serde_json::from_value(get_json(format!("{}/debug/aborts", s.url())).await).unwrap()
}

#[tokio::test]
async fn scale_out_abort_endpoint_takes_vllms_ids_only_and_stops_generation() {
    let s = sim(&flags("--speed 1 --profile tiny-test --enable-scale-out")).await;
    let resp = start_long_stream(&s, "to-abort").await;
    let reader = tokio::spawn(async move { resp.text().await.unwrap() });
    eventually("tokens flowing", || async {
        metric(&s, &format!("vllm:generation_tokens_total{}", labels())).await >= 3.0
    })
    .await;
    const PATH: &str = "/inference/v1/abort_requests";
    // The X-Request-Id as sent, and an internal id (random suffix): vLLM's endpoint matches
    // neither, answers 200 all the same, and the request goes on.
    for wrong in ["to-abort", "chatcmpl-to-abort-1a2b3c4d", "cmpl-to-abort-0"] {
        assert_eq!(
            post_abort(&s, PATH, serde_json::json!({"request_ids": [wrong]})).await,
            (200, String::new())
        );
    }
    assert_eq!(engine(&s).await["running"], 1, "a wrong id aborts nothing");
    // Bodies vLLM refuses.
    assert_eq!(post_abort(&s, PATH, serde_json::json!({})).await.0, 400);
    // The id vLLM gives a chat completion: chatcmpl-<X-Request-Id>.
    assert_eq!(
        post_abort(
            &s,
            PATH,
            serde_json::json!({"request_ids": ["chatcmpl-to-abort"]})
        )
        .await,
        (200, String::new())
    );
    let events = sse_events(
        &tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    let last_choice: Value = serde_json::from_str(&events[events.len() - 3]).unwrap();
    assert_eq!(last_choice["choices"][0]["finish_reason"], "abort");
    assert_aborted_and_freed(&s).await;
    let seen = aborts(&s).await;
    let matched: Vec<u64> = seen
        .iter()
        .map(|a| a["aborted"].as_u64().unwrap())
        .collect();
    assert_eq!(matched, [0, 0, 0, 0, 1], "{seen:?}");
    assert_eq!(
        seen[4]["request_ids"],
        serde_json::json!(["chatcmpl-to-abort"])
    );

    // A completion is cmpl-<X-Request-Id>-0 (its first and only prompt).
    let resp = send(
        client()
            .post(format!("{}/v1/completions", s.url()))
            .header("x-request-id", "cmp-1")
            .json(
                &serde_json::json!({"prompt": "hi", "max_tokens": 5000, "ignore_eos": true,
                                  "stream": true}),
            ),
    )
    .await;
    let reader = tokio::spawn(async move { resp.text().await.unwrap() });
    eventually("completion running", || async {
        engine(&s).await["running"] == 1
    })
    .await;
    for id in ["cmp-1", "cmpl-cmp-1", "cmpl-cmp-1-0"] {
        post_abort(&s, PATH, serde_json::json!({"request_ids": id})).await;
    }
    tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .unwrap()
        .unwrap();
    let seen = aborts(&s).await;
    let matched: Vec<u64> = seen[5..]
        .iter()
        .map(|a| a["aborted"].as_u64().unwrap())
        .collect();
    assert_eq!(matched, [0, 0, 1], "{seen:?}");
    s.shutdown().await;
}

#[tokio::test]
async fn a_default_vllm_serve_has_no_abort_endpoint() {
    let s = sim(&["--speed", "1", "--profile", "tiny-test"]).await;
    let resp = start_long_stream(&s, "stays").await;
    let mut body = resp.bytes_stream();
    body.next().await.unwrap().unwrap();
    let ids = serde_json::json!({"request_ids": ["chatcmpl-stays"]});
    // vLLM's stand-in for its scale-out routes while --enable-scale-out is off.
    let (status, text) = post_abort(&s, "/inference/v1/abort_requests", ids.clone()).await;
    assert_eq!(status, 403);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "PermissionDeniedError");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--enable-scale-out"));
    // Only the tokens-only and development servers have this one.
    assert_eq!(
        post_abort(&s, "/abort_requests", ids).await,
        (404, r#"{"detail":"Not Found"}"#.to_owned())
    );
    assert_eq!(engine(&s).await["running"], 1, "nothing was aborted");
    let statuses: Vec<u64> = aborts(&s)
        .await
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [403, 404]);
    // Closing the connection is what stops it.
    drop(body);
    assert_aborted_and_freed(&s).await;
    s.shutdown().await;
}

#[tokio::test]
async fn the_api_key_guards_the_abort_endpoint_as_it_guards_v1() {
    let s = sim(&flags(
        "--speed 5 --profile tiny-test --enable-scale-out --api-key k",
    ))
    .await;
    let url = format!("{}/inference/v1/abort_requests", s.url());
    let body = serde_json::json!({"request_ids": ["chatcmpl-none"]});
    let r = send(client().post(&url).json(&body)).await;
    assert_eq!(r.status(), 401);
    let r = send(client().post(&url).bearer_auth("k").json(&body)).await;
    assert_eq!(r.status(), 200);
    s.shutdown().await;
}

#[tokio::test]
async fn priority_policy_admits_lower_priority_values_first() {
    // Real speed and 10,000-token answers: a request that has the only seat keeps it for about
    // a minute, so nothing below depends on how fast the machine is.
    let s = sim(&flags(
        "--speed 1 --profile tiny-test --max-num-seqs 1 --scheduling-policy priority",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    // Occupy the only seat, then queue a low-priority and a high-priority request.
    let blocker = tokio::spawn(stream_to_end(url.clone(), chat_body("block", 10_000, true)));
    eventually("blocker running", || async {
        running_waiting(&s).await == (1, 0)
    })
    .await;
    let started = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, (name, prio)) in [("late", 10), ("urgent", -5)].into_iter().enumerate() {
        let mut body = chat_body(name, 10_000, true);
        body["priority"] = prio.into();
        let (url, started) = (url.clone(), started.clone());
        tasks.push(tokio::spawn(async move {
            let resp = send(client().post(url).json(&body)).await;
            let mut stream = resp.bytes_stream();
            // Body bytes come only with tokens: the first chunk means the engine runs it.
            stream.next().await.unwrap().unwrap();
            started.lock().unwrap().push(name);
            while stream.next().await.is_some() {}
        }));
        eventually("queued", || async {
            running_waiting(&s).await == (1, i as u64 + 1)
        })
        .await;
    }
    // The blocker leaves; the seat goes to the lower `priority` value, which then holds it.
    blocker.abort();
    eventually("one of the two queued requests got the seat", || {
        let started = started.clone();
        async move { !started.lock().unwrap().is_empty() }
    })
    .await;
    assert_eq!(running_waiting(&s).await, (1, 1));
    assert_eq!(*started.lock().unwrap(), ["urgent"]);
    for t in tasks {
        t.abort();
    }
    eventually("engine empty", || async {
        running_waiting(&s).await == (0, 0)
    })
    .await;
    s.shutdown().await;
}

#[tokio::test]
async fn fixed_profile_has_constant_latency_and_no_batching_limit() {
    let s = sim(&flags(
        "--profile fixed --fixed-ttft-ms 5 --fixed-itl-ms 1 --max-num-seqs 2",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            tokio::spawn(stream_to_end(
                url.clone(),
                chat_body(&format!("q{i}"), 20, true),
            ))
        })
        .collect();
    for t in tasks {
        assert_eq!(usage_of(&t.await.unwrap())["completion_tokens"], 20);
    }
    let e = engine(&s).await;
    assert_eq!(e["mode"], "fixed");
    s.shutdown().await;

    // Ten requests whose first token is ten minutes away: all ten run at once, none waits,
    // although --max-num-seqs is 2.
    let s = sim(&flags(
        "--profile fixed --fixed-ttft-ms 600000 --max-num-seqs 2",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    let held: Vec<_> = (0..10)
        .map(|i| {
            tokio::spawn(stream_to_end(
                url.clone(),
                chat_body(&format!("h{i}"), 20, true),
            ))
        })
        .collect();
    eventually("all ten running", || async {
        running_waiting(&s).await == (10, 0)
    })
    .await;
    for h in &held {
        h.abort();
    }
    eventually("engine empty", || async {
        running_waiting(&s).await == (0, 0)
    })
    .await;
    let e = engine(&s).await;
    assert_eq!(
        e["max_running_seen"], 10,
        "fixed mode ignores --max-num-seqs: {e}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn closing_the_connection_during_prefill_aborts_before_the_first_token() {
    // 8,000 prompt tokens in chunks of 256 at real speed: about a third of a second of prefill.
    let s = sim(&flags(
        "--speed 1 --profile tiny-test --max-num-batched-tokens 256",
    ))
    .await;
    let resp = send(
        client()
            .post(format!("{}/v1/chat/completions", s.url()))
            .json(&chat_body(&words(8000, "repo"), 50, true)),
    )
    .await;
    eventually("prefill started", || async {
        metric(&s, &format!("vllm:num_requests_running{}", labels())).await == 1.0
    })
    .await;
    drop(resp);
    assert_aborted_and_freed(&s).await;
    assert_eq!(
        metric(&s, &format!("vllm:generation_tokens_total{}", labels())).await,
        0.0,
        "aborted before any token was generated"
    );
    s.shutdown().await;
}

/// vLLM 0.33+ accepts a priority under `fcfs` (the check that refused it is gone) and ignores it.
#[tokio::test]
async fn a_priority_without_priority_scheduling_is_accepted_as_vllm_does() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let mut body = chat_body("hi", 3, false);
    body["priority"] = (-5).into();
    let resp = send(client().post(&url).json(&body)).await;
    assert_eq!(resp.status(), 200);
    s.shutdown().await;
}

/// The prompt chunks of the steps `/debug/steps` recorded, with how many sequences ran in each.
async fn chunks(s: &vllm_sim::SimServer) -> Vec<(u64, u64)> {
    let steps: Vec<Value> =
        serde_json::from_value(get_json(format!("{}/debug/steps", s.url())).await).unwrap();
    steps
        .iter()
        .filter(|st| st["max_chunk"].as_u64().unwrap() > 0)
        .map(|st| {
            (
                st["max_chunk"].as_u64().unwrap(),
                st["running"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn long_prefill_token_threshold_caps_long_prefills_while_others_run() {
    let flags = flags("--speed 1 --profile tiny-test --max-num-batched-tokens 2048 --long-prefill-token-threshold 256");
    // Alone, a long prompt has nobody to starve: vLLM lifts the cap (its first step takes the
    // whole budget).
    let s = sim(&flags).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let events = stream_to_end(url, chat_body(&words(3000, "review"), 5, true)).await;
    assert_eq!(usage_of(&events)["completion_tokens"], 5);
    let alone = chunks(&s).await;
    assert_eq!(alone.first().map(|c| c.0), Some(2048), "{alone:?}");
    s.shutdown().await;

    // Beside a decoding stream (4,000 tokens, about 20 s at this speed, dropped at the end),
    // every chunk of the long prompt is capped.
    let s = sim(&flags).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let holder = reqwest::Client::new()
        .post(&url)
        .json(&chat_body("hold a seat", 4000, true))
        .send()
        .await
        .unwrap();
    let mut held = holder.bytes_stream();
    held.next().await.unwrap().unwrap();
    // Read on while the review runs (a stream left unread could stop at a full socket).
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = held.next().await {} });
    let events = stream_to_end(url, chat_body(&words(3000, "review"), 5, true)).await;
    assert_eq!(usage_of(&events)["completion_tokens"], 5);
    let beside = chunks(&s).await;
    let long: Vec<u64> = beside.iter().filter(|c| c.1 >= 2).map(|c| c.0).collect();
    assert!(long.iter().all(|c| *c <= 256), "{beside:?}");
    assert!(
        long.len() >= 12,
        "3,000 tokens in chunks of at most 256 beside the holder: {beside:?}"
    );
    reader.abort();
    s.shutdown().await;
}
