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
    /// Webhook attempts out at once, at most [`super::webhook::MAX_ATTEMPTS_OUT`]: one a
    /// receiver holds open (to `jobs.webhook_timeout`) holds a socket.
    pub webhook_permits: std::sync::Arc<tokio::sync::Semaphore>,
    /// Wakes the scheduler: a job was queued, or capacity may have come back.
    pub wake: Notify,
    /// Pre-empted jobs waiting for a seat to resume: while any does, the scheduler starts no
    /// queued job (a resumed job goes first).
    pub resuming: AtomicUsize,
    /// The API keys in force (`[auth]`): a job whose key was revoked does not start, and a
    /// running one ends.
    pub keys: Option<std::sync::Arc<dyn KeysInForce>>,
    /// No job starts before this: a run failed for the engine (down, erroring), and what the
    /// gateway last knew of its health may be from before (see `runner::schedule`).
    pub engine_pause: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Context {
    /// The job metric families.
    pub fn metrics(&self) -> &JobMetrics {
        self.state.metrics().jobs()
    }

    /// Jobs that may run at once (0: no bound of their own). `jobs.max_running`; when that is
    /// 0 and admission bounds nothing (`admission.policy = "fifo"` without a `max_concurrency`:
    /// every try for a seat succeeds), the large lane's `max_concurrency`, the seats its doc
    /// says bound jobs: otherwise every queued job (up to `jobs.max_jobs`) ran at once.
    pub fn max_running(&self) -> usize {
        let config = self.state.config();
        let unbounded = config.admission.policy == crate::config::Policy::Fifo
            && config.admission.fifo.max_concurrency.is_none();
        match self.config.max_running {
            0 if unbounded => config.lanes.large.max_concurrency.get() as usize,
            n => n,
        }
    }
}
