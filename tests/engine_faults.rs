//! An engine that breaks vLLM's wire rules (the simulator's broken-engine flags): the gateway
//! ends the request at a bound, answers with a clear error or the answer as it finished, and
//! gives every seat back.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// The client's side, bounded: a broken engine must not keep the request open.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still open after 60 s"))
}

/// A 5-token answer streamed on `/v1` (ending with `[DONE]`, its 5 words), the same answer
/// whole (200, its 5 words) and an `/answer` (ending with `done`): the stream's text and the
/// whole answer.
async fn whole_on_every_route(h: &Harness) -> (String, serde_json::Value) {
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                      "ignore_eos": true, "stream": true});
    let text = within("a stream", post_text(h.url("/v1/chat/completions"), &body)).await;
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]", "{text}");
    let words: usize = events
        .iter()
        .filter(|(_, d)| d.starts_with('{'))
        .map(|(_, d)| delta_words(d))
        .sum();
    assert_eq!(words, 5, "{text}");
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let resp = within(
        "a whole answer",
        send(client().post(h.url("/v1/chat/completions")).json(&whole)),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let chat: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(message_words(&chat), 5, "{chat}");
    let answer = within(
        "/answer",
        post_text(
            h.url("/answer"),
            &json!({"prompt": "hi", "max_output_tokens": 4}),
        ),
    )
    .await;
    assert_eq!(sse(&answer).last().unwrap().0, "done", "{answer}");
    (text, chat)
}

/// An engine that goes on sending after its finish reason: the answer ends at the finish
/// (what came after it is not the answer), streamed or not, and nothing is held after.
#[tokio::test]
async fn an_engine_that_talks_past_its_finish_ends_at_the_finish() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --chatter-after-finish"),
        |_| {},
    )
    .await;
    let (text, _) = whole_on_every_route(&h).await;
    assert!(!text.contains("more"), "{text}");
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}

/// An engine that sends an error after its finish reason (vLLM's stream generator does, when
/// its code after the generation loop raises): the answer was whole, and every route keeps it
/// as a clean end: `/answer`'s `done`, a whole `/v1` answer's 200, a `/v1` stream without an
/// error chunk, a job done (not continued, not failed). Nothing is held after.
#[tokio::test]
async fn an_error_after_the_finish_keeps_the_whole_answer() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --error-after-finish"),
        |_| {},
    )
    .await;
    let (text, chat) = whole_on_every_route(&h).await;
    assert!(!text.contains("\"error\""), "{text}");
    assert_eq!(chat["usage"]["completion_tokens"], 5, "{chat}");
    let resp = send(
        client()
            .post(h.url("/jobs"))
            .json(&json!({"prompt": "hi", "max_output_tokens": 4})),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let id = resp.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = h.url(&format!("/jobs/{id}"));
    let mut job = serde_json::Value::Null;
    for _ in 0..600 {
        job = tutor_testkit::get_json(url.clone()).await;
        if job["status"] != "queued" && job["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(job["status"], "done", "{job}");
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}

/// An engine whose chunks are far larger than any token (a few tokens make megabytes): a whole
/// answer is held in memory, so it is refused with a 502 once it passes what the model's
/// length could take (4 KiB a token), the engine's work aborted, instead of growing until
/// the total timeout.
#[tokio::test]
async fn a_whole_answer_larger_than_the_model_could_write_is_refused() {
    let h = harness(
        // A token a chunk, 50 ms apart: the engine is still writing (for 45 s) when the gateway
        // refuses, however slowly a loaded machine reads (an engine that had finished would
        // have nothing to abort).
        &flags("--profile fixed --fixed-ttft-ms 1 --fixed-itl-ms 50 --chunk-padding-bytes 900000"),
        |c| c.upstream.max_model_len = 1024.try_into().unwrap(),
    )
    .await;
    // 4 MiB at most for 1,024 tokens: the fifth chunk passes it.
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 900,
                      "ignore_eos": true});
    let resp = within(
        "a whole answer",
        send(client().post(h.url("/v1/chat/completions")).json(&body)),
    )
    .await;
    let err = assert_error(resp, 502, "upstream_error").await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("bytes"), "{message}");
    eventually("the engine's work was aborted", || h.sim_aborted() == 1).await;
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}

/// An engine (or a proxy before it) that answers with a redirect: the gateway does not follow
/// it, which would send the prompt and the upstream key wherever `Location` points. The client
/// gets a clear error, the place redirected to gets nothing, and nothing is held.
#[tokio::test]
async fn a_redirect_from_the_engine_is_not_followed() {
    let elsewhere = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(
        "--speed 50 --profile tiny-test",
    )))
    .await
    .unwrap();
    let redirect = format!(
        "--speed 50 --profile tiny-test --redirect-to {}",
        elsewhere.url()
    );
    let h = harness(&flags(&redirect), |_| {}).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let resp = within(
        "the request",
        send(client().post(h.url("/v1/chat/completions")).json(&body)),
    )
    .await;
    assert_error(resp, 502, "upstream_error").await;
    let reached = tutor_testkit::get_json(format!("{}/debug/requests", elsewhere.url())).await;
    assert_eq!(reached, json!([]), "the redirect was followed");
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
    elsewhere.shutdown().await;
}

/// vLLM refuses some requests only as its engine takes them (a token id past the vocabulary, a
/// grammar its backend cannot build): streaming, its answer is a 200 whose first event is the
/// 400. A client that asked for a whole answer gets that 400 with vLLM's message, as vLLM
/// would have answered it (a 502 would be retried by the OpenAI SDK, the engine asked three
/// times); a streaming one gets what vLLM streams, the error as its only event. Every seat
/// comes back.
#[tokio::test]
async fn a_request_the_engine_refuses_as_it_takes_it_is_a_400_not_a_502() {
    let h = harness(&flags("--speed 50 --profile tiny-test"), |_| {}).await;
    for (path, mut body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        ("/v1/completions", json!({"prompt": "hi"})),
    ] {
        body["max_tokens"] = json!(5);
        body["allowed_token_ids"] = json!([5, 999_999]);
        body["stream"] = json!(false);
        let resp = within("the answer", send(client().post(h.url(path)).json(&body))).await;
        let err = assert_error(resp, 400, "upstream_rejected").await;
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains("out-of-vocab"), "{path}: {err}");
        body["stream"] = json!(true);
        let resp = within("the stream", send(client().post(h.url(path)).json(&body))).await;
        assert_eq!(resp.status(), 200);
        let events = tutor_testkit::sse_events(&resp.text().await.unwrap());
        assert_eq!(events.len(), 2, "{events:?}");
        let err = json(&events[0]);
        assert_eq!(err["error"]["code"], "upstream_rejected", "{path}: {err}");
        assert!(err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out-of-vocab"));
        assert_eq!(events[1], "[DONE]");
    }
    eventually("every seat is back", || h.idle()).await;
    let m = h.metrics_text().await;
    for route in ["chat_completions", "completions"] {
        let series = format!(
            "tutor_gateway_requests_total{{lane=\"small\",outcome=\"upstream_error\",route=\"{route}\"}}"
        );
        assert_eq!(metric_or_zero(&m, &series), 0.0, "{m}");
    }
    h.shutdown().await;
}
