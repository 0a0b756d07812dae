//! Telemetry: after a scripted mix, the per-lane histograms count what happened, the request log
//! has one line per request and never the prompt, and the exposition passes `promtool`.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

async fn answer(h: &Harness, prompt: &str, max: u32) -> Vec<(String, String)> {
    let body = post_text(
        h.url("/answer"),
        &json!({"messages": [{"role": "system", "content": words(200, "You are a patient tutor.")},
                                   {"role": "user", "content": prompt}],
                      "max_output_tokens": max}),
    )
    .await;
    sse(&body)
}

/// The sim's speed for [`scripted_mix`]: real time (the tiny profile's 5 ms a token), so the
/// stream cancelled after 3 tokens is still far from the small lane's 256-token limit (about
/// 1.3 s on) when its client leaves, on a loaded machine too (at 20x real time it was 64 ms, and
/// a stalled test thread let it move to the medium lane or finish first).
const MIX_SPEED: &str = "1";

async fn scripted_mix(h: &Harness) {
    // 5 small and 2 medium complete answers, 1 large, 1 small cancelled mid-stream.
    for i in 0..5 {
        let ev = answer(
            h,
            &format!("SECRET-PROMPT-{i} why does my loop never end?"),
            10,
        )
        .await;
        assert_eq!(ev.last().unwrap().0, "done");
    }
    for i in 0..2 {
        let ev = answer(h, &words(2000, &format!("SECRET-PROMPT-m{i}")), 20).await;
        assert_eq!(json(&ev[0].1)["lane"], "medium");
    }
    let ev = answer(h, &words(8000, "SECRET-PROMPT-large"), 30).await;
    assert_eq!(json(&ev[0].1)["lane"], "large");
    let resp = send(client().post(h.url("/v1/chat/completions")).json(
        &json!({"messages": [{"role": "user", "content": "SECRET-PROMPT-leaving"}],
                      "max_tokens": 500, "ignore_eos": true, "stream": true}),
    ))
    .await;
    let mut body = Streamed::new(resp);
    body.until(|seen| seen.matches("\"content\":\" ").count() >= 3)
        .await;
    drop(body);
    eventually("cancellation recorded", || {
        h.idle() && h.log.lock().unwrap().len() == 9
    })
    .await;
}

#[tokio::test]
async fn histograms_count_each_lane_and_the_log_has_one_line_per_request() {
    let h = harness(
        &[
            "--speed",
            MIX_SPEED,
            "--profile",
            "tiny-test",
            "--enable-prompt-tokens-details",
            "--enable-per-request-metrics",
            // Answers run to their max_output_tokens (drawn lengths average 100,000).
            "--mean-output-tokens",
            "100000",
        ],
        |_| {},
    )
    .await;
    scripted_mix(&h).await;
    let text = h.metrics_text().await;
    let m = |s: &str| metric(&text, s);
    // Time to first token: every request that got a token, per lane.
    assert_eq!(
        m("tutor_gateway_time_to_first_token_seconds_count{lane=\"small\"}"),
        6.0
    );
    assert_eq!(
        m("tutor_gateway_time_to_first_token_seconds_count{lane=\"medium\"}"),
        2.0
    );
    assert_eq!(
        m("tutor_gateway_time_to_first_token_seconds_count{lane=\"large\"}"),
        1.0
    );
    for lane in ["small", "medium", "large"] {
        let ttft = m(&format!(
            "tutor_gateway_time_to_first_token_seconds_count{{lane=\"{lane}\"}}"
        ));
        for family in [
            "tutor_gateway_queue_wait_seconds",
            "tutor_gateway_prefill_seconds",
            "tutor_gateway_output_tokens",
        ] {
            assert_eq!(
                m(&format!("{family}_count{{lane=\"{lane}\"}}")),
                ttft,
                "{family} {lane}"
            );
        }
    }
    // vLLM's per-request metrics come with the final usage chunk: not for the cancelled one.
    assert_eq!(
        m("tutor_gateway_engine_queue_seconds_count{lane=\"small\"}"),
        5.0
    );
    assert_eq!(
        m("tutor_gateway_engine_queue_seconds_count{lane=\"medium\"}"),
        2.0
    );
    // Output tokens: 5 x 10 + 3 (cancelled, at least) small; 2 x 20 medium; 30 large.
    assert!(m("tutor_gateway_output_tokens_sum{lane=\"small\"}") >= 53.0);
    assert_eq!(m("tutor_gateway_output_tokens_sum{lane=\"medium\"}"), 40.0);
    assert_eq!(m("tutor_gateway_output_tokens_sum{lane=\"large\"}"), 30.0);
    assert_eq!(
        m("tutor_gateway_decode_tokens_per_second_count{lane=\"medium\"}"),
        2.0
    );
    assert_eq!(
        m("tutor_gateway_time_per_output_token_seconds_count{lane=\"large\"}"),
        1.0
    );
    // The relay's own time: at least one write per finished stream, each observed once.
    let relayed = m("tutor_gateway_relay_seconds_count");
    assert!(
        relayed >= 9.0,
        "8 answers and 1 cancelled stream wrote at least once each: {relayed}"
    );
    assert!(m("tutor_gateway_relay_seconds_sum") >= 0.0);
    // Cancellation: one, mid-stream, in the small lane.
    assert_eq!(
        m("tutor_gateway_cancellations_total{lane=\"small\",stage=\"decode\"}"),
        1.0
    );
    assert_eq!(
        m("tutor_gateway_cancellations_total{lane=\"small\",stage=\"queued\"}"),
        0.0
    );
    assert_eq!(
        m("tutor_gateway_cancelled_after_tokens_count{lane=\"small\"}"),
        1.0
    );
    assert_eq!(
        m("tutor_gateway_requests_total{lane=\"small\",outcome=\"ok\",route=\"answer\"}"),
        5.0
    );
    assert_eq!(m("tutor_gateway_requests_total{lane=\"small\",outcome=\"cancelled\",route=\"chat_completions\"}"), 1.0);
    // Prefix cache: the shared system prompt hits from the second request on.
    let hits: f64 = ["small", "medium", "large"]
        .iter()
        .map(|l| {
            m(&format!(
                "tutor_gateway_prefix_cache_hits_total{{lane=\"{l}\"}}"
            ))
        })
        .sum();
    let queries: f64 = ["small", "medium", "large"]
        .iter()
        .map(|l| {
            m(&format!(
                "tutor_gateway_prefix_cache_queries_total{{lane=\"{l}\"}}"
            ))
        })
        .sum();
    assert!(
        hits >= 7.0 * 192.0 && hits < queries,
        "hits {hits} of {queries}"
    );

    // The request log: one JSON line each, the latency split, never the prompt.
    let log = h.log.lock().unwrap().clone();
    assert_eq!(log.len(), 9);
    for line in &log {
        let text = line.to_string();
        assert!(
            !text.contains("SECRET-PROMPT"),
            "prompt text in the request log: {text}"
        );
        assert!(line["request_id"].as_str().unwrap().len() == 32);
        assert!(line["timings"]["total_ms"].as_f64().unwrap() > 0.0);
    }
    // Every /answer request shares the tutor's system prompt, so one fingerprint (M18).
    let fp = tutor_gateway::prompt::fingerprint(&words(200, "You are a patient tutor."), None);
    let answers: Vec<_> = log.iter().filter(|l| l["route"] == "answer").collect();
    assert_eq!(answers.len(), 8);
    assert!(
        answers.iter().all(|l| l["fingerprint"] == fp.as_str()),
        "{answers:?}"
    );
    let done: Vec<_> = log.iter().filter(|l| l["outcome"] == "ok").collect();
    assert_eq!(done.len(), 8);
    for l in &done {
        assert!(l["input_tokens"].as_u64().unwrap() > 0);
        assert!(l["timings"]["engine_queue_ms"].as_f64().is_some(), "{l}");
        assert!(
            l["timings"]["time_to_first_token_ms"].as_f64().unwrap()
                >= l["timings"]["ttft_ms"].as_f64().unwrap()
        );
    }
    let cancelled: Vec<_> = log.iter().filter(|l| l["outcome"] == "cancelled").collect();
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0]["cancelled_at"], "decode");
    // The cancelled stream had vLLM's running usage (its prompt), never its final one, the only
    // one that says what was cached: it is no miss in the hit ratio, and its cached tokens are
    // unknown, not 0.
    assert!(
        cancelled[0]["input_tokens"].as_u64().unwrap() > 0,
        "{log:?}"
    );
    assert!(cancelled[0]["cached_tokens"].is_null(), "{log:?}");
    let finished: u64 = done
        .iter()
        .map(|l| l["input_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(queries, finished as f64);
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_the_queue_is_counted_at_stage_queued() {
    // A tenth of real speed: the blocker's 1,000 tokens (still small work) hold the only small
    // slot for about fifty seconds; it is let go as soon as the second request has left the
    // queue, so the test does not wait for it (a loaded machine once took longer than the
    // five seconds of real speed to queue and abort the second one: it was admitted instead).
    let h = harness(&["--speed", "0.1", "--profile", "tiny-test"], |c| {
        set_lane(c, tutor_gateway::lane::Lane::Small, 1)
    })
    .await;
    let mut blocker = send(client()
        .post(h.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "ignore_eos": true, "stream": true}))).await;
    // Decoding: its client leaving later is a cancellation at stage decode.
    let mut seen = String::new();
    while !seen.contains("\"content\"") {
        let chunk = blocker.chunk().await.unwrap().expect("the blocker streams");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let url = h.url("/answer");
    let queued =
        tokio::spawn(async move { client().get(url).query(&[("prompt", "hello")]).send().await });
    eventually("queued", || h.queued(tutor_gateway::lane::Lane::Small) == 1).await;
    queued.abort();
    // It leaves the queue while the blocker still holds the slot: cancelled while queued.
    eventually("the queue empties", || {
        h.queued(tutor_gateway::lane::Lane::Small) == 0
    })
    .await;
    drop(blocker);
    eventually("idle", || h.idle()).await;
    // The counters may be bumped just after the lane empties: wait for them (30 s: a guard).
    let queued_series = "tutor_gateway_cancellations_total{lane=\"small\",stage=\"queued\"}";
    let decode_series = "tutor_gateway_cancellations_total{lane=\"small\",stage=\"decode\"}";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut text = h.metrics_text().await;
    let value = |text: &str, series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.parse::<f64>().ok())
    };
    while !(value(&text, queued_series) == Some(1.0) && value(&text, decode_series) == Some(1.0))
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
        text = h.metrics_text().await;
    }
    assert_eq!(
        metric(
            &text,
            "tutor_gateway_cancellations_total{lane=\"small\",stage=\"queued\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "tutor_gateway_cancellations_total{lane=\"small\",stage=\"decode\"}"
        ),
        1.0
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_exposition_passes_promtool_check_metrics() {
    let h = harness(
        &flags(&format!(
            "--speed {MIX_SPEED} --profile tiny-test --enable-prompt-tokens-details"
        )),
        |_| {},
    )
    .await;
    scripted_mix(&h).await;
    let text = h.metrics_text().await;
    let promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child =
        promtool.expect("promtool is not installed: run scripts/test, which installs it");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{report}"
    );
    assert!(
        report.trim().is_empty(),
        "promtool lint findings:\n{report}"
    );
    h.shutdown().await;
}
