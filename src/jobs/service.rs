//! [`Jobs`]: the job service the routes call (`POST /jobs`, `GET /jobs/{id}`, `DELETE`,
//! `GET /jobs/{id}/events`) and the pipeline diverts to, written once over [`JobBackend`]: it
//! checks and classifies a submission, parses `Last-Event-ID`, bounds the event streams per
//! tenant, and hands the rest to the backend chosen when it starts.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderMap;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backend::{JobBackend, NewJob};
use super::context::Context;
use super::entry::Status;
use super::local::LocalJobs;
use super::redis::RedisJobs;
use super::{events, runner, webhook};
use crate::error::GatewayError;
use crate::pipeline::parse::{self, AnswerRequest};
use crate::pipeline::respond::link_trace;
use crate::pipeline::tenant::{TenantSlot, TenantSlots};
use crate::pipeline::{
    self, prompt, AppState, Divert, NotTaken, Prepared, Ready, RequestCtx, Tenant,
};
use crate::telemetry::{RequestRecord, Route};

/// The job service: the backend and the scheduler. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Jobs(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    ctx: Arc<Context>,
    /// Where jobs are kept: in process, or in the quota's Redis.
    backend: Arc<dyn JobBackend>,
    /// Event streams open per tenant (`jobs.max_event_streams_per_tenant`).
    /// `GET /jobs/{id}/events` streams each tenant holds open on this replica, bounded by
    /// `jobs.max_event_streams_per_tenant`: a stream lasts as long as its job (hours for a
    /// queued review), so without a bound one client's streams could fill
    /// `server.max_requests_in_flight` and lock every other client out.
    streams: Arc<TenantSlots>,
    /// Whether jobs are kept in the quota's Redis (they outlive this replica).
    shared: bool,
}

impl Jobs {
    /// The service over `state`, with its scheduler and its backend's tasks running until
    /// `stop`; running jobs and webhook deliveries go on `tasks`. The backend is the quota's:
    /// Redis when the quota is in Redis, this process otherwise. With `keys` (`[auth]`), a job
    /// ends when the key that submitted it is revoked (it does not start; a running one stops,
    /// its engine work aborted), from the first job the scheduler takes.
    pub fn start(
        state: AppState,
        stop: CancellationToken,
        tasks: TaskTracker,
        keys: Option<Arc<dyn crate::pipeline::tenant::KeysInForce>>,
    ) -> Self {
        let config = state.config().jobs.clone();
        let ctx = Arc::new(Context {
            http: webhook::client(&config),
            webhook_permits: webhook::permits(),
            state,
            config,
            stop,
            tasks,
            wake: Notify::new(),
            resuming: std::sync::atomic::AtomicUsize::new(0),
            keys,
            engine_pause: std::sync::Mutex::default(),
        });
        let (backend, shared): (Arc<dyn JobBackend>, bool) = match RedisJobs::start(&ctx) {
            Some(redis) => (Arc::new(redis), true),
            None => (Arc::new(LocalJobs::start(&ctx)), false),
        };
        if ctx.config.enabled {
            let watch = ctx.state.metrics().background();
            tokio::spawn(watch.watch(
                "jobs scheduler",
                runner::schedule(ctx.clone(), backend.clone()),
            ));
        }
        Jobs(Arc::new(Inner {
            ctx,
            backend,
            streams: Arc::default(),
            shared,
        }))
    }

    /// Whether jobs are kept in the quota's Redis, where they outlive this replica (else in
    /// this process: they end with it).
    pub fn shared(&self) -> bool {
        self.0.shared
    }

    /// The gateway's state (for the routes served beside the jobs).
    pub fn state(&self) -> &AppState {
        &self.0.ctx.state
    }

    /// `server.max_body_bytes`, for the error that names it.
    pub fn max_body_bytes(&self) -> usize {
        self.0.ctx.state.config().server.max_body_bytes
    }

    /// `POST /jobs`: checks, classifies and queues the job; its id and URLs.
    pub async fn submit(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        tenant: Option<Tenant>,
    ) -> (Option<String>, Result<Value, GatewayError>) {
        let inner = &self.0;
        if !inner.ctx.config.enabled {
            return (
                None,
                Err(GatewayError::JobsUnavailable(
                    "jobs are switched off here (jobs.enabled = false)",
                )),
            );
        }
        let ctx = RequestCtx::snapshot(&inner.ctx.state);
        let record = ctx.record(Route::Job);
        let id = record.request_id().to_owned();
        (
            Some(id),
            self.submit_as(&ctx, record, headers, body, tenant).await,
        )
    }

    /// [`Jobs::submit`], recorded in `record` (whose id the job takes).
    async fn submit_as(
        &self,
        ctx: &RequestCtx,
        mut record: RequestRecord,
        headers: &HeaderMap,
        body: Bytes,
        tenant: Option<Tenant>,
    ) -> Result<Value, GatewayError> {
        let inner = &self.0;
        link_trace(&mut record, headers);
        let checked = async {
            // Counted (its text and its parsed form) before anything parses it; held in
            // `server.max_queued_bytes` while it waits to be parsed and classified, as a
            // request's (the job store then counts the same bytes, `jobs.max_bytes`: a queued
            // job keeps the parsed request, far larger than its text when it has many values).
            let held = parse::held_bytes(&body, ctx.config())?;
            let parsing = ctx
                .queued_bytes()
                .hold(tenant.as_ref().map(|t| t.0.as_str()), held)?;
            let mut value = ctx
                .off_workers(body.clone(), |_, b| parse::json_body(b))
                .await?;
            let notify = match value.as_object_mut().and_then(|o| o.remove("notify")) {
                Some(raw) => Some(webhook::check_notify(
                    &raw,
                    &inner.ctx.config.webhook_allow,
                )?),
                None => None,
            };
            let req = AnswerRequest::from_value(value)?;
            let prepared = prompt::answer_request(ctx, req, tenant.as_ref()).await?;
            let prepared = Prepared {
                // What the queued job keeps: its text and its parsed, classified form, and
                // what its course added to it (its system message and tools).
                size: held.saturating_add(prepared.size),
                background: true,
                ..prepared
            };
            let prepared = Prepared { tenant, ..prepared };
            Ok::<_, GatewayError>((prepared, notify, parsing))
        }
        .await;
        let (prepared, notify, parsing) = match checked {
            Ok(c) => c,
            Err(e) => return Err(pipeline::refused(record, e)),
        };
        let ready = match pipeline::classify(ctx, prepared, &mut record).await {
            Ok(r) => r,
            Err(e) => return Err(pipeline::refused(record, e)),
        };
        // Counted and classified: the job store takes it from here.
        drop(parsing);
        self.adopt(ready, record, notify)
            .await
            .map_err(|back| pipeline::refused(back.record, back.error))
    }

    /// Queues an already classified request (a submission, or a diverted `/answer`): its id and
    /// URLs, or the request back (429 `jobs_full` when the store is at its bounds, 503 when it
    /// cannot be reached).
    async fn adopt(
        &self,
        ready: Ready,
        record: RequestRecord,
        notify: Option<reqwest::Url>,
    ) -> Result<Value, Box<NotTaken>> {
        let id = record.request_id().to_owned();
        let share = self.share_of(&ready);
        let job = NewJob {
            ready,
            record,
            notify,
            share,
        };
        self.0.backend.adopt(job).await?;
        Ok(accepted(&id))
    }

    /// `ready`'s tenant's share (`auth.tenant_shares`; 1 by default).
    fn share_of(&self, ready: &Ready) -> f64 {
        ready
            .tenant()
            .and_then(|t| {
                self.0
                    .ctx
                    .state
                    .config()
                    .auth
                    .tenant_shares
                    .get(&t.0)
                    .copied()
            })
            .map_or(1.0, f64::from)
    }

    /// `GET /jobs/{id}`.
    pub async fn status(&self, id: &str, tenant: Option<&Tenant>) -> Result<Value, GatewayError> {
        self.0.backend.status(job_id(id)?, tenant).await
    }

    /// `DELETE /jobs/{id}`: a queued job ends at once; a running one when its stream has been
    /// dropped and the engine abort sent (waited for, briefly). A job that had already ended
    /// has its result dropped (status `expired`, its room in the bounds back).
    pub async fn cancel(&self, id: &str, tenant: Option<&Tenant>) -> Result<Value, GatewayError> {
        self.0.backend.cancel(job_id(id)?, tenant).await
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
        let id = job_id(id)?;
        let from = match last_event_id.map(str::trim) {
            None | Some("") => (1, 0),
            // Reconnecting after the last event: nothing more will come.
            Some(events::END_ID) => {
                self.0.backend.exists(id, tenant).await?;
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
        let stream = self.0.backend.events(id, tenant, from).await?;
        let max = self.0.ctx.config.max_event_streams_per_tenant;
        let Some(slot) = self.0.streams.take(tenant, max) else {
            self.0.ctx.state.metrics().refused("event_streams");
            return Err(GatewayError::TooManyStreams);
        };
        Ok(Some(held(stream, slot)))
    }

    /// Event streams `tenant` holds open on this replica (`None`: without a tenant).
    pub fn event_streams(&self, tenant: Option<&str>) -> usize {
        self.0.streams.held(tenant)
    }
}

impl Divert for Jobs {
    fn has_room(&self, bytes: usize) -> bool {
        self.0.backend.has_room(bytes as u64)
    }

    fn divert(
        &self,
        ready: Ready,
        record: RequestRecord,
    ) -> BoxFuture<'_, Result<Value, Box<NotTaken>>> {
        Box::pin(self.adopt(ready, record, None))
    }
}

/// `stream`, holding `slot` until it is dropped.
fn held<S>(stream: S, slot: TenantSlot) -> BoxStream<'static, S::Item>
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
/// `id` if it has a job id's shape (a request id: 32 lowercase hex digits), else "not found":
/// nothing else is ever a job, and a path such as `<id>:text` must not reach the store's keys
/// (in Redis it named the job's text list: a wrong-type error read as "store unreachable").
fn job_id(id: &str) -> Result<&str, GatewayError> {
    let shaped = id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if shaped {
        Ok(id)
    } else {
        Err(GatewayError::JobNotFound)
    }
}

fn accepted(id: &str) -> Value {
    json!({
        "id": id,
        "status": Status::Queued.as_str(),
        "status_url": format!("/jobs/{id}"),
        "events_url": format!("/jobs/{id}/events"),
    })
}
