//! Fields checked the way vLLM reads them, and `/tokenize` inside admission.
//!
//! vLLM's request models coerce types (pydantic lax mode: `"20"` and `20.0` are 20, `"true"`
//! is true), so a check that reads only a JSON integer or boolean lets the same value through
//! in another spelling. `echo` with log-probabilities is `prompt_logprobs` under another name.
//! Stop strings, logit biases and guides are engine CPU outside any lane; media URLs are
//! fetched by the engine from wherever they point. `/tokenize` renders the same chat template
//! and was relayed unchecked, outside any lane.

use std::time::Duration;

use serde_json::{json, Value};
use tutor_gateway::lane::Lane;

use crate::common::*;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

/// Every stream stalls after its first token with the connection open: a seat held for as long
/// as the test needs.
const STALLING: &str = "--speed 50 --profile tiny-test --stall-after-tokens 1";

/// A short chat body with `extra` fields.
fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// A short completions body with `extra` fields.
fn completion(extra: Value) -> Value {
    let mut body = json!({"prompt": "hi", "max_tokens": 3});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// POSTs `body` to `path`: the status and the JSON answer.
async fn post(h: &Harness, path: &str, body: &Value) -> (u16, Value) {
    let resp = send(client().post(h.url(path)).json(body)).await;
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `body` on `path` is a 400 in the OpenAI shape naming `param`.
async fn refused(h: &Harness, path: &str, body: &Value, param: &str) {
    let (status, answer) = post(h, path, body).await;
    let shown = body.to_string();
    let shown = &shown[..shown.len().min(300)];
    assert_eq!(status, 400, "{shown} -> {answer}");
    assert_eq!(
        answer["error"]["code"], "bad_request",
        "{shown} -> {answer}"
    );
    assert_eq!(answer["error"]["param"], param, "{shown} -> {answer}");
}

#[tokio::test]
async fn coerced_numbers_and_booleans_are_judged_by_the_value_vllm_reads() {
    let h = harness(FAST, |_| {}).await;
    for (path, body, param) in [
        // Above server.max_logprobs (5) once read as vLLM reads it.
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 20.0})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": "true", "top_logprobs": "20"})),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            completion(json!({"logprobs": "20"})),
            "logprobs",
        ),
        (
            "/v1/completions",
            completion(json!({"logprobs": 20.0})),
            "logprobs",
        ),
        // Work multipliers spelled as strings or numbers.
        (
            "/v1/chat/completions",
            chat(json!({"use_beam_search": "true"})),
            "use_beam_search",
        ),
        (
            "/v1/completions",
            completion(json!({"use_beam_search": "yes"})),
            "use_beam_search",
        ),
        (
            "/v1/completions",
            completion(json!({"best_of": "4"})),
            "best_of",
        ),
        // min_tokens above the declared output (3) once read.
        (
            "/v1/chat/completions",
            chat(json!({"min_tokens": "500"})),
            "min_tokens",
        ),
        (
            "/v1/completions",
            completion(json!({"min_tokens": 500.0})),
            "min_tokens",
        ),
        // -1: every token of the vocabulary, to vLLM.
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": -1})),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            completion(json!({"logprobs": "-1"})),
            "logprobs",
        ),
        // vLLM would stream nothing while the model reasons: output the gateway cannot count.
        (
            "/v1/chat/completions",
            chat(json!({"include_reasoning": "false"})),
            "include_reasoning",
        ),
        // What vLLM could not read either is named, never passed on unjudged.
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": "abc"})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 2.5})),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            completion(json!({"min_tokens": "lots"})),
            "min_tokens",
        ),
    ] {
        refused(&h, path, &body, param).await;
    }
    assert!(
        h.sim_requests().await.is_empty(),
        "no refused request reached the engine"
    );
    // Within bounds: accepted, and forwarded as the value judged.
    let (status, answer) = post(
        &h,
        "/v1/chat/completions",
        &chat(json!({"logprobs": "true", "top_logprobs": "3", "max_tokens": "3"})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(h.sim_requests().await.last().unwrap()["max_tokens"], 3);
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn echo_with_logprobs_is_refused_like_prompt_logprobs() {
    let h = harness(FAST, |_| {}).await;
    for (path, body) in [
        (
            "/v1/completions",
            completion(json!({"echo": true, "logprobs": 1})),
        ),
        (
            "/v1/completions",
            completion(json!({"echo": "true", "logprobs": "0"})),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"echo": true, "logprobs": true, "top_logprobs": 2})),
        ),
        // Chat's top_logprobs is 0 in vLLM when left out or null: any echo asks for prompt
        // logprobs.
        ("/v1/chat/completions", chat(json!({"echo": 1}))),
        (
            "/v1/chat/completions",
            chat(json!({"echo": true, "top_logprobs": null})),
        ),
    ] {
        refused(&h, path, &body, "echo").await;
    }
    assert!(h.sim_requests().await.is_empty());
    // Echo without log-probabilities computes nothing more.
    let body = completion(json!({"echo": true}));
    let (status, answer) = post(&h, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{body} -> {answer}");
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn oversized_stop_logit_bias_and_guides_are_refused() {
    let h = harness(FAST, |_| {}).await;
    // Far past each field's own bound, within the JSON values a body may hold (more is refused
    // before parsing, below).
    let stops: Vec<String> = (0..1_000).map(|i| format!("s{i}")).collect();
    let bias: serde_json::Map<String, Value> =
        (0..1_000).map(|i| (i.to_string(), json!(1))).collect();
    let ids: Vec<u32> = (0..50_000).collect();
    let regex = "(a|b)*".repeat(20_000);
    let schema = json!({"type": "object", "properties": (0..5_000)
        .map(|i| (format!("p{i}"), json!({"type": "string"})))
        .collect::<serde_json::Map<String, Value>>()});
    for (body, param) in [
        (chat(json!({"stop": stops})), "stop"),
        (chat(json!({"stop": "x".repeat(100_000)})), "stop"),
        (chat(json!({"bad_words": stops})), "bad_words"),
        (chat(json!({"logit_bias": bias})), "logit_bias"),
        (chat(json!({"allowed_token_ids": ids})), "allowed_token_ids"),
        (chat(json!({"stop_token_ids": ids})), "stop_token_ids"),
        (chat(json!({"guided_regex": regex})), "guided_regex"),
        (chat(json!({"guided_grammar": regex})), "guided_grammar"),
        (chat(json!({"guided_json": schema})), "guided_json"),
        (
            chat(
                json!({"guided_choice": (0..1_000).map(|i| format!("{i:032}")).collect::<Vec<_>>()}),
            ),
            "guided_choice",
        ),
        (
            chat(json!({"structured_outputs": {"regex": regex}})),
            "structured_outputs",
        ),
        (
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "big", "schema": schema}}})),
            "response_format",
        ),
    ] {
        refused(&h, "/v1/chat/completions", &body, param).await;
    }
    refused(
        &h,
        "/v1/completions",
        &completion(json!({"guided_regex": "(a|b)*".repeat(20_000)})),
        "guided_regex",
    )
    .await;
    // A hundred thousand stop strings: more JSON values than any request needs, refused
    // before anything parses them.
    let countless: Vec<String> = (0..100_000).map(|i| format!("s{i}")).collect();
    let (status, answer) = post(
        &h,
        "/v1/chat/completions",
        &chat(json!({"stop": countless})),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (413, &json!("body_too_large"))
    );
    assert!(h.sim_requests().await.is_empty());
    // Within the bounds: accepted.
    let body = chat(json!({"stop": ["\n\n", "END"], "logit_bias": {"42": -100},
        "guided_json": {"type": "string", "pattern": "^[a-z]+$"}, "stop_token_ids": [2]}));
    let (status, answer) = post(&h, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

/// A guide a few bytes long can slow every step of the batch (xgrammar 0.2.9, measured in
/// `docs/results/guides/`): a count above 128 is built otherwise, and a mask fill (made for each
/// guided request at every step) then took 8x (`maxItems` 200) to 8,400x (`pattern`
/// `[a-z]{1,129}`, 28 ms) the plain guide's; a regex or grammar guide of a few dozen bytes,
/// milliseconds to seconds. By default regex and grammar guides are refused, and in JSON
/// schemas a count or a pattern's weight past 128 is; the same schemas at 128 pass. With
/// `fields.regex_guides` a regex is taken, weighed the same way.
#[tokio::test]
async fn a_guide_whose_structure_slows_every_step_is_refused() {
    let h = harness(FAST, |_| {}).await;
    let tool = |count: u32| {
        json!({"type": "function", "function": {"name": "pick", "parameters":
            {"type": "object", "properties": {"ids": {"type": "array", "maxItems": count}}}}})
    };
    let cases = |n: u32| {
        let pattern = format!("^[a-z]{{1,{n}}}$");
        vec![
            (
                chat(json!({"guided_json": {"type": "array", "minItems": n}})),
                "guided_json",
            ),
            (
                chat(
                    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a",
                    "schema": {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}}}}),
                ),
                "response_format",
            ),
            (
                chat(json!({"tools": [tool(n)], "tool_choice": "required"})),
                "tool_choice",
            ),
            // A call left to the model: vLLM's strict tool calling compiles the tools too.
            (chat(json!({"tools": [tool(n)]})), "tools"),
            (
                chat(json!({"tools": [tool(n)], "tool_choice": "auto"})),
                "tools",
            ),
        ]
    };
    let mut over = cases(129);
    // Counts of 16 each, nested: 256 atoms.
    over.push((
        chat(json!({"guided_json": {"type": "string", "pattern": "^([a-z]{1,16}){1,16}$"}})),
        "guided_json",
    ));
    // Regex and grammar guides, however small.
    over.push((chat(json!({"guided_regex": "[a-z]?"})), "guided_regex"));
    over.push((
        chat(json!({"structured_outputs": {"grammar": "root ::= [a-z]"}})),
        "structured_outputs",
    ));
    for (body, param) in over {
        refused(&h, "/v1/chat/completions", &body, param).await;
    }
    assert!(h.sim_requests().await.is_empty());
    for (body, param) in cases(128) {
        let (status, answer) = post(&h, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{param}: {answer}");
    }
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;

    let h = harness(FAST, |c| c.fields.regex_guides = true).await;
    refused(
        &h,
        "/v1/chat/completions",
        &chat(json!({"guided_regex": "([a-z]{1,16} ){0,20}"})),
        "guided_regex",
    )
    .await;
    let (status, answer) = post(
        &h,
        "/v1/chat/completions",
        &chat(json!({"guided_regex": "[a-z]{1,128}"})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

/// A chat whose one user message holds a text part and a media part `key` pointing at `url`.
fn with_media(key: &str, url: &str) -> Value {
    json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is in this?"},
        {"type": key, key: {"url": url}}]}], "max_tokens": 3})
}

#[tokio::test]
async fn media_urls_reach_the_engine_only_as_data_or_from_listed_hosts() {
    let h = harness(FAST, |c| {
        c.fields.media_hosts = vec!["media.example.edu".into()];
    })
    .await;
    let engine = h.sim.url();
    for (key, url) in [
        ("image_url", "http://169.254.169.254/latest/meta-data/iam/"),
        ("image_url", "http://127.0.0.1:8000/metrics"),
        ("image_url", engine.as_str()),
        ("image_url", "http://[::1]/x.png"),
        ("image_url", "http://0x7f.1/x.png"),
        ("image_url", "https://media.example.edu@127.0.0.1/x.png"),
        ("image_url", "file:///etc/passwd"),
        ("video_url", "http://10.0.0.1/v.mp4"),
        ("audio_url", "http://localhost/a.wav"),
        // A listed host's other ports: its admin port, a Redis beside it.
        ("image_url", "http://media.example.edu:6379/"),
        ("image_url", "https://media.example.edu:8080/x.png"),
    ] {
        refused(
            &h,
            "/v1/chat/completions",
            &with_media(key, url),
            "messages",
        )
        .await;
    }
    // The same through /answer (and so through jobs).
    let (status, answer) = post(
        &h,
        "/answer",
        &json!({"messages": with_media("image_url", "http://169.254.169.254/")["messages"]}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(h.sim_requests().await.is_empty());
    for url in [
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
        "https://media.example.edu/cat.png",
    ] {
        let (status, answer) = post(&h, "/v1/chat/completions", &with_media("image_url", url)).await;
        assert_eq!(status, 200, "{url} -> {answer}");
    }
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn tokenize_gets_the_same_field_checks_as_v1() {
    let h = harness(FAST, |_| {}).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    for (body, param) in [
        (
            json!({"messages": messages, "chat_template": "{% for m in messages %}{{ m }}{% endfor %}"}),
            "chat_template",
        ),
        (
            json!({"messages": messages, "documents": [{"text": "x"}]}),
            "documents",
        ),
        (
            json!({"messages": with_media("image_url", "http://169.254.169.254/")["messages"]}),
            "messages",
        ),
        (json!({"messages": "not a list"}), "messages"),
        (
            json!({"prompt": "hi", "add_special_tokens": true, "best_of": "3"}),
            "best_of",
        ),
    ] {
        refused(&h, "/tokenize", &body, param).await;
    }
    for body in [
        json!({"messages": messages, "return_token_strs": true}),
        json!({"prompt": "hi there"}),
    ] {
        let (status, answer) = post(&h, "/tokenize", &body).await;
        assert_eq!(status, 200, "{body} -> {answer}");
        assert!(answer["count"].as_u64().unwrap() > 0, "{answer}");
    }
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn tokenize_waits_for_a_small_lane_seat() {
    let h = harness(&flags(STALLING), |c| {
        set_lane(c, Lane::Small, 1);
        c.lanes.small.queue.timeout = Duration::from_secs(60);
        c.upstream.idle_timeout = Duration::from_secs(60);
    })
    .await;
    // The small lane's one seat, held by a stream stalled after its first token.
    let blocker = send(client().post(h.url("/v1/chat/completions")).json(
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
                      "stream": true}),
    ))
    .await;
    assert_eq!(blocker.status(), 200);
    assert_eq!(h.in_flight(Lane::Small), 1);
    let url = h.url("/tokenize");
    let tokenize = tokio::spawn(async move {
        let resp = send(client().post(url).json(&json!({"prompt": "count me"}))).await;
        (resp.status().as_u16(), resp.text().await.unwrap())
    });
    eventually("the tokenize call waits in the small lane's queue", || {
        h.queued(Lane::Small) == 1
    })
    .await;
    assert!(!tokenize.is_finished(), "no answer while the lane is full");
    assert!(h.in_flight(Lane::Small) <= 1);
    // The seat comes back: the tokenize call gets it and its answer.
    drop(blocker);
    let (status, body) = tokenize.await.unwrap();
    assert_eq!(status, 200, "{body}");
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

/// `"max_tokens": null` on `/v1/completions` is 16 tokens to the gateway (OpenAI's default,
/// what it reserves) but "up to the model's length" to vLLM: the engine gets the limit the
/// gateway counted. `stream_interval` (vLLM sends one chunk every N tokens, so the output
/// count arrives N tokens late) is refused.
#[tokio::test]
async fn a_null_output_limit_is_the_limit_counted_and_batched_chunks_are_refused() {
    let h = harness(FAST, |_| {}).await;
    let (status, answer) = post(
        &h,
        "/v1/completions",
        &json!({"prompt": "def f(x):", "max_tokens": null, "ignore_eos": true}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 16, "{answer}");
    let seen = h.sim_requests().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["max_tokens"], 16, "{seen:?}");
    refused(
        &h,
        "/v1/chat/completions",
        &chat(json!({"stream_interval": 1000, "stream": true})),
        "stream_interval",
    )
    .await;
    refused(
        &h,
        "/v1/completions",
        &json!({"prompt": "x", "stream_interval": 64}),
        "stream_interval",
    )
    .await;
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}
