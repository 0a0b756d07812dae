//! Tokens that decode to no text: `allowed_token_ids` (or a `logit_bias`) that holds the
//! engine to a special token that is not an end of sequence. vLLM's detokenizer skips special
//! tokens (`skip_special_tokens`, on by default) and streams each one as a chunk with an empty
//! `delta.content`. The gateway counted output by the chunks with text, so such an answer ran
//! in the small lane to the model's context length, never checked against its limit. Every
//! chunk that stands for a token is counted now: the request is cut (or moved) at the small
//! lane's limit like any other.

use std::num::NonZeroU64;

use serde_json::json;
use tutor_gateway::config::Config;

use crate::common::*;
use crate::one_small_cut_cleaned_up;

/// The engine stops at its 3,400-token context; slow enough that the small lane's limit comes
/// long before.
const SIM: &str = "--speed 2 --profile tiny-test --max-model-len 3400";

fn context(c: &mut Config) {
    c.upstream.max_model_len = 3400.try_into().unwrap();
    // The medium lane has no token room for a promotion: past the small lane's limit the
    // request is cut.
    c.lanes.medium.max_tokens_in_flight = NonZeroU64::new(1_000).unwrap();
}

#[tokio::test]
async fn an_answer_of_tokens_without_text_is_cut_at_the_small_lane_limit() {
    let h = harness(&flags(SIM), context).await;
    // (`ignore_eos`: the simulator's way to say the token is no end of sequence, which draws
    // the answer's length otherwise.)
    let body = json!({"messages": [{"role": "user", "content": "why does my loop never end"}],
                      "stream": true, "ignore_eos": true, "allowed_token_ids": [128002]});
    let text = post_text(h.url("/v1/chat/completions"), &body).await;
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]", "{text}");
    let last = json(&events[events.len() - 2].1);
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    assert_eq!(last["tutor_gateway"]["cut"], "lane_limit", "{last}");
    assert_eq!(last["tutor_gateway"]["lane"], "small");
    let after = last["tutor_gateway"]["after_tokens"].as_u64().unwrap();
    assert!(
        (257..3000).contains(&after),
        "cut past the small limit (256), long before the context's end: {after}"
    );
    let relayed: usize = events
        .iter()
        .filter(|(_, d)| d.starts_with('{'))
        .map(|(_, d)| delta_text(d).len())
        .sum();
    assert_eq!(relayed, 0, "the tokens decode to no text");
    one_small_cut_cleaned_up(&h).await;
    h.shutdown().await;
}
