//! Nothing gets past the lanes (issue 15): what the client may set, how sessions are bounded
//! and accounted, that every lane has an output bound its reservation covers, that a stream
//! without `[DONE]` frees its slot at the finish reason, and that no prompt text reaches the
//! logs, the request log or the metrics.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tutor_gateway::lane::Lane;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

/// Every stream stalls after its first token with the connection open (a request that holds
/// its seat, place or reservation for as long as the test needs).
const STALLING: &str = "--speed 50 --profile tiny-test --stall-after-tokens 1";

/// Waits until the gateway serves a new request again (a seat or place came back).
async fn served_again(h: &Harness, what: &str) {
    tutor_testkit::eventually(what, || async {
        client()
            .get(h.url("/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
}

#[tokio::test]
async fn a_clients_priority_never_reaches_the_engine() {
    // A client's priority would jump its engine queue under `--scheduling-policy priority`
    // (and is ignored without it): the engine sees 0, whatever the client sent.
    let h = harness(FAST, |_| {}).await;
    let resp = send(client()
        .post(h.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "priority": -100}))).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let seen = h.sim_requests().await;
    assert_eq!(seen.last().unwrap()["priority"], 0, "{seen:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn work_multipliers_are_refused_and_unknown_fields_follow_the_config() {
    let h = harness(FAST, |c| {
        c.server.unknown_fields = tutor_gateway::config::UnknownFields::Reject;
    })
    .await;
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    for (extra, param) in [
        (json!({"use_beam_search": true}), Some("use_beam_search")),
        (json!({"prompt_logprobs": 5}), Some("prompt_logprobs")),
        (
            json!({"logprobs": true, "top_logprobs": 20}),
            Some("top_logprobs"),
        ),
        (
            json!({"chat_template": "{% for m in messages %}{{m}}{{m}}{% endfor %}"}),
            Some("chat_template"),
        ),
        (json!({"not_a_field": 1}), None),
    ] {
        let resp = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .json(&chat(extra.clone())),
        )
        .await;
        assert_eq!(resp.status(), 400, "{extra}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
        assert_eq!(body["error"]["param"], json!(param), "{body}");
    }
    let resp = send(
        client()
            .post(h.url("/v1/completions"))
            .json(&json!({"prompt": "hi", "max_tokens": 3, "best_of": 3})),
    )
    .await;
    assert_eq!(resp.status(), 400);
    assert!(h.idle());
    h.shutdown().await;
}

#[tokio::test]
async fn large_requests_without_max_tokens_never_exceed_their_reservation() {
    // Without a limit the engine would generate up to max_model_len (16,384) less the prompt.
    let h = harness(&["--speed", "200", "--profile", "tiny-test"], |_| {}).await;
    let review = words(7000, "review");
    let mut tasks = Vec::new();
    for i in 0..4 {
        let body = json!({"messages": [{"role": "user", "content": format!("{i} {review}")}], "ignore_eos": true});
        let url = h.url("/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let resp: Value = send_json(client().post(url).json(&body)).await;
            resp
        }));
    }
    for t in tasks {
        let resp = t.await.unwrap();
        // The shipped default output budget: what the large lane reserved for it.
        assert_eq!(resp["usage"]["completion_tokens"], 512, "{resp}");
    }
    let log = h.log.lock().unwrap().clone();
    let seen = h.sim_requests().await;
    assert_eq!(log.len(), 4);
    for (entry, sent) in log.iter().zip(&seen) {
        assert_eq!(entry["lane"], "large", "{entry}");
        // The output the engine may generate is what the reservation holds beyond the input.
        let reserved = entry["tokens_reserved"].as_u64().unwrap();
        let input = entry["input_tokens_estimated"].as_u64().unwrap();
        assert_eq!(
            sent["max_tokens"].as_u64().unwrap(),
            reserved - input,
            "{entry} {sent}"
        );
        assert_eq!(entry["output_tokens"], 512);
    }
    assert!(h.idle());
    h.shutdown().await;
}

#[tokio::test]
async fn parallel_continues_see_each_other() {
    // Every stream stalls after its first token with the connection open: all three requests
    // hold their session reservation (200 declared tokens each) at once.
    let h = harness(&flags(STALLING), |c| {
        c.upstream.idle_timeout = Duration::from_secs(60)
    })
    .await;
    let mut streams = Vec::new();
    for i in 0..3 {
        let resp = send(client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": format!("continue {i}"), "max_output_tokens": 200, "session_id": "student-9"}))).await;
        assert_eq!(resp.status(), 200);
        streams.push(resp);
    }
    // The three see 0, 200 and 400 tokens before them in some order: exactly one has passed
    // the small lane's 256-token limit and goes to medium.
    let metrics = h.metrics_text().await;
    assert_eq!(
        metric(
            &metrics,
            r#"tutor_gateway_continuations_reclassified_total{from="small",to="medium"}"#
        ),
        1.0
    );
    assert_eq!(h.in_flight(Lane::Medium), 1);
    drop(streams);
    eventually("every lane back to zero", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn session_ids_are_checked_and_their_map_is_bounded() {
    let h = harness(FAST, |c| c.promotion.max_sessions = 20).await;
    let huge = "a".repeat(1 << 20);
    let resp = send(
        client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": "hi", "session_id": huge})),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["param"], "session_id", "{body}");
    assert!(body.to_string().len() < 1000, "the id is not echoed back");
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .header("x-session-id", "a b")
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})),
    )
    .await;
    assert_eq!(resp.status(), 400);

    let mut peak = 0.0f64;
    for i in 0..60 {
        let text = post_text(
            h.url("/answer"),
            &json!({"prompt": "hi", "max_output_tokens": 2, "session_id": format!("flood-{i}")}),
        )
        .await;
        assert!(text.contains("event: done"), "{text}");
        let tracked = metric(&h.metrics_text().await, "tutor_gateway_sessions_tracked");
        peak = peak.max(tracked);
    }
    let metrics = h.metrics_text().await;
    assert_eq!(peak, 20.0);
    assert_eq!(
        metric(&metrics, "tutor_gateway_sessions_evicted_total"),
        40.0
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_slot_is_freed_at_the_finish_reason_without_done() {
    // The engine (or a proxy in between) never sends `[DONE]` and keeps the connection open.
    let h = harness(
        &flags("--speed 50 --profile tiny-test --omit-done-rate 1 --omit-done-hang"),
        |c| {
            c.upstream.idle_timeout = Duration::from_secs(120);
            set_lane(c, Lane::Small, 1);
        },
    )
    .await;
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": true});
    let mut elapsed = Vec::new();
    for _ in 0..3 {
        // One seat: each request gets it only once the one before let it go. Far below the
        // idle timeout, or the test's own limit fails it.
        let start = std::time::Instant::now();
        let resp = tokio::time::timeout(Duration::from_secs(60), async {
            let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
            resp.text().await.unwrap()
        })
        .await
        .expect("the stream ends without waiting out the idle timeout");
        assert!(resp.contains("\"finish_reason\":\"length\""), "{resp}");
        assert!(
            resp.ends_with("data: [DONE]\n\n"),
            "the client still gets its end: {resp}"
        );
        elapsed.push(start.elapsed().as_secs_f64() * 1e3);
    }
    eventually("every lane back to zero", || h.idle()).await;
    // Each answer ended with its last event: the second waited out for a `[DONE]` that never
    // came (after which its client got the end) is in no answer's total time, nor its decode.
    let log = h.log.lock().unwrap().clone();
    assert_eq!(log.len(), 3);
    for (line, client_ms) in log.iter().zip(&elapsed) {
        let total = line["timings"]["total_ms"].as_f64().unwrap();
        assert!(
            total + 990.0 <= *client_ms,
            "{total} of {client_ms} ms: {line}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn no_prompt_text_reaches_the_logs() {
    const SECRET: &str = "sk-live-4242-DO-NOT-LOG";
    // This test's runtime has one thread: everything the gateway logs is on it.
    let (captured, _guard) = tutor_testkit::capture_logs(tracing::Level::TRACE);
    let h = harness(
        &flags("--speed 50 --profile tiny-test --max-model-len 2000"),
        |c| c.upstream.max_model_len = 2000.try_into().unwrap(),
    )
    .await;
    let url = h.url("/v1/chat/completions");
    let question = format!("my key is {SECRET}, why does it fail?");
    for body in [
        // vLLM's 400 quotes the value of a field it cannot read.
        json!({"messages": [{"role": "user", "content": question}], "max_tokens": 3, "seed": SECRET}),
        // serde quotes the value of a field of the wrong type.
        json!({"messages": [{"role": "user", "content": question}], "max_tokens": SECRET}),
        // Too long for the model.
        json!({"messages": [{"role": "user", "content": format!("{question} {}", words(3000, "x"))}], "max_tokens": 3}),
        // A normal answer.
        json!({"messages": [{"role": "user", "content": question}], "max_tokens": 3, "stop": [SECRET]}),
    ] {
        let _ = send(client().post(&url).json(&body)).await.text().await;
    }
    let _ = send(
        client()
            .post(&url)
            .header("content-type", "application/json")
            .body(format!(
                "{{\"messages\": [{{\"role\": \"user\", \"content\": \"{SECRET}"
            )),
    )
    .await
    .text()
    .await;
    let metrics = h.metrics_text().await;
    let log = h.log.lock().unwrap().clone();
    h.shutdown().await;
    let logged = captured.text();
    assert!(
        logged.contains("request rejected"),
        "the errors were logged: {logged}"
    );
    assert!(!logged.contains(SECRET), "{logged}");
    assert!(!metrics.contains(SECRET));
    for line in &log {
        assert!(!line.to_string().contains(SECRET), "{line}");
    }
}

/// Everything the gateway sends until it closes the connection; fails if it leaves it open.
async fn read_all(mut tcp: tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the gateway left the connection open");
    String::from_utf8_lossy(&out).into_owned()
}

fn addr(h: &Harness) -> std::net::SocketAddr {
    h.gw.addr
}

/// The gateway's metrics without a connection (for when every seat is taken).
fn metrics_now(h: &Harness) -> String {
    let state = &h.gw.state;
    state.metrics().render(&state.admission().snapshot())
}

#[tokio::test]
async fn a_connection_beyond_the_limit_gets_503_not_a_hang() {
    let h = harness(FAST, |c| c.server.max_connections = 2).await;
    // Two idle connections take both seats (accepted in order, before the third).
    let a = tokio::net::TcpStream::connect(addr(&h)).await.unwrap();
    let b = tokio::net::TcpStream::connect(addr(&h)).await.unwrap();
    let third = tokio::net::TcpStream::connect(addr(&h)).await.unwrap();
    let answer = read_all(third).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("\"code\":\"overloaded\""), "{answer}");
    assert_eq!(
        metric(
            &metrics_now(&h),
            r#"tutor_gateway_refused_total{limit="connections"}"#
        ),
        1.0
    );
    // A seat freed is a seat taken again.
    drop((a, b));
    served_again(&h, "a new connection is served").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_slow_loris_is_cut_at_the_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let h = harness(FAST, |c| {
        c.server.header_read_timeout = Duration::from_millis(300);
        c.server.max_connections = 1;
    })
    .await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&h)).await.unwrap();
    // Half a request head, and then nothing: the only seat is held until the timeout.
    tcp.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .unwrap();
    let answer = read_all(tcp).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "closed (or 408), not served: {answer}"
    );
    // The seat came back.
    served_again(&h, "the seat is free again").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_body_that_never_finishes_gets_408() {
    use tokio::io::AsyncWriteExt;
    let h = harness(FAST, |c| {
        c.server.body_read_timeout = Duration::from_millis(300)
    })
    .await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&h)).await.unwrap();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"messages\":",
    )
    .await
    .unwrap();
    let answer = read_all(tcp).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    assert!(h.idle());
    h.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_the_in_flight_limit_get_503() {
    let h = harness(&flags(STALLING), |c| {
        c.server.max_requests_in_flight = 1;
        c.upstream.idle_timeout = Duration::from_secs(60);
    })
    .await;
    // One stream holds the only place (stalled after its first token).
    let held = send(client().post(h.url("/v1/chat/completions")).json(
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": true}),
    ))
    .await;
    assert_eq!(held.status(), 200);
    // The gateway tier's own load, as its autoscaler reads it: the held stream.
    let in_flight = || h.gw.state.metrics().requests_in_flight().get();
    assert_eq!(in_flight(), 1);
    let resp = send(client().get(h.url("/v1/models"))).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(in_flight(), 1, "a refused request is not counted");
    // A full gateway still says it is alive (an orchestrator would restart it, and the held
    // stream with it) and still shows its refusals to the scraper.
    for probe in ["/healthz", "/health", "/ping"] {
        let resp = send(client().get(h.url(probe))).await;
        assert_eq!(resp.status(), 200, "{probe} while full");
    }
    let scrape = send(client().get(h.url("/metrics"))).await;
    assert_eq!(scrape.status(), 200);
    let scrape = scrape.text().await.unwrap();
    assert_eq!(
        metric(
            &scrape,
            r#"tutor_gateway_refused_total{limit="requests_in_flight"}"#
        ),
        1.0
    );
    assert_eq!(in_flight(), 1, "probes and scrapes are not the tier's load");
    drop(held);
    tutor_testkit::eventually("the place is free once the stream ended", || async {
        client()
            .get(h.url("/v1/models"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    eventually("every lane back to zero", || h.idle()).await;
    eventually("no request in flight", || in_flight() == 0).await;
    h.shutdown().await;
}

/// A body's parsed form is many times its text when its values are tiny (`0,` is two bytes, a
/// parsed value 32 and more): a waiting request holds what it holds in memory, not its text, and
/// a body of more values than any request needs is refused before anything parses it.
#[tokio::test]
async fn a_waiting_body_holds_its_parsed_size_and_a_body_of_countless_values_is_refused() {
    let h = harness(&flags(STALLING), |c| {
        set_lane(c, Lane::Small, 1);
        c.upstream.idle_timeout = Duration::from_secs(60);
    })
    .await;
    let with_values = |n: usize| {
        let mut body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 5,
                              "stream": true});
        // A field the gateway forwards as it is (`server.unknown_fields = "forward"`).
        body["metadata"] = Value::Array(vec![json!(0); n]);
        body
    };
    let seat = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&with_values(1)),
    )
    .await;
    assert_eq!(seat.status(), 200);
    // 10,000 values in 20 KB of text: waiting, it holds what they take parsed.
    let text = with_values(10_000).to_string();
    let waiting = tokio::spawn(
        client()
            .post(h.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(text.clone())
            .send(),
    );
    eventually("one request queued", || h.queued(Lane::Small) == 1).await;
    let held = h.gw.state.queued_bytes().held();
    assert!(
        held >= (text.len() + 10_000 * 32) as u64,
        "{held} bytes held for {} of text",
        text.len()
    );
    // More values than any request needs (a token-id prompt four times the model's length and
    // 16,384 more): refused, whatever room there is, and the engine never sees it.
    let max_len = h.gw.state.config().upstream.max_model_len.get() as usize;
    let before = h.sim_requests().await.len();
    let countless = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&with_values(4 * max_len + 16_384)),
    )
    .await;
    let err = assert_error(countless, 413, "body_too_large").await;
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("JSON values"),
        "{err}"
    );
    assert_eq!(h.sim_requests().await.len(), before);
    drop(seat);
    let admitted = waiting.await.unwrap().unwrap();
    assert_eq!(admitted.status(), 200);
    drop(admitted);
    eventually("every lane back to zero", || h.idle()).await;
    eventually("every byte back", || h.gw.state.queued_bytes().held() == 0).await;
    h.shutdown().await;
}

#[tokio::test]
async fn queued_bodies_are_bounded_in_bytes() {
    let h = harness(&flags(STALLING), |c| {
        set_lane(c, Lane::Small, 1);
        c.server.max_queued_bytes = 3000;
        c.upstream.idle_timeout = Duration::from_secs(60);
    })
    .await;
    let body = |salt: &str| json!({"messages": [{"role": "user", "content": format!("{salt} {}", "x".repeat(1800))}], "max_tokens": 5, "stream": true});
    // The only small seat is held by a stalled stream; the next request waits in the queue.
    let seat = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&body("a")),
    )
    .await;
    assert_eq!(seat.status(), 200);
    let url = h.url("/v1/chat/completions");
    let waiting = tokio::spawn(client().post(url).json(&body("b")).send());
    eventually("one request queued", || h.queued(Lane::Small) == 1).await;
    assert!(h.gw.state.queued_bytes().held() > 1800);
    // A second 1.8 KB body would pass the 3,000 bytes queued bodies may hold.
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&body("c")),
    )
    .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "queue_full");
    drop(seat);
    let admitted = waiting.await.unwrap().unwrap();
    assert_eq!(admitted.status(), 200);
    drop(admitted);
    eventually("every lane back to zero", || h.idle()).await;
    assert_eq!(h.gw.state.queued_bytes().held(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn every_wrong_call_gets_an_error_that_names_what_is_wrong() {
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |_| {}).await;
    // No such endpoint, or not with this method: the OpenAI error shape, not an empty body.
    let resp = send(client().get(h.url("/v1/nothing-here"))).await;
    assert_error(resp, 404, "not_found").await;
    let resp = send(client().get(h.url("/v1/chat/completions"))).await;
    assert_error(resp, 405, "method_not_allowed").await;
    let resp = send(client().put(h.url("/v1/completions")).body("{}")).await;
    assert_error(resp, 405, "method_not_allowed").await;
    // HEAD /answer starts nothing in the engine (a GET there starts an answer).
    let resp = send(client().head(h.url("/answer?prompt=why&max_output_tokens=3"))).await;
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "GET, POST");
    assert!(h.sim_requests().await.is_empty(), "the engine saw nothing");
    // A value of the wrong type: `param` names its field.
    for (field, value) in [
        ("max_tokens", json!(-5)),
        ("max_completion_tokens", json!(-3)),
        ("n", json!(-1)),
        ("model", json!(5)),
        ("stream_options", json!("yes")),
    ] {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        body[field] = value;
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        let err = assert_error(resp, 400, "bad_request").await;
        assert_eq!(err["error"]["param"], field, "{err}");
    }
    // /answer's output limit is its own field.
    let resp = send(client().get(h.url("/answer?prompt=hi&max_output_tokens=16385"))).await;
    let err = assert_error(resp, 400, "too_long").await;
    assert_eq!(err["error"]["param"], "max_output_tokens", "{err}");
    h.shutdown().await;
}

/// Under an open-file limit too low for `server.max_connections` (the default 10,000 against
/// `ulimit -n 256`), a connection beyond what the process can hold was accepted until the
/// accept failed for want of a file, and then waited in the listen backlog unanswered. The
/// gateway now accepts only what the limit holds ((256 - 64) / 2 = 96, said at start), and
/// the next connection gets its 503. The public listener's open connections are read from
/// the admin listener (its own seats): the test's 96 are all held before the next comes (the
/// start-up probe's connection, closed by the client, may still hold a seat for a moment on a
/// loaded machine), and every seat is back once they close.
#[tokio::test]
async fn under_a_low_open_file_limit_a_connection_beyond_it_gets_503() {
    use tokio::io::AsyncReadExt;
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(FAST))
        .await
        .unwrap();
    let gw = common::process::GatewayProcess::start_limited(
        "fds",
        &format!(
            "[server]\nheader_read_timeout_ms = 120000\nadmin_listen = \"127.0.0.1:0\"\n\
             [telemetry]\nrequest_log = \"off\"\n\
             [classify]\ntokenizer = \"heuristic\"\n\
             [upstream]\nbase_url = \"{}\"\n",
            sim.url()
        ),
        &[],
        Some(256),
    )
    .await;
    assert!(gw.log().contains("accepting=96"), "{}", gw.log());
    let metrics = format!("{}/metrics", gw.admin_url().await);
    let open = r#"tutor_gateway_connections_open{listener="public"}"#;
    let refused = r#"tutor_gateway_refused_total{limit="connections"}"#;
    let scrape = || async { get_text(&metrics).await };
    let open_is = |n: f64| {
        let scrape = &scrape;
        move || async move { metric(&scrape().await, open) == n }
    };
    tutor_testkit::eventually("the start-up probe's connection is closed", open_is(0.0)).await;
    let addr = gw.url.trim_start_matches("http://").to_owned();
    // The 96 it holds, idle (their head never comes).
    let mut held = Vec::new();
    for _ in 0..96 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    tutor_testkit::eventually("the 96 are held", open_is(96.0)).await;
    assert_eq!(metric_or_zero(&scrape().await, refused), 0.0);
    let mut beyond = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), beyond.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        read.is_ok(),
        "no answer: the connection was left hanging\n{}",
        gw.log()
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let text = scrape().await;
    assert_eq!(metric(&text, refused), 1.0, "{text}");
    assert_eq!(metric(&text, open), 96.0, "{text}");
    drop(held);
    tutor_testkit::eventually("every seat back", open_is(0.0)).await;
    drop(gw);
    sim.shutdown().await;
}

/// Bodies being received hold at most `server.max_receiving_bytes` together: two uploads that
/// stall at 600 bytes each under a bound of 1,000 cannot both be held (one gets 503
/// `overloaded`, whichever arrived second), so trickling uploads cannot hold
/// `max_requests_in_flight` x `max_body_bytes` of memory. A body larger than the bound passes
/// alone, and the stalled bytes come back when their connections go.
#[tokio::test]
async fn bodies_being_received_are_bounded_in_bytes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = harness(FAST, |c| {
        c.server.max_receiving_bytes = 1_000;
        c.server.body_read_timeout = Duration::from_secs(120);
    })
    .await;
    let stalled = || async {
        let mut tcp = tokio::net::TcpStream::connect(addr(&h)).await.unwrap();
        let part = format!("{{\"messages\":\"{}", "x".repeat(600));
        tcp.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
                 content-length: 2000\r\n\r\n{part}"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        tcp
    };
    let (mut one, mut two) = (stalled().await, stalled().await);
    let (mut a, mut b) = ([0u8; 64], [0u8; 64]);
    let answer = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::select! {
            n = one.read(&mut a) => String::from_utf8_lossy(&a[..n.unwrap()]).into_owned(),
            n = two.read(&mut b) => String::from_utf8_lossy(&b[..n.unwrap()]).into_owned(),
        }
    })
    .await
    .expect("one of the two uploads is refused");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    drop((one, two));
    // Alone, a body larger than the bound passes (once the stalled bytes are given back).
    let big =
        json!({"messages": [{"role": "user", "content": "y".repeat(4_000)}], "max_tokens": 2});
    let mut status = 0;
    for _ in 0..300 {
        status = client()
            .post(h.url("/v1/chat/completions"))
            .json(&big)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200);
    let m = metrics_now(&h);
    assert!(metric(&m, "tutor_gateway_refused_total{limit=\"receiving_bytes\"}") >= 1.0);
    h.shutdown().await;
}

/// A body the gateway will not read is refused before it is sent: a `Content-Length` above
/// `server.max_body_bytes` gets 413 at once (no `100 Continue` asking for 50 MB first), and a
/// compressed body 415 naming its encoding (it would be read as broken JSON). Neither reaches
/// a lane.
#[tokio::test]
async fn a_body_the_gateway_will_not_read_is_refused_before_it_is_sent() {
    let h = harness(FAST, |_| {}).await;
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 50000000\r\nexpect: 100-continue\r\n\r\n";
    let answer = send_head(&h, head).await.expect("an answer, then the end");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(answer.contains("\"code\":\"body_too_large\""), "{answer}");
    for encoding in ["gzip", "br", "identity, deflate"] {
        let resp = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("content-encoding", encoding)
                .body(r#"{"messages":[{"role":"user","content":"hi"}]}"#),
        )
        .await;
        let err = assert_error(resp, 415, "unsupported_media_type").await;
        let message = err["error"]["message"].as_str().unwrap();
        let named = encoding.rsplit(' ').next().unwrap();
        assert!(message.contains(named), "{message}");
    }
    // `identity` is no encoding.
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .header("content-encoding", "identity")
            .json(&serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
    let m = h.metrics_text().await;
    assert_eq!(family_total(&m, "tutor_gateway_requests_total"), 1.0, "{m}");
    assert_eq!(
        metric(&m, "tutor_gateway_denied_total{reason=\"body\"}"),
        4.0
    );
    // A request without a body is not refused for a header a proxy added.
    let resp = send(
        client()
            .get(h.url("/v1/models"))
            .header("content-encoding", "gzip"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(h.idle());
    h.shutdown().await;
}

/// Writes `head` (ignoring a write the gateway cut short) and reads until the gateway ends the
/// connection: what it sent, or `None` if it was still open after 30 s.
async fn send_head(h: &Harness, head: &[u8]) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr(h)).await.unwrap();
    let _ = tcp.write_all(head).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        // A reset (the gateway closed with bytes of ours unread) ends it as well as a close.
        while let Ok(n @ 1..) = tcp.read(&mut buf).await {
            out.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    ended
        .ok()
        .map(|()| String::from_utf8_lossy(&out).into_owned())
}

/// A request head is held to `server.max_head_bytes` (32 KiB by default; hyper alone would
/// buffer about 400 KB): a larger one is refused with 431, and one still arriving is not
/// buffered past it until the header timeout, so every open connection holds at most that.
#[tokio::test]
async fn request_heads_are_bounded_in_bytes() {
    let h = harness(FAST, |c| {
        c.server.header_read_timeout = Duration::from_secs(120)
    })
    .await;
    let head = |pad: usize, end: &str| {
        format!(
            "GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\nx-pad: {}\r\n{end}",
            "a".repeat(pad)
        )
    };
    let small = send_head(&h, head(24 << 10, "\r\n").as_bytes()).await;
    let small = small.expect("a 24 KiB head is answered");
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    for (what, head) in [
        ("a whole 40 KiB head", head(40 << 10, "\r\n")),
        ("40 KiB of a head still arriving", head(40 << 10, "")),
    ] {
        let answer = send_head(&h, head.as_bytes()).await;
        let answer = answer.unwrap_or_else(|| panic!("{what}: the connection stayed open"));
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{what}: {answer}"
        );
    }
    assert!(h.idle());
    served_again(&h, "served after the refusals").await;
    h.shutdown().await;
}

/// A body over `PARSE_INLINE_BYTES` is parsed on the blocking pool: it is answered as the
/// same body sent small would be, its refusals named the same way.
#[tokio::test]
async fn a_large_body_is_parsed_off_the_workers_with_the_same_answers() {
    let h = harness(FAST, |_| {}).await;
    let padded = |body: &str| {
        let pad = " ".repeat(tutor_gateway::pipeline::PARSE_INLINE_BYTES + 1);
        format!("{{{pad}{}", &body[1..])
    };
    let post = |path: &'static str, body: String| {
        let h = &h;
        async move {
            send(
                client()
                    .post(h.url(path))
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await
        }
    };
    let ok = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}"#;
    let resp = post("/v1/chat/completions", padded(ok)).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let two = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2}"#;
    let resp = post("/v1/chat/completions", padded(two)).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["param"], "n", "{err}");
    // Tools that no context could hold are refused as too long right after parsing (not
    // canonicalized, fingerprinted and keyed first); 60,000 values, under the most a body may
    // hold (beyond it the body is refused before parsing: 413 `body_too_large`).
    let zeros = vec![0; 60_000];
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"x": zeros}}}]);
    let big =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "tools": tools});
    let resp = post("/v1/chat/completions", big.to_string()).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "too_long", "{err}");
    let answer = r#"{"messages": [{"role": "user", "content": "hi"}], "max_output_tokens": 3}"#;
    let resp = post("/answer", padded(answer)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: done"), "{text}");
    h.shutdown().await;
}
