//! OpenTelemetry: one `llm.generate` span per request with the latency split and GenAI
//! attributes, for a normal request, a cancelled one and an upstream error; the client's trace
//! continues into vLLM through `traceparent`.
//!
//! Each test installs an in-memory exporter as the thread's subscriber; `#[tokio::test]` runs the
//! gateway and the simulator on that same thread, so every span lands there.

mod common;

use common::traces::{attr, traces};
use common::*;
use opentelemetry::trace::Status;
use opentelemetry::Value;
use opentelemetry_sdk::trace::SpanData;
use serde_json::json;

fn num(span: &SpanData, key: &str) -> f64 {
    match attr(span, key) {
        Some(Value::F64(v)) => v,
        Some(Value::I64(v)) => v as f64,
        other => panic!("{key}: {other:?} in {:?}", span.attributes),
    }
}

fn text(span: &SpanData, key: &str) -> String {
    match attr(span, key) {
        Some(v) => v.as_str().into_owned(),
        None => panic!("{key} missing in {:?}", span.attributes),
    }
}

/// The `traceparent` headers the simulator received, in order.
async fn traceparents(h: &Harness) -> Vec<String> {
    reqwest::get(format!("{}/debug/traceparents", h.sim.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

#[tokio::test]
async fn a_normal_request_has_the_full_span_and_its_trace_reaches_vllm() {
    let t = traces();
    let h = harness(
        &flags("--speed 20 --profile tiny-test --enable-prompt-tokens-details --enable-per-request-metrics"),
        |_| {},
    )
    .await;
    let resp = send(
        client()
            .get(h.url("/answer"))
            .query(&[
                ("prompt", "why does my loop never end?"),
                ("max_output_tokens", "12"),
            ])
            .header("traceparent", format!("00-{TRACE_ID}-00f067aa0ba902b7-01")),
    )
    .await;
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events.last().unwrap().0, "done");
    // The span closes when the handler is done, which may be just after the last byte.
    eventually("the span ended", || !t.generate_spans().is_empty()).await;
    let spans = t.generate_spans();
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(
        s.span_context.trace_id().to_string(),
        TRACE_ID,
        "joined the frontend's trace"
    );
    assert_eq!(s.parent_span_id.to_string(), "00f067aa0ba902b7");
    assert_eq!(text(s, "llm.lane"), "small");
    assert_eq!(text(s, "llm.outcome"), "ok");
    assert_eq!(s.status, Status::Unset);
    assert_eq!(num(s, "llm.output_tokens"), 12.0);
    assert_eq!(num(s, "gen_ai.usage.output_tokens"), 12.0);
    assert!(num(s, "gen_ai.usage.input_tokens") > 0.0);
    assert_eq!(
        num(s, "llm.input_tokens"),
        num(s, "gen_ai.usage.input_tokens")
    );
    assert!(num(s, "llm.input_tokens.estimated") > 0.0);
    assert_eq!(num(s, "llm.cached_tokens"), 0.0);
    assert!(num(s, "llm.time_to_first_token_ms") >= num(s, "llm.ttft_ms"));
    assert!(num(s, "llm.queue_wait_ms") >= 0.0);
    assert!(num(s, "llm.prefill_ms") >= 0.0);
    assert!(num(s, "llm.engine_queue_ms") >= 0.0);
    assert!(num(s, "llm.decode_tps") > 0.0);
    assert_eq!(text(s, "gen_ai.system"), "vllm");
    assert_eq!(text(s, "gen_ai.operation.name"), "chat");
    assert_eq!(
        text(s, "gen_ai.request.model"),
        "meta-llama/Llama-3.1-8B-Instruct"
    );
    assert_eq!(num(s, "gen_ai.request.max_tokens"), 12.0);
    assert_eq!(text(s, "gen_ai.response.finish_reasons"), "length");
    assert_eq!(
        text(s, "llm.prompt_fingerprint"),
        tutor_gateway::prompt::fingerprint("", None)
    );
    // vLLM got the gateway's span as parent: same trace, the gateway span's id.
    let seen = traceparents(&h).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0],
        format!("00-{TRACE_ID}-{}-01", s.span_context.span_id())
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_request_records_where_it_stopped() {
    let t = traces();
    // Real speed, 4,000 tokens (20 s): still generating when a loaded gateway notices the
    // client gone (900 tokens at five times the speed were done in 0.9 s).
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |_| {}).await;
    let resp = send(client().post(h.url("/v1/chat/completions")).json(
        &json!({"messages": [{"role": "user", "content": "explain ownership"}], "max_tokens": 4000,
                      "ignore_eos": true, "stream": true}),
    ))
    .await;
    let mut body = Streamed::new(resp);
    body.until(|seen| seen.matches("\"content\":\" ").count() >= 4)
        .await;
    drop(body);
    eventually("idle", || h.idle()).await;
    eventually("the span ended", || !t.generate_spans().is_empty()).await;
    let spans = t.generate_spans();
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(text(s, "llm.outcome"), "cancelled");
    assert_eq!(
        s.status,
        Status::Unset,
        "a client going away is not a failure"
    );
    assert!(num(s, "llm.cancelled_after_tokens") >= 4.0);
    assert_eq!(text(s, "gen_ai.operation.name"), "chat");
    assert!(attr(s, "llm.ttft_ms").is_some());
    h.shutdown().await;
}

#[tokio::test]
async fn an_upstream_error_is_on_the_span() {
    let t = traces();
    // Real speed and a long answer: the injected error (after 2 tokens) cannot share a batch
    // with the finish, however late the gateway reads (such a batch skips the error).
    let h = harness(
        &flags("--speed 1 --profile tiny-test --midstream-error-rate 1 --error-after-tokens 2"),
        |_| {},
    )
    .await;
    let body = post_text(
        h.url("/v1/completions"),
        &json!({"prompt": "def f():", "max_tokens": 2000, "stream": true}),
    )
    .await;
    assert!(body.contains("upstream_error"));
    eventually("the span ended", || !t.generate_spans().is_empty()).await;
    let spans = t.generate_spans();
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(text(s, "llm.outcome"), "upstream_error");
    assert_eq!(text(s, "error.type"), "upstream_error");
    // The engine failed it: the span's status says so, for "status = error" searches.
    assert_eq!(s.status, Status::error("upstream_error"));
    assert!(
        attr(s, "otel.status_description").is_none(),
        "the status, not an attribute"
    );
    assert_eq!(text(s, "gen_ai.operation.name"), "text_completion");
    // Without a client traceparent the gateway starts the trace and vLLM joins it.
    let seen = traceparents(&h).await;
    assert_eq!(
        seen,
        vec![format!(
            "00-{}-{}-01",
            s.span_context.trace_id(),
            s.span_context.span_id()
        )]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_job_has_one_span_in_the_submitting_clients_trace() {
    let t = traces();
    let h = harness(&["--speed", "20", "--profile", "tiny-test"], |_| {}).await;
    let resp = send(
        client()
            .post(h.url("/jobs"))
            .header("traceparent", format!("00-{TRACE_ID}-00f067aa0ba902b7-01"))
            .json(&json!({"prompt": "review my repository", "max_output_tokens": 6})),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let id = read_json(resp).await["id"].as_str().unwrap().to_owned();
    let status_url = h.url(&format!("/jobs/{id}"));
    let mut status = String::new();
    for _ in 0..1000 {
        let v = json(
            &reqwest::get(&status_url)
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
        status = v["status"].as_str().unwrap().to_owned();
        if status == "done" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(status, "done");
    eventually("the job's span ended", || !t.generate_spans().is_empty()).await;
    let spans = t.generate_spans();
    assert_eq!(spans.len(), 1, "one span per job");
    let s = &spans[0];
    assert_eq!(s.span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(s.parent_span_id.to_string(), "00f067aa0ba902b7");
    assert_eq!(text(s, "llm.lane"), "large");
    assert_eq!(text(s, "llm.outcome"), "ok");
    assert_eq!(s.status, Status::Unset);
    // The job's request to vLLM continues the same trace.
    let seen = traceparents(&h).await;
    assert_eq!(
        seen,
        [format!("00-{TRACE_ID}-{}-01", s.span_context.span_id())]
    );
    h.shutdown().await;
}

/// Only `llm.generate` spans are exported, whatever else is traced: an HTTP/2 request, whose
/// library traces a span per frame, exports that one span and nothing of HTTP/2's.
#[tokio::test]
async fn only_the_request_span_is_exported() {
    let t = traces();
    let h = harness(&flags("--speed 50 --profile tiny-test"), |_| {}).await;
    let tcp = tokio::net::TcpStream::connect(h.gw.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", h.gw.addr))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": true});
    send.send_data(bytes::Bytes::from(body.to_string()), true)
        .unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    let mut text = Vec::new();
    while let Some(data) = stream.data().await {
        let data = data.unwrap();
        let _ = stream.flow_control().release_capacity(data.len());
        text.extend_from_slice(&data);
    }
    assert!(String::from_utf8_lossy(&text).ends_with("data: [DONE]\n\n"));
    drop(client);
    eventually("the span ended", || !t.generate_spans().is_empty()).await;
    assert_eq!(t.span_names(), ["llm.generate"]);
    conn.abort();
    h.shutdown().await;
}
