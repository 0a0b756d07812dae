//! A cut answer continued (`continue_final_message`, `add_generation_prompt`) as vLLM renders
//! and validates it: the continued answer goes on where the cut one stopped, so a resumed
//! answer equals an uninterrupted one, and its prompt finds the original one in the prefix
//! cache.

mod common;

use common::*;
use serde_json::{json, Value};

const QUESTION: &str = "why does my recursive function overflow the stack?";

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// What [`ask`] adds to continue `cut`, the answer so far, for `max_tokens` more: the question
/// and `cut` as the final assistant message, continued (as the gateway resumes a pre-empted
/// answer).
fn continuing(cut: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": cut},
        ],
        "continue_final_message": true,
        "add_generation_prompt": false,
        "max_tokens": max_tokens,
    })
}

/// The text of a chat stream and its usage.
fn read(body: &str) -> (String, Value) {
    let events = sse_events(body);
    assert_eq!(events.last().unwrap(), "[DONE]", "{body}");
    let mut text = String::new();
    let mut usage = Value::Null;
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if !c["usage"].is_null() {
            usage = c["usage"].clone();
        }
    }
    (text, usage)
}

#[tokio::test]
async fn a_continued_answer_goes_on_where_the_cut_one_stopped() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --enable-prompt-tokens-details",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    // The whole answer, uninterrupted.
    let (whole, usage) = read(&post_text(&url, &ask(json!({"max_tokens": 40}))).await);
    assert_eq!(usage["completion_tokens"], 40);
    // Cut after 15 tokens, then continued for the 25 left.
    let (cut, _) = read(&post_text(&url, &ask(json!({"max_tokens": 15}))).await);
    let resumed = continuing(&cut, 25);
    let (rest, usage) = read(&post_text(&url, &ask(resumed.clone())).await);
    assert_eq!(format!("{cut}{rest}"), whole, "one answer, each token once");
    assert_eq!(usage["completion_tokens"], 25);
    // Its prompt is the original prompt and the cut text: the original is served from the
    // prefix cache (whole 16-token blocks of it).
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(cached >= 16, "the original prompt hits: {usage}");
    // And so does the cut answer: vLLM caches a request's full output blocks too, so every
    // full block of the continued prompt but the one holding its last token is a hit.
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached, (prompt - 1) / 16 * 16, "{usage}");
    // /tokenize renders it alike.
    let mut tokenize = resumed.clone();
    tokenize.as_object_mut().unwrap().remove("max_tokens");
    let counted = send_json(
        client()
            .post(format!("{}/tokenize", s.url()))
            .json(&tokenize),
    )
    .await;
    assert_eq!(counted["count"], usage["prompt_tokens"], "{counted}");
    // continue_final_message alone (add_generation_prompt left to its default) is accepted,
    // as vLLM's validator reads the fields as sent.
    let mut alone = resumed.clone();
    alone
        .as_object_mut()
        .unwrap()
        .remove("add_generation_prompt");
    let (same, _) = read(&post_text(&url, &ask(alone)).await);
    assert_eq!(same, rest);
    s.shutdown().await;
}

/// The answer and the reasoning of a chat stream.
fn read_both(body: &str) -> (String, String) {
    let (mut content, mut reasoning) = (String::new(), String::new());
    for e in sse_events(body).iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        let delta = &c["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or_default());
        reasoning.push_str(delta["reasoning"].as_str().unwrap_or_default());
    }
    (content, reasoning)
}

/// A reasoning model's answer continued: it goes on after the reasoning where the cut one
/// stopped, and comes out as content only when the chat template closes the think block
/// before the continued message (vLLM's parser finds the reasoning ended in the prompt); else
/// vLLM's `deepseek_r1` parser streams it as reasoning.
#[tokio::test]
async fn a_reasoning_models_continued_answer_is_streamed_as_its_template_lets_the_parser_read_it() {
    for closes in [false, true] {
        let extra = if closes {
            " --template-closes-reasoning"
        } else {
            ""
        };
        let s = sim(&flags(&format!(
            "--speed 50 --profile tiny-test --reasoning-tokens 5{extra}"
        )))
        .await;
        let url = format!("{}/v1/chat/completions", s.url());
        let (whole, thought) = read_both(&post_text(&url, &ask(json!({"max_tokens": 40}))).await);
        assert_eq!(thought.split_whitespace().count(), 5);
        assert_eq!(whole.split_whitespace().count(), 35);
        let (cut, _) = read_both(&post_text(&url, &ask(json!({"max_tokens": 15}))).await);
        assert_eq!(cut.split_whitespace().count(), 10);
        let (content, reasoning) = read_both(&post_text(&url, &ask(continuing(&cut, 25))).await);
        let rest = if closes {
            assert!(reasoning.is_empty(), "{reasoning}");
            content
        } else {
            assert!(content.is_empty(), "{content} / {reasoning}");
            reasoning
        };
        assert_eq!(format!("{cut}{rest}"), whole, "the rest of the answer");
        s.shutdown().await;
    }
}

/// The finish reason of a chat stream.
fn finish(body: &str) -> String {
    sse_events(body)
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_owned))
        .next_back()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_continued_answer_stops_where_the_uninterrupted_one_would_have() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --mean-output-tokens 60",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    // Its own length, drawn from the seed and the prompt: it stops before the limit.
    let no_eos = |extra: Value| {
        let mut body = ask(extra);
        body["ignore_eos"] = json!(false);
        body["seed"] = json!(7);
        body
    };
    let whole_body = post_text(&url, &no_eos(json!({"max_tokens": 1000}))).await;
    let (whole, usage) = read(&whole_body);
    let n = usage["completion_tokens"].as_u64().unwrap() as u32;
    assert_eq!(finish(&whole_body), "stop", "{usage}");
    assert!(n >= 2, "{usage}");
    // Cut halfway, then continued with the rest of the limit.
    let k = n / 2;
    let (cut, _) = read(&post_text(&url, &no_eos(json!({"max_tokens": k}))).await);
    let rest_body = post_text(&url, &no_eos(continuing(&cut, 1000 - k))).await;
    let (rest, usage) = read(&rest_body);
    assert_eq!(format!("{cut}{rest}"), whole);
    assert_eq!(usage["completion_tokens"], n - k);
    assert_eq!(finish(&rest_body), "stop");
    s.shutdown().await;
}

#[tokio::test]
async fn the_prompt_ends_as_add_generation_prompt_and_continue_final_message_say() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let tokenize = format!("{}/tokenize", s.url());
    let count = |extra: Value| {
        let mut body = json!({"messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": " the loop"},
        ]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let url = tokenize.clone();
        async move {
            let v = send_json(client().post(url).json(&body)).await;
            v["count"].as_u64().unwrap()
        }
    };
    let opened = count(json!({})).await;
    let closed = count(json!({"add_generation_prompt": false})).await;
    let continued =
        count(json!({"continue_final_message": true, "add_generation_prompt": false})).await;
    // The default opens the assistant's turn after the last message; false leaves it closed;
    // continuing drops the last message's end marker as well.
    assert!(
        opened > closed && closed > continued,
        "{opened} {closed} {continued}"
    );
    s.shutdown().await;
}

/// A 400 whose message says `says`.
async fn refused(resp: reqwest::Response, says: &str) {
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{body}");
}

#[tokio::test]
async fn bad_continuations_get_vllms_errors() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let resp = send(client().post(&url).json(&ask(json!({
        "messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "the"}],
        "continue_final_message": true,
        "add_generation_prompt": true,
        "max_tokens": 4,
    }))))
    .await;
    refused(
        resp,
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
    )
    .await;
    // Nothing to continue.
    let resp = send(client().post(&url).json(&ask(json!({
        "messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": " "}],
        "continue_final_message": true,
        "add_generation_prompt": false,
        "max_tokens": 4,
    }))))
    .await;
    refused(resp, "final message does not appear").await;
    s.shutdown().await;
}

/// A cut answer's blocks are evicted from the GPU's prefix cache (a long request in between
/// needs every block) before it is continued: with `--kv-offloading-size` the continuation
/// loads them from CPU memory (counted in `cached_tokens`, as vLLM counts them); without, it
/// recomputes them.
#[tokio::test]
async fn with_kv_offloading_an_evicted_cut_answer_is_loaded_not_recomputed() {
    for offload in [false, true] {
        let extra = if offload {
            " --kv-offloading-size 1"
        } else {
            ""
        };
        let s = sim(&flags(&format!(
            "--speed 50 --profile tiny-test --enable-prompt-tokens-details \
             --num-gpu-blocks 64 --max-model-len 1024{extra}"
        )))
        .await;
        let url = format!("{}/v1/chat/completions", s.url());
        let (cut, _) = read(&post_text(&url, &ask(json!({"max_tokens": 15}))).await);
        // 64 blocks of 16 tokens: this one takes every block the cut answer left cached.
        // (Words of four letters, one token each: a digit is a token of its own.)
        let letter = |n: usize| char::from(b'a' + (n % 26) as u8);
        let filler: String = (0..960)
            .map(|i| format!("w{}{}{} ", letter(i / 676), letter(i / 26), letter(i)))
            .collect();
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": filler}],
            "max_tokens": 40,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let (_, usage) = read(&post_text(&url, &body).await);
        let filled = usage["prompt_tokens"].as_u64().unwrap() + 40;
        assert!(filled > 63 * 16, "the filler needs every block: {usage}");
        let (_, usage) = read(&post_text(&url, &ask(continuing(&cut, 25))).await);
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        if offload {
            assert_eq!(cached, (prompt - 1) / 16 * 16, "loaded: {usage}");
            let e = engine(&s).await;
            assert_eq!(e["offload_loaded_blocks"], cached / 16, "{e}");
            assert!(e["offload_stored_blocks"].as_u64() > Some(63), "{e}");
        } else {
            assert_eq!(cached, 0, "evicted and recomputed: {usage}");
        }
        s.shutdown().await;
    }
}

#[tokio::test]
async fn kv_offloading_refuses_what_it_does_not_simulate() {
    for (extra, says) in [
        (
            "--kv-offloading-size 1 --kv-offloading-backend lmcache",
            "not simulated",
        ),
        ("--kv-offloading-size 0", "positive number of GiB"),
        ("--kv-offloading-size 1 --profile fixed", "batched profile"),
    ] {
        let args = vllm_sim::SimArgs::for_test(&flags(extra));
        let Err(err) = vllm_sim::start(&args).await else {
            panic!("{extra}: started");
        };
        assert!(format!("{err:#}").contains(says), "{extra}: {err:#}");
    }
}
