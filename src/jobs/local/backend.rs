//! [`LocalJobs`]: the job store in this process (`quota.backend = "local"`), bounded by
//! `jobs.max_jobs` and `jobs.max_bytes`, lost on restart. The queue's head takes its seat with
//! [`crate::admission::Admission::try_acquire_idle`]; admission's `freed` signal wakes the
//! scheduler; a sweeper expires results and forgets expired ids.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use futures::future::{self, BoxFuture};
use futures::{FutureExt, StreamExt};
use serde_json::Value;
use tokio::time::Instant;

use super::events;
use super::queue::Store;
use crate::admission::preempt::Preemptible;
use crate::error::GatewayError;
use crate::jobs::backend::{too_large, Claim, EventStream, JobBackend, JobRun, NewJob, Take};
use crate::jobs::context::Context;
use crate::jobs::entry::{Ended, Entry, Status};
use crate::jobs::webhook;
use crate::lane::Lane;
use crate::pipeline::{NotTaken, Ready, Tenant};
use crate::telemetry::RequestRecord;

/// The in-process store (a cheap handle: runs hold one to end their job).
#[derive(Debug, Clone)]
pub struct LocalJobs {
    ctx: Arc<Context>,
    store: Arc<Mutex<Store>>,
}

impl LocalJobs {
    /// The store, with its sweeper and the scheduler's wake-up on freed capacity running until
    /// the gateway stops (when jobs are enabled).
    pub fn start(ctx: &Arc<Context>) -> Self {
        let jobs = Self {
            ctx: ctx.clone(),
            store: Arc::default(),
        };
        if ctx.config.enabled {
            let watch = ctx.state.metrics().background();
            tokio::spawn(watch.watch("jobs sweeper", sweep(jobs.clone())));
            tokio::spawn(watch.watch("jobs wake-up", wake_on_freed(ctx.clone())));
            tokio::spawn(watch.watch("jobs stop", cancel_queued_at_stop(jobs.clone())));
        }
        jobs
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// Whether `store` takes one more job of `bytes` (`jobs.max_jobs`, `jobs.max_bytes`).
    fn fits(&self, store: &Store, bytes: u64) -> bool {
        let config = &self.ctx.config;
        store.live() < config.max_jobs && store.bytes + bytes <= config.max_bytes
    }

    /// Whether `tenant` may keep one more job of `bytes` (`jobs.max_jobs_per_tenant`,
    /// `jobs.max_bytes_per_tenant`); the refusal names its own limit.
    fn tenant_fits(&self, store: &Store, tenant: &str, bytes: u64) -> Result<(), GatewayError> {
        let config = &self.ctx.config;
        let (jobs, held) = store.held_by(tenant);
        if jobs >= config.max_jobs_per_tenant {
            return Err(GatewayError::TenantJobsFull {
                tenant: tenant.to_owned(),
                what: "jobs",
                held: jobs as u64,
                limit: config.max_jobs_per_tenant as u64,
            });
        }
        if held + bytes > config.max_bytes_per_tenant {
            return Err(GatewayError::TenantJobsFull {
                tenant: tenant.to_owned(),
                what: "bytes",
                held,
                limit: config.max_bytes_per_tenant,
            });
        }
        Ok(())
    }

    /// Queues `job` (429 `tenant_jobs_full` when its tenant is at its own bounds, `jobs_full`
    /// when the store is at its bounds).
    fn push(&self, job: NewJob) -> Result<(), Box<NotTaken>> {
        let id = job.record.request_id().to_owned();
        let bytes = job.ready.size as u64;
        {
            let mut store = self.store();
            // Stopping: its queued jobs were cancelled, and nothing would ever run a new one
            // (a large request diverted to a job during the drain keeps its place instead,
            // and ends with the drain's 503).
            let stopping = self
                .ctx
                .stop
                .is_cancelled()
                .then_some(GatewayError::Shutdown);
            let refused = stopping
                .or_else(|| too_large(&self.ctx.config, bytes, job.ready.tenant().is_some()))
                .or_else(|| match job.ready.tenant() {
                    Some(t) => self.tenant_fits(&store, &t.0, bytes).err(),
                    None => None,
                })
                .or_else(|| (!self.fits(&store, bytes)).then_some(GatewayError::JobsFull));
            if let Some(error) = refused {
                drop(store);
                return Err(Box::new(NotTaken {
                    ready: job.ready,
                    record: job.record,
                    error,
                }));
            }
            let class = job.ready.class;
            // Its session's reservation is given back once the store has it, as the shared
            // store does: a job that waits hours must not move its session's questions to
            // larger lanes meanwhile, and its run is not counted in the session.
            let work = (job.ready.without_session(), job.record);
            let entry = Entry::new(id.clone(), class, work, job.notify, bytes);
            store.push(Arc::new(entry), bytes, job.share);
            // Under the lock: the scheduler cannot move it to `running` before it is counted.
            self.ctx.metrics().moved(None, Some("queued"));
        }
        self.ctx.wake.notify_one();
        tracing::info!(job = %id, "job queued");
        Ok(())
    }

    /// `DELETE /jobs/{id}` (see [`JobBackend::cancel`]).
    async fn cancel_job(&self, id: &str, tenant: Option<&Tenant>) -> Result<Value, GatewayError> {
        let entry = self.entry(id, tenant)?;
        if entry.lock().status.is_final() {
            // It ended before this call (or expired): its result goes now, as at its expiry,
            // and so does the job (its client is done with it). Kept as an `expired` record,
            // uncounted by `jobs.max_jobs`, a loop of submit, DELETE, DELETE left one more
            // record a round for `jobs.result_ttl`, without bound.
            self.expire(&entry);
            self.forget_expired(&entry);
            return Ok(entry.view(None));
        }
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
        let _ = tokio::time::timeout(Duration::from_secs(5), wait).await;
        // Cancelled; still running when the wait ran out (its runner ends it soon); or it
        // ended on its own meanwhile (its result is kept: a second DELETE drops it).
        Ok(entry.view(None))
    }

    /// Drops the result of `entry`, a job that ended (its text and answer, its bytes and its
    /// place in its tenant's and the store's bounds come back): status `expired`, forgotten
    /// `jobs.result_ttl` later (as the Redis store does). Nothing to do for a job already
    /// expired.
    fn expire(&self, entry: &Arc<Entry>) {
        let mut store = self.store();
        let Some(from) = entry.update(|s| {
            let from = s.status;
            if from == Status::Expired || !from.is_final() {
                return None;
            }
            s.status = Status::Expired;
            s.expired = Some(Instant::now());
            s.text = String::new();
            s.ends = Vec::new();
            s.answer = None;
            s.error = None;
            Some((from, std::mem::take(&mut s.bytes)))
        }) else {
            return;
        };
        let (from, freed) = from;
        store.bytes = store.bytes.saturating_sub(freed);
        store.expired += 1;
        drop(store);
        self.ctx
            .metrics()
            .moved(Some(from.as_str()), Some("expired"));
    }

    /// Forgets `entry`, an expired job, unless the sweeper did first.
    fn forget_expired(&self, entry: &Arc<Entry>) {
        let mut store = self.store();
        if entry.lock().status == Status::Expired && store.forget(&entry.id).is_some() {
            store.expired -= 1;
            drop(store);
            self.ctx.metrics().moved(Some("expired"), None);
        }
    }

    /// The head of the queue with its seat, taken out of the queue and marked running, when
    /// idle capacity fits it.
    fn next_startable(&self) -> Option<Claim> {
        let mut store = self.store();
        loop {
            let entry = store.head()?;
            let need = entry
                .lock()
                .work
                .as_ref()
                .map(|(ready, _)| (ready.class.work, ready.prefill));
            let Some((work, prefill)) = need else {
                // Cancelled in between: not startable, not in the way.
                store.unqueue(&entry.id);
                continue;
            };
            let admission = self.ctx.state.admission();
            if let Err(too_large) = admission.admissible(Lane::Large, work) {
                // A reload lowered the limits below it: it would never run, and every job
                // behind it would wait for good. It fails as it would have on arrival.
                store.unqueue(&entry.id);
                let work = entry.lock().work.take();
                drop(store);
                let error = GatewayError::from(too_large);
                if let Some((_, mut record)) = work {
                    record.finish(error.outcome(), Some(error.code()), None);
                }
                self.end(&entry, Ended::Failed(error.code(), error.message()));
                store = self.store();
                continue;
            }
            let max_running = self.ctx.max_running();
            if max_running > 0 && store.running >= max_running {
                return None;
            }
            let (guard, preempt) = if self.ctx.config.preempt {
                let handle = Preemptible::new(self.ctx.config.max_preemptions > 0);
                let guard =
                    admission.try_acquire_preemptible(Lane::Large, work, prefill, &handle)?;
                (guard, Some(handle))
            } else {
                (
                    admission.try_acquire_idle(Lane::Large, work, prefill)?,
                    None,
                )
            };
            store.start(&entry.id);
            let taken = entry.lock().work.take();
            let Some(mut work) = taken else {
                drop(guard);
                continue;
            };
            store.running += 1;
            let started = (SystemTime::now(), Instant::now());
            work.1.runs_from(started.1);
            entry.update(|s| {
                s.status = Status::Running;
                s.started = Some(started);
            });
            self.ctx.metrics().moved(Some("queued"), Some("running"));
            return Some(Claim {
                waited: started.1 - entry.submitted.1,
                guard,
                preempt,
                resumed: None,
                run: Box::new(LocalRun {
                    jobs: self.clone(),
                    entry,
                    work: Some(work),
                }),
            });
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
                Ended::Cancelled | Ended::HandedBack(_) => Status::Cancelled,
            };
            match how {
                Ended::Done(answer) => s.answer = Some(*answer),
                Ended::Failed(code, message) => s.error = Some((code, message)),
                Ended::Cancelled | Ended::HandedBack(_) => {}
            }
            s.finished = Some(now);
            // Its text, and where each piece ends (served to `Last-Event-ID`): a piece is a
            // token of a few bytes, so its end's 8 bytes are most of what it holds.
            let ends = s.ends.len().saturating_mul(std::mem::size_of::<usize>());
            let text_bytes = s.text.len().saturating_add(ends) as u64;
            s.bytes += text_bytes;
            (from, s.status, s.started.map(|t| now.1 - t.1), text_bytes)
        });
        store.bytes += text_bytes;
        if from == Status::Running {
            store.running -= 1;
        }
        let metrics = self.ctx.metrics();
        metrics.moved(Some(from.as_str()), Some(to.as_str()));
        drop(store);
        if from == Status::Running {
            // Under `jobs.max_running` the next queued job may start now: its seat may have
            // come back long before (at this run's last token), when the scheduler found the
            // running count full and went to sleep.
            self.ctx.wake.notify_one();
        }
        if let Some(ran) = ran {
            metrics.ran(ran);
        }
        tracing::info!(job = %entry.id, status = to.as_str(), "job ended");
        let notify = entry.lock().notify.clone();
        if let Some(url) = notify {
            // The body as the job ended, before a DELETE can drop its result.
            let body = webhook::body(entry.view(None), &url, entry.tenant.as_deref());
            self.ctx
                .tasks
                .spawn(deliver(self.ctx.clone(), entry.clone(), url, body));
        }
    }
}

impl JobBackend for LocalJobs {
    fn poll_every(&self) -> Option<Duration> {
        None
    }

    fn has_room(&self, bytes: u64) -> bool {
        self.fits(&self.store(), bytes)
    }

    fn adopt(&self, job: NewJob) -> BoxFuture<'_, Result<(), Box<NotTaken>>> {
        future::ready(self.push(job)).boxed()
    }

    fn status<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<Value, GatewayError>> {
        let view = self.entry(id, tenant).map(|entry| {
            let position = self.store().position(id);
            entry.view(position)
        });
        future::ready(view).boxed()
    }

    fn cancel<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<Value, GatewayError>> {
        self.cancel_job(id, tenant).boxed()
    }

    fn exists<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<(), GatewayError>> {
        future::ready(self.entry(id, tenant).map(drop)).boxed()
    }

    fn events<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
        // In process a job runs once: ids are plain numbers.
        (_run, from): (u64, usize),
    ) -> BoxFuture<'a, Result<EventStream, GatewayError>> {
        let stream = self
            .entry(id, tenant)
            .map(|entry| events::stream(entry, from).boxed());
        future::ready(stream).boxed()
    }

    fn take(&self) -> BoxFuture<'_, Take> {
        future::ready(
            self.next_startable()
                .map_or(Take::Idle, |claim| Take::Started(Box::new(claim))),
        )
        .boxed()
    }
}

/// A job running from the in-process store: its pieces go to its record, its end to the store.
struct LocalRun {
    jobs: LocalJobs,
    entry: Arc<Entry>,
    work: Option<(Ready, RequestRecord)>,
}

impl JobRun for LocalRun {
    fn work(&mut self) -> BoxFuture<'_, Result<(Ready, RequestRecord), Ended>> {
        let work = self.work.take().ok_or_else(|| {
            Ended::Failed("internal", "the job's request was already sent".to_owned())
        });
        future::ready(work).boxed()
    }

    fn piece(&mut self, text: &str) {
        self.entry.update(|s| {
            s.text.push_str(text);
            s.ends.push(s.text.len());
        });
    }

    fn preempted(&mut self, n: u32) {
        self.entry.update(|s| s.preempted = n);
    }

    fn cancelled(&self) -> BoxFuture<'static, ()> {
        self.entry.cancel.clone().cancelled_owned().boxed()
    }

    fn lost(&self) -> BoxFuture<'static, ()> {
        // Nobody else owns an in-process job.
        future::pending().boxed()
    }

    fn finish(self: Box<Self>, outcome: Option<Ended>) -> BoxFuture<'static, ()> {
        // (Never lost in process: `None` cannot come; it would end the job cancelled.)
        self.jobs
            .end(&self.entry, outcome.unwrap_or(Ended::HandedBack(None)));
        future::ready(()).boxed()
    }
}

/// Delivers `entry`'s result (`body`) to its `notify` URL (`url`), retrying as configured;
/// each attempt is recorded in the job.
async fn deliver(ctx: Arc<Context>, entry: Arc<Entry>, url: reqwest::Url, body: String) {
    webhook::send(&ctx, &entry.id, url, body, |webhook| {
        // Retried while the job keeps its result (a DELETE may drop it before it expires).
        let kept = entry.update(|s| {
            s.webhook = webhook;
            s.status != Status::Expired
        });
        async move { kept }
    })
    .await;
}

/// When the gateway stops, ends every queued job as cancelled, as the running ones are (a job
/// kept in process has nowhere to go): their followers get the final status at once, instead
/// of waiting for a job that will never run until the connection is cut.
async fn cancel_queued_at_stop(jobs: LocalJobs) {
    jobs.ctx.stop.cancelled().await;
    let queued = jobs.store().take_queued();
    for entry in queued {
        // Its classified request goes (the session reservation with it) outside the lock.
        let work = entry.lock().work.take();
        drop(work);
        jobs.end(&entry, Ended::Cancelled);
    }
}

/// Wakes the scheduler whenever admission says capacity may have come back (a guard dropped, a
/// first token, a waiter left); a change is never missed.
async fn wake_on_freed(ctx: Arc<Context>) {
    let Some(mut freed) = ctx.state.admission().freed() else {
        return;
    };
    loop {
        tokio::select! {
            _ = ctx.stop.cancelled() => return,
            changed = freed.changed() => if changed.is_err() { return },
        }
        ctx.wake.notify_one();
    }
}

/// Expires results `jobs.result_ttl` after their job ended (text and answer dropped, bytes
/// given back, status `expired`) and forgets expired ids as long again after they expired (a
/// `DELETE` may have dropped one early).
async fn sweep(jobs: LocalJobs) {
    let ttl = jobs.ctx.config.result_ttl;
    let every = (ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = jobs.ctx.stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = Instant::now();
        let ended = jobs.store().ended();
        for entry in ended {
            let (finished, expired, status) = {
                let s = entry.lock();
                (s.finished, s.expired, s.status)
            };
            let Some((_, finished)) = finished else {
                continue;
            };
            if status == Status::Expired && expired.is_some_and(|at| now >= at + ttl) {
                // (A `DELETE` may have forgotten it since the list was taken.)
                jobs.forget_expired(&entry);
            } else if status != Status::Expired && now >= finished + ttl {
                jobs.expire(&entry);
            }
        }
    }
}
