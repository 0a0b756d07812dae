//! Helpers for `tests/upstream.rs`: the simulator, a test config, metrics, the abort calls the
//! simulator saw, captured logs, and a recording HTTP endpoint. HTTP, scraping and polling
//! helpers come from `tutor-testkit`.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;
use tutor_gateway::config::{Config, UpstreamConfig};
use tutor_gateway::upstream::{AbortEndpoint, Endpoint, UpstreamClient, UpstreamRequest};
use vllm_sim::{SimArgs, SimServer};

pub use tutor_testkit::{eventually, flags, get_json, send, words, Streamed};
use tutor_testkit::{metric_or_zero, metrics_text};

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// The simulator with `extra` flags: a default `vllm serve` (no abort endpoint; a closed
/// connection aborts) unless `extra` has `--enable-scale-out`.
pub async fn sim(extra: &[&str]) -> SimServer {
    vllm_sim::start(&SimArgs::for_test(extra))
        .await
        .expect("simulator starts")
}

/// The shipped upstream config pointed at `base_url`, with test-sized timeouts.
pub fn upstream_config(base_url: &str) -> UpstreamConfig {
    let mut c = Config::default().upstream;
    c.base_url = base_url.to_owned();
    // Bounded, with room for a loaded machine's accept (every engine here is on loopback).
    c.connect_timeout = Duration::from_secs(5);
    c.first_token_timeout = Duration::from_secs(10);
    c.idle_timeout = Duration::from_secs(5);
    c.total_timeout = Duration::from_secs(30);
    c
}

pub fn client_for(config: UpstreamConfig) -> UpstreamClient {
    UpstreamClient::new(config, TaskTracker::new()).unwrap()
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

/// A chat request; the client adds `stream` and `stream_options` itself.
pub fn chat(id: &str, content: &str, max_tokens: u32) -> UpstreamRequest {
    UpstreamRequest {
        endpoint: Endpoint::ChatCompletions,
        request_id: id.to_owned(),
        traceparent: None,
        affinity: None,
        pin: None,
        continues_answer: false,
        body: object(json!({
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "ignore_eos": true,
        })),
    }
}

pub fn completion(id: &str, prompt: &str, max_tokens: u32) -> UpstreamRequest {
    UpstreamRequest {
        endpoint: Endpoint::Completions,
        request_id: id.to_owned(),
        traceparent: None,
        affinity: None,
        pin: None,
        continues_answer: false,
        body: object(json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true})),
    }
}

/// Value of one metric series, 0 when absent (a counter not yet incremented).
pub async fn metric(s: &SimServer, series: &str) -> f64 {
    metric_or_zero(&metrics_text(&s.url()).await, series)
}

pub fn running() -> String {
    format!("vllm:num_requests_running{{engine=\"0\",model_name=\"{MODEL}\"}}")
}

pub fn aborted() -> String {
    format!(
        "vllm:request_success_total{{engine=\"0\",model_name=\"{MODEL}\",finished_reason=\"abort\"}}"
    )
}

/// Waits until the client's start-up probe of the abort endpoint has an answer; returns it.
pub async fn probed(client: &UpstreamClient) -> AbortEndpoint {
    eventually("the abort endpoint probe answered", || async {
        !matches!(
            client.abort_endpoint(),
            AbortEndpoint::Unknown | AbortEndpoint::Probing
        )
    })
    .await;
    client.abort_endpoint()
}

/// Every call the simulator saw to an abort path (`/debug/aborts`): `path`, `status`,
/// `request_ids`, `aborted` (how many requests the ids matched).
pub async fn abort_calls(s: &SimServer) -> Vec<Value> {
    serde_json::from_value(get_json(format!("{}/debug/aborts", s.url())).await).unwrap()
}

/// The abort calls the simulator saw besides the client's probe (whose id starts with
/// [`tutor_gateway::upstream::PROBE_ID_PREFIX`]).
pub async fn abort_calls_after_probe(s: &SimServer) -> Vec<Value> {
    abort_calls(s)
        .await
        .into_iter()
        .filter(|c| {
            !c["request_ids"][0]
                .as_str()
                .is_some_and(|id| id.contains(tutor_gateway::upstream::PROBE_ID_PREFIX))
        })
        .collect()
}

/// Everything logged at DEBUG and above while the guard lives (see
/// [`tutor_testkit::capture_logs`]).
pub fn capture_logs() -> (Captured, tracing::subscriber::DefaultGuard) {
    tutor_testkit::capture_logs(tracing::Level::DEBUG)
}

pub use tutor_testkit::Captured;

/// The engine dropped exactly one request as aborted and runs nothing.
pub async fn assert_one_abort_in_engine(s: &SimServer) {
    for _ in 0..1000 {
        if metric(s, &running()).await == 0.0 && metric(s, &aborted()).await == 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let e = get_json(format!("{}/debug/engine", s.url())).await;
    assert_eq!(e["aborted"], 1, "{e}");
    assert_eq!(e["running"], 0, "{e}");
}

/// One request as the recorder saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Request line and headers.
    pub head: String,
    pub body: String,
}

/// A tiny HTTP endpoint that records every request, optionally forwards its body to
/// `{forward}/inference/v1/abort_requests`, then answers `200` with an empty body.
pub struct Recorder {
    pub base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    pub async fn start(forward: Option<String>) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                let forward = forward.clone();
                tokio::spawn(async move {
                    let Some(req) = read_request(&mut sock).await else {
                        return;
                    };
                    if let Some(to) = forward {
                        send(
                            reqwest::Client::new()
                                .post(format!("{to}/inference/v1/abort_requests"))
                                .header("content-type", "application/json")
                                .body(req.body.clone()),
                        )
                        .await;
                    }
                    log.lock().unwrap().push(req);
                    let _ = sock
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        Recorder { base_url, seen }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let head = text[..end].to_owned();
        let len = tutor_testkit::content_length(&head);
        while buf.len() < end + 4 + len {
            let n = sock.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
        return Some(Seen { head, body });
    }
}
