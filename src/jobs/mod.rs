//! Background jobs (M16, M23): a repository review submitted with `POST /jobs` runs out of the
//! capacity interactive traffic leaves idle, and its client polls, attaches to its events, or
//! gets a webhook, instead of holding a connection and a queue place.
//!
//! - `POST /jobs`: the `/answer` body plus an optional `notify` webhook URL (allowed only when
//!   it matches `jobs.webhook_allow`). Checked and classified at once (the same 400s as
//!   `/answer`); 202 with `{"id","status","status_url","events_url"}`.
//! - `GET /jobs/{id}`: status, queue position, and when done the answer with usage and timings.
//! - `GET /jobs/{id}/events`: SSE (`status`, `token` with ids, then `done` or `error`); a late
//!   client gets the text so far first; `Last-Event-ID` resumes after that piece (`events.rs`).
//! - `DELETE /jobs/{id}`: cancels; a running job's stream is dropped, which aborts the engine's
//!   work and gives its seat and tokens back.
//!
//! Scheduling (`runner.rs`): oldest first, in the large lane only, and only when that lane has
//! one of its own seats free, nobody waits in its queue, and the tokens and prefill fit
//! ([`crate::admission::Admission::try_acquire_idle`]); it wakes whenever capacity comes back.
//! A job never borrows a seat and never queues ahead of an interactive request.
//!
//! Storage: with `quota.backend = "local"`, in this process (`store.rs`), bounded by
//! `jobs.max_jobs` and `jobs.max_bytes`, lost on restart; with `"redis"`, in the quota's Redis
//! (`shared/`): any replica answers for any job, the fleet's large lane is the idle capacity,
//! and a job whose gateway dies runs again on another one (up to `jobs.max_attempts` runs). A
//! finished job's result expires after `jobs.result_ttl` (status `expired`); the id is forgotten
//! as long again after that. Webhooks (`webhook.rs`): HMAC-SHA256 signed, retried with backoff
//! and jitter, every attempt listed in the status.

// Numbers from clients reach these modules (ids, offsets, lengths): no cast may wrap or drop a
// sign; checked or saturating arithmetic instead.
#![deny(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

mod entry;
mod events;
mod runner;
mod shared;
mod store;
mod streams;
mod webhook;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use axum::body::Bytes;
use axum::http::HeaderMap;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use entry::Status;

use crate::config::JobsConfig;
use crate::error::GatewayError;
use crate::pipeline::parse::{self, AnswerRequest};
use crate::pipeline::respond::link_trace;
use crate::pipeline::{
    self, prompt, AppState, Divert, NotTaken, Prepared, Ready, RequestCtx, Tenant,
};
use crate::telemetry::RequestRecord;
use crate::telemetry::Route;
use entry::{Answer, Entry};
use store::Store;

/// The job service: the store, the scheduler and the sweeper. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Jobs(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    state: AppState,
    config: JobsConfig,
    store: Mutex<Store>,
    /// A job was queued.
    submitted: Notify,
    /// The gateway is shutting down: the scheduler stops, running jobs are cancelled.
    stop: CancellationToken,
    /// Running jobs and webhook deliveries, which shutdown waits for (a cancelled job's
    /// engine abort goes out before the process ends).
    tasks: TaskTracker,
    /// Webhook deliveries (no redirects: an allowed host cannot send the gateway elsewhere).
    http: reqwest::Client,
    /// The shared store, when Redis is the quota's backend (then `store` stays empty).
    shared: Option<Arc<shared::SharedJobs>>,
    /// Event streams open per tenant (`jobs.max_event_streams_per_tenant`).
    streams: Arc<streams::StreamSlots>,
}

impl Jobs {
    /// The service over `state`, with its scheduler and sweeper running until `stop`; running
    /// jobs and webhook deliveries go on `tasks`.
    pub fn start(state: AppState, stop: CancellationToken, tasks: TaskTracker) -> Self {
        let config = state.config().jobs.clone();
        let http = webhook::client(&config);
        let shared = state
            .admission()
            .shared()
            .map(|redis| Arc::new(shared::SharedJobs::new(redis.clone(), &config)));
        let jobs = Jobs(Arc::new(Inner {
            state,
            config,
            store: Mutex::new(Store::default()),
            submitted: Notify::new(),
            stop,
            tasks,
            http,
            shared,
            streams: Arc::default(),
        }));
        if jobs.0.config.enabled {
            match &jobs.0.shared {
                Some(shared) => {
                    tokio::spawn(shared::runner::schedule(jobs.clone(), shared.clone()));
                    tokio::spawn(shared::runner::beat(jobs.clone(), shared.clone()));
                    tokio::spawn(shared::runner::listen(jobs.clone(), shared.clone()));
                }
                None => {
                    tokio::spawn(runner::schedule(jobs.clone()));
                    tokio::spawn(runner::sweep(jobs.clone()));
                }
            }
        }
        jobs
    }

    /// The gateway's state (for the routes served beside the jobs).
    pub fn state(&self) -> &AppState {
        &self.0.state
    }

    /// `server.max_body_bytes`, for the error that names it.
    pub fn max_body_bytes(&self) -> usize {
        self.0.state.config().server.max_body_bytes
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.0.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The job `id`, if `tenant` may see it: its own tenant's, or any job when neither has
    /// one (`[auth]` off). Another tenant's job is "not found", as if it did not exist.
    fn entry(&self, id: &str, tenant: Option<&Tenant>) -> Result<Arc<Entry>, GatewayError> {
        let entry = self.store().get(id).ok_or(GatewayError::JobNotFound)?;
        if entry.tenant.as_deref() == tenant.map(|t| t.0.as_str()) {
            Ok(entry)
        } else {
            Err(GatewayError::JobNotFound)
        }
    }

    /// `POST /jobs`: checks, classifies and queues the job; its id and URLs.
    pub async fn submit(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        tenant: Option<Tenant>,
    ) -> Result<Value, GatewayError> {
        let inner = &self.0;
        if !inner.config.enabled {
            return Err(GatewayError::JobsUnavailable(
                "jobs are switched off here (jobs.enabled = false)",
            ));
        }
        let ctx = RequestCtx::snapshot(&inner.state);
        let mut record = ctx.record(Route::Job);
        link_trace(&mut record, headers);
        let checked = async {
            let mut value = parse::json_body(&body)?;
            let notify = match value.as_object_mut().and_then(|o| o.remove("notify")) {
                Some(raw) => Some(webhook::check_notify(&raw, &inner.config.webhook_allow)?),
                None => None,
            };
            let req = AnswerRequest::from_value(value)?;
            let prepared = Prepared {
                size: body.len(),
                background: true,
                tenant,
                ..prompt::answer_request(&ctx, req).await?
            };
            Ok::<_, GatewayError>((prepared, notify))
        }
        .await;
        let (prepared, notify) = match checked {
            Ok(c) => c,
            Err(e) => return Err(pipeline::refused(record, e)),
        };
        let ready = match pipeline::classify(&ctx, prepared, &mut record).await {
            Ok(r) => r,
            Err(e) => return Err(pipeline::refused(record, e)),
        };
        let taken = match &inner.shared {
            Some(shared) => self.adopt_shared(shared, ready, record, notify).await,
            None => self.adopt(ready, record, notify),
        };
        taken.map_err(|back| pipeline::refused(back.record, back.error))
    }

    /// [`Jobs::adopt`] into the shared store: the classified request is kept in Redis (any
    /// replica may run it) and the submission's record is handed over to the run's.
    async fn adopt_shared(
        &self,
        shared: &shared::SharedJobs,
        ready: Ready,
        record: RequestRecord,
        notify: Option<reqwest::Url>,
    ) -> Result<Value, Box<NotTaken>> {
        let id = record.request_id().to_owned();
        let share = self.share_of(&ready);
        let traceparent = record.upstream_traceparent();
        let submitted = shared
            .submit(
                &self.0.config,
                &id,
                &ready,
                notify.as_ref(),
                traceparent,
                share,
            )
            .await;
        if let Err(error) = submitted {
            return Err(Box::new(NotTaken {
                ready,
                record,
                error,
            }));
        }
        drop(ready);
        record.hand_over();
        tracing::info!(job = %id, "job queued (shared store)");
        Ok(accepted(&id))
    }

    /// `ready`'s tenant's share (`auth.tenant_shares`; 1 by default).
    fn share_of(&self, ready: &Ready) -> f64 {
        ready
            .tenant()
            .and_then(|t| self.0.state.config().auth.tenant_shares.get(&t.0).copied())
            .map_or(1.0, f64::from)
    }

    /// Queues an already classified request (a submission, or a diverted `/answer`): its id and
    /// URLs, or the request back with 429 `jobs_full` when the store is at its bounds.
    fn adopt(
        &self,
        ready: Ready,
        record: RequestRecord,
        notify: Option<reqwest::Url>,
    ) -> Result<Value, Box<NotTaken>> {
        let inner = &self.0;
        let id = record.request_id().to_owned();
        let bytes = ready.size as u64;
        {
            let mut store = self.store();
            if !self.has_room(&store, bytes) {
                drop(store);
                return Err(Box::new(NotTaken {
                    ready,
                    record,
                    error: GatewayError::JobsFull,
                }));
            }
            let class = ready.class;
            let share = self.share_of(&ready);
            let entry = Entry::new(id.clone(), class, (ready, record), notify, bytes);
            store.push(Arc::new(entry), bytes, share);
            // Under the lock: the scheduler cannot move it to `running` before it is counted.
            inner.state.metrics().jobs().moved(None, Some("queued"));
        }
        inner.submitted.notify_one();
        tracing::info!(job = %id, "job queued");
        Ok(accepted(&id))
    }

    /// Whether `store` takes one more job of `bytes` (`jobs.max_jobs`, `jobs.max_bytes`).
    fn has_room(&self, store: &Store, bytes: u64) -> bool {
        store.live() < self.0.config.max_jobs && store.bytes + bytes <= self.0.config.max_bytes
    }

    /// `GET /jobs/{id}`.
    pub async fn status(&self, id: &str, tenant: Option<&Tenant>) -> Result<Value, GatewayError> {
        if let Some(shared) = &self.0.shared {
            return shared.status(id, tenant).await;
        }
        let entry = self.entry(id, tenant)?;
        let position = self.store().position(id);
        Ok(entry.view(position))
    }

    /// `DELETE /jobs/{id}`: a queued job ends at once; a running one when its stream has been
    /// dropped and the engine abort sent (waited for, briefly). Cancelling twice is fine; a job
    /// that already ended otherwise is a 409.
    pub async fn cancel(&self, id: &str, tenant: Option<&Tenant>) -> Result<Value, GatewayError> {
        if let Some(shared) = &self.0.shared {
            let (view, ended_here) = shared.cancel(id, tenant).await?;
            if ended_here {
                shared::runner::notify_ended(self, shared, id).await;
            }
            return Ok(view);
        }
        let entry = self.entry(id, tenant)?;
        let queued = {
            let mut store = self.store();
            let queued = store.unqueue(id);
            if queued {
                // Its classified request goes (the session reservation with it) outside the lock.
                entry.lock().work.take()
            } else {
                None
            }
        };
        if let Some(work) = queued {
            drop(work);
            self.end(&entry, Ended::Cancelled);
        }
        let mut rx = entry.watch();
        entry.cancel.cancel();
        let wait = async {
            while !entry.lock().status.is_final() {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await;
        match entry.lock().status {
            Status::Cancelled | Status::Running | Status::Queued => {}
            other => return Err(GatewayError::JobFinished(other.as_str())),
        }
        Ok(entry.view(None))
    }

    /// `GET /jobs/{id}/events`, resuming after piece `last_event_id` when given; `None` when
    /// that was the last event (the route answers 204).
    pub async fn events(
        &self,
        id: &str,
        tenant: Option<&Tenant>,
        last_event_id: Option<&str>,
    ) -> Result<Option<BoxStream<'static, Result<Bytes, std::convert::Infallible>>>, GatewayError>
    {
        let (run, from) = match last_event_id.map(str::trim) {
            None | Some("") => (1, 0),
            // Reconnecting after the last event: nothing more will come.
            Some(events::END_ID) => {
                self.exists(id, tenant).await?;
                return Ok(None);
            }
            Some(v) => events::parse_piece_id(v).ok_or_else(|| {
                GatewayError::bad_request(
                    format!(
                        "Last-Event-ID must be the id of an event of this job: `n` or \
                         `<run>.<n>` (n from 0 to {}, run from 1 to {}), or `end`",
                        events::MAX_PIECE_ID,
                        events::MAX_RUN
                    ),
                    Some("last-event-id"),
                )
            })?,
        };
        let max = self.0.config.max_event_streams_per_tenant;
        if let Some(shared) = &self.0.shared {
            shared.check(id, tenant).await?;
            let slot = self.0.streams.take(tenant, max)?;
            let stream = shared::stream(shared.clone(), id.to_owned(), (run, from));
            return Ok(Some(held(stream, slot)));
        }
        // In process a job runs once: ids are plain numbers.
        let _ = run;
        let entry = self.entry(id, tenant)?;
        let slot = self.0.streams.take(tenant, max)?;
        Ok(Some(held(events::stream(entry, from), slot)))
    }

    /// Event streams `tenant` holds open on this replica (`None`: without a tenant).
    pub fn event_streams(&self, tenant: Option<&str>) -> usize {
        self.0.streams.held(tenant)
    }

    /// Whether job `id` exists for `tenant` (404 otherwise).
    async fn exists(&self, id: &str, tenant: Option<&Tenant>) -> Result<(), GatewayError> {
        match &self.0.shared {
            Some(shared) => shared.check(id, tenant).await,
            None => self.entry(id, tenant).map(drop),
        }
    }

    /// Ends `entry` (from queued or running) and sends its webhook.
    fn end(&self, entry: &Arc<Entry>, how: Ended) {
        let now = (SystemTime::now(), Instant::now());
        // The store's lock first (as everywhere), so its byte count and the job's agree for
        // the sweeper.
        let mut store = self.store();
        let (from, to, ran, text_bytes) = entry.update(|s| {
            let from = s.status;
            s.status = match &how {
                Ended::Done(_) => Status::Done,
                Ended::Failed(..) => Status::Failed,
                // In process, a job handed back at shutdown has nowhere to go.
                Ended::Cancelled | Ended::HandedBack => Status::Cancelled,
            };
            match how {
                Ended::Done(answer) => s.answer = Some(answer),
                Ended::Failed(code, message) => s.error = Some((code, message)),
                Ended::Cancelled | Ended::HandedBack => {}
            }
            s.finished = Some(now);
            let text_bytes = s.text.len() as u64;
            s.bytes += text_bytes;
            (from, s.status, s.started.map(|t| now.1 - t.1), text_bytes)
        });
        store.bytes += text_bytes;
        if from == Status::Running {
            store.running -= 1;
        }
        let metrics = self.0.state.metrics().jobs();
        metrics.moved(Some(from.as_str()), Some(to.as_str()));
        drop(store);
        if let Some(ran) = ran {
            metrics.ran(ran);
        }
        tracing::info!(job = %entry.id, status = to.as_str(), "job ended");
        if entry.lock().notify.is_some() {
            self.0
                .tasks
                .spawn(webhook::deliver(self.clone(), entry.clone()));
        }
    }
}

impl Divert for Jobs {
    fn has_room(&self, bytes: usize) -> bool {
        match &self.0.shared {
            Some(shared) => shared.has_room(&self.0.config, bytes as u64),
            None => self.has_room(&self.store(), bytes as u64),
        }
    }

    fn divert(
        &self,
        ready: Ready,
        record: RequestRecord,
    ) -> BoxFuture<'_, Result<Value, Box<NotTaken>>> {
        Box::pin(async move {
            match &self.0.shared {
                Some(shared) => self.adopt_shared(shared, ready, record, None).await,
                None => self.adopt(ready, record, None),
            }
        })
    }
}

/// `stream`, holding `slot` until it is dropped.
fn held<S>(stream: S, slot: streams::StreamSlot) -> BoxStream<'static, S::Item>
where
    S: futures::Stream + Send + 'static,
{
    stream
        .map(move |item| {
            let _slot = &slot;
            item
        })
        .boxed()
}

/// The answer to an accepted job: its id and URLs.
fn accepted(id: &str) -> Value {
    json!({
        "id": id,
        "status": Status::Queued.as_str(),
        "status_url": format!("/jobs/{id}"),
        "events_url": format!("/jobs/{id}/events"),
    })
}

/// How a job ended.
enum Ended {
    Done(Answer),
    Failed(&'static str, String),
    Cancelled,
    /// Shared store only: the gateway is shutting down; the job goes back to the queue for
    /// another replica.
    HandedBack,
}
