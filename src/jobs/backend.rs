//! The one interface of a job store: [`JobBackend`], implemented in process
//! (`local/`, `quota.backend = "local"`) and in Redis (`redis/`, `quota.backend = "redis"`).
//! The service (`service.rs`) answers the routes through it, and the one scheduler
//! (`runner.rs`) starts and runs jobs through it; whatever a backend needs beside (the
//! in-process sweeper, Redis's beat and listener) is a task the backend starts itself.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde_json::Value;

use super::entry::Ended;
use std::sync::Arc;

use crate::admission::preempt::Preemptible;
use crate::admission::LaneGuard;
use crate::config::JobsConfig;
use crate::error::GatewayError;
use crate::pipeline::{NotTaken, Ready, Tenant};
use crate::telemetry::RequestRecord;

/// A job's events as SSE text (see `events.rs`).
pub type EventStream = BoxStream<'static, Result<Bytes, Infallible>>;

/// A classified request to keep as a job.
#[derive(Debug)]
pub struct NewJob {
    /// The request (its id is its record's request id).
    pub ready: Ready,
    /// Its record, handed over to the run's.
    pub record: RequestRecord,
    /// Where to POST the result.
    pub notify: Option<reqwest::Url>,
    /// Its tenant's share of the queue (`auth.tenant_shares`; 1 by default).
    pub share: f64,
}

/// A job store: where jobs are kept, how they are read, cancelled and followed, and how the
/// queue's head is taken to run. Every method that reaches the store is a future (Redis is a
/// round trip; in process they are ready at once).
pub trait JobBackend: Send + Sync + std::fmt::Debug {
    /// How long the scheduler sleeps without being woken before it looks at the queue again
    /// (`None`: only when woken through [`super::context::Context::wake`]).
    fn poll_every(&self) -> Option<Duration>;

    /// Whether a job of `bytes` would be taken now (`jobs.max_jobs`, `jobs.max_bytes`).
    fn has_room(&self, bytes: u64) -> bool;

    /// Queues `job`, or gives it back with the reason (429 `jobs_full`, 503 store down).
    fn adopt(&self, job: NewJob) -> BoxFuture<'_, Result<(), Box<NotTaken>>>;

    /// `GET /jobs/{id}` for `tenant` (another tenant's job is not found).
    fn status<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<Value, GatewayError>>;

    /// `DELETE /jobs/{id}`: a queued job ends at once; a running one when its stream has been
    /// dropped (waited for, briefly). A job that had already ended (done, failed, cancelled)
    /// has its result dropped at once, as at its expiry: status `expired`, its room in its
    /// tenant's and the store's bounds back. Sends the webhook of a job this call ended.
    fn cancel<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<Value, GatewayError>>;

    /// Whether job `id` exists for `tenant` (404 otherwise).
    fn exists<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<(), GatewayError>>;

    /// Job `id`'s event stream for `tenant`, after piece `from.1` of run `from.0` (404 when
    /// there is no such job).
    fn events<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
        from: (u64, usize),
    ) -> BoxFuture<'a, Result<EventStream, GatewayError>>;

    /// Takes the queue's head to run it, when idle large-lane capacity fits it.
    fn take(&self) -> BoxFuture<'_, Take>;
}

/// What [`JobBackend::take`] found.
pub enum Take {
    /// The head starts: it holds its seat and runs on this replica.
    Started(Box<Claim>),
    /// The head changed while it was being taken (another replica started or cancelled it):
    /// worth another look at once.
    Moved,
    /// Nothing to start now (no job, no idle capacity, or the store is unreachable).
    Idle,
}

/// A job taken to run here: its seat, and the run that writes its outcome.
pub struct Claim {
    /// How long it was queued (submission to start).
    pub waited: Duration,
    /// Its seat (a large-lane one, or with `jobs.preempt` any lane's), tokens and prefill.
    pub guard: LaneGuard,
    /// With `jobs.preempt`: the seat's handle, through which admission asks it back.
    pub preempt: Option<Arc<Preemptible>>,
    /// A job handed back with its text (Redis, `jobs.preempt`): what its earlier runs
    /// produced, to be continued.
    pub resumed: Option<Resumed>,
    /// Its run.
    pub run: Box<dyn JobRun>,
}

/// What the earlier runs of a job handed back with its text produced (see `runner.rs`).
#[derive(Debug, Clone)]
pub struct Resumed {
    /// The text so far.
    pub text: String,
    /// The runs' progress as they handed it back (`runner::Progress::to_json`).
    pub progress: Value,
}

/// One run of a job on this replica, from its start to its end: the backend's side of
/// `runner::run`.
pub trait JobRun: Send {
    /// The classified request to send and its record; or how the job ends without running
    /// (its stored request cannot be read).
    fn work(&mut self) -> BoxFuture<'_, Result<(Ready, RequestRecord), Ended>>;

    /// Keeps a streamed piece of text (readers see it as it comes).
    fn piece(&mut self, text: &str);

    /// The run was pre-empted `n` times so far (its status says so); it goes on.
    fn preempted(&mut self, _n: u32) {}

    /// Whether a pre-empted run hands its job back to the shared queue with its text (any
    /// replica continues it) instead of waiting here for a seat to continue it on.
    fn hands_back(&self) -> bool {
        false
    }

    /// Resolves when the job's cancel is asked (`DELETE`, from any replica).
    fn cancelled(&self) -> BoxFuture<'static, ()>;

    /// Resolves when this run no longer owns the job (only a shared store can lose one: its
    /// runner lease lapsed and the job runs elsewhere, or the store stayed unreachable); it
    /// then stops and writes nothing more.
    fn lost(&self) -> BoxFuture<'static, ()>;

    /// Ends the run with `outcome` (`None`: lost): the job's status, the metrics, the webhook.
    fn finish(self: Box<Self>, outcome: Option<Ended>) -> BoxFuture<'static, ()>;
}

/// A job's request that counts `bytes` in the job store (as the backend counts it: in process
/// its text plus 80 a JSON value, in Redis the JSON kept), refused when it alone is more than a
/// bound of `config` (`tenant`: it has one, so its tenant's bound too): 413 `job_too_large`,
/// since no store of this size could keep it, where a 429 would promise room that never comes.
pub fn too_large(config: &JobsConfig, bytes: u64, tenant: bool) -> Option<GatewayError> {
    let bounds = [
        Some(("jobs.max_bytes", config.max_bytes)),
        tenant.then_some(("jobs.max_bytes_per_tenant", config.max_bytes_per_tenant)),
    ];
    bounds
        .into_iter()
        .flatten()
        .find(|(_, max)| bytes > *max)
        .map(|(limit, max)| GatewayError::JobTooLarge {
            held: bytes,
            limit,
            max,
        })
}
