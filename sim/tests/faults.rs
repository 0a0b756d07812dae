//! Fault injection, for testing a client's (the gateway's) error paths.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::Value;

async fn stream_text(s: &vllm_sim::SimServer, max_tokens: u32) -> String {
    post_text(
        format!("{}/v1/chat/completions", s.url()),
        &chat_body("hi", max_tokens, true),
    )
    .await
}

#[tokio::test]
async fn fail_rate_one_answers_500_in_vllm_shape() {
    let s = sim(&flags("--speed 50 --profile tiny-test --fail-rate 1")).await;
    let resp = send(
        client()
            .post(format!("{}/v1/chat/completions", s.url()))
            .json(&chat_body("hi", 5, true)),
    )
    .await;
    assert_eq!(resp.status(), 500);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "InternalServerError");
    assert_eq!(v["error"]["code"], 500);
    s.shutdown().await;
}

#[tokio::test]
async fn midstream_error_is_an_error_event_then_done_and_frees_the_engine() {
    // Real speed and a long answer: the error (after 3 tokens) cannot share a batch with the
    // finish however late the reader polls (a batch that also finishes skips the error).
    let s = sim(&flags(
        "--speed 1 --profile tiny-test --midstream-error-rate 1 --error-after-tokens 3",
    ))
    .await;
    let events = sse_events(&stream_text(&s, 5000).await);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], 500);
    let tokens: usize = events[..events.len() - 2]
        .iter()
        .map(|e| delta_words(e))
        .sum();
    assert_eq!(tokens, 3);
    eventually("engine idle", || async {
        metric(&s, &format!("vllm:num_requests_running{}", labels())).await == 0.0
    })
    .await;
    s.shutdown().await;
}

#[tokio::test]
async fn stalled_stream_keeps_the_connection_open_without_bytes() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --stall-after-tokens 2",
    ))
    .await;
    let resp = send(
        client()
            .post(format!("{}/v1/chat/completions", s.url()))
            .json(&chat_body("hi", 50, true)),
    )
    .await;
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    // The tokens of the events received whole.
    let tokens = |text: &str| -> usize {
        let whole = &text[..text.rfind("\n\n").map_or(0, |end| end + 2)];
        if whole.is_empty() {
            return 0;
        }
        sse_events(whole).iter().map(|e| delta_words(e)).sum()
    };
    // The two tokens (however long a loaded machine takes to send them)...
    tokio::time::timeout(Duration::from_secs(60), async {
        while tokens(&text) < 2 {
            let chunk = body
                .next()
                .await
                .expect("the stream ended before two tokens");
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    })
    .await
    .expect("two tokens within 60 s");
    // ...then silence: nothing more, no end, no error.
    let stalled = tokio::time::timeout(Duration::from_millis(500), async {
        while let Some(chunk) = body.next().await {
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    })
    .await;
    assert!(stalled.is_err(), "the stream neither ended nor errored");
    assert!(!text.contains("[DONE]"));
    drop(body);
    assert_eq!(tokens(&text), 2, "two tokens then silence: {text}");
    s.shutdown().await;
}

#[tokio::test]
async fn omitted_done_and_garbage_lines_are_injectable() {
    let s = sim(&flags("--speed 50 --profile tiny-test --omit-done-rate 1")).await;
    let text = stream_text(&s, 5).await;
    assert!(!text.contains("[DONE]") && text.contains("\"finish_reason\":\"length\""));
    s.shutdown().await;

    let s = sim(&flags("--speed 50 --profile tiny-test --garbage-rate 1")).await;
    let text = stream_text(&s, 5).await;
    let bad = sse_events(&text)
        .iter()
        .filter(|e| *e != "[DONE]" && serde_json::from_str::<Value>(e).is_err())
        .count();
    assert!(bad >= 1, "{text}");
    s.shutdown().await;
}
