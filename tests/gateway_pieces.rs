//! Long prompts prefilled in pieces through vLLM's prefix cache (`admission.prefill_piece_tokens`)
//! end to end, with the simulator's engine steps as the witness (`GET /debug/steps`): with
//! pieces on, no step computes more than one piece of a review's prompt, every piece is found
//! cached by the next and by the request itself (nothing computed twice), and the answer is the
//! same; off, the same review is computed in one step. Asserted on steps and counters, never on
//! times.

mod common;
#[allow(unused_macros)]
mod jobs;
mod redis_common;

use common::*;
use serde_json::{json, Value};

/// Pieces of 1,024 tokens.
const PIECE: u32 = 1024;

/// A fast simulator whose usage tells the prefix-cache hits (`cached_tokens`).
const CACHED_TOKENS: &[&str] = &[
    "--speed",
    "50",
    "--profile",
    "tiny-test",
    "--enable-prompt-tokens-details",
];

/// The largest prompt chunk one sequence computed in one step, over the steps after `after`.
async fn largest_chunk(h: &Harness, after: u64) -> (u64, u64) {
    let steps = tutor_testkit::get_json(format!("{}/debug/steps", h.sim.url())).await;
    let steps = steps.as_array().unwrap();
    let last = steps
        .iter()
        .map(|s| s["step"].as_u64().unwrap())
        .max()
        .unwrap_or(after);
    let largest = steps
        .iter()
        .filter(|s| s["step"].as_u64().unwrap() > after)
        .map(|s| s["max_chunk"].as_u64().unwrap())
        .max()
        .unwrap_or(0);
    (largest, last)
}

async fn review(h: &Harness, salt: &str) -> Value {
    // About 5,000 prompt tokens: large.
    let body = json!({"messages": [{"role": "user", "content": words(5000, salt)}],
                      "max_tokens": 10});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(resp.status(), 200);
    read_json(resp).await
}

#[tokio::test]
async fn a_long_prompt_is_prefilled_one_piece_per_step_and_nothing_is_computed_twice() {
    let h = harness(CACHED_TOKENS, |c| c.admission.prefill_piece_tokens = PIECE).await;
    let answer = review(&h, "pieced").await;
    let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 4 * u64::from(PIECE), "{answer}");
    let (largest, last) = largest_chunk(&h, 0).await;
    assert!(
        largest <= u64::from(PIECE),
        "a step computed {largest} tokens of one prompt"
    );
    // The request itself found every piece cached.
    let pieces = (prompt - 1) / u64::from(PIECE);
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, pieces * u64::from(PIECE), "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 10);
    let m = h.metrics_text().await;
    assert_eq!(
        metric(&m, "tutor_gateway_prefill_pieces_total"),
        pieces as f64
    );
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_prefill_pieced_requests_total{outcome=\"pieced\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(&m, "tutor_gateway_prefill_piece_recomputed_tokens_total"),
        0.0
    );
    assert_eq!(
        metric(&m, "tutor_gateway_prefill_pieces_seconds_count"),
        1.0
    );
    // An `/answer` review too: every piece found cached by the request itself.
    let body = json!({"prompt": words(5000, "answer-pieced"), "max_output_tokens": 5});
    let resp = send(client().post(h.url("/answer")).json(&body)).await;
    assert_eq!(resp.status(), 200);
    let events = sse(&resp.text().await.unwrap());
    let done: Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
    let prompt = done["usage"]["input_tokens"].as_u64().unwrap();
    let answer_pieces = (prompt - 1) / u64::from(PIECE);
    assert_eq!(
        done["usage"]["cached_tokens"].as_u64().unwrap(),
        answer_pieces * u64::from(PIECE),
        "{done}"
    );
    let pieces = pieces + answer_pieces;
    assert_eq!(
        metric(
            &h.metrics_text().await,
            "tutor_gateway_prefill_piece_recomputed_tokens_total"
        ),
        0.0
    );
    // Short questions are never pieced.
    let q = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 2});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&q)).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
    assert_eq!(
        metric(
            &h.metrics_text().await,
            "tutor_gateway_prefill_pieces_total"
        ),
        pieces as f64
    );
    // Off (a reload): the same kind of review is computed in one step.
    let mut off = h.gw.state.config().as_ref().clone();
    off.admission.prefill_piece_tokens = 0;
    tutor_gateway::pipeline::reload::apply(&h.gw.state, off).unwrap();
    let _ = review(&h, "whole").await;
    let (largest, _) = largest_chunk(&h, last).await;
    assert!(
        largest > u64::from(PIECE),
        "off, the prompt went whole: {largest}"
    );
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

/// `jobs.prefill_piece_tokens`: a job's long prompt is prefilled in pieces of its own while
/// interactive requests go whole (`admission.prefill_piece_tokens` off). On a mostly idle
/// engine a job's prompt chunk is what makes a question's engine step long.
#[tokio::test]
async fn a_jobs_prompt_is_pieced_and_an_interactive_one_of_the_same_size_is_not() {
    let h = harness(CACHED_TOKENS, |c| c.jobs.prefill_piece_tokens = PIECE).await;
    let _ = review(&h, "interactive").await;
    let (largest, last) = largest_chunk(&h, 0).await;
    assert!(
        largest > u64::from(PIECE),
        "the interactive review went whole: {largest}"
    );
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_prefill_pieces_total"), 0.0);
    // The same size of review as a job: in pieces, each found cached by the next and by the
    // job's own request.
    let base = h.url("");
    let body = json!({"prompt": words(5000, "job"), "max_output_tokens": 5});
    let id = jobs::submit_ok(&base, &body).await;
    let v = jobs::done(&base, &id).await;
    let usage = &v["answer"]["usage"];
    let prompt = usage["input_tokens"].as_u64().unwrap();
    assert!(prompt > 4 * u64::from(PIECE), "{v}");
    let pieces = (prompt - 1) / u64::from(PIECE);
    assert_eq!(
        usage["cached_tokens"].as_u64(),
        Some(pieces * u64::from(PIECE)),
        "{v}"
    );
    let (largest, _) = largest_chunk(&h, last).await;
    assert!(
        largest <= u64::from(PIECE),
        "a step computed {largest} tokens of the job's prompt"
    );
    assert_eq!(
        metric(
            &h.metrics_text().await,
            "tutor_gateway_prefill_pieces_total"
        ),
        pieces as f64
    );
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn prompts_with_media_are_not_pieced() {
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |c| {
        c.admission.prefill_piece_tokens = PIECE;
    })
    .await;
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": words(5000, "media")},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]}], "max_tokens": 5});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
    let status = resp.status();
    let _ = resp.text().await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(&m, "tutor_gateway_prefill_pieces_total"),
        0.0,
        "{status}"
    );
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_prefill_pieced_requests_total{outcome=\"not_text\"}"
        ),
        1.0,
        "{status}"
    );
    h.shutdown().await;
}

/// A field `/tokenize` cannot take that changes the prompt's ids: pieces of the ids it gives
/// would never be found cached (the request would prefill its whole prompt again after them),
/// so the prompt goes whole.
#[tokio::test]
async fn prompts_whose_ids_tokenize_cannot_tell_are_not_pieced() {
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |c| {
        c.admission.prefill_piece_tokens = PIECE;
    })
    .await;
    let fields = [
        json!({"truncate_prompt_tokens": 6000}),
        json!({"reasoning_effort": "low"}),
        json!({"tool_choice": "none"}),
    ];
    for (i, field) in fields.iter().enumerate() {
        let mut body = json!({"messages": [{"role": "user", "content": words(5000, &format!("ids{i}"))}],
                              "max_tokens": 5});
        body.as_object_mut()
            .unwrap()
            .extend(field.as_object().unwrap().clone());
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 200, "{field}");
        let _ = resp.text().await;
    }
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_prefill_pieces_total"), 0.0);
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_prefill_pieced_requests_total{outcome=\"unmatched\"}"
        ),
        3.0
    );
    h.shutdown().await;
}
