//! The gateway's endpoints against vllm-sim: streams, lanes by request kind, bad input, upstream
//! failures.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tutor_gateway::lane::Lane;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

/// A browser's `EventSource` drops any answer but a 200 unread: a `GET /answer` that reads
/// events and is refused before its stream gets 200 and the refusal as its one `error` event
/// (status and `Retry-After` inside, id `end`), and its reconnection (`Last-Event-ID: end`) gets
/// 204, which stops it. A `POST` (a `fetch()` client) and a `GET` that does not read events keep
/// the HTTP status; the refusal is counted as what it is.
#[tokio::test]
async fn an_event_source_reads_why_its_answer_was_refused() {
    let h = harness(FAST, |_| {}).await;
    let too_long = [
        ("prompt", "what is a loop?"),
        ("max_output_tokens", "100000"),
    ];
    let resp = send(
        client()
            .get(h.url("/answer"))
            .query(&too_long)
            .header("accept", "text/event-stream")
            .header("cache-control", "no-cache"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let body = resp.text().await.unwrap();
    assert!(body.contains("id: end"), "{body}");
    let events = sse(&body);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "error");
    let data = json(&events[0].1);
    assert_eq!(data["code"], "too_long", "{data}");
    assert_eq!(data["status"], 400, "{data}");
    assert_eq!(data["param"], "max_output_tokens", "{data}");
    let again = send(
        client()
            .get(h.url("/answer"))
            .query(&too_long)
            .header("accept", "text/event-stream")
            .header("last-event-id", "end"),
    )
    .await;
    assert_eq!(again.status(), 204, "the reconnection is told to stop");
    let plain = send(client().get(h.url("/answer")).query(&too_long)).await;
    assert_error(plain, 400, "too_long").await;
    // A fetch()-based SSE client with a key reads the status itself.
    let fetched = send(
        client()
            .get(h.url("/answer"))
            .query(&too_long)
            .header("accept", "text/event-stream")
            .header("cache-control", "no-cache")
            .bearer_auth("a-key"),
    )
    .await;
    assert_error(fetched, 400, "too_long").await;
    let posted = send(
        client()
            .post(h.url("/answer"))
            .header("accept", "text/event-stream")
            .json(&json!({"prompt": "what is a loop?", "max_output_tokens": 100000})),
    )
    .await;
    assert_error(posted, 400, "too_long").await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            r#"tutor_gateway_requests_total{lane="none",outcome="too_long",route="answer"}"#
        ),
        4.0,
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn answer_get_streams_meta_tokens_and_done() {
    let h = harness(FAST, |_| {}).await;
    let resp = send(client().get(h.url("/answer")).query(&[
        ("prompt", "why does this TypeScript error happen?"),
        ("max_output_tokens", "12"),
    ]))
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events[0].0, "meta");
    let meta = json(&events[0].1);
    assert_eq!(meta["request_id"], id.as_str());
    assert_eq!(meta["lane"], "small");
    let tokens: Vec<_> = events.iter().filter(|(n, _)| n == "token").collect();
    let text: String = tokens
        .iter()
        .map(|(_, d)| json(d)["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text.split_whitespace().count(), 12);
    let (name, done) = events.last().unwrap();
    assert_eq!(name, "done");
    let done = json(done);
    assert_eq!(done["usage"]["output_tokens"], 12);
    assert_eq!(done["finish_reason"], "length");
    let t = &done["timings"];
    assert!(t["time_to_first_token_ms"].as_f64().unwrap() >= t["ttft_ms"].as_f64().unwrap());
    assert!(t["decode_tps"].as_f64().unwrap() > 0.0);
    h.shutdown().await;
}

#[tokio::test]
async fn answer_post_accepts_messages_and_rejects_bad_bodies() {
    let h = harness(FAST, |_| {}).await;
    let ok = send(client()
        .post(h.url("/answer"))
        .json(&json!({
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a closure?"}],
            "max_output_tokens": 5, "session_id": "s-1"
        }))).await;
    assert_eq!(ok.status(), 200);
    let events = sse(&ok.text().await.unwrap());
    assert_eq!(events.last().unwrap().0, "done");

    for (body, needle) in [
        (
            json!({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}),
            "exactly one",
        ),
        (
            json!({"prompt": "a", "max_output_tokens": "ten"}),
            "max_output_tokens",
        ),
        (json!({"prompt": "a", "temperature": 0.5}), "unknown field"),
        (json!({"prompt": "   "}), "must not be empty"),
    ] {
        let r = send(client().post(h.url("/answer")).json(&body)).await;
        assert_eq!(r.status(), 400, "{body}");
        let err = r.json::<serde_json::Value>().await.unwrap();
        assert_eq!(err["error"]["code"], "bad_request");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(needle),
            "{err}"
        );
    }
    // Each error names the field to fix (`param`), in words a student's frontend can show.
    let post = |body: serde_json::Value| send(client().post(h.url("/answer")).json(&body));
    let get = |query: &'static str| send(client().get(h.url(&format!("/answer?{query}"))));
    for (resp, param, needle) in [
        (
            post(json!({"messages": []})).await,
            json!("messages"),
            "must not be empty",
        ),
        (
            post(json!({"prompt": "a", "max_output_tokens": -3})).await,
            json!("max_output_tokens"),
            "whole number from 0",
        ),
        (
            get("max_output_tokens=5").await,
            json!("prompt"),
            "missing field `prompt`",
        ),
        (
            get("prompt=why&max_output_tokens=abc").await,
            json!("max_output_tokens"),
            "max_output_tokens",
        ),
        // A field the client named (not the gateway's) is never a `param`.
        (
            get("prompt=why&max_tokens=5").await,
            json!(null),
            "unknown field",
        ),
    ] {
        let err = assert_error(resp, 400, "bad_request").await;
        let message = err["error"]["message"].as_str().unwrap();
        assert_eq!(err["error"]["param"], param, "{err}");
        assert!(message.contains(needle), "{err}");
        assert!(!message.contains("deserialize"), "{err}");
        assert!(!message.contains("u32"), "{err}");
    }
    // A field name of 100,000 characters is named, not echoed whole (as /v1 shortens it).
    let long = "x".repeat(100_000);
    let mut body = json!({"prompt": "a"});
    body[&long] = json!(1);
    let query = format!("/answer?prompt=a&{}=1", "y".repeat(20_000));
    for resp in [post(body).await, send(client().get(h.url(&query))).await] {
        let err = assert_error(resp, 400, "bad_request").await;
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains("unknown field"), "{err}");
        assert!(
            message.chars().count() <= 300,
            "{} characters",
            message.len()
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn v1_chat_and_completions_relay_vllm_chunks_faithfully() {
    let h = harness(FAST, |_| {}).await;
    // Streaming chat without stream_options: vLLM's chunks, no usage chunk, then [DONE].
    let body = post_text(
        h.url("/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": true}),
    )
    .await;
    let events = sse(&body);
    assert!(
        events.iter().all(|(n, _)| n == "message"),
        "plain data: events only"
    );
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<_> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| json(d))
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c.get("usage").is_none()));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    // As vLLM 0.33+: `stream_options` without `include_usage: true` asks for no usage, and
    // running usage comes only with it (the gateway always asks the engine for both).
    for options in [json!({}), json!({"continuous_usage_stats": true})] {
        let body = post_text(
            h.url("/v1/chat/completions"),
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                    "stream": true, "stream_options": options}),
        )
        .await;
        let events = sse(&body);
        assert!(
            events[..events.len() - 1]
                .iter()
                .all(|(_, d)| json(d).get("usage").is_none()),
            "{options}: {body}"
        );
    }

    // With include_usage the usage chunk is relayed too.
    let body = post_text(
        h.url("/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": true,
                      "stream_options": {"include_usage": true}}),
    )
    .await;
    let events = sse(&body);
    let usage = json(&events[events.len() - 2].1);
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);

    // Non-streaming chat and completions come back whole, in vLLM's shapes.
    let chat: serde_json::Value = send_json(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})),
    )
    .await;
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(message_words(&chat), 4);
    assert_eq!(chat["usage"]["completion_tokens"], 4);
    let cmpl: serde_json::Value = send_json(
        client()
            .post(h.url("/v1/completions"))
            .json(&json!({"prompt": "def fib(n):", "max_tokens": 3})),
    )
    .await;
    assert_eq!(cmpl["object"], "text_completion");
    assert!(cmpl["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(cmpl["usage"]["completion_tokens"], 3);
    let stream = post_text(
        h.url("/v1/completions"),
        &json!({"prompt": "def fib(n):", "max_tokens": 3, "stream": true}),
    )
    .await;
    assert_eq!(sse(&stream).last().unwrap().1, "[DONE]");
    h.shutdown().await;
}

/// The answer to `body` at `path` through the gateway, and the simulator's own.
async fn through_and_direct(
    h: &Harness,
    path: &str,
    body: &serde_json::Value,
) -> (serde_json::Value, serde_json::Value) {
    let ask = |base: String| send_json(client().post(format!("{base}{path}")).json(body));
    (ask(h.gw.url()).await, ask(h.sim.url()).await)
}

/// The gateway streams from vLLM and assembles a non-streaming answer itself: what vLLM
/// streams beside the text, tool calls and reasoning, is in the message as vLLM would give it.
#[tokio::test]
async fn a_non_streaming_answer_keeps_its_tool_calls_and_reasoning() {
    let mut flags = FAST.to_vec();
    flags.extend(["--reasoning-tokens", "3"]);
    let h = harness(&flags, |_| {}).await;
    let body = json!({
        "messages": [{"role": "user", "content": "look up my grade"}],
        "max_tokens": 10,
        "ignore_eos": true,
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    });
    let (through, direct) = through_and_direct(&h, "/v1/chat/completions", &body).await;
    let (got, want) = (
        &through["choices"][0]["message"],
        &direct["choices"][0]["message"],
    );
    let calls = got["tool_calls"].as_array().expect("tool calls");
    assert_eq!(calls.len(), 1, "{through}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(
        calls[0]["function"], want["tool_calls"][0]["function"],
        "{through}"
    );
    assert!(calls[0]["id"]
        .as_str()
        .unwrap()
        .starts_with("chatcmpl-tool-"));
    let arguments: serde_json::Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        arguments["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        7
    );
    assert_eq!(got["content"], want["content"]);
    assert_eq!(got["reasoning"], want["reasoning"]);
    assert_eq!(
        got["reasoning"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        3
    );
    assert_eq!(through["usage"]["completion_tokens"], 10);

    // A plain answer: its reasoning, then its text.
    let plain: serde_json::Value = send_json(client().post(h.url("/v1/chat/completions")).json(
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "ignore_eos": true}),
    ))
    .await;
    let message = &plain["choices"][0]["message"];
    assert_eq!(
        message["reasoning"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        3
    );
    assert_eq!(message_words(&plain), 5);
    // No empty `tool_calls` (sent back with the history, an empty list breaks Llama 3's tool
    // templates).
    assert!(message.get("tool_calls").is_none(), "{plain}");

    // A client's own continuation of that answer is given as vLLM gives it, the reasoning
    // parser's labels included (only the gateway's continuations of pre-empted work read
    // them as the answer).
    let continued = json!({
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": message["content"]}],
        "continue_final_message": true, "add_generation_prompt": false,
        "max_tokens": 4, "ignore_eos": true,
    });
    let (through, direct) = through_and_direct(&h, "/v1/chat/completions", &continued).await;
    let (got, want) = (
        &through["choices"][0]["message"],
        &direct["choices"][0]["message"],
    );
    assert_eq!(
        want["reasoning"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        4,
        "{direct}"
    );
    assert_eq!(
        (&got["content"], &got["reasoning"]),
        (&want["content"], &want["reasoning"])
    );
    h.shutdown().await;
}

/// Log-probabilities asked for (within `server.max_logprobs`) are in a non-streaming answer as
/// vLLM would give them: the streamed pieces joined.
#[tokio::test]
async fn a_non_streaming_answer_keeps_its_logprobs() {
    let h = harness(FAST, |_| {}).await;
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                   "ignore_eos": true, "logprobs": true, "top_logprobs": 3}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "def fib(n):", "max_tokens": 6, "ignore_eos": true, "logprobs": 2}),
        ),
    ] {
        let (through, direct) = through_and_direct(&h, path, &body).await;
        let got = &through["choices"][0]["logprobs"];
        assert!(got.is_object(), "{path}: {through}");
        assert_eq!(*got, direct["choices"][0]["logprobs"], "{path}");
    }
    // Not asked for: none.
    let plain: serde_json::Value = send_json(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})),
    )
    .await;
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");
    h.shutdown().await;
}

#[tokio::test]
async fn the_seed_request_kinds_land_in_small_medium_and_large() {
    let h = harness(FAST, |_| {}).await;
    for (words_n, max, lane) in [
        (300, 120, "small"),
        (2000, 300, "medium"),
        (8000, 500, "large"),
    ] {
        let resp = send(
            client()
                .post(h.url("/answer"))
                .json(&json!({"prompt": words(words_n, "context"), "max_output_tokens": max})),
        )
        .await;
        let events = sse(&resp.text().await.unwrap());
        assert_eq!(json(&events[0].1)["lane"], lane, "{words_n} words + {max}");
        assert_eq!(events.last().unwrap().0, "done");
    }
    let metrics = h.metrics_text().await;
    for lane in ["small", "medium", "large"] {
        assert!(
            metrics.contains(&format!(
                "tutor_gateway_requests_total{{lane=\"{lane}\",outcome=\"ok\",route=\"answer\"}} 1"
            )),
            "{metrics}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn bad_input_gets_the_documented_4xx_in_openai_shape() {
    let h = harness(FAST, |c| c.server.max_body_bytes = 64 * 1024).await;
    let url = h.url("/v1/chat/completions");
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client().post(&url).body("{not json"), 400, "bad_request"),
        (client().post(&url).body("[1,2]"), 400, "bad_request"),
        (
            client().post(&url).json(&json!({"messages": "hi"})),
            400,
            "bad_request",
        ),
        (
            client().post(&url).json(
                &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}),
            ),
            400,
            "bad_request",
        ),
        (
            client()
                .post(&url)
                .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": "maybe"})),
            400,
            "bad_request",
        ),
        (
            client().post(&url).json(&json!({"messages": []})),
            400,
            "bad_request",
        ),
        (
            client()
                .post(&url)
                .json(&json!({"messages": [{"role": "user", "content": "hi"}], "n": 3})),
            400,
            "bad_request",
        ),
        (
            client()
                .post(&url)
                .json(&json!({"messages": [{"role": "user", "content": words(20_000, "x")}]})),
            413,
            "body_too_large",
        ),
        (
            client().post(&url).json(
                &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16_385}),
            ),
            400,
            "too_long",
        ),
        (
            client()
                .post(h.url("/v1/completions"))
                .json(&json!({"prompt": [1, 2, 3]})),
            400,
            "bad_request",
        ),
    ];
    for (req, status, code) in cases {
        let r = send(req.header("content-type", "application/json")).await;
        assert_eq!(r.status().as_u16(), status);
        let err: serde_json::Value = r.json().await.unwrap();
        assert_eq!(err["error"]["code"], code, "{err}");
        assert!(err["error"]["message"].as_str().unwrap().len() > 5);
        assert!(err["error"]["type"].is_string());
    }
    assert_eq!(
        h.sim.engine.snapshot().steps,
        0,
        "nothing reached the engine"
    );
    assert!(h.idle());
    h.shutdown().await;
}

/// vLLM refusals that are not the client's doing say so. A prompt the engine counts past its
/// context (the gateway's estimate let it through: here the gateway is told of a longer context
/// than the engine has) is the same `too_long` the gateway gives itself, with vLLM's message.
/// A 404 to the gateway's own model (a wrong `upstream.model`, an engine deployed with another;
/// an `/answer` client names no model) is 503 `upstream_unavailable`, not `upstream_rejected`.
#[tokio::test]
async fn the_engines_refusals_that_are_not_the_clients_doing_say_so() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --max-model-len 1024"),
        |c| c.upstream.max_model_len = std::num::NonZeroU32::new(16_384).unwrap(),
    )
    .await;
    let prompt = "loop ".repeat(3000);
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 3})),
    )
    .await;
    let err = assert_error(resp, 400, "too_long").await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("maximum context length"), "{err}");
    assert!(h.idle());
    h.shutdown().await;

    let h = harness(&flags("--speed 50 --profile tiny-test"), |c| {
        c.upstream.model = "someone/else".into();
    })
    .await;
    let resp = send(
        client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 3})),
    )
    .await;
    let err = assert_error(resp, 503, "upstream_unavailable").await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("upstream.model"), "{err}");
    assert!(h.idle());
    h.shutdown().await;
}

#[tokio::test]
async fn vllm_rejections_pass_through_with_vllms_message() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --max-model-len 16384"),
        |c| {
            c.upstream.model = "meta-llama/Llama-3.1-8B-Instruct".into();
        },
    )
    .await;
    let r = send(client()
        .post(h.url("/v1/chat/completions"))
        .json(&json!({"model": "other-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))).await;
    assert_eq!(r.status(), 404);
    let err: serde_json::Value = r.json().await.unwrap();
    assert_eq!(err["error"]["type"], "NotFoundError");
    assert_eq!(err["error"]["code"], "upstream_rejected");
    assert!(h.idle(), "the slot came back");
    // Counted as the client's doing, outside the upstream-errors alert's outcomes.
    let m = h.metrics_text().await;
    let rejected = r#"tutor_gateway_requests_total{lane="small",outcome="upstream_rejected",route="chat_completions"}"#;
    assert_eq!(metric(&m, rejected), 1.0, "{m}");
    assert!(!m.contains(r#"outcome="upstream_error""#), "{m}");
    h.shutdown().await;
}

#[tokio::test]
async fn upstream_down_gives_503_fast_and_readyz_says_so() {
    let refused = tutor_testkit::RefusedPort::new();
    let port = refused.port();
    // Every upstream timeout an hour long: only the refused connection can produce the 503,
    // so "fast" needs no stopwatch; the 30 s guard fails the test if the gateway waits instead.
    let h = harness(FAST, |c| {
        c.upstream.base_url = format!("http://127.0.0.1:{port}");
        c.upstream.connect_timeout = Duration::from_secs(3_600);
        c.upstream.first_token_timeout = Duration::from_secs(3_600);
        c.upstream.idle_timeout = Duration::from_secs(3_600);
        c.upstream.total_timeout = Duration::from_secs(3_600);
    })
    .await;
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}))
            .send(),
    )
    .await
    .expect("a refused connection is a 503 at once, not after a timeout")
    .unwrap();
    assert_error(r, 503, "upstream_unavailable").await;
    assert_eq!(send(client().get(h.url("/readyz"))).await.status(), 503);
    assert_eq!(send(client().get(h.url("/healthz"))).await.status(), 200);
    assert!(h.idle());
    h.shutdown().await;
}

#[tokio::test]
async fn a_stalled_upstream_hits_the_idle_timeout_with_a_clean_error() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --stall-after-tokens 3"),
        |c| {
            // 3 s: a loaded machine that delays one of the first three tokens must not pass for
            // a silent engine (the count below is exact).
            c.upstream.idle_timeout = Duration::from_secs(3);
        },
    )
    .await;
    let body = send_text(
        client()
            .get(h.url("/answer"))
            .query(&[("prompt", "hello"), ("max_output_tokens", "50")]),
    )
    .await;
    let events = sse(&body);
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(json(data)["code"], "upstream_timeout");
    let words: usize = events
        .iter()
        .filter(|(n, _)| n == "token")
        .map(|(_, d)| json(d)["text"].as_str().unwrap().split_whitespace().count())
        .sum();
    assert_eq!(words, 3, "three tokens, then silence, then the timeout");

    let body = post_text(
        h.url("/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": true}),
    )
    .await;
    let events = sse(&body);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert_eq!(
        json(&events[events.len() - 2].1)["error"]["code"],
        "upstream_timeout"
    );
    assert!(h.idle());
    let metrics = h.metrics_text().await;
    assert!(metrics.contains("outcome=\"upstream_timeout\""));
    // The relay histogram is the gateway's own time from a read to its write: the engine's
    // silence before each timeout (3 s each) is not in it.
    let relayed = metric(&metrics, "tutor_gateway_relay_seconds_sum");
    assert!(relayed < 6.0, "{relayed} s relayed");
    h.shutdown().await;
}

#[tokio::test]
async fn models_are_relayed_from_the_upstream() {
    let h = harness(FAST, |_| {}).await;
    let v: serde_json::Value = send_json(client().get(h.url("/v1/models"))).await;
    assert_eq!(v["data"][0]["id"], "meta-llama/Llama-3.1-8B-Instruct");
    assert_eq!(send(client().get(h.url("/readyz"))).await.status(), 200);
    let _ = Lane::Small;
    h.shutdown().await;
}

/// Clients written for vLLM probe its own routes first (guidellm refuses a server whose
/// `GET /health` is a 404): the gateway answers them like vLLM does.
#[tokio::test]
async fn vllm_probe_routes_answer_like_vllm() {
    let h = harness(FAST, |_| {}).await;
    for (method, path) in [("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")] {
        let req = match method {
            "GET" => client().get(h.url(path)),
            _ => client().post(h.url(path)),
        };
        assert_eq!(send(req).await.status(), 200, "{method} {path}");
    }
    let version = tutor_testkit::get_json(h.url("/version")).await;
    assert_eq!(
        version["version"],
        vllm_sim::VLLM_VERSION,
        "relayed from vLLM"
    );
    let resp = send(
        client()
            .post(h.url("/tokenize"))
            .json(&json!({"prompt": "one two three"})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let tokens: serde_json::Value = resp.json().await.unwrap();
    let count = tokens["count"].as_u64().unwrap();
    assert!(count >= 3, "the engine's own count: {tokens}");
    assert_eq!(tokens["tokens"].as_array().unwrap().len() as u64, count);
    // vLLM counts a tokenize request at any length: a chat longer than the model goes through
    // (the same body on /v1/chat/completions is refused as too long).
    let long = json!({"messages": [{"role": "user", "content": "word ".repeat(25_000)}]});
    let resp = send(client().post(h.url("/tokenize")).json(&long)).await;
    assert_eq!(resp.status(), 200);
    let counted: serde_json::Value = resp.json().await.unwrap();
    assert!(
        counted["count"].as_u64().unwrap() > 16_384,
        "{}",
        counted["count"]
    );
    // An answer over 1 MiB (300,000 ids) comes whole: it used to be cut at 1 MiB, a 200 whose
    // JSON did not parse.
    let huge = json!({"prompt": "word ".repeat(300_000)});
    let resp = send(client().post(h.url("/tokenize")).json(&huge)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.len() > 1 << 20, "{} bytes", text.len());
    let counted: serde_json::Value = serde_json::from_str(&text).expect("whole JSON");
    assert_eq!(
        counted["tokens"].as_array().unwrap().len() as u64,
        counted["count"].as_u64().unwrap()
    );
    let mut chat = long.clone();
    chat["max_tokens"] = json!(1);
    let refused = send(client().post(h.url("/v1/chat/completions")).json(&chat)).await;
    assert_eq!(refused.status(), 400);
    // vLLM's validation errors come back with vLLM's status and shape.
    let bad = send(
        client()
            .post(h.url("/tokenize"))
            .json(&json!({"no_prompt": true})),
    )
    .await;
    assert_eq!(bad.status(), 400);
    let body: serde_json::Value = bad.json().await.unwrap();
    assert!(body["error"]["message"].is_string(), "{body}");
    h.shutdown().await;
}

/// With vLLM down, the relayed probe routes say so (503) instead of hanging or pretending.
#[tokio::test]
async fn relayed_probe_routes_report_an_unreachable_engine() {
    let refused = tutor_testkit::RefusedPort::new();
    let h = harness(FAST, |c| {
        c.upstream.base_url = refused.url();
    })
    .await;
    let version = send(client().get(h.url("/version"))).await;
    assert_eq!(version.status(), 503);
    let tokenize = send(
        client()
            .post(h.url("/tokenize"))
            .json(&json!({"prompt": "hi"})),
    )
    .await;
    assert_eq!(tokenize.headers()["retry-after"], "1");
    assert_error(tokenize, 503, "upstream_unavailable").await;
    assert_eq!(
        send(client().get(h.url("/health"))).await.status(),
        200,
        "liveness is the gateway's own, as /healthz"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn answer_events_carry_ids_and_a_reconnect_is_told_to_stop() {
    let h = harness(FAST, |_| {}).await;
    let url = h.url("/answer");
    let body = send_text(
        client()
            .get(&url)
            .query(&[("prompt", "what is a closure?"), ("max_output_tokens", "5")]),
    )
    .await;
    // `meta` has an id too: a browser cut off before the first token reconnects with it.
    assert!(
        body.starts_with("retry: 3000\nid: 0\nevent: meta\n"),
        "{body}"
    );
    let ids: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .skip(1)
        .collect();
    let tokens = sse(&body).iter().filter(|(n, _)| n == "token").count();
    let expected: Vec<String> = (1..=tokens).map(|i| i.to_string()).collect();
    assert_eq!(
        &ids[..tokens],
        expected.as_slice(),
        "token events numbered from 1"
    );
    assert_eq!(ids[tokens..], ["end"], "the last event is `end`");
    assert!(body.contains("id: end\nevent: done\n"), "{body}");
    // A browser EventSource reconnects with the last id: 204 stops it, nothing is generated.
    let again = send(
        client()
            .get(&url)
            .query(&[("prompt", "what is a closure?")])
            .header("last-event-id", "end"),
    )
    .await;
    assert_eq!(again.status(), 204);
    // One cut off after `meta`, before its first token, reconnects with `0`: stopped too.
    let early = send(
        client()
            .get(&url)
            .query(&[("prompt", "what is a closure?")])
            .header("last-event-id", "0"),
    )
    .await;
    assert_eq!(early.status(), 204);
    let m = h.metrics_text().await;
    assert_eq!(family_total(&m, "tutor_gateway_requests_total"), 1.0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_vllm_with_an_api_key_is_called_with_it() {
    const KEY: &str = "sk-vllm-test-key-123";
    let flags = ["--speed", "50", "--profile", "tiny-test", "--api-key", KEY];
    let file = std::env::temp_dir().join(format!("tutor-gateway-key-{}", std::process::id()));
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    let path = file.to_str().unwrap().to_owned();
    let toml =
        format!("[classify]\ntokenizer = \"heuristic\"\n[upstream]\napi_key_file = \"{path}\"\n");
    let keyed = tutor_gateway::config::Config::from_toml_str(&toml).unwrap();
    assert!(
        !format!("{keyed:?}").contains(KEY),
        "the key never shows in the config's Debug"
    );
    let h = harness(&flags, |c| {
        c.upstream.api_key = keyed.upstream.api_key.clone()
    })
    .await;
    let resp = send(
        client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 3})),
    )
    .await;
    assert_eq!(sse(&resp.text().await.unwrap()).last().unwrap().0, "done");
    assert_eq!(send(client().get(h.url("/v1/models"))).await.status(), 200);
    h.shutdown().await;
    // Without the key, vLLM's 401 is the gateway's problem, not the client's: a 401 would
    // tell the client its own key is wrong.
    let h = harness(&flags, |_| {}).await;
    let resp = send(
        client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 3})),
    )
    .await;
    let err = assert_error(resp, 502, "upstream_error").await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("upstream.api_key"), "{message}");
    h.shutdown().await;
    std::fs::remove_file(file).unwrap();
}

/// A TLS front for `backend` (`127.0.0.1:port`), with the test certificate for 127.0.0.1 that
/// `tests/fixtures/tls/ca.pem` signed; its `https://` URL.
async fn tls_front(backend: std::net::SocketAddr) -> String {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    url
}

#[tokio::test]
async fn tls_to_a_vllm_whose_certificate_a_private_ca_signed() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(FAST))
        .await
        .unwrap();
    let front = tls_front(sim.addr).await;
    let ca = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls/ca.pem");
    let toml = format!(
        "[classify]\ntokenizer = \"heuristic\"\n[upstream]\nbase_url = \"{front}\"\nca_file = \"{}\"\n",
        ca.display()
    );
    let trusting = tutor_gateway::config::Config::from_toml_str(&toml).unwrap();
    let h = harness(FAST, |c| c.upstream = trusting.upstream.clone()).await;
    let resp = send(
        client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 3})),
    )
    .await;
    assert_eq!(sse(&resp.text().await.unwrap()).last().unwrap().0, "done");
    h.shutdown().await;
    // Without the CA the certificate is not trusted: vLLM is unreachable, not silently used.
    let h = harness(FAST, |c| c.upstream.base_url = front.clone()).await;
    let resp = send(
        client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 3})),
    )
    .await;
    assert_eq!(resp.status(), 503);
    h.shutdown().await;
    sim.shutdown().await;
}

/// vLLM's 5xx and its errors mid-stream reach the client by status and error type only: their
/// wording (an engine traceback can quote the prompt or the answer) stays out of the message,
/// which also goes into job records and webhooks.
#[tokio::test]
async fn the_engines_own_failure_text_never_reaches_the_client() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --fail-rate 1"),
        |_| {},
    )
    .await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let r = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(r.status(), 502);
    let err: serde_json::Value = r.json().await.unwrap();
    let message = err["error"]["message"].as_str().unwrap();
    assert!(!message.contains("injected"), "{message}");
    assert!(
        message.contains("500") && message.contains("InternalServerError"),
        "{message}"
    );
    h.shutdown().await;

    let h = harness(
        &flags("--speed 50 --profile tiny-test --midstream-error-rate 1 --error-after-tokens 2"),
        |_| {},
    )
    .await;
    let stream = json!({"prompt": "def f():", "max_tokens": 200, "stream": true});
    let text = post_text(h.url("/v1/completions"), &stream).await;
    assert!(text.contains("upstream_error"), "{text}");
    assert!(!text.contains("injected"), "{text}");
    assert!(text.contains("InternalServerError"), "{text}");
    assert!(h.idle());
    h.shutdown().await;
}
