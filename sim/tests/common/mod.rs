//! Shared helpers: start a simulator on 127.0.0.1:0; HTTP, SSE and scraping come from
//! `tutor-testkit`.
#![allow(dead_code, missing_docs, unused_imports)]

use std::time::Duration;

use serde_json::Value;
use vllm_sim::{SimArgs, SimServer};

pub use tutor_testkit::{
    client, delta_words, eventually, flags, get_json, get_text, message_words, metrics_text,
    post_text, send, send_json, sse_events, words,
};

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

pub async fn sim(extra: &[&str]) -> SimServer {
    vllm_sim::start(&SimArgs::for_test(extra))
        .await
        .expect("simulator starts")
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

pub async fn engine(s: &SimServer) -> Value {
    get_json(format!("{}/debug/engine", s.url())).await
}

/// Value of one metric line (exact series text before the value).
pub async fn metric(s: &SimServer, series: &str) -> f64 {
    tutor_testkit::metric(&metrics_text(&s.url()).await, series)
}

pub fn labels() -> String {
    format!("{{engine=\"0\",model_name=\"{MODEL}\"}}")
}
