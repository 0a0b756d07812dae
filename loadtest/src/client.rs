//! One streamed request against a target, timed on the client: first token, every token event,
//! the end, and what went wrong.

use std::time::Duration;

use anyhow::Context as _;
use futures::{FutureExt as _, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;
use tutor_wire::sse::SseParser;

/// Longest wait for one job submission or status answer (they are answered at once).
const JOB_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a pooled connection may stay idle before this tool drops it rather than send on
/// it: under the gateway's default `server.keep_alive_idle_ms` (10 s), so a request never goes
/// out on a connection the gateway is closing at that moment. (With reqwest's default, 90 s,
/// that race failed 8 of 161 requests of an open-loop pilot at a low rate, each one
/// "connection closed before message completed".) A gateway configured with a shorter
/// keep-alive needs this shorter too.
pub const POOL_IDLE: Duration = Duration::from_secs(4);

/// The HTTP client every target uses, sending `headers` on every request.
fn http_client(headers: reqwest::header::HeaderMap) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(1024)
        .pool_idle_timeout(POOL_IDLE)
        .default_headers(headers)
        .build()?)
}

/// Which API the target speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// The gateway's `POST /answer` (`event: token` SSE).
    Answer,
    /// `POST /v1/chat/completions` streaming (the gateway, vLLM or the simulator).
    Chat,
    /// The gateway's `POST /jobs` (the `/answer` body), then its `events_url` (SSE) until `done`:
    /// times run from the submission.
    Jobs,
}

/// Where requests go.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL without a trailing slash, e.g. `http://127.0.0.1:8080` (the first one when
    /// requests alternate between several, see [`Target::alternating`]).
    pub base_url: String,
    /// Every base URL requests go to, in turn (one gateway replica each).
    bases: std::sync::Arc<Vec<String>>,
    /// The next one.
    turn: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Whether each of `bases` answered its last `/readyz` poll with 200 (all true unless
    /// [`Target::watch_ready`] runs).
    ready: std::sync::Arc<Vec<std::sync::atomic::AtomicBool>>,
    /// The API used.
    pub api: Api,
    /// `model` sent on the chat API (omitted when `None`).
    pub model: Option<String>,
    /// Sent as `x-tutor-deadline-ms` (the class's `deadline_ms`; omitted when `None`), wall ms.
    pub deadline_ms: Option<u32>,
    /// The simulator's speed factor when the target runs on simulated time (1: real time): a
    /// class's deadline, in simulated ms, is divided by it (the gateway lives in wall time).
    speed: f64,
    http: reqwest::Client,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The stream ended normally.
    Ok,
    /// HTTP error, error event, broken stream.
    Error,
    /// Still running when the run's hard deadline came; dropped.
    Cut,
}

/// What the client saw of one request. Times are seconds from the request's send.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Error code (`http_429`, `queue_timeout`, `connect`, ...) when not ok.
    pub error: Option<String>,
    /// Time to the first non-empty token event.
    pub ttft_s: Option<f64>,
    /// Arrival time of every token event.
    pub token_times: Vec<f32>,
    /// Output tokens (the server's usage when it reports it, else token events).
    pub output_tokens: u32,
    /// Send to end of stream (ok requests).
    pub e2e_s: Option<f64>,
    /// Set when the gateway sent the request elsewhere instead of answering it in full:
    /// `"job"` (an `/answer` that became a background job: a `job` event, then the stream
    /// ends; the status is an error `diverted_to_job`) or `"lane_limit"` (a `cut` event: the
    /// answer outgrew its lane and was cut, then `done`).
    pub diverted: Option<String>,
    /// Prompt tokens as the engine counted them (its usage), when the stream reported them.
    pub prompt_tokens: Option<u32>,
    /// Of those, tokens the engine served from its prefix cache: the gateway's `done`
    /// `usage.cached_tokens`, or vLLM's `usage.prompt_tokens_details.cached_tokens` (0 when the
    /// usage came without it: vLLM leaves it out when nothing was cached). `None` with
    /// `prompt_tokens`.
    pub cached_tokens: Option<u32>,
}

impl Outcome {
    /// An error with nothing received yet.
    fn empty() -> Self {
        Outcome {
            status: Status::Error,
            error: None,
            ttft_s: None,
            token_times: Vec::new(),
            output_tokens: 0,
            e2e_s: None,
            diverted: None,
            prompt_tokens: None,
            cached_tokens: None,
        }
    }
}

/// What a stream's usage said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Usage {
    output: Option<u32>,
    prompt: Option<u32>,
    cached: Option<u32>,
}

impl Target {
    /// A target at `base_url` speaking `api`.
    pub fn new(base_url: &str, api: Api, model: Option<String>) -> anyhow::Result<Self> {
        let http = http_client(reqwest::header::HeaderMap::new())?;
        let base_url = base_url.trim_end_matches('/').to_string();
        Ok(Self {
            bases: std::sync::Arc::new(vec![base_url.clone()]),
            turn: std::sync::Arc::default(),
            ready: std::sync::Arc::new(vec![std::sync::atomic::AtomicBool::new(true)]),
            base_url,
            api,
            model,
            deadline_ms: None,
            speed: 1.0,
            http,
        })
    }

    /// Every request carries `Authorization: Bearer <key>` (a gateway with `[auth]` on: the
    /// key names the tenant the load is sent as). The key is sent, never printed.
    pub fn with_api_key(mut self, key: &str) -> anyhow::Result<Self> {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .context("the API key is not a valid header value")?;
        value.set_sensitive(true);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, value);
        self.http = http_client(headers)?;
        Ok(self)
    }

    /// A target whose requests go to each of `base_urls` in turn (replicas behind a
    /// round-robin balancer).
    pub fn alternating(
        base_urls: &[String],
        api: Api,
        model: Option<String>,
    ) -> anyhow::Result<Self> {
        let first = base_urls.first().context("no base URL")?;
        let mut t = Self::new(first, api, model)?;
        t.bases = std::sync::Arc::new(
            base_urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .collect(),
        );
        t.ready = std::sync::Arc::new(
            base_urls
                .iter()
                .map(|_| std::sync::atomic::AtomicBool::new(true))
                .collect(),
        );
        Ok(t)
    }

    /// Acts as a load balancer's health check: polls every base URL's `/readyz` each `every`
    /// (timeout `every`), and from then on requests go only to those whose last poll answered
    /// 200 (in turn; to all in turn while none is ready). Runs until the returned task is
    /// aborted.
    pub fn watch_ready(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let t = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let polls = t.bases.iter().map(|b| {
                    let req = t.http.get(format!("{b}/readyz")).timeout(every).send();
                    async move { matches!(req.await, Ok(r) if r.status().is_success()) }
                });
                let up = futures::future::join_all(polls).await;
                for (flag, up) in t.ready.iter().zip(up) {
                    flag.store(up, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
    }

    /// The base URL of the next request: the next ready one in turn.
    fn base(&self) -> &str {
        use std::sync::atomic::Ordering::Relaxed;
        let i = self.turn.fetch_add(1, Relaxed);
        let n = self.bases.len();
        (0..n)
            .map(|k| (i + k) % n)
            .find(|&j| self.ready[j].load(Relaxed))
            .map_or(&self.bases[i % n], |j| &self.bases[j])
    }

    /// The same target in front of a simulator at `speed` (see [`Target::for_class`]).
    pub fn simulated_at(mut self, speed: f64) -> Self {
        if speed.is_finite() && speed > 0.0 {
            self.speed = speed;
        }
        self
    }

    /// The same target as a scenario class sends it: its `api` (when it names one) and its
    /// `deadline_ms` (simulated ms over the speed, at least 1).
    pub fn for_class(&self, api: Option<Api>, deadline_ms: Option<u32>) -> Self {
        let mut t = api.map_or_else(|| self.clone(), |api| self.with_api(api));
        t.deadline_ms = deadline_ms.map(|d| ((f64::from(d) / self.speed).round() as u32).max(1));
        t
    }

    /// The same target speaking `api`.
    pub fn with_api(&self, api: Api) -> Self {
        Self {
            api,
            ..self.clone()
        }
    }

    fn request(
        &self,
        system: Option<&str>,
        prompt: &str,
        max_tokens: u32,
    ) -> reqwest::RequestBuilder {
        let mut messages = vec![];
        if let Some(system) = system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let messages = Value::Array(messages);
        let answer = json!({"messages": messages, "max_output_tokens": max_tokens});
        let builder = match self.api {
            Api::Answer => self
                .http
                .post(format!("{}/answer", self.base()))
                .json(&answer),
            Api::Jobs => self
                .http
                .post(format!("{}/jobs", self.base()))
                .json(&answer),
            Api::Chat => {
                let mut body = json!({
                    "messages": messages, "max_tokens": max_tokens, "ignore_eos": true,
                    "stream": true, "stream_options": {"include_usage": true},
                });
                if let Some(m) = &self.model {
                    body["model"] = json!(m);
                }
                self.http
                    .post(format!("{}/v1/chat/completions", self.base()))
                    .json(&body)
            }
        };
        match self.deadline_ms {
            Some(ms) => builder.header("x-tutor-deadline-ms", ms.to_string()),
            None => builder,
        }
    }

    /// Sends one request and reads its stream until it ends or `cut_at` passes.
    pub async fn send(&self, prompt: &str, max_tokens: u32, cut_at: Instant) -> Outcome {
        self.send_with_system(None, prompt, max_tokens, cut_at)
            .await
    }

    /// [`Target::send`] with a system message first (a shared prefix) when `system` is given.
    /// A request whose reading panics (a bug of this tool, or an answer it cannot take) is an
    /// error, `client_panic`, not a request that vanishes from the counts.
    pub async fn send_with_system(
        &self,
        system: Option<&str>,
        prompt: &str,
        max_tokens: u32,
        cut_at: Instant,
    ) -> Outcome {
        caught(self.read_one(system, prompt, max_tokens, cut_at)).await
    }

    async fn read_one(
        &self,
        system: Option<&str>,
        prompt: &str,
        max_tokens: u32,
        cut_at: Instant,
    ) -> Outcome {
        let start = Instant::now();
        let mut out = Outcome {
            token_times: Vec::with_capacity(max_tokens as usize),
            ..Outcome::empty()
        };
        let resp =
            match tokio::time::timeout_at(cut_at, self.request(system, prompt, max_tokens).send())
                .await
            {
                Err(_) => return cut(out),
                Ok(Err(e)) => return fail(out, if e.is_connect() { "connect" } else { "http" }),
                Ok(Ok(r)) => r,
            };
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            // An early refusal says so in its body (JSON, or one `error` event on `/answer`):
            // `http_503_deadline_unmet` (a refusal still, by its `http_` code).
            let body = tokio::time::timeout_at(cut_at, resp.text()).await;
            let code = match body {
                Ok(Ok(text)) if text.contains("\"deadline_unmet\"") => {
                    format!("http_{status}_deadline_unmet")
                }
                _ => format!("http_{status}"),
            };
            return fail(out, &code);
        }
        let resp = match self.api {
            Api::Jobs => match tokio::time::timeout_at(cut_at, self.job_events(resp)).await {
                Err(_) => return cut(out),
                Ok(Err(code)) => return fail(out, code),
                Ok(Ok(r)) => r,
            },
            Api::Answer | Api::Chat => resp,
        };
        let mut stream = resp.bytes_stream();
        let mut parser = SseParser::default();
        let mut usage = Usage::default();
        loop {
            let chunk = match tokio::time::timeout_at(cut_at, stream.next()).await {
                Err(_) => return cut(out),
                Ok(None) => return fail(out, "stream_ended_early"),
                Ok(Some(Err(_))) => return fail(out, "stream_broken"),
                Ok(Some(Ok(c))) => c,
            };
            if parser.feed(&chunk).is_err() {
                return fail(out, "stream_broken");
            }
            while let Some(event) = parser.pop_event() {
                let t = start.elapsed().as_secs_f64();
                let data = String::from_utf8_lossy(&event.data);
                match self.on_event(event.name(), &data, &mut usage) {
                    Event::Token => {
                        out.ttft_s.get_or_insert(t);
                        out.token_times.push(t as f32);
                    }
                    Event::Other => {}
                    Event::Cut(code) => out.diverted = Some(code),
                    Event::Job => {
                        out.diverted = Some("job".into());
                        return fail(out, "diverted_to_job");
                    }
                    Event::Error(code) => return fail(out, &code),
                    Event::End => {
                        out.status = Status::Ok;
                        out.e2e_s = Some(t);
                        out.output_tokens = usage.output.unwrap_or(out.token_times.len() as u32);
                        out.prompt_tokens = usage.prompt;
                        out.cached_tokens = usage.prompt.map(|_| usage.cached.unwrap_or(0));
                        return out;
                    }
                }
            }
        }
    }

    /// Submits one job (`POST /jobs` with the `/answer` body, whatever this target's API):
    /// the job's id, or an error code (`http_429`, `connect`, `job_submit_body`, ...).
    pub async fn submit_job(
        &self,
        system: Option<&str>,
        prompt: &str,
        max_tokens: u32,
    ) -> Result<String, String> {
        let resp = self
            .with_api(Api::Jobs)
            .request(system, prompt, max_tokens)
            .timeout(JOB_CALL_TIMEOUT)
            .send()
            .await
            .map_err(|e| if e.is_connect() { "connect" } else { "http" }.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("http_{}", resp.status().as_u16()));
        }
        let v: Value = resp.json().await.map_err(|_| "job_submit_body")?;
        v["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "job_submit_body".to_string())
    }

    /// `GET /jobs/{id}`: the job's JSON (`status`, `submitted_at`, `started_at`,
    /// `finished_at`, `preempted`, `answer.usage`, ...), or an error code.
    pub async fn job_status(&self, id: &str) -> Result<Value, String> {
        let resp = self
            .http
            .get(format!("{}/jobs/{id}", self.base_url))
            .timeout(JOB_CALL_TIMEOUT)
            .send()
            .await
            .map_err(|e| if e.is_connect() { "connect" } else { "http" }.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("http_{}", resp.status().as_u16()));
        }
        resp.json().await.map_err(|_| "job_status_body".to_string())
    }

    /// The event stream of the job a `POST /jobs` answer (`submitted`) names.
    async fn job_events(
        &self,
        submitted: reqwest::Response,
    ) -> Result<reqwest::Response, &'static str> {
        let v: Value = submitted.json().await.map_err(|_| "job_submit_body")?;
        let url = v["events_url"].as_str().ok_or("job_submit_body")?;
        let resp = self
            .http
            .get(format!("{}{url}", self.base_url))
            .send()
            .await
            .map_err(|_| "http")?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err("job_events_status")
        }
    }

    /// What one SSE event (`name`, `data` payload) means for the request.
    fn on_event(&self, name: &str, data: &str, usage: &mut Usage) -> Event {
        match self.api {
            Api::Jobs if name == "status" => {
                let v: Value = serde_json::from_str(data).unwrap_or_default();
                match v["status"].as_str() {
                    Some(s @ ("cancelled" | "expired")) => Event::Error(format!("job_{s}")),
                    _ => Event::Other,
                }
            }
            Api::Answer | Api::Jobs => match name {
                "token" | "tool_call" => Event::Token,
                "job" => Event::Job,
                "cut" => {
                    let v: Value = serde_json::from_str(data).unwrap_or_default();
                    Event::Cut(v["code"].as_str().unwrap_or("lane_limit").to_string())
                }
                "done" => {
                    let v: Value = serde_json::from_str(data).unwrap_or_default();
                    let u = &v["usage"];
                    let n = |v: &Value| v.as_u64().map(|n| n as u32);
                    *usage = Usage {
                        output: n(&u["output_tokens"]),
                        prompt: n(&u["input_tokens"]),
                        cached: n(&u["cached_tokens"]),
                    };
                    Event::End
                }
                "error" => {
                    let v: Value = serde_json::from_str(data).unwrap_or_default();
                    Event::Error(v["code"].as_str().unwrap_or("error_event").to_string())
                }
                _ => Event::Other,
            },
            Api::Chat => {
                if data.trim() == "[DONE]" {
                    return Event::End;
                }
                let v: Value = match serde_json::from_str(data) {
                    Ok(v) => v,
                    Err(_) => return Event::Other,
                };
                if let Some(e) = v.get("error") {
                    let code = e["code"].as_str().map(str::to_string);
                    return Event::Error(code.unwrap_or_else(|| "error_event".into()));
                }
                let u = &v["usage"];
                if let Some(n) = u["completion_tokens"].as_u64() {
                    usage.output = Some(n as u32);
                }
                if let Some(n) = u["prompt_tokens"].as_u64() {
                    usage.prompt = Some(n as u32);
                }
                if let Some(n) = u["prompt_tokens_details"]["cached_tokens"].as_u64() {
                    usage.cached = Some(n as u32);
                }
                match v["choices"][0]["delta"]["content"].as_str() {
                    Some(s) if !s.is_empty() => Event::Token,
                    _ => Event::Other,
                }
            }
        }
    }
}

enum Event {
    Token,
    Other,
    /// The answer was cut at a lane limit (`done` follows).
    Cut(String),
    /// The `/answer` became a background job (the stream ends next).
    Job,
    Error(String),
    End,
}

/// `reading`'s outcome, or an error `client_panic` when it panicked.
async fn caught(reading: impl std::future::Future<Output = Outcome>) -> Outcome {
    std::panic::AssertUnwindSafe(reading)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| fail(Outcome::empty(), "client_panic"))
}

fn fail(mut out: Outcome, code: &str) -> Outcome {
    out.status = Status::Error;
    out.error = Some(code.to_string());
    out.output_tokens = out.token_times.len() as u32;
    out
}

fn cut(mut out: Outcome) -> Outcome {
    out.status = Status::Cut;
    out.error = Some("cut_at_deadline".into());
    out.output_tokens = out.token_times.len() as u32;
    out
}

#[cfg(test)]
mod tests {

    /// A connection idle longer than [`POOL_IDLE`] is not sent on again: the next request opens
    /// a new one (a server that keeps it open counts two connections), so a gateway closing
    /// idle connections after its default 10 s never races a request onto a closing one.
    #[tokio::test]
    async fn a_connection_idle_past_the_pool_limit_is_not_reused() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        // Answers every request on a connection with one complete SSE stream, keeping the
        // connection open (HTTP/1.1 keep-alive) for as long as the client wants it.
        let server = tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut seen = Vec::new();
                    loop {
                        let n = match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        seen.extend_from_slice(&buf[..n]);
                        // One request = its head and its JSON body (Content-Length long).
                        let Some(head_end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&seen[..head_end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if seen.len() < head_end + 4 + len {
                            continue;
                        }
                        seen.drain(..head_end + 4 + len);
                        let body = "event: token\ndata: {\"text\":\"hi\"}\n\n\
                                    event: done\ndata: {}\n\n";
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                             content-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let t = Target::new(&url, Api::Answer, None).unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let first = t.send("a", 1, far).await;
        assert_eq!(first.status, Status::Ok, "{first:?}");
        let before = accepted.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(POOL_IDLE + Duration::from_millis(500)).await;
        let second = t.send("b", 1, far).await;
        assert_eq!(second.status, Status::Ok, "{second:?}");
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            before + 1,
            "a connection idle past POOL_IDLE is dropped, not sent on"
        );
        server.abort();
    }

    /// A request whose reading panics still counts, as an error.
    #[tokio::test]
    async fn a_panicking_read_is_an_error_not_a_lost_request() {
        let o = caught(async { panic!("a reply this tool cannot take") }).await;
        assert_eq!(o.status, Status::Error);
        assert_eq!(o.error.as_deref(), Some("client_panic"));
        let ok = caught(async {
            Outcome {
                status: Status::Ok,
                ..Outcome::empty()
            }
        })
        .await;
        assert_eq!(ok.status, Status::Ok);
    }
    use super::*;

    /// Reads `raw` (one event, without its blank line) with the SSE parser and interprets it.
    fn read(t: &Target, raw: &str, usage: &mut Usage) -> Event {
        let mut p = SseParser::default();
        p.feed(raw.as_bytes()).unwrap();
        p.feed(b"\n\n").unwrap();
        let e = p.pop_event().unwrap();
        t.on_event(e.name(), &String::from_utf8_lossy(&e.data), usage)
    }

    #[test]
    fn answer_and_chat_events_are_read() {
        let t = Target::new("http://127.0.0.1:1", Api::Answer, None).unwrap();
        let mut u = Usage::default();
        assert!(matches!(
            read(&t, "event: token\ndata: {\"text\":\"a\"}", &mut u),
            Event::Token
        ));
        let done = "event: done\ndata: {\"usage\":{\"output_tokens\":12}}";
        assert!(matches!(read(&t, done, &mut u), Event::End));
        assert_eq!(u.output, Some(12));
        let done = "event: done\ndata: {\"usage\":{\"input_tokens\":900,\"output_tokens\":12,\"cached_tokens\":640}}";
        assert!(matches!(read(&t, done, &mut u), Event::End));
        assert_eq!((u.prompt, u.cached), (Some(900), Some(640)));
        let j = t.with_api(Api::Jobs);
        assert!(matches!(
            read(&j, "id: 3\nevent: token\ndata: {\"text\":\"a\"}", &mut u),
            Event::Token
        ));
        assert!(matches!(
            read(&j, "event: status\ndata: {\"status\":\"running\"}", &mut u),
            Event::Other
        ));
        let gone = "event: status\ndata: {\"status\":\"cancelled\"}";
        assert!(matches!(read(&j, gone, &mut u), Event::Error(ref s) if s == "job_cancelled"));
        let c = Target::new("http://127.0.0.1:1", Api::Chat, None).unwrap();
        let chunk = "data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}";
        assert!(matches!(read(&c, chunk, &mut u), Event::Token));
        let mut cu = Usage::default();
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":37,\"prompt_tokens_details\":{\"cached_tokens\":96}}}";
        assert!(matches!(read(&c, usage, &mut cu), Event::Other));
        assert_eq!(
            (cu.output, cu.prompt, cu.cached),
            (Some(37), Some(120), Some(96))
        );
        assert!(matches!(read(&c, "data: [DONE]", &mut u), Event::End));
        let cut = "event: cut\ndata: {\"code\":\"lane_limit\",\"lane\":\"small\"}";
        assert!(matches!(read(&t, cut, &mut u), Event::Cut(ref s) if s == "lane_limit"));
        let job = "id: job:7\nevent: job\ndata: {\"id\":\"7\"}";
        assert!(matches!(read(&t, job, &mut u), Event::Job));
        let err = "data: {\"error\":{\"code\":\"upstream_timeout\"}}";
        assert!(matches!(read(&c, err, &mut u), Event::Error(ref s) if s == "upstream_timeout"));
    }

    #[tokio::test]
    async fn a_class_deadline_is_sent_in_wall_ms_and_an_early_refusal_is_told_apart() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = sock.read(&mut buf).await.unwrap();
                assert!(n > 0);
                head.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"error":{"code":"deadline_unmet","predicted_wait_ms":900}}"#;
            let resp = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(resp.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head).to_lowercase()
        });
        // 1,500 simulated ms at speed 3: 500 wall ms.
        let t = Target::new(&url, Api::Answer, None)
            .unwrap()
            .simulated_at(3.0)
            .for_class(None, Some(1_500));
        let cut_at = Instant::now() + Duration::from_secs(10);
        let out = t.send("hello", 10, cut_at).await;
        let head = server.await.unwrap();
        assert!(head.contains("x-tutor-deadline-ms: 500\r\n"), "{head}");
        assert_eq!(out.error.as_deref(), Some("http_503_deadline_unmet"));
        // Without a deadline, no header.
        let plain = Target::new(&url, Api::Answer, None).unwrap();
        assert_eq!(plain.deadline_ms, None);
    }
}
