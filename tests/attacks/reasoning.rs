//! A reasoning model streams its thinking as `delta.reasoning` (current vLLM) before any
//! content. Those are output tokens: a small-lane request that reasons 3,000 tokens leaves the
//! small lane at its mid-stream limit while it is still reasoning (it used to stay there for
//! the whole reasoning phase), its prefill room comes back at the first reasoning token, the
//! request log counts the reasoning in its output, and the time to first token is the first
//! reasoning token's (the first answer token's time is logged beside it).

use futures::StreamExt;
use serde_json::{json, Value};
use tutor_gateway::config::Config;
use tutor_gateway::lane::Lane;

use crate::common::*;

/// The engine reasons 3,000 tokens before it answers, and stops at its 3,400-token context.
const REASONING_SIM: &[&str] = &[
    "--speed",
    "10",
    "--profile",
    "tiny-test",
    "--max-model-len",
    "3400",
    "--reasoning-tokens",
    "3000",
];

fn reasoning_context(c: &mut Config) {
    c.upstream.max_model_len = 3400.try_into().unwrap();
    c.admission.prefill_budget_tokens = 12_288;
}

/// Reasoning and answer tokens in the complete events of `text` (the simulator writes one word
/// per token).
fn counted(text: &str) -> (usize, usize) {
    let complete = text.rsplit_once("\n\n").map_or("", |(a, _)| a);
    let mut tokens = (0, 0);
    for (_, data) in sse(complete).iter().filter(|(_, d)| d.starts_with('{')) {
        let delta = &json(data)["choices"][0]["delta"];
        let words_of = |v: &Value| v.as_str().unwrap_or("").split_whitespace().count();
        tokens.0 += words_of(&delta["reasoning"]);
        tokens.1 += words_of(&delta["content"]);
    }
    tokens
}

#[tokio::test]
async fn a_small_request_that_reasons_3000_tokens_leaves_the_small_lane_while_reasoning() {
    let h = harness(REASONING_SIM, reasoning_context).await;
    let resp = client()
        .post(h.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "why does my loop never end"}],
                      "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    // Read well past the small lane's limit (256), but still inside the reasoning phase.
    while counted(&text).0 < 300 {
        text.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    assert_eq!(counted(&text).1, 0, "no answer token yet: still reasoning");
    eventually(
        "the reasoning request left the small lane and its prefill room",
        || {
            let s = h.gw.state.admission().snapshot();
            h.in_flight(Lane::Small) == 0 && s.prefill_tokens == 0
        },
    )
    .await;

    while let Some(chunk) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let (reasoning, answer) = counted(&text);
    assert_eq!(reasoning, 3000, "every reasoning token relayed");
    assert!(answer > 0, "the answer follows the reasoning");
    eventually("every counter back to zero", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_lane_promotions_total{from=\"small\",to=\"medium\"}"
        ),
        1.0,
        "it started in the small lane and was promoted"
    );

    let log = h.log.lock().unwrap().clone();
    let line = log
        .iter()
        .find(|l| l["route"] == "chat_completions")
        .expect("the request is logged");
    assert_eq!(line["outcome"], "ok");
    assert_eq!(
        line["output_tokens"].as_u64().unwrap() as usize,
        reasoning + answer,
        "the reasoning is counted as output: {line}"
    );
    let t = &line["timings"];
    let first_token = t["time_to_first_token_ms"].as_f64().unwrap();
    let first_answer = t["time_to_first_answer_ms"].as_f64().unwrap();
    assert!(
        first_token < first_answer,
        "time to first token is the first reasoning token's, before the answer's: {t}"
    );
    h.shutdown().await;
}
