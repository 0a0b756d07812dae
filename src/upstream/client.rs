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
use super::replica::{self, Replica, Replicas, Ticket};
use super::request::{prepare_body, UpstreamRequest};
use super::route;
use super::stream::{StreamLimits, UpstreamStream};
use crate::config::UpstreamConfig;
use crate::telemetry::estimate_metrics::ExactOutcome;
use crate::telemetry::ReplicaMetrics;

/// Longest a non-streaming call (`/v1/models`, `/health`) may take, connect included.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes kept from a non-streaming body (an error JSON, the model list); the rest is
/// dropped, so a broken upstream cannot make the gateway buffer without bound.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How long an idle connection to vLLM is kept for the next request: under uvicorn's
/// keep-alive (vLLM's `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s), which closes it on its side. A
/// request sent on a pooled connection just as vLLM closes it fails (hyper retries only a
/// request it never wrote), and the client would get a 502.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// Most bytes of a `/tokenize` answer: a 4 MiB prompt's ids take more than [`MAX_BODY_BYTES`]
/// (about 6 MB for a million ids); beyond this it is a 502, never a cut answer. Held until the
/// client takes it (at most `server.client_write_timeout_ms`), so kept to a few MB.
pub const MAX_TOKENIZE_BYTES: usize = 8 << 20;

/// The vLLM client. Cheap to clone (the connection pool, config, replicas and task tracker
/// are shared).
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    http: reqwest::Client,
    config: Arc<UpstreamConfig>,
    tasks: TaskTracker,
    /// The replicas, each with its abort caller, health and requests in flight.
    replicas: Arc<Replicas>,
    /// The last `/health` probe for `/readyz` (one replica).
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
        Self::build(
            config,
            self.tasks.clone(),
            self.replicas.metrics().clone(),
            Some(&self.replicas),
        )
    }

    /// A client for `config`. Abort calls are spawned on `tasks`: close and wait on it at
    /// shutdown so no abort is lost. Env proxies are ignored: the vLLM hop is internal.
    pub fn new(config: UpstreamConfig, tasks: TaskTracker) -> Result<Self, UpstreamError> {
        Self::with_metrics(config, tasks, ReplicaMetrics::default())
    }

    /// [`UpstreamClient::new`], reporting each replica's traffic into `metrics`. With several
    /// replicas and `upstream.routing.health_interval_ms > 0`, built inside a Tokio runtime, it
    /// checks their `/health` in the background while it lives.
    pub fn with_metrics(
        config: UpstreamConfig,
        tasks: TaskTracker,
        metrics: ReplicaMetrics,
    ) -> Result<Self, UpstreamError> {
        Self::build(config, tasks, metrics, None)
    }

    /// [`UpstreamClient::with_metrics`]; the replicas at the URLs of `previous` (the set a
    /// reload replaces) go on with what it knew of them ([`Replicas::new`]).
    fn build(
        config: UpstreamConfig,
        tasks: TaskTracker,
        metrics: ReplicaMetrics,
        previous: Option<&Replicas>,
    ) -> Result<Self, UpstreamError> {
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
        // A redirect is refused (a 3xx is the engine's error): vLLM never sends one, and
        // following it would send the prompt, and the key, wherever it points.
        let mut builder = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(POOL_IDLE)
            .redirect(reqwest::redirect::Policy::none())
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
        let watch = metrics.background().clone();
        let replicas = Arc::new(Replicas::new(
            config.replica_set(),
            config.routing.clone(),
            metrics,
            previous,
            |replica| {
                let mut own = (*config).clone();
                own.base_url.clone_from(&replica.url);
                let abort = AbortCaller::new(http.clone(), Arc::new(own), tasks.clone());
                abort.probe();
                abort
            },
        ));
        if replicas.checks_run() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let http = http.clone();
                let model = config.model.clone();
                let checks = replica::health_loop(Arc::downgrade(&replicas), move |r| {
                    let http = http.clone();
                    let model = model.clone();
                    async move {
                        probe_health(&http, &r.config.url)
                            .await
                            .map_err(|e| e.to_string())?;
                        r.abort.probe();
                        if r.lacks_model() {
                            probe_model(&http, &r.config.url, &model).await?;
                            r.serves_model();
                        }
                        Ok(())
                    }
                });
                runtime.spawn(watch.watch("replica health checks", checks));
            }
        }
        Ok(Self {
            http,
            config,
            tasks,
            replicas,
            readiness: Arc::default(),
        })
    }

    /// The replicas and their state.
    pub fn replicas(&self) -> &Replicas {
        &self.replicas
    }

    /// The upstream settings in force.
    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    /// The tracker abort calls are spawned on.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// What is known of the (first) engine's abort endpoint (`upstream.abort.mode = "auto"`).
    pub fn abort_endpoint(&self) -> AbortEndpoint {
        self.replicas.all()[0].abort.endpoint()
    }

    /// Sends a streaming generation request and returns once vLLM's response headers arrive.
    ///
    /// The replica is chosen by [`Replicas::pick`] from the request's routing key, unless the
    /// request is pinned to a replica that takes traffic ([`Replicas::pick_named`]). The body is
    /// changed by [`prepare_body`] (streaming with usage forced). The engine abort is armed
    /// (against that replica) before sending, so dropping this future while it waits for
    /// headers also aborts. A connection error or a 5xx answer, which vLLM gives before it runs
    /// anything, is tried once more on another replica. Errors: [`UpstreamError::Unavailable`]
    /// when vLLM cannot be reached (within `connect_timeout`), [`UpstreamError::Status`] for a
    /// non-2xx answer (vLLM's error parsed), [`UpstreamError::FirstTokenTimeout`] /
    /// [`UpstreamError::TotalTimeout`] when headers take too long,
    /// [`UpstreamError::Transport`] when the connection breaks after sending.
    pub async fn stream(&self, req: UpstreamRequest) -> Result<UpstreamStream, UpstreamError> {
        let id_header =
            HeaderValue::from_str(&req.request_id).map_err(|_| UpstreamError::InvalidRequestId)?;
        let traceparent = req.traceparent.as_deref().and_then(|tp| {
            match HeaderValue::from_str(tp) {
                Ok(v) => Some(v),
                Err(_) => {
                    tracing::debug!(request_id = %req.request_id, "invalid traceparent dropped");
                    None
                }
            }
        });
        let mut body = req.body;
        let continues = req.continues_answer;
        prepare_body(&mut body, &self.config.model);
        let configured_model =
            body.get("model").and_then(serde_json::Value::as_str) == Some(&self.config.model);
        let body = Bytes::from(serde_json::to_vec(&body).expect("a JSON map always serializes"));
        let key = req.affinity.as_deref().map(route::hash_str);
        let sending = Sending {
            request_id: req.request_id,
            configured_model,
            endpoint: req.endpoint,
            id_header,
            traceparent,
            body,
        };
        let pinned = req
            .pin
            .as_deref()
            .and_then(|name| self.replicas.pick_named(name));
        let ticket = pinned
            .or_else(|| self.replicas.pick(key, None, None))
            .ok_or_else(|| UpstreamError::Unavailable("no vLLM replica configured".into()))?;
        let sent = match self.send_on(ticket, &sending).await {
            Err((e, failed)) if e.retryable() && self.replicas.len() > 1 => {
                let Some(next) = self.replicas.pick(key, Some(&failed), Some("retry")) else {
                    return Err(e);
                };
                tracing::info!(
                    request_id = %sending.request_id,
                    from = failed.name(),
                    to = next.replica().name(),
                    error = e.code(),
                    "sent again on another replica"
                );
                self.send_on(next, &sending).await.map_err(|(e, _)| e)
            }
            answer => answer.map_err(|(e, _)| e),
        };
        sent.map(|stream| stream.continuing_answer(continues))
    }

    /// One try of [`UpstreamClient::stream`] on the ticket's replica; on failure, the error and
    /// that replica (for a retry elsewhere).
    async fn send_on(
        &self,
        ticket: Ticket,
        s: &Sending,
    ) -> Result<UpstreamStream, (UpstreamError, Arc<Replica>)> {
        let replica = Arc::clone(ticket.replica());
        let fail = |e: UpstreamError| (e, Arc::clone(&replica));
        let url = format!("{}{}", replica.config.url, s.endpoint.path());
        let mut builder = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header("x-request-id", s.id_header.clone())
            .body(s.body.clone());
        if let Some(tp) = &s.traceparent {
            builder = builder.header("traceparent", tp.clone());
        }

        let limits = StreamLimits::from_config(&self.config);
        let sent_at = Instant::now();
        let mut abort = replica.abort.arm(s.request_id.clone(), s.endpoint);
        let (deadline, timeout_error) = limits.first_token_deadline(sent_at);
        let resp = match tokio::time::timeout_at(deadline, builder.send()).await {
            Err(_) => return Err(fail(timeout_error)), // `abort` drops here and fires.
            Ok(Err(e)) if e.is_connect() => {
                // Nothing reached the engine.
                abort.disarm();
                let e = UpstreamError::Unavailable(describe(e));
                self.replicas
                    .failed(&replica, "connection refused or unreachable");
                return Err(fail(e));
            }
            Ok(Err(e)) => return Err(fail(UpstreamError::Transport(describe(e)))),
            Ok(Ok(resp)) => resp,
        };
        let headers_at = Instant::now();
        let status = resp.status();
        if !status.is_success() {
            // vLLM rejected the request before running it: nothing to abort.
            abort.disarm();
            if status.is_server_error() {
                self.replicas.failed(&replica, "5xx answer");
            }
            let raw = read_capped(resp, deadline).await.unwrap_or_default();
            let error =
                EngineError::parse(&raw).unwrap_or_else(|| EngineError::unreadable(status, raw));
            if status == StatusCode::NOT_FOUND && s.configured_model && error.model_not_found() {
                // vLLM's 404 for a model it does not serve: this replica was deployed with
                // another model (or has not loaded it yet), or `upstream.model` is wrong. The
                // deployment's fault, not the client's (an `/answer` client names no model):
                // tried on another replica, and kept out of routing until its `/v1/models`
                // lists the model.
                let why = format!(
                    "answered 404 to upstream.model `{}` (not served there)",
                    self.config.model
                );
                self.replicas.lacks_model(&replica, &why);
                return Err(fail(UpstreamError::Unavailable(format!(
                    "replica {} {why}",
                    replica.config.name
                ))));
            }
            return Err(fail(UpstreamError::Status {
                status,
                error: Box::new(error),
            }));
        }
        self.replicas.succeeded(&replica, false);
        let headers = resp.headers().clone();
        let body = resp.bytes_stream().map(|r| r.map_err(describe)).boxed();
        Ok(UpstreamStream::new(
            s.request_id.clone(),
            headers,
            body,
            abort,
            limits,
            sent_at,
            headers_at,
        )
        .with_ticket(ticket))
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
        let url = format!("{}/tokenize", self.replicas.any().config.url);
        let request = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        let resp = Self::send_by(request, deadline).await?;
        Self::raw_within(resp, deadline, MAX_TOKENIZE_BYTES).await
    }

    /// vLLM's count of the prompt `body` renders (a `/tokenize` body), within `timeout`: the
    /// outcome, and the count when there is one (an error, a timeout or an answer without
    /// `count` have none).
    pub async fn prompt_count(
        &self,
        body: bytes::Bytes,
        timeout: std::time::Duration,
    ) -> (ExactOutcome, Option<u32>) {
        match tokio::time::timeout(timeout, self.tokenize(body)).await {
            Err(_) => (ExactOutcome::Timeout, None),
            Ok(Err(_)) => (ExactOutcome::Failed, None),
            Ok(Ok(answer)) => {
                let count = serde_json::from_slice::<serde_json::Value>(&answer.body)
                    .ok()
                    .and_then(|v| v["count"].as_u64())
                    .and_then(|n| u32::try_from(n).ok());
                match count {
                    Some(n) => (ExactOutcome::Counted, Some(n)),
                    None => (ExactOutcome::Failed, None),
                }
            }
        }
    }

    /// Spawns `task` on the tracker a shutdown waits on (the abort calls').
    pub fn spawn_tracked<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Reads a small answer whole; non-2xx -> [`UpstreamError::Status`] with vLLM's error.
    async fn raw(resp: reqwest::Response, deadline: Instant) -> Result<RawResponse, UpstreamError> {
        Self::raw_within(resp, deadline, MAX_BODY_BYTES).await
    }

    /// [`Client::raw`] for an answer of at most `most` bytes: a longer successful one is a
    /// protocol error (relaying it cut would be a 200 with broken JSON); an error's body is
    /// kept up to [`MAX_BODY_BYTES`].
    async fn raw_within(
        resp: reqwest::Response,
        deadline: Instant,
        most: usize,
    ) -> Result<RawResponse, UpstreamError> {
        let status = resp.status();
        let content_type = resp.headers().get(CONTENT_TYPE).cloned();
        let cap = if status.is_success() {
            most
        } else {
            MAX_BODY_BYTES
        };
        let (body, cut) = read_up_to(resp, deadline, cap).await?;
        if cut && status.is_success() {
            return Err(UpstreamError::Protocol(format!(
                "the engine's answer passed {most} bytes"
            )));
        }
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
    /// calls in between, and calls while a probe runs, get that probe's answer (as text). With
    /// several replicas: ready while at least one takes traffic (the background checks decide).
    pub async fn readiness(&self) -> Result<(), String> {
        if self.replicas.checks_run() {
            let status = self.replicas.status();
            if status.iter().any(|r| r.healthy) {
                return Ok(());
            }
            let why: Vec<String> = status
                .iter()
                .map(|r| format!("{}: {}", r.name, r.error.as_deref().unwrap_or("ejected")))
                .collect();
            return Err(format!("no healthy vLLM replica ({})", why.join("; ")));
        }
        let mut last = self.readiness.lock().await;
        if let Some((at, answer)) = last.as_ref() {
            if at.elapsed() < self.config.health_cache {
                return answer.clone();
            }
        }
        let answer = if self.replicas.len() > 1 {
            // No background checks (`health_interval_ms = 0`): ready while any replica answers
            // (probing only the first said 503 with the others up, and ready with them down).
            self.any_healthy().await
        } else {
            self.health().await.map_err(|e| e.to_string())
        };
        *last = Some((Instant::now(), answer.clone()));
        answer
    }

    /// Probes every replica's `/health` at once: `Ok` when one answers, else each one's error.
    async fn any_healthy(&self) -> Result<(), String> {
        let probes = self.replicas.all().iter().map(|replica| async move {
            let answer = probe_health(&self.http, &replica.config.url).await;
            if answer.is_ok() {
                replica.abort.probe();
            }
            (replica.config.name.clone(), answer)
        });
        let answers = futures::future::join_all(probes).await;
        if answers.iter().any(|(_, a)| a.is_ok()) {
            return Ok(());
        }
        let why: Vec<String> = answers
            .into_iter()
            .filter_map(|(name, a)| a.err().map(|e| format!("{name}: {e}")))
            .collect();
        Err(format!("no vLLM replica answers ({})", why.join("; ")))
    }

    /// Readiness probe: `GET /health` answers 2xx (vLLM: 200 when the engine is alive, 503 when
    /// it is dead -> [`UpstreamError::Status`]). A healthy answer while the abort endpoint is
    /// still unknown (vLLM was not up when the client was built) starts its probe.
    pub async fn health(&self) -> Result<(), UpstreamError> {
        let replica = self.replicas.any();
        probe_health(&self.http, &replica.config.url).await?;
        replica.abort.probe();
        Ok(())
    }

    async fn get(&self, path: &str, deadline: Instant) -> Result<reqwest::Response, UpstreamError> {
        let url = format!("{}{}", self.replicas.any().config.url, path);
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

/// A request as sent, kept for a second try on another replica.
struct Sending {
    request_id: String,
    /// It asks for `upstream.model`, which every replica must serve.
    configured_model: bool,
    endpoint: super::request::Endpoint,
    id_header: HeaderValue,
    traceparent: Option<HeaderValue>,
    body: Bytes,
}

/// `GET {base_url}/health` answers 2xx (vLLM: 200 when the engine is alive, 503 when it is
/// dead -> [`UpstreamError::Status`]).
async fn probe_health(http: &reqwest::Client, base_url: &str) -> Result<(), UpstreamError> {
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let request = http.get(format!("{base_url}/health"));
    let resp = UpstreamClient::send_by(request, deadline).await?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body = read_capped(resp, deadline).await.unwrap_or_default();
    let error = EngineError::parse(&body).unwrap_or_else(|| EngineError::unreadable(status, body));
    Err(UpstreamError::Status {
        status,
        error: Box::new(error),
    })
}

/// `GET {base_url}/v1/models` lists `model` (an `id` of its `data`): for a replica that
/// answered 404 to it ([`Replicas::lacks_model`]).
async fn probe_model(http: &reqwest::Client, base_url: &str, model: &str) -> Result<(), String> {
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let request = http.get(format!("{base_url}/v1/models"));
    let resp = UpstreamClient::send_by(request, deadline)
        .await
        .map_err(|e| e.to_string())?;
    let list = UpstreamClient::raw(resp, deadline)
        .await
        .map_err(|e| e.to_string())?;
    let listed = serde_json::from_slice::<serde_json::Value>(&list.body)
        .ok()
        .and_then(|v| {
            let data = v.get("data")?.as_array()?.clone();
            Some(
                data.iter()
                    .any(|m| m.get("id").and_then(serde_json::Value::as_str) == Some(model)),
            )
        });
    match listed {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "answered 404 to upstream.model `{model}`, and its /v1/models does not list it"
        )),
        None => {
            Err("answered 404 to upstream.model, and its /v1/models is not a model list".into())
        }
    }
}

/// Reads a non-streaming body, keeping at most [`MAX_BODY_BYTES`], until `deadline`.
async fn read_capped(resp: reqwest::Response, deadline: Instant) -> Result<Bytes, UpstreamError> {
    read_up_to(resp, deadline, MAX_BODY_BYTES)
        .await
        .map(|(body, _)| body)
}

/// Reads a non-streaming body, keeping at most `cap` bytes, until `deadline`; whether more
/// came (the rest is not read).
async fn read_up_to(
    resp: reqwest::Response,
    deadline: Instant,
    cap: usize,
) -> Result<(Bytes, bool), UpstreamError> {
    let mut out = BytesMut::new();
    let mut body = resp.bytes_stream();
    loop {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => return Err(UpstreamError::ResponseTimeout(PROBE_TIMEOUT)),
            Ok(None) => return Ok((out.freeze(), false)),
            Ok(Some(Err(e))) => return Err(UpstreamError::Transport(describe(e))),
            Ok(Some(Ok(chunk))) => {
                let room = cap - out.len();
                if chunk.len() > room {
                    out.extend_from_slice(&chunk[..room]);
                    return Ok((out.freeze(), true));
                }
                out.extend_from_slice(&chunk);
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
