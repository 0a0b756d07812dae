//! Engine abort (M21): [`AbortGuard`] calls the configured abort for one request id exactly
//! once, unless the request finished cleanly.
//!
//! Closing the connection should make vLLM abort the request, but some releases kept generating
//! after a disconnect, so the gateway also calls the engine's abort endpoint
//! (`upstream.abort`, default `POST {base_url}/abort_requests {"request_ids":["{id}"]}`).
//!
//! The guard is owned by the [`super::UpstreamStream`] (before that, by the send in
//! [`super::UpstreamClient::stream`]). It fires on drop unless [`AbortGuard::disarm`] was
//! called after a finish reason arrived, so every way out (client gone, error, timeout, panic,
//! a cancelled future) sends the abort; [`AbortGuard::abort_now`] fires it early. Firing takes
//! the call out of the guard, so a second fire is a no-op: never two aborts for one request.
//!
//! The call runs in a task spawned on the client's [`TaskTracker`] (so shutdown can wait for
//! it), bounded by [`ABORT_TIMEOUT`]; failures are logged at `warn` with the request id only,
//! never a body. With `upstream.abort.enabled = false` nothing is sent: dropping the connection
//! is then the only signal.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::config::UpstreamConfig;

/// Longest an abort call may take (connect included) before it is given up and logged.
pub const ABORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where one request's abort stands. Read it with [`AbortGuard::state`] or, after the guard is
/// gone, through an [`AbortWatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AbortState {
    /// Not fired yet: dropping the guard now sends the abort.
    Armed = 0,
    /// The request finished cleanly; no abort will be sent.
    Disarmed = 1,
    /// Fired while the abort call is disabled in config: only the connection was dropped.
    ConnectionOnly = 2,
    /// The abort call is in flight.
    Sending = 3,
    /// The engine answered the abort call with a 2xx status.
    Sent = 4,
    /// The abort call failed (connection error, non-2xx status or [`ABORT_TIMEOUT`]); logged.
    Failed = 5,
    /// Fired outside a Tokio runtime (dropped during process teardown), so not sent; logged.
    Skipped = 6,
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
            AbortState::Sending | AbortState::Sent | AbortState::Failed
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

/// Sends the engine abort for one request when dropped or told to, unless disarmed.
#[derive(Debug)]
pub struct AbortGuard {
    /// `Some` while armed; taken by the first fire or disarm.
    call: Option<AbortCall>,
    state: Arc<AtomicU8>,
}

#[derive(Debug)]
struct AbortCall {
    http: reqwest::Client,
    config: Arc<UpstreamConfig>,
    request_id: String,
    tasks: TaskTracker,
}

impl AbortGuard {
    /// An armed guard for `request_id` (the `X-Request-Id` sent to vLLM).
    pub fn new(
        http: reqwest::Client,
        config: Arc<UpstreamConfig>,
        request_id: String,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            call: Some(AbortCall {
                http,
                config,
                request_id,
                tasks,
            }),
            state: Arc::new(AtomicU8::new(AbortState::Armed as u8)),
        }
    }

    /// The request finished cleanly: nothing to abort. No effect once fired.
    pub fn disarm(&mut self) {
        if self.call.take().is_some() {
            self.set(AbortState::Disarmed);
        }
    }

    /// Fires the abort now (spawned; returns at once). Returns true when this call fired it,
    /// false when it had already fired or was disarmed.
    pub fn abort_now(&mut self) -> bool {
        let Some(call) = self.call.take() else {
            return false;
        };
        if !call.config.abort.enabled {
            self.set(AbortState::ConnectionOnly);
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                request_id = %call.request_id,
                "engine abort not sent: no async runtime (shutting down)"
            );
            self.set(AbortState::Skipped);
            return true;
        };
        self.set(AbortState::Sending);
        let state = Arc::clone(&self.state);
        let tasks = call.tasks.clone();
        tasks.spawn_on(
            async move {
                let outcome = call.send().await;
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

impl AbortCall {
    async fn send(self) -> AbortState {
        let abort = &self.config.abort;
        let method = match reqwest::Method::from_bytes(abort.method.as_str().as_bytes()) {
            Ok(m) => m,
            Err(_) => return AbortState::Failed,
        };
        let url = abort.url(&self.config.base_url, &self.request_id);
        let body = abort.body(&self.request_id);
        let mut req = self
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
            Ok(resp) if resp.status().is_success() => {
                tracing::debug!(request_id = %self.request_id, "engine abort sent");
                AbortState::Sent
            }
            Ok(resp) => {
                tracing::warn!(
                    request_id = %self.request_id,
                    status = %resp.status(),
                    "engine abort refused"
                );
                AbortState::Failed
            }
            Err(e) => {
                tracing::warn!(
                    request_id = %self.request_id,
                    error = %e.without_url(),
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
