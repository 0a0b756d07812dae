//! An honest early "no" (`x-tutor-deadline-ms`): a request whose predicted wait (the requests
//! ahead over the lane's recent admission rate) already misses its deadline is refused at once
//! with a 503 (429 when its tenant holds more than its share of the waiting requests),
//! `deadline_unmet` and a `Retry-After` from the prediction; one whose deadline the
//! prediction meets waits its turn; a bad header is a 400 naming it. `/answer` read as an event
//! stream gets the estimate as its one `error` event. Asserted on states (a
//! deadline of 1 ms behind a queue, an hour), never on times.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tutor_gateway::config::TtftObjective;
use tutor_gateway::lane::Lane;

/// A large request: 5,000 prompt tokens (over medium_max_work with its output), 100 out.
fn review(salt: &str) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": words(5000, salt)}], "max_tokens": 100})
}

async fn post(h: &Harness, body: &serde_json::Value, deadline: Option<&str>) -> reqwest::Response {
    let mut req = client().post(h.url("/v1/chat/completions")).json(body);
    if let Some(d) = deadline {
        req = req.header("x-tutor-deadline-ms", d);
    }
    send(req).await
}

#[tokio::test]
async fn a_request_whose_predicted_wait_misses_its_deadline_is_refused_at_once() {
    // Real-time engine steps: each review holds the one large seat for about a second.
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |c| {
        set_lane(c, Lane::Large, 1);
        // An objective of an hour, which no wait here misses.
        c.lanes.large.ttft_slo = Some(TtftObjective {
            target: Duration::from_secs(3600),
            quantile_permille: 990,
        });
    })
    .await;
    // Bad deadlines are refused, whatever the queue.
    for bad in ["0", "abc", "3600001", "-5", ""] {
        let resp = post(&h, &review("bad"), Some(bad)).await;
        let body = assert_error(resp, 400, "bad_request").await;
        assert_eq!(
            body["error"]["param"], "x-tutor-deadline-ms",
            "{bad:?}: {body}"
        );
    }
    // Two reviews one after the other: the lane's admission rate.
    for i in 0..2 {
        let resp = post(&h, &review(&format!("warm{i}")), None).await;
        assert_eq!(resp.status(), 200);
        let _ = resp.text().await;
    }
    // One runs, two wait: 1,000 tokens each, about 5 s a review, so someone still waits
    // while a loaded machine parses the two 5,000-word requests in a hurry below.
    let url = h.url("/v1/chat/completions");
    let running: Vec<_> = (0..3)
        .map(|i| {
            let mut body = review(&format!("queued{i}"));
            body["max_tokens"] = json!(1_000);
            body["ignore_eos"] = json!(true);
            let url = url.clone();
            tokio::spawn(async move { post_text(url, &body).await })
        })
        .collect();
    eventually("two reviews waiting", || h.queued(Lane::Large) >= 2).await;
    // 1 ms cannot be met behind two reviews: refused now, told when to come back.
    let resp = post(&h, &review("hurry"), Some("1")).await;
    assert_eq!(resp.status(), 503);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body = read_json(resp).await;
    assert_eq!(body["error"]["code"], "deadline_unmet", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("predicted wait"), "{message}");
    assert!(
        body["error"]["predicted_wait_ms"].as_u64().unwrap() > 0,
        "{body}"
    );
    assert!(
        body["error"]["deadline_ms"].as_u64().unwrap() <= 1,
        "{body}"
    );
    // `/answer` read as an event stream: the same 503, the estimate as its one `error` event.
    let resp = send(
        client()
            .post(h.url("/answer"))
            .header("accept", "text/event-stream")
            .header("x-tutor-deadline-ms", "1")
            .json(&json!({"prompt": words(5000, "hurry-answer"), "max_output_tokens": 100})),
    )
    .await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "error");
    let data: serde_json::Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(data["code"], "deadline_unmet", "{data}");
    assert!(data["predicted_wait_ms"].as_u64().unwrap() > 0, "{data}");
    assert!(data["retry_after_s"].as_u64().unwrap() >= 1, "{data}");
    // An hour is met: it waits its turn and completes.
    let resp = post(&h, &review("patient"), Some("3600000")).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let _ = resp.text().await;
    for r in running {
        r.await.unwrap();
    }
    eventually("every seat and token back", || h.idle()).await;
    // The refusals for a deadline of 1 ms, shorter than the lane's objective, are the
    // clients' own doing: not filed as the lane missing it (every first token came).
    let w =
        h.gw.state
            .metrics()
            .ttft_window()
            .quantile(Lane::Large, 0.99, Duration::from_secs(3600))
            .unwrap();
    assert!(w.seconds.is_finite(), "{w:?}");
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_requests_total{lane=\"large\",outcome=\"deadline_unmet\",route=\"chat_completions\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_requests_total{lane=\"large\",outcome=\"deadline_unmet\",route=\"answer\"}"
        ),
        1.0
    );
    // The waits that had a prediction were compared with it, in the line of long prompts
    // (the reviews wait for prefill room as well as a seat).
    assert!(
        metric(
            &m,
            "tutor_gateway_wait_prediction_error_seconds_count{lane=\"large\",line=\"prefill\"}"
        ) >= 1.0
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_nearer_deadline_goes_ahead_of_earlier_requests_of_its_lane() {
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |c| {
        set_lane(c, Lane::Large, 1);
    })
    .await;
    // A stream holds the one large seat until the test stops reading it (3,000 tokens, 15 s:
    // without `ignore_eos` its drawn length averaged 200 tokens, a second).
    let holder = send(client().post(h.url("/v1/chat/completions")).json(&json!({
        "messages": [{"role": "user", "content": words(5000, "holder")}],
        "max_tokens": 3000,
        "ignore_eos": true,
        "stream": true,
    })))
    .await;
    assert_eq!(holder.status(), 200);
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Two reviews without a deadline (the large lane has no objective), then one with an hour.
    for (label, deadline) in [
        ("first", None),
        ("second", None),
        ("urgent", Some("3600000")),
    ] {
        let (h_url, order) = (h.url("/v1/chat/completions"), order.clone());
        let before = h.queued(Lane::Large);
        tasks.push(tokio::spawn(async move {
            let mut req = client().post(h_url).json(&review(label));
            if let Some(d) = deadline {
                req = req.header("x-tutor-deadline-ms", d);
            }
            let resp = send(req).await;
            assert_eq!(resp.status(), 200);
            let _ = resp.text().await;
            order.lock().unwrap().push(label);
        }));
        eventually("it waits", || h.queued(Lane::Large) > before).await;
    }
    // The holder goes away: its seat comes back, and the one seat serves the rest one by one.
    drop(holder);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["urgent", "first", "second"]);
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_tenant_over_its_share_of_the_waiting_requests_is_told_429_others_503() {
    let (a, b) = ("key-of-school-a", "key-of-school-b");
    // Every stream stalls after its first token: a review holds the one large seat until its
    // client goes away, so who waits is fixed, not timed.
    let stalling = [
        "--speed",
        "50",
        "--profile",
        "tiny-test",
        "--stall-after-tokens",
        "1",
    ];
    let h = harness(&stalling, |c| {
        set_lane(c, Lane::Large, 1);
        c.upstream.idle_timeout = std::time::Duration::from_secs(120);
        with_keys(c, &[(a, "school-a"), (b, "school-b")]);
        // An objective every wait here misses: what the autopilot's window files as the
        // lane's misses shows.
        c.lanes.large.ttft_slo = Some(TtftObjective {
            target: Duration::from_millis(1),
            quantile_permille: 990,
        });
    })
    .await;
    let window = || {
        h.gw.state
            .metrics()
            .ttft_window()
            .quantile(Lane::Large, 0.99, Duration::from_secs(3600))
    };
    let keyed = |key: &'static str, salt: &str, deadline: Option<&'static str>| {
        let body = json!({"messages": [{"role": "user", "content": words(5000, salt)}],
                          "max_tokens": 100, "stream": true});
        let mut req = client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body);
        if let Some(d) = deadline {
            req = req.header("x-tutor-deadline-ms", d);
        }
        req
    };
    // School A: one review holds the seat, two wait; school B: one waits.
    let seat = send(keyed(a, "a-seat", None)).await;
    assert_eq!(seat.status(), 200);
    let mut waiting: Vec<_> = (0..2)
        .map(|i| tokio::spawn(keyed(a, &format!("a{i}"), None).send()))
        .collect();
    eventually("A's two waiting", || h.queued(Lane::Large) == 2).await;
    waiting.push(tokio::spawn(keyed(b, "b0", None).send()));
    eventually("B's waiting too", || h.queued(Lane::Large) == 3).await;
    // (A first token is filed as its stream ends: the window holds nothing yet.)
    assert_eq!(window().map(|w| w.samples), None);
    // A holds 2 of the 3 waiting with an equal share: its own backlog, 429, and no miss of
    // the lane's (it was one, and steered the autopilot for everyone).
    let resp = send(keyed(a, "a-hurry", Some("1"))).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(window().map(|w| w.samples), None, "{:?}", window());
    assert!(resp.headers().contains_key("retry-after"));
    let body = read_json(resp).await;
    assert_eq!(body["error"]["code"], "deadline_unmet", "{body}");
    assert_eq!(body["error"]["tenant_over_share"], true, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("more than its share"));
    // B, within its share: the lane is busy, 503.
    let resp = send(keyed(b, "b-hurry", Some("1"))).await;
    assert_eq!(resp.status(), 503);
    let body = read_json(resp).await;
    assert_eq!(body["error"]["tenant_over_share"], false, "{body}");
    // Its predicted wait misses the lane's objective: the lane's miss, infinitely late.
    let w = window().unwrap();
    assert_eq!(w.samples, 1, "{w:?}");
    assert!(w.seconds.is_infinite(), "{w:?}");
    drop(seat);
    for w in waiting {
        w.abort();
    }
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}
