//! The autopilot (`[autopilot]`, `[lanes.<lane>] ttft_slo_ms`): a missed objective tightens the
//! large lane's seats and the prefill budget down to their floors, never below, and reviews
//! still complete there; objectives met with headroom loosen them back to the configured
//! values; off, nothing changes. Each rule is asserted as a state reached (within a generous
//! bound), never as a time: the objectives used are either impossible (1 ms for a simulated
//! engine whose every step takes milliseconds) or unmissable (an hour).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tutor_gateway::config::{Config, TtftObjective};

/// Reads a series from the gateway's metrics.
async fn series(h: &Harness, name: &str) -> f64 {
    metric(&h.metrics_text().await, name)
}

/// Sends short questions until `done` holds on the metrics (at most 60 s: a loaded machine).
async fn until(h: &Harness, what: &str, done: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 2});
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        let _ = resp.text().await;
        if done(&h.metrics_text().await) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reached: {what}"
        );
    }
}

fn objective(ms: u64) -> Option<TtftObjective> {
    Some(TtftObjective {
        target: Duration::from_millis(ms),
        quantile_permille: 500,
    })
}

/// Autopilot on, looking every 20 ms over 2 s, judging from 3 first tokens, no hold.
fn piloted(c: &mut Config, small_ms: u64) {
    c.autopilot.enabled = true;
    c.autopilot.interval = Duration::from_millis(20);
    c.autopilot.window = Duration::from_secs(2);
    c.autopilot.min_samples = 3;
    c.autopilot.hold = Duration::ZERO;
    c.lanes.small.ttft_slo = objective(small_ms);
    c.lanes.medium.ttft_slo = None;
}

const AT_FLOOR_SEATS: &str = "tutor_gateway_autopilot_large_seats";
const BUDGET: &str = "tutor_gateway_autopilot_prefill_budget_tokens";

#[tokio::test]
async fn a_missed_objective_tightens_to_the_floors_and_reviews_still_complete() {
    // Real-time engine steps (speed 1): no first token comes within 1 ms.
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |c| {
        piloted(c, 1)
    })
    .await;
    until(&h, "large seats at the floor", |m| {
        metric(m, AT_FLOOR_SEATS) == 1.0 && metric(m, BUDGET) == 2048.0
    })
    .await;
    let m = h.metrics_text().await;
    assert!(
        metric(
            &m,
            "tutor_gateway_autopilot_adjustments_total{reason=\"tighten\"}"
        ) >= 1.0
    );
    assert!(
        metric(
            &m,
            "tutor_gateway_autopilot_objective_ratio{lane=\"small\"}"
        ) > 1.0
    );
    assert_eq!(metric(&m, "tutor_gateway_autopilot_enabled"), 1.0);
    // Still missed, the knobs stay at their floors (never below): one large seat...
    until(&h, "a decision at the floor", |m| {
        metric(
            m,
            "tutor_gateway_autopilot_adjustments_total{reason=\"at_floor\"}",
        ) >= 1.0
    })
    .await;
    assert_eq!(series(&h, AT_FLOOR_SEATS).await, 1.0);
    // ...on which a review runs to its end.
    // 5,000 prompt tokens and 10 out: large (over medium_max_work's 5,000).
    let review = json!({"messages": [{"role": "user", "content": words(5000, "review")}],
                        "max_tokens": 10});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&review)).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let _ = resp.text().await;
    let log = h.log.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|e| e["lane"] == "large" && e["outcome"] == "ok"),
        "the review completed in the large lane"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn objectives_met_with_headroom_loosen_back_to_the_configured_values() {
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |c| {
        piloted(c, 1)
    })
    .await;
    until(&h, "tightened", |m| {
        metric(
            m,
            "tutor_gateway_autopilot_adjustments_total{reason=\"tighten\"}",
        ) >= 1.0
    })
    .await;
    assert!(series(&h, AT_FLOOR_SEATS).await < 10.0);
    // A reload makes the objective an hour: met with headroom on every look.
    let mut relaxed = h.gw.state.config().as_ref().clone();
    relaxed.lanes.small.ttft_slo = objective(3_600_000);
    tutor_gateway::pipeline::reload::apply(&h.gw.state, relaxed).unwrap();
    until(&h, "back to the configured values", |m| {
        metric(m, AT_FLOOR_SEATS) == 10.0 && metric(m, BUDGET) == 12_288.0
    })
    .await;
    assert!(
        series(
            &h,
            "tutor_gateway_autopilot_adjustments_total{reason=\"loosen\"}"
        )
        .await
            >= 1.0
    );
    h.shutdown().await;
}

#[tokio::test]
async fn off_the_configured_values_hold_exactly() {
    // The same impossible objective, autopilot off (the default).
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |c| {
        piloted(c, 1);
        c.autopilot.enabled = false;
    })
    .await;
    for _ in 0..20 {
        let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 2});
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        let _ = resp.text().await;
    }
    // Once it has looked: the configured values, nothing moved.
    until(&h, "a look", |m| metric(m, AT_FLOOR_SEATS) == 10.0).await;
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_autopilot_enabled"), 0.0);
    assert_eq!(metric(&m, BUDGET), 12_288.0);
    assert_eq!(
        family_total(&m, "tutor_gateway_autopilot_adjustments_total"),
        0.0
    );
    h.shutdown().await;
}
