//! Shared helpers: start a simulator on 127.0.0.1:0 and read its SSE streams.
#![allow(dead_code, missing_docs)]

use std::time::Duration;

use serde_json::Value;
use vllm_sim::{SimArgs, SimServer};

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

pub async fn sim(extra: &[&str]) -> SimServer {
    vllm_sim::start(&SimArgs::for_test(extra))
        .await
        .expect("simulator starts")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A user message of about `words` heuristic tokens (each word below is one token).
pub fn words(n: usize, salt: &str) -> String {
    let mut s = String::from(salt);
    for i in 0..n {
        s.push_str([" cat", " dog", " map", " key", " fn", " let"][i % 6]);
    }
    s
}

/// POSTs `body` as JSON and reads the whole answer as text.
pub async fn post_text(url: impl reqwest::IntoUrl, body: &Value) -> String {
    client()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub fn chat_body(content: &str, max_tokens: u32, stream: bool) -> Value {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// Splits an SSE body into `data:` payloads, asserting vLLM's framing: only `data: ` lines,
/// each event terminated by a blank line.
pub fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "stream must end with a blank line: {body:?}"
    );
    body.trim_end_matches("\n\n")
        .split("\n\n")
        .map(|ev| {
            assert!(!ev.contains('\n'), "one line per event: {ev:?}");
            ev.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without `data: `: {ev:?}"))
                .to_owned()
        })
        .collect()
}

pub async fn get_json(url: String) -> Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub async fn engine(s: &SimServer) -> Value {
    get_json(format!("{}/debug/engine", s.url())).await
}

/// Value of one metric line (exact series text before the value).
pub async fn metric(s: &SimServer, series: &str) -> f64 {
    let text = client()
        .get(format!("{}/metrics", s.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("series {series} missing"))
        .parse()
        .unwrap()
}

pub fn labels() -> String {
    format!("{{engine=\"0\",model_name=\"{MODEL}\"}}")
}

/// Polls `cond` every 10 ms for up to 10 s.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..1000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}
