//! Lanes over HTTP: large work is bounded, small work gets through, and a client that goes away
//! (queued, during prefill, mid-stream) stops the engine's work and gives everything back.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::json;
use tutor_gateway::lane::Lane;

fn large_body(salt: &str, max_tokens: u32) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": words(8000, salt)}], "max_tokens": max_tokens,
           "ignore_eos": true, "stream": true})
}

async fn stream_to_end(url: String, body: serde_json::Value) -> String {
    post_text(url, &body).await
}

/// The seed's large lane: 4 seats (the shipped default is 10; these tests count to four).
fn seed_large_lane(c: &mut tutor_gateway::config::Config) {
    set_lane(c, Lane::Large, 4);
}

#[tokio::test]
async fn the_engine_never_sees_more_than_four_large_requests() {
    let h = harness(
        &flags("--speed 20 --profile tiny-test --num-gpu-blocks 8192"),
        seed_large_lane,
    )
    .await;
    let url = h.url("/v1/chat/completions");
    let tasks: Vec<_> = (0..10)
        .map(|i| tokio::spawn(stream_to_end(url.clone(), large_body(&format!("r{i}"), 40))))
        .collect();
    for t in tasks {
        let body = t.await.unwrap();
        assert!(
            body.ends_with("data: [DONE]\n\n"),
            "every large request finishes"
        );
    }
    // A limit, not a peak: how many overlap depends on timing. That the four are reached is
    // `small_requests_are_admitted_while_large_ones_queue_and_queued_clients_can_leave`.
    let seen = h.sim.engine.snapshot().max_running_seen;
    assert!(
        (1..=4).contains(&seen),
        "lanes 32/20/4: the engine saw {seen} large requests at once"
    );
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

/// Four large requests decoding for a long time, holding the whole large lane.
async fn fill_large_lane(h: &Harness) -> Vec<reqwest::Response> {
    let mut blockers = Vec::new();
    for i in 0..4 {
        let resp = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .json(&large_body(&format!("block{i}"), 5000)),
        )
        .await;
        assert_eq!(resp.status(), 200);
        blockers.push(resp);
    }
    assert_eq!(h.in_flight(Lane::Large), 4);
    blockers
}

#[tokio::test]
async fn small_requests_are_admitted_while_large_ones_queue_and_queued_clients_can_leave() {
    // Real speed: each blocker's 5,000 tokens take about half a minute, so they hold the lane
    // for the whole test however slow the machine (at speed 5 they had about five seconds).
    let h = harness(
        &flags("--speed 1 --profile tiny-test --num-gpu-blocks 8192"),
        seed_large_lane,
    )
    .await;
    let blockers = fill_large_lane(&h).await;
    // Two more large requests wait in the gateway's queue.
    let queued: Vec<_> = (0..2)
        .map(|i| {
            tokio::spawn(stream_to_end(
                h.url("/v1/chat/completions"),
                large_body(&format!("q{i}"), 10),
            ))
        })
        .collect();
    eventually("two large requests queued", || h.queued(Lane::Large) == 2).await;

    // A student's short question goes straight through.
    let small = send_text(client().get(h.url("/answer")).query(&[
        ("prompt", "why does my loop never end?"),
        ("max_output_tokens", "20"),
    ]))
    .await;
    let events = sse(&small);
    assert_eq!(json(&events[0].1)["lane"], "small");
    assert_eq!(events.last().unwrap().0, "done");
    assert_eq!(h.queued(Lane::Large), 2, "large requests are still waiting");
    assert_eq!(
        h.sim_running(),
        4,
        "the engine only ever saw the four admitted large requests"
    );

    // Queued clients give up: they leave the queue and never reach the engine.
    for q in queued {
        q.abort();
    }
    eventually("queue empties when queued clients leave", || {
        h.queued(Lane::Large) == 0
    })
    .await;
    assert_eq!(h.sim_aborted(), 0);

    // The blockers leave mid-stream: the engine aborts them and the lane empties.
    drop(blockers);
    eventually("blockers aborted in the engine", || {
        h.sim_aborted() == 4 && h.sim_running() == 0
    })
    .await;
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_during_prefill_aborts_the_engine_work() {
    // 8,000 prompt tokens in chunks of 32 at real speed: about 250 steps, 1.6 s of prefill;
    // then 4,000 tokens (20 s: the engine is still at work whenever a loaded gateway notices
    // its client gone; an answer's drawn length could have been a few tokens).
    let h = harness(
        &flags(
            "--speed 1 --profile tiny-test --max-num-batched-tokens 32 \
             --mean-output-tokens 1000000",
        ),
        |_| {},
    )
    .await;
    let resp = send(client().post(h.url("/answer")).json(
        &json!({"prompt": words(8000, "review this repository"), "max_output_tokens": 4000}),
    ))
    .await;
    assert_eq!(resp.status(), 200);
    eventually("prefill running in the engine", || h.sim_running() == 1).await;
    drop(resp);
    eventually("engine aborted the request", || {
        h.sim_aborted() == 1 && h.sim_running() == 0
    })
    .await;
    eventually("lane back to zero", || h.idle()).await;
    let metrics = h.metrics_text().await;
    assert!(
        metrics.contains(
            "tutor_gateway_requests_total{lane=\"large\",outcome=\"cancelled\",route=\"answer\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("tutor_gateway_cancelled_after_tokens_count{lane=\"large\"} 1"));
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_mid_stream_aborts_and_records_tokens_relayed() {
    // A short prompt with 4,000 tokens of output budget is medium work: 20 s at real speed,
    // still generating when a loaded gateway notices its client gone.
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |_| {}).await;
    let resp = send(client().post(h.url("/v1/chat/completions")).json(
        &json!({"messages": [{"role": "user", "content": "explain ownership"}], "max_tokens": 4000,
                      "ignore_eos": true, "stream": true}),
    ))
    .await;
    let mut body = Streamed::new(resp);
    body.until(|text| text.matches("\"content\":\" ").count() >= 5)
        .await;
    drop(body);
    eventually("engine aborted the request", || {
        h.sim_aborted() == 1 && h.sim_running() == 0
    })
    .await;
    eventually("lane back to zero", || h.idle()).await;
    let metrics = h.metrics_text().await;
    let sum: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tutor_gateway_cancelled_after_tokens_sum{lane=\"medium\"} "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap();
    assert!(sum >= 5.0, "cancelled after {sum} tokens");
    // The engine stopped: no more tokens are generated after the abort, beyond the steps it
    // had already planned (vLLM's async scheduling plans one ahead: at most two in flight,
    // which a late engine thread may still end after the abort is seen).
    let generated = h.sim.engine.snapshot().steps;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let later = h.sim.engine.snapshot().steps;
    assert!(
        later <= generated + 2,
        "{} steps after the abort",
        later - generated
    );
    h.shutdown().await;
}

/// One engine seat, held by a blocker; a large then a small request queue in the engine, the
/// blocker leaves. Returns which of the two got the seat.
///
/// Real speed and long answers, so whoever holds the seat keeps it for seconds: the other one
/// cannot produce a token meanwhile, and the first token seen tells who was scheduled first,
/// however slowly the machine runs.
async fn first_served(engine_priority: bool) -> &'static str {
    let h = harness(
        &flags("--speed 1 --profile tiny-test --max-num-seqs 1 --scheduling-policy priority"),
        |c| c.admission.engine_priority = engine_priority,
    )
    .await;
    let url = h.url("/v1/chat/completions");
    // 4,000 tokens (medium work): about twenty seconds on the seat.
    let blocker = tokio::spawn(stream_to_end(
        url.clone(),
        json!({"messages": [{"role": "user", "content": "block"}], "max_tokens": 4000, "ignore_eos": true, "stream": true}),
    ));
    eventually("blocker running", || h.sim_running() == 1).await;
    let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, body) in [
        ("large", large_body("review", 1000)),
        (
            "small",
            // 1,000 tokens of output is still small work (at most 1,200).
            json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 1000, "ignore_eos": true, "stream": true}),
        ),
    ] {
        let (url, served) = (url.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let resp = send(client().post(url).json(&body)).await;
            let mut stream = resp.bytes_stream();
            let mut text = String::new();
            while !text.contains("\"content\":\" ") {
                let Some(chunk) = stream.next().await else {
                    return;
                };
                text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            }
            served.lock().unwrap().push(name);
            while stream.next().await.is_some() {}
        }));
        let waiting = if name == "large" { 1 } else { 2 };
        eventually("queued in the engine", || {
            h.sim.engine.snapshot().waiting == waiting
        })
        .await;
    }
    blocker.abort();
    eventually("one of the two got the seat", || {
        !served.lock().unwrap().is_empty()
    })
    .await;
    let engine = h.sim.engine.snapshot();
    assert_eq!((engine.running, engine.waiting), (1, 1), "{engine:?}");
    let first = served.lock().unwrap().clone();
    assert_eq!(first.len(), 1, "the other one is still waiting: {first:?}");
    for t in tasks {
        t.abort();
    }
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
    first[0]
}

#[tokio::test]
async fn engine_priority_lets_a_short_question_overtake_queued_long_work() {
    assert_eq!(
        first_served(false).await,
        "large",
        "without it the engine serves arrival order"
    );
    assert_eq!(
        first_served(true).await,
        "small",
        "with it small (priority 0) goes before large (2)"
    );
}
