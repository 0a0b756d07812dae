//! Test support shared by the gateway's tests and benches, the simulator's tests and the load
//! tool's tests: HTTP round trips ([`send`], [`send_text`], [`send_json`], [`Streamed`]), SSE
//! bodies read with the one parser of [`tutor_wire::sse`], Prometheus scrapes read with
//! [`tutor_wire::prom`], polling, the simulator's flags written as one line ([`flags`]), free
//! ports, a forwarder that cuts and restores connections ([`Outage`]) and log capture
//! ([`capture_logs`]).
//!
//! It depends on neither the gateway nor the simulator, so any crate of the workspace can use it
//! as a dev-dependency without a cycle. Helpers panic on failure: they are for tests.
//! [`bench`] holds what the benchmarks share; [`picture`], pictures in `data:` URLs.

pub mod bench;
pub mod logs;
mod outage;
pub mod picture;

pub use logs::{capture_logs, Captured};
pub use outage::Outage;

use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use tutor_wire::sse::{SseEvent, SseParser};

/// An HTTP client with a 60 s timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Sends `request`; panics when it cannot be sent (the answer's status is not checked).
pub async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
    request.send().await.unwrap()
}

/// Sends `request` and reads the whole answer as text.
pub async fn send_text(request: reqwest::RequestBuilder) -> String {
    send(request).await.text().await.unwrap()
}

/// Sends `request` and parses the whole answer as JSON.
pub async fn send_json(request: reqwest::RequestBuilder) -> Value {
    send(request).await.json().await.unwrap()
}

/// POSTs `body` as JSON and reads the whole answer as text.
pub async fn post_text(url: impl reqwest::IntoUrl, body: &Value) -> String {
    send_text(client().post(url).json(body)).await
}

/// GETs `url` and reads the whole answer as text.
pub async fn get_text(url: impl reqwest::IntoUrl) -> String {
    send_text(client().get(url)).await
}

/// GETs `url` and parses the answer as JSON.
pub async fn get_json(url: impl reqwest::IntoUrl) -> Value {
    send_json(client().get(url)).await
}

/// A streaming answer read piece by piece, with the text read so far.
pub struct Streamed {
    resp: reqwest::Response,
    /// Everything read so far.
    pub text: String,
}

impl Streamed {
    /// Starts reading `resp`'s body.
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            text: String::new(),
        }
    }

    /// Reads until `done` holds for the text so far (checked before each read); panics when the
    /// body ends first.
    pub async fn until(&mut self, mut done: impl FnMut(&str) -> bool) -> &str {
        while !done(&self.text) {
            let chunk = self.resp.chunk().await.unwrap();
            let chunk = chunk.unwrap_or_else(|| panic!("the body ended first:\n{}", self.text));
            self.text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        &self.text
    }

    /// Reads the body to its end; the whole text.
    pub async fn rest(mut self) -> String {
        while let Some(chunk) = self.resp.chunk().await.unwrap() {
            self.text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        self.text
    }
}

/// A TCP port on 127.0.0.1 where every connection is refused, for as long as this value lives:
/// a socket bound to it that never listens. Nobody else can take the port meanwhile, so an
/// "engine down" test cannot reach another test's listener that happened to get a port picked
/// and released (the race of [`free_port`]).
pub struct RefusedPort {
    socket: tokio::net::TcpSocket,
}

impl RefusedPort {
    /// Binds a fresh port (the kernel's pick) without listening on it.
    pub fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        Self { socket }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.socket.local_addr().unwrap().port()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }
}

impl Default for RefusedPort {
    fn default() -> Self {
        Self::new()
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound, read and released). Another
/// process's listener or any outgoing connection may take it before it is used: prefer port 0
/// and reading the bound port back, or [`RefusedPort`] for a port where nothing answers.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The `Content-Length` of an HTTP head (the text before the blank line), 0 when it has none.
pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0)
}

/// Command-line flags written as one line (`"--speed 1 --profile tiny-test"`), split at white
/// space: how tests give the simulator its arguments.
pub fn flags(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// About `n` heuristic tokens of text after `salt` (each word is one token).
pub fn words(n: usize, salt: &str) -> String {
    let mut s = String::from(salt);
    for i in 0..n {
        s.push_str([" cat", " dog", " map", " key", " fn", " let"][i % 6]);
    }
    s
}

/// Every complete event of a whole SSE body, as [`SseParser`] reads it; an event left
/// unterminated at the end counts as ended.
pub fn parse_sse(body: &str) -> Vec<SseEvent> {
    let mut parser = SseParser::default();
    parser
        .feed(body.as_bytes())
        .expect("SSE body within the event size cap");
    parser.feed(b"\n\n").unwrap();
    std::iter::from_fn(|| parser.pop_event()).collect()
}

fn data_text(event: &SseEvent) -> String {
    String::from_utf8(event.data.to_vec()).expect("SSE data is UTF-8")
}

/// An SSE body as (event name, data) pairs; `data:`-only events get the name `message`. Asserts
/// that the body holds only `event: `, `data: `, `id: ` and `retry: ` lines.
pub fn sse(body: &str) -> Vec<(String, String)> {
    for line in body.lines() {
        assert!(
            line.is_empty()
                || ["event: ", "data: ", "id: ", "retry: "]
                    .iter()
                    .any(|f| line.starts_with(f)),
            "unexpected SSE line {line:?}"
        );
    }
    parse_sse(body)
        .iter()
        .map(|e| (e.name().to_owned(), data_text(e)))
        .collect()
}

/// The `data:` payloads of an SSE body, asserting vLLM's framing: only `data: ` lines, one per
/// event, each event terminated by a blank line.
pub fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "stream must end with a blank line: {body:?}"
    );
    let data: Vec<String> = parse_sse(body).iter().map(data_text).collect();
    let framed: String = data.iter().map(|d| format!("data: {d}\n\n")).collect();
    assert_eq!(framed, body, "vLLM framing: one `data: ` line per event");
    data
}

/// Generated text in one chat completion chunk (`choices[0].delta.content`, empty when
/// absent), given as its SSE `data` payload.
pub fn delta_text(data: &str) -> String {
    let v: Value = serde_json::from_str(data).unwrap();
    v["choices"][0]["delta"]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Words of generated text in one chat completion chunk ([`delta_text`]).
pub fn delta_words(data: &str) -> usize {
    delta_text(data).split_whitespace().count()
}

/// Words of generated text in a whole (non-streamed) chat completion
/// (`choices[0].message.content`, which must be a string).
pub fn message_words(chat: &Value) -> usize {
    chat["choices"][0]["message"]["content"]
        .as_str()
        .expect("choices[0].message.content is a string")
        .split_whitespace()
        .count()
}

/// The Prometheus text exposition at `{base_url}/metrics`.
pub async fn metrics_text(base_url: &str) -> String {
    get_text(format!("{base_url}/metrics")).await
}

/// The value of one series (its exact text before the value) in a scrape; panics when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    tutor_wire::prom::series_value(text, series)
        .unwrap_or_else(|| panic!("series {series} missing in\n{text}"))
}

/// The value of one series in a scrape, 0 when absent (a counter not yet incremented).
pub fn metric_or_zero(text: &str, series: &str) -> f64 {
    tutor_wire::prom::series_value(text, series).unwrap_or(0.0)
}

/// The sum of all samples of the metric family `name` in a scrape, 0 when it has none.
pub fn family_total(text: &str, name: &str) -> f64 {
    tutor_wire::prom::family_sum(text, name).unwrap_or(0.0)
}

/// Polls `cond` every 10 ms for up to 30 s (a bound for a hang on a loaded machine, not a
/// speed limit); panics naming `what` when it never holds.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out (30 s) waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
