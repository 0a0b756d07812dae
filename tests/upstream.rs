//! The upstream client against `vllm-sim` on 127.0.0.1:0: full streams, vLLM's errors, faults,
//! timeouts, and the engine abort (M21): closing the connection, plus the abort call in each
//! `upstream.abort.mode`, against the simulator as a default `vllm serve` (no abort endpoint)
//! and with `--enable-scale-out` (vLLM's `/inference/v1/abort_requests`).

#[path = "upstream/common.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::task::TaskTracker;
use tutor_gateway::config::{AbortIdFormat, AbortMode, Config, RequestLogSink};
use tutor_gateway::upstream::{
    AbortCaller, AbortEndpoint, AbortGuard, AbortState, Chunk, Endpoint, UpstreamClient,
    UpstreamError, UpstreamStream,
};

/// Reads to the end: every chunk, and the error that ended it, if any.
async fn drain(s: &mut UpstreamStream) -> (Vec<Chunk>, Option<UpstreamError>) {
    let mut chunks = Vec::new();
    while let Some(item) = s.next_event().await {
        match item {
            Ok(c) => chunks.push(c),
            Err(e) => return (chunks, Some(e)),
        }
    }
    (chunks, None)
}

fn text(chunks: &[Chunk]) -> String {
    chunks.iter().map(|c| c.text.as_str()).collect()
}

/// Reads until `n` content chunks arrived.
async fn read_tokens(s: &mut UpstreamStream, n: usize) {
    let mut seen = 0;
    while seen < n {
        let c = s.next_event().await.unwrap().unwrap();
        seen += usize::from(c.has_content);
    }
}

async fn wait_tasks(client: &UpstreamClient) {
    client.tasks().close();
    tokio::time::timeout(Duration::from_secs(30), client.tasks().wait())
        .await
        .expect("abort tasks finish");
}

#[tokio::test]
async fn chat_stream_parses_completely_with_exact_usage() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --enable-request-id-headers --enable-per-request-metrics",
    ))
    .await;
    let client = client_for(upstream_config(&s.url()));
    let mut stream = client
        .stream(chat("chat-1", &words(30, "q"), 20))
        .await
        .unwrap();
    assert_eq!(stream.headers()["x-request-id"], "chat-1");
    let (chunks, err) = drain(&mut stream).await;
    assert!(err.is_none(), "{err:?}");
    for c in &chunks {
        let v: Value = serde_json::from_slice(&c.raw).unwrap();
        assert_eq!(v["id"], "chatcmpl-chat-1");
    }
    assert!(!chunks[0].has_content, "role chunk first");
    assert_eq!(text(&chunks).split_whitespace().count(), 20);
    let tokens = stream.output_tokens();
    assert!(tokens.exact && tokens.count == 20, "{tokens:?}");
    let content_chunks = chunks.iter().filter(|c| c.has_content).count() as u32;
    assert!((1..=20).contains(&content_chunks));
    assert_eq!(stream.finish_reason(), Some("length"));
    assert!(stream.usage().unwrap().prompt_tokens >= 30);
    assert!(stream
        .engine_metrics()
        .unwrap()
        .time_to_first_token_ms
        .is_some());
    assert!(!stream.missing_done());
    assert_eq!(stream.abort_state(), AbortState::Disarmed);
    let t = stream.timings();
    let first = t.first_content_at.unwrap();
    assert!(t.sent_at <= t.headers_at && t.headers_at <= first && first <= t.ended_at.unwrap());
    s.shutdown().await;
}

#[tokio::test]
async fn completions_stream_parses_completely_with_exact_usage() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let client = client_for(upstream_config(&s.url()));
    let mut stream = client
        .stream(completion("cmp-1", &words(10, "p"), 15))
        .await
        .unwrap();
    let (chunks, err) = drain(&mut stream).await;
    assert!(err.is_none(), "{err:?}");
    let v: Value = serde_json::from_slice(&chunks[0].raw).unwrap();
    assert_eq!(v["id"], "cmpl-cmp-1");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(text(&chunks).split_whitespace().count(), 15);
    assert_eq!(stream.output_tokens().count, 15);
    assert!(stream.output_tokens().exact);
    s.shutdown().await;
}

#[tokio::test]
async fn callers_stream_options_are_kept_and_running_usage_is_exact() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let client = client_for(upstream_config(&s.url()));
    let mut req = chat("cont-1", "hi", 12);
    req.body.insert(
        "stream_options".into(),
        json!({"continuous_usage_stats": true}),
    );
    let mut stream = client.stream(req).await.unwrap();
    let mut last = 0;
    while let Some(c) = stream.next_event().await {
        let c = c.unwrap();
        let n = stream.output_tokens();
        assert!(n.exact, "usage on every chunk");
        assert!(n.count >= last);
        last = n.count;
        assert!(c.usage.is_some());
    }
    assert_eq!(last, 12);
    s.shutdown().await;
}

#[tokio::test]
async fn request_id_traceparent_and_forced_stream_body_reach_the_wire() {
    let rec = Recorder::start(None).await;
    let mut config = upstream_config(&rec.base_url);
    config.abort.mode = AbortMode::On; // no probe: the recorder sees the request first
    let client = client_for(config);
    let mut req = chat("trace-1", "hi", 5);
    req.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
    req.body.insert("stream".into(), json!(false));
    req.body.insert(
        "stream_options".into(),
        json!({"continuous_usage_stats": true}),
    );
    let mut stream = client.stream(req).await.unwrap();
    // The recorder answers 200 with an empty body: closed before any finish reason.
    assert!(matches!(
        drain(&mut stream).await.1,
        Some(UpstreamError::ClosedEarly)
    ));
    drop(stream);
    wait_tasks(&client).await;
    let seen = rec.seen();
    assert_eq!(seen.len(), 2, "the request, then one abort: {seen:?}");
    let head = seen[0].head.to_ascii_lowercase();
    assert!(head.starts_with("post /v1/chat/completions "), "{head}");
    assert!(head.contains("\r\nx-request-id: trace-1"), "{head}");
    assert!(head.contains("\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-"));
    let body: Value = serde_json::from_str(&seen[0].body).unwrap();
    assert_eq!(body["stream"], true);
    assert_eq!(
        body["stream_options"],
        json!({"continuous_usage_stats": true, "include_usage": true})
    );
    assert_eq!(body["model"], MODEL);
    assert!(seen[1]
        .head
        .starts_with("POST /inference/v1/abort_requests "));
    assert_eq!(seen[1].body, r#"{"request_ids":["chatcmpl-trace-1"]}"#);
}

#[tokio::test]
async fn prompt_too_long_comes_back_as_status_400_with_vllms_error() {
    let s = sim(&flags("--speed 50 --profile tiny-test --max-model-len 64")).await;
    let client = client_for(upstream_config(&s.url()));
    let err = client
        .stream(chat("long-1", &words(200, "x"), 8))
        .await
        .unwrap_err();
    let UpstreamError::Status { status, error } = err else {
        panic!("{err:?}")
    };
    assert_eq!(status, 400);
    assert_eq!(error.kind.as_deref(), Some("BadRequestError"));
    assert_eq!(error.param.as_deref(), Some("input_tokens"));
    assert_eq!(error.code.as_deref(), Some("400"));
    assert!(
        error
            .message
            .contains("maximum context length is 64 tokens"),
        "{}",
        error.message
    );
    let raw: Value = serde_json::from_slice(&error.raw).unwrap();
    assert_eq!(raw["error"]["param"], "input_tokens");

    let mut wrong_model = chat("model-1", "hi", 4);
    wrong_model
        .body
        .insert("model".into(), json!("no-such-model"));
    let err = client.stream(wrong_model).await.unwrap_err();
    assert!(
        matches!(&err, UpstreamError::Status { status, error }
        if *status == 404 && error.kind.as_deref() == Some("NotFoundError")),
        "{err:?}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn upstream_500_before_streaming_is_a_status_error() {
    let s = sim(&flags("--speed 50 --profile tiny-test --fail-rate 1")).await;
    let client = client_for(upstream_config(&s.url()));
    let err = client.stream(chat("fail-1", "hi", 4)).await.unwrap_err();
    assert!(
        matches!(&err, UpstreamError::Status { status, error }
        if *status == 500 && error.kind.as_deref() == Some("InternalServerError")),
        "{err:?}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn upstream_down_is_unavailable_fast() {
    let refused = tutor_testkit::RefusedPort::new();
    let port = refused.port();
    // Every timeout an hour long: only the refused connection can end these calls, so "fast"
    // needs no stopwatch. The 60 s guard fails the test if a call waits for a timeout instead.
    let mut config = upstream_config(&format!("http://127.0.0.1:{port}"));
    config.connect_timeout = Duration::from_secs(3_600);
    config.first_token_timeout = Duration::from_secs(3_600);
    config.idle_timeout = Duration::from_secs(3_600);
    config.total_timeout = Duration::from_secs(3_600);
    let client = client_for(config);
    tokio::time::timeout(Duration::from_secs(60), async {
        let err = client.stream(chat("down-1", "hi", 4)).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Unavailable(_)), "{err:?}");
        assert!(client
            .health()
            .await
            .is_err_and(|e| matches!(e, UpstreamError::Unavailable(_))));
        assert!(client
            .models()
            .await
            .is_err_and(|e| matches!(e, UpstreamError::Unavailable(_))));
    })
    .await
    .expect("a refused connection fails at once, without waiting for a timeout");
}

#[tokio::test]
async fn models_and_health_pass_through() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let client = client_for(upstream_config(&s.url()));
    client.health().await.unwrap();
    let models = client.models().await.unwrap();
    assert_eq!(models.status, 200);
    assert!(models
        .content_type
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v: Value = serde_json::from_slice(&models.body).unwrap();
    assert_eq!(v["data"][0]["id"], MODEL);
    s.shutdown().await;
}

#[tokio::test]
async fn stalled_stream_hits_the_idle_timeout_and_the_engine_is_aborted() {
    let s = sim(&flags(
        "--speed 2 --profile tiny-test --stall-after-tokens 3 --enable-scale-out",
    ))
    .await;
    let mut config = upstream_config(&s.url());
    // 3 s: a loaded machine that leaves the reader unpolled for a while between two of the
    // first three tokens must not pass for a silent engine.
    config.idle_timeout = Duration::from_secs(3);
    let client = client_for(config);
    assert_eq!(probed(&client).await, AbortEndpoint::Offered);
    // An answer long enough that the engine is still generating it when the abort comes, however
    // late a loaded machine sends it (a short one could finish in the engine first: nothing left
    // to abort). 5,000 tokens take about 12 s here, well past the 3 s timeout.
    let mut stream = client.stream(chat("stall-1", "hi", 5000)).await.unwrap();
    let started = Instant::now();
    let (chunks, err) = drain(&mut stream).await;
    assert!(
        matches!(err, Some(UpstreamError::IdleTimeout(_))),
        "{err:?}"
    );
    // The idle timer runs from the last token, which came after `started`: a lower bound that
    // holds however loaded the machine is. (The error kind shows it was not the total timeout.)
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(text(&chunks).split_whitespace().count(), 3);
    assert!(stream.abort_state().call_sent());
    assert!(!stream.output_tokens().exact);
    wait_tasks(&client).await;
    assert_eq!(stream.abort_state(), AbortState::Sent);
    assert_one_abort_in_engine(&s).await;
    s.shutdown().await;
}

#[tokio::test]
async fn queued_in_the_engine_past_the_first_token_timeout_is_aborted_there() {
    let s = sim(&flags("--speed 1 --profile tiny-test --max-num-seqs 1")).await;
    let mut config = upstream_config(&s.url());
    config.first_token_timeout = Duration::from_millis(300);
    let client = client_for(config);
    // The busy request through a client of its own, with the default timeouts: a loaded machine
    // may take longer than 300 ms to bring its first token, which is not what is tested.
    let busy_client = client_for(upstream_config(&s.url()));
    let mut busy = busy_client
        .stream(chat("busy-1", "hi", 5000))
        .await
        .unwrap();
    read_tokens(&mut busy, 1).await;
    let mut queued = client.stream(chat("queued-1", "hi", 5)).await.unwrap();
    let (_, err) = drain(&mut queued).await;
    assert!(
        matches!(err, Some(UpstreamError::FirstTokenTimeout(_))),
        "{err:?}"
    );
    let waiting = format!("vllm:num_requests_waiting{{engine=\"0\",model_name=\"{MODEL}\"}}");
    eventually("the queued request left the engine", || async {
        metric(&s, &waiting).await == 0.0 && metric(&s, &aborted()).await == 1.0
    })
    .await;
    assert_eq!(
        metric(&s, &running()).await,
        1.0,
        "the busy request still runs"
    );
    drop(busy);
    eventually("busy aborted too", || async {
        metric(&s, &running()).await == 0.0
    })
    .await;
    s.shutdown().await;
}

#[tokio::test]
async fn midstream_error_is_an_engine_error() {
    // Real speed and a long answer: the injected error (after 3 tokens) cannot share a batch
    // with the finish, however late this reader polls. (The simulator skips the error when
    // the batch that crosses the threshold also finishes the request.)
    let s = sim(&flags(
        "--speed 1 --profile tiny-test --midstream-error-rate 1 --error-after-tokens 3",
    ))
    .await;
    let client = client_for(upstream_config(&s.url()));
    let mut stream = client.stream(chat("err-1", "hi", 5000)).await.unwrap();
    let (chunks, err) = drain(&mut stream).await;
    let Some(UpstreamError::Engine(e)) = err else {
        panic!("{err:?}")
    };
    assert_eq!(e.message, "injected engine error");
    assert_eq!(e.code.as_deref(), Some("500"));
    assert_eq!(text(&chunks).split_whitespace().count(), 3);
    assert!(stream.next_event().await.is_none());
    s.shutdown().await;
}

#[tokio::test]
async fn garbage_is_a_protocol_error_and_the_abort_is_sent() {
    let s = sim(&flags(
        "--speed 1 --profile tiny-test --garbage-rate 1 --enable-scale-out",
    ))
    .await;
    let client = client_for(upstream_config(&s.url()));
    assert_eq!(probed(&client).await, AbortEndpoint::Offered);
    let mut stream = client.stream(chat("junk-1", "hi", 5000)).await.unwrap();
    let (_, err) = drain(&mut stream).await;
    let Some(UpstreamError::Protocol(msg)) = err else {
        panic!("{err:?}")
    };
    assert!(
        !msg.contains("truncated"),
        "no payload text in errors: {msg}"
    );
    assert!(stream.abort_state().call_sent());
    wait_tasks(&client).await;
    assert_eq!(stream.abort_state(), AbortState::Sent);
    assert_one_abort_in_engine(&s).await;
    s.shutdown().await;
}

#[tokio::test]
async fn omitted_done_after_the_finish_ends_cleanly() {
    let s = sim(&flags("--speed 50 --profile tiny-test --omit-done-rate 1")).await;
    let client = client_for(upstream_config(&s.url()));
    let mut stream = client.stream(chat("nodone-1", "hi", 7)).await.unwrap();
    let (_, err) = drain(&mut stream).await;
    assert!(err.is_none(), "{err:?}");
    assert!(stream.missing_done());
    assert_eq!(stream.output_tokens().count, 7);
    assert_eq!(stream.abort_state(), AbortState::Disarmed);
    s.shutdown().await;
}

#[tokio::test]
async fn stock_vllm_a_dropped_stream_stops_generation_with_no_abort_call_and_the_probe_says_what_to_set(
) {
    let (logs, _guard) = capture_logs();
    // A default `vllm serve`: no abort endpoint.
    let s = sim(&["--speed", "1", "--profile", "tiny-test"]).await;
    let client = client_for(upstream_config(&s.url()));
    assert_eq!(probed(&client).await, AbortEndpoint::Absent);
    let mut stream = client.stream(chat("stock-1", "hi", 5000)).await.unwrap();
    read_tokens(&mut stream, 3).await;
    let watch = stream.abort_watch();
    drop(stream);
    assert_eq!(watch.state(), AbortState::ConnectionOnly);
    assert_one_abort_in_engine(&s).await;
    // Generation stopped: nothing runs in the engine any more (a step already under way when
    // the abort landed may still finish, so steps are not compared).
    assert_eq!(s.engine.snapshot().running, 0, "generation stopped");
    wait_tasks(&client).await;
    assert_eq!(abort_calls(&s).await.len(), 1, "the probe only");
    assert!(abort_calls_after_probe(&s).await.is_empty());
    let text = logs.text();
    assert!(!text.contains("refused"), "{text}");
    // Said once, at warn level, with the URL it tried and what to set instead.
    let said: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("engine has no abort endpoint"))
        .collect();
    assert_eq!(said.len(), 1, "{text}");
    assert!(said[0].contains("WARN"), "{text}");
    assert!(said[0].contains("/inference/v1/abort_requests"), "{text}");
    assert!(said[0].contains("VLLM_SERVER_DEV_MODE"), "{text}");
    s.shutdown().await;
}

#[tokio::test]
async fn auto_against_the_scale_out_endpoint_probes_then_calls_it() {
    let s = sim(&flags("--speed 1 --profile tiny-test --enable-scale-out")).await;
    let client = client_for(upstream_config(&s.url()));
    assert_eq!(probed(&client).await, AbortEndpoint::Offered);
    let probe = abort_calls(&s).await;
    assert_eq!(probe.len(), 1);
    assert_eq!(
        (probe[0]["status"].as_u64(), probe[0]["aborted"].as_u64()),
        (Some(200), Some(0)),
        "the probe names no request: {probe:?}"
    );
    let mut stream = client.stream(chat("auto-1", "hi", 5000)).await.unwrap();
    read_tokens(&mut stream, 3).await;
    let watch = stream.abort_watch();
    drop(stream);
    wait_tasks(&client).await;
    assert_eq!(watch.state(), AbortState::Sent);
    let calls = abort_calls_after_probe(&s).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["request_ids"], json!(["chatcmpl-auto-1"]));
    assert_one_abort_in_engine(&s).await;
    s.shutdown().await;
}

#[tokio::test]
async fn mode_on_calls_even_a_stock_vllm_and_logs_the_refusal() {
    let (logs, _guard) = capture_logs();
    let s = sim(&["--speed", "1", "--profile", "tiny-test"]).await;
    let mut config = upstream_config(&s.url());
    config.abort.mode = AbortMode::On;
    let client = client_for(config);
    let mut stream = client.stream(chat("on-1", "hi", 5000)).await.unwrap();
    read_tokens(&mut stream, 3).await;
    let watch = stream.abort_watch();
    drop(stream);
    wait_tasks(&client).await;
    assert_eq!(
        client.abort_endpoint(),
        AbortEndpoint::Unknown,
        "on never probes"
    );
    assert_eq!(watch.state(), AbortState::Failed);
    let calls = abort_calls(&s).await;
    assert_eq!(calls.len(), 1, "no probe, one call: {calls:?}");
    assert_eq!(calls[0]["status"], 403);
    assert!(logs.text().contains("engine abort refused"));
    // The closed connection stopped it all the same.
    assert_one_abort_in_engine(&s).await;
    s.shutdown().await;
}

#[tokio::test]
async fn dropping_the_stream_midway_sends_exactly_one_abort_that_reaches_the_engine() {
    let s = sim(&flags("--speed 1 --profile tiny-test --enable-scale-out")).await;
    let client = client_for(upstream_config(&s.url()));
    assert_eq!(probed(&client).await, AbortEndpoint::Offered);
    let mut stream = client.stream(chat("walk-1", "hi", 5000)).await.unwrap();
    read_tokens(&mut stream, 3).await;
    assert_eq!(metric(&s, &running()).await, 1.0);
    let watch = stream.abort_watch();
    drop(stream);
    wait_tasks(&client).await;
    assert_eq!(watch.state(), AbortState::Sent);
    let calls = abort_calls_after_probe(&s).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["request_ids"], json!(["chatcmpl-walk-1"]));
    assert_one_abort_in_engine(&s).await;
    s.shutdown().await;
}

/// Starts a stream straight at the simulator, held open by a plain reqwest body the abort
/// guard knows nothing about; returns the body once a token arrived.
async fn held_open(s: &vllm_sim::SimServer, endpoint: Endpoint, id: &str) -> impl Sized {
    let body = match endpoint {
        Endpoint::ChatCompletions => json!({"messages": [{"role": "user", "content": "hi"}]}),
        Endpoint::Completions => json!({"prompt": "hi"}),
    };
    let mut body = body.as_object().unwrap().clone();
    body.extend(
        json!({"max_tokens": 5000, "ignore_eos": true, "stream": true})
            .as_object()
            .unwrap()
            .clone(),
    );
    let resp = send(
        reqwest::Client::new()
            .post(format!("{}{}", s.url(), endpoint.path()))
            .header("x-request-id", id)
            .json(&body),
    )
    .await;
    let mut body = resp.bytes_stream();
    body.next().await.unwrap().unwrap();
    body
}

#[tokio::test]
async fn the_abort_call_alone_stops_the_engine_while_the_connection_stays_open() {
    let s = sim(&flags("--speed 1 --profile tiny-test --enable-scale-out")).await;
    let mut config = upstream_config(&s.url());
    config.abort.mode = AbortMode::On;
    let tasks = TaskTracker::new();
    let caller = AbortCaller::new(reqwest::Client::new(), Arc::new(config), tasks.clone());
    // A chat completion is chatcmpl-<id>, a completion cmpl-<id>-0: the simulator's endpoint,
    // like vLLM's, takes only these, so a wrong id leaves the request running.
    for (endpoint, id, engine_id) in [
        (Endpoint::ChatCompletions, "open-1", "chatcmpl-open-1"),
        (Endpoint::Completions, "open-2", "cmpl-open-2-0"),
    ] {
        let body = held_open(&s, endpoint, id).await;
        let mut guard = caller.arm(id.into(), endpoint);
        assert!(guard.abort_now());
        eventually("the engine aborted it", || async {
            metric(&s, &running()).await == 0.0
        })
        .await;
        let calls = abort_calls(&s).await;
        let last = calls.last().unwrap();
        assert_eq!(last["request_ids"], json!([engine_id]));
        assert_eq!(last["aborted"], 1, "{calls:?}");
        drop(guard);
        drop(body);
    }
    tasks.close();
    tasks.wait().await;
    assert_eq!(s.engine.snapshot().aborted, 2);
    s.shutdown().await;
}

#[tokio::test]
async fn an_abort_naming_the_wrong_id_gets_200_and_stops_nothing() {
    // The X-Request-Id as sent is not the id vLLM's endpoint takes: 200, yet nothing stops.
    let s = sim(&flags("--speed 1 --profile tiny-test --enable-scale-out")).await;
    let mut config = upstream_config(&s.url());
    config.abort.mode = AbortMode::On;
    config.abort.id_format = AbortIdFormat::AsSent;
    let body = held_open(&s, Endpoint::ChatCompletions, "open-3").await;
    let tasks = TaskTracker::new();
    let mut guard = AbortGuard::new(
        reqwest::Client::new(),
        Arc::new(config),
        "open-3".into(),
        tasks.clone(),
    );
    assert!(guard.abort_now());
    tasks.close();
    tasks.wait().await;
    assert_eq!(
        guard.state(),
        AbortState::Sent,
        "vLLM answers 200 to any id"
    );
    let calls = abort_calls(&s).await;
    assert_eq!(calls[0]["request_ids"], json!(["open-3"]));
    assert_eq!(calls[0]["aborted"], 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(metric(&s, &running()).await, 1.0, "still generating");
    drop(body);
    assert_one_abort_in_engine(&s).await;
    s.shutdown().await;
}

#[tokio::test]
async fn mode_off_makes_no_call_and_the_dropped_connection_still_ends_the_request() {
    let s = sim(&flags("--speed 1 --profile tiny-test --enable-scale-out")).await;
    let mut config = upstream_config(&s.url());
    config.abort.mode = AbortMode::Off;
    let client = client_for(config);
    let mut stream = client.stream(chat("quiet-1", "hi", 5000)).await.unwrap();
    read_tokens(&mut stream, 3).await;
    let watch = stream.abort_watch();
    drop(stream);
    assert_eq!(watch.state(), AbortState::ConnectionOnly);
    assert_one_abort_in_engine(&s).await;
    wait_tasks(&client).await;
    assert!(abort_calls(&s).await.is_empty(), "no probe, no call");
    s.shutdown().await;
}

#[tokio::test]
async fn the_gateway_before_a_stock_vllm_client_disconnect_stops_generation_without_a_call() {
    // The acceptance test (issue 18, item 5): a client of the gateway goes away mid-stream.
    let (logs, _guard) = capture_logs();
    // Real speed: the answer's 4,000 tokens take 20 s, so the engine is still at work whenever
    // a loaded gateway notices its client gone.
    let s = sim(&["--speed", "1", "--profile", "tiny-test"]).await;
    let mut config = Config::default();
    config.upstream.base_url = s.url();
    config.telemetry.request_log = RequestLogSink::Off;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = tutor_gateway::server::start(config, listener).unwrap();
    assert_eq!(probed(&gw.state.upstream()).await, AbortEndpoint::Absent);
    let resp = send(
        reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", gw.url()))
            .json(
                &json!({"messages": [{"role": "user", "content": "explain ownership"}],
                      "max_tokens": 4000, "ignore_eos": true, "stream": true}),
            ),
    )
    .await;
    let mut body = Streamed::new(resp);
    body.until(|text| text.matches("\"content\":\" ").count() >= 3)
        .await;
    drop(body);
    // Generation stopped: the engine aborted it and nothing runs there any more.
    assert_one_abort_in_engine(&s).await;
    gw.shutdown().await;
    assert!(
        abort_calls_after_probe(&s).await.is_empty(),
        "no abort call"
    );
    let text = logs.text();
    assert!(!text.contains("refused"), "{text}");
    assert!(!text.contains("engine abort failed"), "{text}");
    s.shutdown().await;
}

#[tokio::test]
async fn a_healthy_health_check_probes_what_start_up_could_not() {
    let s = sim(&flags("--speed 50 --profile tiny-test --enable-scale-out")).await;
    let config = upstream_config(&s.url());
    // Built outside any runtime (as before the engine could be asked): nothing probed yet.
    let client = std::thread::spawn(move || client_for(config))
        .join()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(client.abort_endpoint(), AbortEndpoint::Unknown);
    assert!(abort_calls(&s).await.is_empty());
    client.health().await.unwrap();
    assert_eq!(probed(&client).await, AbortEndpoint::Offered);
    client.health().await.unwrap();
    wait_tasks(&client).await;
    assert_eq!(abort_calls(&s).await.len(), 1, "one probe");
    s.shutdown().await;
}
