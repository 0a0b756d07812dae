//! [`UpstreamClient`]: one pooled reqwest client for vLLM; starts streams, passes `/v1/models`
//! through and probes `/health`. In `upstream.abort.mode = "auto"` it also asks once whether
//! the engine has an abort endpoint ([`AbortCaller::probe`]): when built inside a Tokio
//! runtime, and again after a healthy `/health` while that is still unknown.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::StatusCode;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::abort::{AbortCaller, AbortEndpoint};
use super::error::{EngineError, UpstreamError};
use super::request::{prepare_body, UpstreamRequest};
use super::stream::{StreamLimits, UpstreamStream};
use crate::config::UpstreamConfig;

/// Longest a non-streaming call (`/v1/models`, `/health`) may take, connect included.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes kept from a non-streaming body (an error JSON, the model list); the rest is
/// dropped, so a broken upstream cannot make the gateway buffer without bound.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The vLLM client. Cheap to clone (the connection pool, config and task tracker are shared).
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    http: reqwest::Client,
    config: Arc<UpstreamConfig>,
    tasks: TaskTracker,
    /// Arms each stream's abort guard; knows whether the engine has an abort endpoint.
    abort: AbortCaller,
    /// The last `/health` probe for `/readyz`.
    readiness: Arc<tokio::sync::Mutex<Option<Probe>>>,
}

/// When a `/health` probe was made and what it said.
type Probe = (Instant, Result<(), String>);

/// A non-streaming upstream answer relayed as is (`GET /v1/models`).
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// The upstream's status (always 2xx; other statuses are [`UpstreamError::Status`]).
    pub status: StatusCode,
    /// The upstream's `Content-Type`, if any.
    pub content_type: Option<HeaderValue>,
    /// The body, at most [`MAX_BODY_BYTES`].
    pub body: Bytes,
}

impl UpstreamClient {
    /// A new client for `config` whose abort calls go on this one's task tracker (a config
    /// reload that changed `[upstream]`).
    pub fn with_config(&self, config: UpstreamConfig) -> Result<Self, UpstreamError> {
        Self::new(config, self.tasks.clone())
    }

    /// A client for `config`. Abort calls are spawned on `tasks`: close and wait on it at
    /// shutdown so no abort is lost. Env proxies are ignored: the vLLM hop is internal.
    pub fn new(config: UpstreamConfig, tasks: TaskTracker) -> Result<Self, UpstreamError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = &config.api_key {
            let mut auth =
                HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                    UpstreamError::Unavailable(
                        "the upstream API key is not a valid header value".into(),
                    )
                })?;
            auth.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, auth);
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .no_proxy()
            .default_headers(headers);
        for cert in config
            .ca_pem
            .as_deref()
            .map(reqwest::Certificate::from_pem_bundle)
            .transpose()
            .map_err(|e| UpstreamError::Unavailable(format!("upstream.ca_file: {e}")))?
            .unwrap_or_default()
        {
            builder = builder.add_root_certificate(cert);
        }
        let http = builder.build().map_err(|e| {
            UpstreamError::Unavailable(format!("cannot build the HTTP client: {e}"))
        })?;
        let config = Arc::new(config);
        let abort = AbortCaller::new(http.clone(), Arc::clone(&config), tasks.clone());
        abort.probe();
        Ok(Self {
            http,
            config,
            tasks,
            abort,
            readiness: Arc::default(),
        })
    }

    /// The upstream settings in force.
    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    /// The tracker abort calls are spawned on.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// What is known of the engine's abort endpoint (`upstream.abort.mode = "auto"`).
    pub fn abort_endpoint(&self) -> AbortEndpoint {
        self.abort.endpoint()
    }

    /// Sends a streaming generation request and returns once vLLM's response headers arrive.
    ///
    /// The body is changed by [`prepare_body`] (streaming with usage forced). The engine
    /// abort is armed before sending, so dropping this future while it waits for headers also
    /// aborts. Errors: [`UpstreamError::Unavailable`] when vLLM cannot be reached (within
    /// `connect_timeout`), [`UpstreamError::Status`] for a non-2xx answer (vLLM's error parsed),
    /// [`UpstreamError::FirstTokenTimeout`] / [`UpstreamError::TotalTimeout`] when headers take
    /// too long, [`UpstreamError::Transport`] when the connection breaks after sending.
    pub async fn stream(&self, req: UpstreamRequest) -> Result<UpstreamStream, UpstreamError> {
        let id_header =
            HeaderValue::from_str(&req.request_id).map_err(|_| UpstreamError::InvalidRequestId)?;
        let mut body = req.body;
        prepare_body(&mut body, &self.config.model);
        let body = serde_json::to_vec(&body).expect("a JSON map always serializes");
        let url = format!("{}{}", self.config.base_url, req.endpoint.path());
        let mut builder = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header("x-request-id", id_header)
            .body(body);
        if let Some(tp) = req.traceparent.as_deref() {
            match HeaderValue::from_str(tp) {
                Ok(v) => builder = builder.header("traceparent", v),
                Err(_) => {
                    tracing::debug!(request_id = %req.request_id, "invalid traceparent dropped")
                }
            }
        }

        let limits = StreamLimits::from_config(&self.config);
        let sent_at = Instant::now();
        let mut abort = self.abort.arm(req.request_id.clone(), req.endpoint);
        let (deadline, timeout_error) = limits.first_token_deadline(sent_at);
        let resp = match tokio::time::timeout_at(deadline, builder.send()).await {
            Err(_) => return Err(timeout_error), // `abort` drops here and fires.
            Ok(Err(e)) if e.is_connect() => {
                // Nothing reached the engine.
                abort.disarm();
                return Err(UpstreamError::Unavailable(describe(e)));
            }
            Ok(Err(e)) => return Err(UpstreamError::Transport(describe(e))),
            Ok(Ok(resp)) => resp,
        };
        let headers_at = Instant::now();
        let status = resp.status();
        if !status.is_success() {
            // vLLM rejected the request before running it: nothing to abort.
            abort.disarm();
            let raw = read_capped(resp, deadline).await.unwrap_or_default();
            let error =
                EngineError::parse(&raw).unwrap_or_else(|| EngineError::unreadable(status, raw));
            return Err(UpstreamError::Status {
                status,
                error: Box::new(error),
            });
        }
        let headers = resp.headers().clone();
        let body = resp.bytes_stream().map(|r| r.map_err(describe)).boxed();
        Ok(UpstreamStream::new(
            req.request_id,
            headers,
            body,
            abort,
            limits,
            sent_at,
            headers_at,
        ))
    }

    /// `GET /v1/models`, relayed as is. Non-2xx -> [`UpstreamError::Status`].
    pub async fn models(&self) -> Result<RawResponse, UpstreamError> {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let resp = self.get("/v1/models", deadline).await?;
        Self::raw(resp, deadline).await
    }

    /// `GET /version` (vLLM's `{"version": "x.y.z"}`), relayed as is.
    pub async fn version(&self) -> Result<RawResponse, UpstreamError> {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let resp = self.get("/version", deadline).await?;
        Self::raw(resp, deadline).await
    }

    /// `POST /tokenize` with the client's JSON body, relayed as is (benchmark clients count
    /// tokens with the engine's own tokenizer this way).
    pub async fn tokenize(&self, body: bytes::Bytes) -> Result<RawResponse, UpstreamError> {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let url = format!("{}/tokenize", self.config.base_url);
        let request = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        let resp = Self::send_by(request, deadline).await?;
        Self::raw(resp, deadline).await
    }

    /// Reads a small answer whole; non-2xx -> [`UpstreamError::Status`] with vLLM's error.
    async fn raw(resp: reqwest::Response, deadline: Instant) -> Result<RawResponse, UpstreamError> {
        let status = resp.status();
        let content_type = resp.headers().get(CONTENT_TYPE).cloned();
        let body = read_capped(resp, deadline).await?;
        if !status.is_success() {
            let error =
                EngineError::parse(&body).unwrap_or_else(|| EngineError::unreadable(status, body));
            return Err(UpstreamError::Status {
                status,
                error: Box::new(error),
            });
        }
        Ok(RawResponse {
            status,
            content_type,
            body,
        })
    }

    /// [`UpstreamClient::health`] for `/readyz`: at most one probe per `upstream.health_cache`;
    /// calls in between, and calls while a probe runs, get that probe's answer (as text).
    pub async fn readiness(&self) -> Result<(), String> {
        let mut last = self.readiness.lock().await;
        if let Some((at, answer)) = last.as_ref() {
            if at.elapsed() < self.config.health_cache {
                return answer.clone();
            }
        }
        let answer = self.health().await.map_err(|e| e.to_string());
        *last = Some((Instant::now(), answer.clone()));
        answer
    }

    /// Readiness probe: `GET /health` answers 2xx (vLLM: 200 when the engine is alive, 503 when
    /// it is dead -> [`UpstreamError::Status`]). A healthy answer while the abort endpoint is
    /// still unknown (vLLM was not up when the client was built) starts its probe.
    pub async fn health(&self) -> Result<(), UpstreamError> {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let resp = self.get("/health", deadline).await?;
        let status = resp.status();
        if status.is_success() {
            self.abort.probe();
            return Ok(());
        }
        let body = read_capped(resp, deadline).await.unwrap_or_default();
        let error =
            EngineError::parse(&body).unwrap_or_else(|| EngineError::unreadable(status, body));
        Err(UpstreamError::Status {
            status,
            error: Box::new(error),
        })
    }

    async fn get(&self, path: &str, deadline: Instant) -> Result<reqwest::Response, UpstreamError> {
        let url = format!("{}{}", self.config.base_url, path);
        Self::send_by(self.http.get(url), deadline).await
    }

    /// Sends a small probe-style request, answered by `deadline`.
    async fn send_by(
        request: reqwest::RequestBuilder,
        deadline: Instant,
    ) -> Result<reqwest::Response, UpstreamError> {
        match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => Err(UpstreamError::ResponseTimeout(PROBE_TIMEOUT)),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Unavailable(describe(e))),
            Ok(Err(e)) => Err(UpstreamError::Transport(describe(e))),
            Ok(Ok(resp)) => Ok(resp),
        }
    }
}

/// Reads a non-streaming body, keeping at most [`MAX_BODY_BYTES`], until `deadline`.
async fn read_capped(resp: reqwest::Response, deadline: Instant) -> Result<Bytes, UpstreamError> {
    let mut out = BytesMut::new();
    let mut body = resp.bytes_stream();
    loop {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => return Err(UpstreamError::ResponseTimeout(PROBE_TIMEOUT)),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(e))) => return Err(UpstreamError::Transport(describe(e))),
            Ok(Some(Ok(chunk))) => {
                let room = MAX_BODY_BYTES - out.len();
                out.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if out.len() == MAX_BODY_BYTES {
                    return Ok(out.freeze());
                }
            }
        }
    }
}

/// An error's message with its causes ("error sending request: ...: Connection refused"),
/// without the URL.
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
