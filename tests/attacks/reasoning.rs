//! A reasoning model streams its thinking as `delta.reasoning` (current vLLM) before any
//! content. Those are output tokens: a small-lane request that reasons 3,000 tokens is cut (or
//! promoted) at the small lane's mid-stream limit while it is still reasoning (it used to run
//! the whole reasoning phase in the small lane), its prefill room comes back at the first
//! reasoning token, the request log counts the reasoning in its output, and the time to first
//! token is the first reasoning token's (the first answer token's time is logged beside it).

use std::num::NonZeroU64;

use serde_json::{json, Value};
use tutor_gateway::config::Config;
use tutor_gateway::lane::Lane;

use crate::common::*;
use crate::one_small_cut_cleaned_up;

/// The engine reasons 3,000 tokens before it answers, and stops at its 3,400-token context.
const REASONING_SIM: &str =
    "--speed 10 --profile tiny-test --max-model-len 3400 --reasoning-tokens 3000";

/// The same engine, slower: 3,000 reasoning tokens take several seconds, the small lane's
/// limit a fraction of that.
const SLOW_REASONING_SIM: &str =
    "--speed 2 --profile tiny-test --max-model-len 3400 --reasoning-tokens 3000";

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

fn thinking() -> Value {
    json!({"messages": [{"role": "user", "content": "why does my loop never end"}],
           "ignore_eos": true, "stream": true})
}

#[tokio::test]
async fn a_small_request_that_reasons_3000_tokens_is_cut_at_the_small_limit_while_reasoning() {
    // The medium lane has no token room for a promotion: past the small lane's limit the
    // request is cut.
    let h = harness(&flags(SLOW_REASONING_SIM), |c| {
        reasoning_context(c);
        c.lanes.medium.max_tokens_in_flight = NonZeroU64::new(1_000).unwrap();
    })
    .await;
    let text = post_text(h.url("/v1/chat/completions"), &thinking()).await;
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let last = json(&events[events.len() - 2].1);
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["tutor_gateway"]["cut"], "lane_limit", "{last}");
    assert_eq!(last["tutor_gateway"]["lane"], "small");
    let after = last["tutor_gateway"]["after_tokens"].as_u64().unwrap() as usize;
    let (reasoning, answer) = counted(&text);
    assert_eq!(answer, 0, "cut before any answer token");
    assert!(
        (257..3000).contains(&after),
        "cut past the small limit, in the reasoning phase: {after}"
    );
    assert_eq!(after, reasoning, "every reasoning token relayed is counted");
    one_small_cut_cleaned_up(&h).await;

    let log = h.log.lock().unwrap().clone();
    let line = log
        .iter()
        .find(|l| l["route"] == "chat_completions")
        .expect("the request is logged");
    assert_eq!(line["outcome"], "cut");
    assert_eq!(line["lane"], "small");
    assert_eq!(
        line["output_tokens"].as_u64().unwrap() as usize,
        after,
        "the reasoning is counted as output: {line}"
    );
    let t = &line["timings"];
    assert!(
        t["time_to_first_token_ms"].as_f64().is_some(),
        "a first token was recorded: the first reasoning token: {t}"
    );
    assert!(
        t["time_to_first_answer_ms"].is_null(),
        "no answer token ever came: {t}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_small_request_that_reasons_3000_tokens_leaves_the_small_lane_while_reasoning() {
    let h = harness(&flags(REASONING_SIM), reasoning_context).await;
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&thinking()),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = Streamed::new(resp);
    // Read well past the small lane's limit (256), but still inside the reasoning phase.
    body.until(|text| counted(text).0 >= 300).await;
    assert_eq!(
        counted(&body.text).1,
        0,
        "no answer token yet: still reasoning"
    );
    eventually(
        "the reasoning request left the small lane and its prefill room",
        || {
            let s = h.gw.state.admission().snapshot();
            h.in_flight(Lane::Small) == 0 && s.prefill_tokens == 0
        },
    )
    .await;

    let text = body.rest().await;
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let (reasoning, answer) = counted(&text);
    assert_eq!(reasoning, 3000, "every reasoning token relayed");
    assert!(answer > 0, "the answer follows the reasoning");
    eventually("every counter back to zero", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(&m, SMALL_TO_MEDIUM),
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
