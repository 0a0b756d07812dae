//! Engine abort (M21): closing the upstream connection stops the request in vLLM; the engine's
//! abort endpoint is called as well where it exists, per `upstream.abort.mode`, at most once
//! per request and never after a clean finish.
//!
//! vLLM's OpenAI server aborts a request whose client disconnected, streaming or not, so the
//! connection drop (done by whoever owns the response body: see [`super::UpstreamStream`]) is
//! the abort that always works. A default `vllm serve` has no abort endpoint; `vllm serve
//! --enable-scale-out` serves `POST /inference/v1/abort_requests {"request_ids": [...]}`, keyed
//! by the id vLLM gives the request (`chatcmpl-<X-Request-Id>`, `cmpl-<X-Request-Id>-0`:
//! [`engine_request_id`]).
//!
//! - [`AbortCaller`] (one per [`super::UpstreamClient`], cheap to clone) knows how to reach the
//!   endpoint and, in `auto` mode, whether it exists: [`AbortCaller::probe`] asks once (a call
//!   naming an id no request has) and the answer is shared by every guard: 2xx -> calls are
//!   made; 404, 405, 403, 501 -> the engine has none, no calls (logged once at `info`, never as
//!   a refusal); another 4xx (but 408 and 429) -> none either, logged once at `warn`. Without
//!   an answer (vLLM not up, 5xx, 408, 429, timeout) it stays unknown: the next probe (at most
//!   one per [`PROBE_RETRY`]), or the next abort's own call, settles it. "None" is asked again
//!   [`ABSENT_RECHECK`] after it was found (by the next probe or abort), so an engine restarted
//!   with the endpoint gets abort calls without restarting the gateway.
//! - [`AbortGuard`] (one per request, owned by the [`super::UpstreamStream`], before that by the
//!   send in [`super::UpstreamClient::stream`]) fires on drop unless [`AbortGuard::disarm`] was
//!   called after a finish reason arrived, so every way out (client gone, error, timeout,
//!   panic, a cancelled future) aborts; [`AbortGuard::abort_now`] fires it early. Firing takes
//!   the call out of the guard, so a second fire is a no-op: never two aborts for one request.
//!
//! Calls and probes run in tasks spawned on the client's [`TaskTracker`] (so shutdown can wait
//! for them), bounded by [`ABORT_TIMEOUT`]; failures are logged at `warn` with the request id
//! only, never a body.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use tokio_util::task::TaskTracker;

use super::request::Endpoint;
use crate::config::{AbortIdFormat, AbortMode, UpstreamConfig};

/// Longest an abort call or probe may take (connect included) before it is given up.
pub const ABORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Least time between two probes when the last one got no answer (so a `/readyz` polled every
/// second does not post to a failing endpoint every second).
pub const PROBE_RETRY: Duration = Duration::from_secs(10);

/// How long "the engine has no abort endpoint" holds before it is asked again (vLLM may have
/// been restarted with `--enable-scale-out` meanwhile).
pub const ABSENT_RECHECK: Duration = Duration::from_secs(600);

/// The start of the `X-Request-Id` a probe names (a uuid follows): no request has such an id,
/// so a probe aborts nothing.
pub const PROBE_ID_PREFIX: &str = "tutor-gateway-abort-probe-";

/// The id the engine knows a request by, as `upstream.abort.id_format` says: `request_id` is
/// the `X-Request-Id` sent to `endpoint`.
///
/// vLLM's OpenAI server names a chat completion `chatcmpl-<X-Request-Id>` and the n-th prompt of
/// a completion `cmpl-<X-Request-Id>-<n>` (the gateway sends one prompt: `-0`); its abort
/// endpoint takes these ids (the engine's internal ids add a random suffix it resolves itself).
pub fn engine_request_id(format: AbortIdFormat, request_id: &str, endpoint: Endpoint) -> String {
    match (format, endpoint) {
        (AbortIdFormat::AsSent, _) => request_id.to_owned(),
        (AbortIdFormat::Vllm, Endpoint::ChatCompletions) => format!("chatcmpl-{request_id}"),
        (AbortIdFormat::Vllm, Endpoint::Completions) => format!("cmpl-{request_id}-0"),
    }
}

/// Where one request's abort stands. Read it with [`AbortGuard::state`] or, after the guard is
/// gone, through an [`AbortWatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AbortState {
    /// Not fired yet: dropping the guard now aborts.
    Armed = 0,
    /// The request finished cleanly; nothing is aborted.
    Disarmed = 1,
    /// Fired with no abort call to make (`mode = "off"`, or `auto` and the engine has no
    /// endpoint, or its probe is in flight): only the connection was closed, which is vLLM's
    /// own abort.
    ConnectionOnly = 2,
    /// The abort call is in flight.
    Sending = 3,
    /// The engine answered the abort call with a 2xx status.
    Sent = 4,
    /// The abort call failed (connection error, [`ABORT_TIMEOUT`], or a non-2xx status other
    /// than the ones that make [`AbortState::NotOffered`]); logged.
    Failed = 5,
    /// Fired outside a Tokio runtime (dropped during process teardown), so not sent; logged.
    Skipped = 6,
    /// `auto` mode, endpoint not known yet: the call stood in for the probe and the engine
    /// answered that it has no abort endpoint (404, 405, 403, 501). Only the connection drop
    /// stopped the request; later aborts make no call.
    NotOffered = 7,
}

impl AbortState {
    fn from_u8(v: u8) -> AbortState {
        match v {
            0 => AbortState::Armed,
            1 => AbortState::Disarmed,
            2 => AbortState::ConnectionOnly,
            3 => AbortState::Sending,
            4 => AbortState::Sent,
            5 => AbortState::Failed,
            7 => AbortState::NotOffered,
            _ => AbortState::Skipped,
        }
    }

    /// Whether the request was aborted (connection dropped, with or without the abort call):
    /// for the `cancelled` metrics.
    pub fn fired(self) -> bool {
        !matches!(self, AbortState::Armed | AbortState::Disarmed)
    }

    /// Whether an abort call was sent to the engine (in flight, answered or failed).
    pub fn call_sent(self) -> bool {
        matches!(
            self,
            AbortState::Sending | AbortState::Sent | AbortState::Failed | AbortState::NotOffered
        )
    }
}

/// A read-only view of an [`AbortGuard`]'s state that outlives the guard.
#[derive(Debug, Clone)]
pub struct AbortWatch(Arc<AtomicU8>);

impl AbortWatch {
    /// The current state.
    pub fn state(&self) -> AbortState {
        AbortState::from_u8(self.0.load(Ordering::Acquire))
    }
}

/// What the gateway knows of the engine's abort endpoint (`upstream.abort.mode = "auto"`; the
/// other modes never look).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AbortEndpoint {
    /// Not asked yet, or no answer came (vLLM unreachable, 5xx, timeout): the next probe, or
    /// the next abort's own call, asks.
    Unknown = 0,
    /// A probe (or an abort call standing in for one) is in flight; aborts meanwhile only
    /// close the connection.
    Probing = 1,
    /// It answered 2xx: abort calls are made.
    Offered = 2,
    /// It answered 404, 405, 403 or 501 (stock vLLM), or refused the probe with another 4xx
    /// (logged): no abort calls; closing the connection is the abort. Asked again after
    /// [`ABSENT_RECHECK`].
    Absent = 3,
}

impl AbortEndpoint {
    fn from_u8(v: u8) -> AbortEndpoint {
        match v {
            0 => AbortEndpoint::Unknown,
            1 => AbortEndpoint::Probing,
            2 => AbortEndpoint::Offered,
            _ => AbortEndpoint::Absent,
        }
    }
}

/// How the engine's abort endpoint is reached, and (in `auto` mode) whether it exists; shared
/// by every [`AbortGuard`] it arms. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AbortCaller {
    http: reqwest::Client,
    config: Arc<UpstreamConfig>,
    tasks: TaskTracker,
    endpoint: Arc<AtomicU8>,
    /// What the probes found, and when.
    asked: Arc<std::sync::Mutex<Asked>>,
    /// [`ABSENT_RECHECK`] (shorter in tests).
    absent_recheck: Duration,
}

/// What the probes of one [`AbortCaller`] found, and when.
#[derive(Debug, Default)]
struct Asked {
    /// When a probe last got no answer ([`PROBE_RETRY`]).
    unanswered: Option<std::time::Instant>,
    /// When the engine last said it has no endpoint ([`ABSENT_RECHECK`]).
    absent_since: Option<std::time::Instant>,
    /// The last verdict logged: a re-check that finds the same says nothing.
    told: Option<AbortEndpoint>,
}

impl AbortCaller {
    /// A caller for `config` (`[upstream.abort]`), its calls spawned on `tasks`; in `auto` mode
    /// the endpoint is [`AbortEndpoint::Unknown`] until [`AbortCaller::probe`] or a call tells.
    pub fn new(http: reqwest::Client, config: Arc<UpstreamConfig>, tasks: TaskTracker) -> Self {
        Self {
            http,
            config,
            tasks,
            endpoint: Arc::new(AtomicU8::new(AbortEndpoint::Unknown as u8)),
            asked: Arc::default(),
            absent_recheck: ABSENT_RECHECK,
        }
    }

    /// This caller with "no endpoint" asked again after `after` instead of [`ABSENT_RECHECK`].
    #[cfg(test)]
    fn with_absent_recheck(mut self, after: Duration) -> Self {
        self.absent_recheck = after;
        self
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An armed guard for the request sent to `endpoint` with `X-Request-Id: request_id`.
    pub fn arm(&self, request_id: String, endpoint: Endpoint) -> AbortGuard {
        AbortGuard {
            call: Some(AbortCall {
                caller: self.clone(),
                request_id,
                endpoint,
            }),
            state: Arc::new(AtomicU8::new(AbortState::Armed as u8)),
        }
    }

    /// What is known of the engine's abort endpoint (always [`AbortEndpoint::Unknown`] outside
    /// `auto` mode: nothing is probed).
    pub fn endpoint(&self) -> AbortEndpoint {
        AbortEndpoint::from_u8(self.endpoint.load(Ordering::Acquire))
    }

    /// In `auto` mode with the endpoint unknown (or found absent [`ABSENT_RECHECK`] ago), asks
    /// the engine whether it has one: spawns a call naming an id no request has
    /// ([`PROBE_ID_PREFIX`]) on the task tracker and returns true. Returns false when there is
    /// nothing to ask (another mode, already known, a probe in flight, the last probe
    /// unanswered less than [`PROBE_RETRY`] ago) or no Tokio runtime to run it on.
    pub fn probe(&self) -> bool {
        if self.config.abort.call_mode() != AbortMode::Auto {
            return false;
        }
        let recent = self
            .asked()
            .unanswered
            .is_some_and(|at| at.elapsed() < PROBE_RETRY);
        if recent {
            return false;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if !self.claim_probe() && !self.claim_recheck() {
            return false;
        }
        let id = format!("{PROBE_ID_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let call = AbortCall {
            caller: self.clone(),
            request_id: id,
            endpoint: Endpoint::ChatCompletions,
        };
        self.tasks.clone().spawn_on(
            async move {
                let answer = call.send().await;
                call.caller.settle(&answer, true);
            },
            &runtime,
        );
        true
    }

    /// Takes the right to probe: `Unknown` -> `Probing`.
    fn claim_probe(&self) -> bool {
        self.endpoint
            .compare_exchange(
                AbortEndpoint::Unknown as u8,
                AbortEndpoint::Probing as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Takes the right to ask again whether an absent endpoint is there now: `Absent` ->
    /// `Probing`, once [`ABSENT_RECHECK`] has gone by since it was found absent.
    fn claim_recheck(&self) -> bool {
        let due = self
            .asked()
            .absent_since
            .is_some_and(|at| at.elapsed() >= self.absent_recheck);
        due && self
            .endpoint
            .compare_exchange(
                AbortEndpoint::Absent as u8,
                AbortEndpoint::Probing as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    fn set_endpoint(&self, e: AbortEndpoint) {
        self.endpoint.store(e as u8, Ordering::Release);
    }

    /// Records what an answer says about the endpoint (`auto` mode), logging each change once.
    /// `probe`: the answer was to [`AbortCaller::probe`]'s call (not to a request's abort).
    fn settle(&self, answer: &Answer, probe: bool) {
        let found = match answer {
            Answer::Status(s) => verdict(*s).map(|v| (*s, v)),
            Answer::Failed(_) => None,
        };
        let Some((status, verdict)) = found else {
            // No verdict: let the next probe or abort ask again.
            let _ = self.endpoint.compare_exchange(
                AbortEndpoint::Probing as u8,
                AbortEndpoint::Unknown as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            if probe {
                self.asked().unanswered = Some(std::time::Instant::now());
                tracing::debug!(
                    answer = %answer,
                    "engine abort endpoint probe got no answer; a later /readyz check or abort \
                     asks again"
                );
            }
            return;
        };
        {
            let mut asked = self.asked();
            // When before the verdict: a re-check must not see "absent" with an old time.
            if verdict == AbortEndpoint::Absent {
                asked.absent_since = Some(std::time::Instant::now());
            }
            self.set_endpoint(verdict);
            if asked.told.replace(verdict) == Some(verdict) {
                return;
            }
        }
        let url = &self.config.abort.url_template;
        if status.is_success() {
            tracing::warn!(
                %status,
                %url,
                "engine abort endpoint found: abort calls on (upstream.abort.mode = auto)"
            );
        } else if not_offered(status) {
            tracing::warn!(
                %status,
                %url,
                "engine has no abort endpoint at upstream.abort.url: a client's disconnect \
                 still closes the upstream connection, which aborts the request in vLLM. For \
                 explicit aborts too: against `vllm serve` with VLLM_SERVER_DEV_MODE=1 set \
                 upstream.abort.url = \"{{base_url}}/abort_requests\"; against the scale-out \
                 API (--enable-scale-out) keep \"{{base_url}}/inference/v1/abort_requests\"; or \
                 set upstream.abort.mode = \"off\" to stop probing (see \"Engine aborts\" in \
                 docs/operations.md)"
            );
        } else {
            tracing::warn!(
                %status,
                "engine abort endpoint refused the gateway's call: no abort calls; check \
                 upstream.abort (url, body, id_format) and upstream.api_key_env"
            );
        }
    }
}

/// What a status says about the endpoint: 2xx -> there; [`not_offered`] or another 4xx (but
/// 408 and 429, which say nothing about it) -> none to call; anything else -> no verdict.
fn verdict(status: StatusCode) -> Option<AbortEndpoint> {
    if status.is_success() {
        Some(AbortEndpoint::Offered)
    } else if not_offered(status)
        || (status.is_client_error()
            && !matches!(
                status,
                StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
            ))
    {
        Some(AbortEndpoint::Absent)
    } else {
        None
    }
}

/// Statuses that say the engine has no abort endpoint at that URL: FastAPI's 404 and 405,
/// vLLM's 403 for its scale-out routes while `--enable-scale-out` is off, 501.
fn not_offered(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::NOT_FOUND
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::FORBIDDEN
            | StatusCode::NOT_IMPLEMENTED
    )
}

/// Sends the engine abort for one request when dropped or told to, unless disarmed.
#[derive(Debug)]
pub struct AbortGuard {
    /// `Some` while armed; taken by the first fire or disarm.
    call: Option<AbortCall>,
    state: Arc<AtomicU8>,
}

#[derive(Debug)]
struct AbortCall {
    caller: AbortCaller,
    /// The `X-Request-Id` the gateway sent.
    request_id: String,
    /// Where it was sent (it decides the engine's id).
    endpoint: Endpoint,
}

impl AbortGuard {
    /// An armed guard for the chat completion sent with `X-Request-Id: request_id`, with its
    /// own [`AbortCaller`] (so in `auto` mode its call is also its probe).
    /// [`AbortCaller::arm`] shares one caller's probe among many guards.
    pub fn new(
        http: reqwest::Client,
        config: Arc<UpstreamConfig>,
        request_id: String,
        tasks: TaskTracker,
    ) -> Self {
        AbortCaller::new(http, config, tasks).arm(request_id, Endpoint::ChatCompletions)
    }

    /// The request finished cleanly: nothing to abort. No effect once fired.
    pub fn disarm(&mut self) {
        if self.call.take().is_some() {
            self.set(AbortState::Disarmed);
        }
    }

    /// Fires the abort now (any call is spawned; returns at once). Returns true when this call
    /// fired it, false when it had already fired or was disarmed.
    pub fn abort_now(&mut self) -> bool {
        let Some(call) = self.call.take() else {
            return false;
        };
        let caller = &call.caller;
        // In `auto` mode, whether this call also asks if the endpoint exists.
        let probing = match caller.config.abort.call_mode() {
            AbortMode::Off => {
                self.set(AbortState::ConnectionOnly);
                return true;
            }
            AbortMode::On => false,
            AbortMode::Auto => match caller.endpoint() {
                AbortEndpoint::Offered => false,
                // Found absent long enough ago: this call asks again.
                AbortEndpoint::Absent if caller.claim_recheck() => true,
                AbortEndpoint::Absent | AbortEndpoint::Probing => {
                    self.set(AbortState::ConnectionOnly);
                    return true;
                }
                AbortEndpoint::Unknown => {
                    if !caller.claim_probe() {
                        // Another call took the probe just now.
                        self.set(AbortState::ConnectionOnly);
                        return true;
                    }
                    true
                }
            },
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if probing {
                caller.set_endpoint(AbortEndpoint::Unknown);
            }
            tracing::warn!(
                request_id = %call.request_id,
                "engine abort not sent: no async runtime (shutting down)"
            );
            self.set(AbortState::Skipped);
            return true;
        };
        self.set(AbortState::Sending);
        let state = Arc::clone(&self.state);
        let tasks = caller.tasks.clone();
        tasks.spawn_on(
            async move {
                let answer = call.send().await;
                let outcome = call.outcome(&answer);
                state.store(outcome as u8, Ordering::Release);
            },
            &runtime,
        );
        true
    }

    /// The current state.
    pub fn state(&self) -> AbortState {
        AbortState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// A view of the state that stays readable after the guard is dropped.
    pub fn watch(&self) -> AbortWatch {
        AbortWatch(Arc::clone(&self.state))
    }

    fn set(&self, state: AbortState) {
        self.state.store(state as u8, Ordering::Release);
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        self.abort_now();
    }
}

/// How an abort call or probe ended.
#[derive(Debug)]
enum Answer {
    /// The engine answered with this status.
    Status(StatusCode),
    /// No answer: why (connection error, timeout, bad method), without the URL.
    Failed(String),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Status(s) => write!(f, "status {s}"),
            Answer::Failed(e) => f.write_str(e),
        }
    }
}

impl AbortCall {
    /// Sends the configured call for this request, naming it by its engine id.
    async fn send(&self) -> Answer {
        let abort = &self.caller.config.abort;
        let Ok(method) = reqwest::Method::from_bytes(abort.method.as_str().as_bytes()) else {
            return Answer::Failed("invalid method".into());
        };
        let id = engine_request_id(abort.id_format, &self.request_id, self.endpoint);
        let url = abort.url(&self.caller.config.base_url, &id);
        let body = abort.body(&id);
        let mut req = self
            .caller
            .http
            .request(method, url)
            .timeout(ABORT_TIMEOUT)
            .header("x-request-id", &self.request_id);
        if !body.is_empty() {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        match req.send().await {
            Ok(resp) => Answer::Status(resp.status()),
            Err(e) => Answer::Failed(e.without_url().to_string()),
        }
    }

    /// What `answer` means for this request's abort; logs it and, in `auto` mode, records
    /// what it says about the endpoint.
    fn outcome(&self, answer: &Answer) -> AbortState {
        let auto = self.caller.config.abort.call_mode() == AbortMode::Auto;
        if auto {
            self.caller.settle(answer, false);
        }
        match answer {
            Answer::Status(s) if s.is_success() => {
                tracing::debug!(request_id = %self.request_id, "engine abort sent");
                AbortState::Sent
            }
            Answer::Status(s) if auto && not_offered(*s) => {
                // Logged once by `settle`; the connection drop stopped the request.
                tracing::debug!(request_id = %self.request_id, status = %s, "no engine abort endpoint");
                AbortState::NotOffered
            }
            Answer::Status(s) if auto && verdict(*s).is_some() => {
                // `settle` logged the refusal once; no more calls are made.
                tracing::debug!(request_id = %self.request_id, status = %s, "engine abort refused");
                AbortState::Failed
            }
            Answer::Status(s) => {
                tracing::warn!(
                    request_id = %self.request_id,
                    status = %s,
                    "engine abort refused"
                );
                AbortState::Failed
            }
            Answer::Failed(e) => {
                tracing::warn!(
                    request_id = %self.request_id,
                    error = %e,
                    "engine abort failed"
                );
                AbortState::Failed
            }
        }
    }
}

#[cfg(test)]
#[path = "abort_tests.rs"]
mod tests;
