//! What every part of the job service shares, whichever the backend: the gateway's state, the
//! `[jobs]` config, the shutdown signal, the task tracker, the webhook client, and the
//! scheduler's wake-up.

use std::sync::atomic::AtomicUsize;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::JobsConfig;
use crate::pipeline::tenant::KeysInForce;
use crate::pipeline::AppState;
use crate::telemetry::JobMetrics;

/// The service's shared context (one per gateway, behind an `Arc`).
#[derive(Debug)]
pub struct Context {
    /// The gateway's state (admission, metrics, config for the runs).
    pub state: AppState,
    /// `[jobs]` as the gateway started with it.
    pub config: JobsConfig,
    /// The gateway is shutting down: the scheduler and the backend's tasks stop, running jobs
    /// end (cancelled in process, handed back to the queue in Redis).
    pub stop: CancellationToken,
    /// Running jobs and webhook deliveries, which shutdown waits for (a cancelled job's
    /// engine abort goes out before the process ends).
    pub tasks: TaskTracker,
    /// Webhook deliveries ([`super::webhook::client`]: no redirects, no proxy, public
    /// addresses only); `None` when it could not be built (every delivery fails).
    pub http: Option<reqwest::Client>,
    /// Wakes the scheduler: a job was queued, or capacity may have come back.
    pub wake: Notify,
    /// Pre-empted jobs waiting for a seat to resume: while any does, the scheduler starts no
    /// queued job (a resumed job goes first).
    pub resuming: AtomicUsize,
    /// The API keys in force (`[auth]`): a job whose key was revoked does not start, and a
    /// running one ends.
    pub keys: Option<std::sync::Arc<dyn KeysInForce>>,
}

impl Context {
    /// The job metric families.
    pub fn metrics(&self) -> &JobMetrics {
        self.state.metrics().jobs()
    }
}
