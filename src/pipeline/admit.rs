//! The admit step: a [`Ready`] request waits for its seat and token reservation in its lane
//! ([`crate::admission`]) and becomes [`Admitted`], holding them in a [`LaneGuard`]. With a
//! [`Divert`], a large `/answer` that waited too long leaves the queue and becomes a job.

use serde_json::Value;

use super::classify::Ready;
use super::ctx::RequestCtx;
use super::respond::refused;
use crate::admission::{AdmissionError, Ask, LaneGuard};
use crate::error::GatewayError;
use crate::lane::Lane;
use crate::telemetry::Line;
use crate::telemetry::RequestRecord;

/// Where a large `/answer` that waited `jobs.divert_large_after_ms` for its seat goes instead:
/// the job service, which takes the classified request and answers with its id and URLs. On
/// failure (the job store is full) it has written the request's record.
pub trait Divert: Send + Sync {
    /// Whether a job of `bytes` would be taken now (when not, the request keeps its place).
    fn has_room(&self, bytes: usize) -> bool;

    /// Takes `ready` and its `record` as a job: its id and URLs, or the request back (the job
    /// store was full, or could not be reached), which then keeps its place in the queue.
    fn divert(
        &self,
        ready: Ready,
        record: RequestRecord,
    ) -> futures::future::BoxFuture<'_, Result<Value, Box<NotTaken>>>;
}

/// A request a [`Divert`] did not take, given back with the reason.
#[derive(Debug)]
pub struct NotTaken {
    /// The request.
    pub ready: Ready,
    /// Its record.
    pub record: RequestRecord,
    /// Why it was not taken.
    pub error: GatewayError,
}

/// A request that holds its seat, its token reservation and its prefill reservation (the
/// guard gives them back when it drops), with its record: what [`super::send()`] sends.
#[derive(Debug)]
pub struct Admitted {
    pub(super) ready: Ready,
    pub(super) guard: LaneGuard,
    pub(super) record: RequestRecord,
}

impl Admitted {
    /// `ready`, admitted under `guard` by another way than [`admit`] (the job scheduler takes
    /// idle seats itself).
    pub fn new(ready: Ready, guard: LaneGuard, record: RequestRecord) -> Self {
        Self {
            ready,
            guard,
            record,
        }
    }
}

/// What [`admit`] made of a request: admitted, or the job it became.
#[derive(Debug)]
// Made and taken apart once per request.
#[allow(clippy::large_enum_variant)]
pub enum Admit {
    /// Holds its seat: to send.
    Admitted(Admitted),
    /// Waited `jobs.divert_large_after_ms` and became a job: its id and URLs.
    Diverted(Value),
}

/// Waits for `ready`'s seat. With `divert`, a large request whose predicted wait is past
/// `jobs.divert_large_after_ms` becomes a job at once, and one still waiting for its seat after
/// that long leaves the queue and becomes a job instead. A failure is
/// written to the request's `record` here. A client that goes away meanwhile drops the record,
/// which counts it as cancelled where it was.
pub async fn admit(
    ctx: &RequestCtx,
    mut ready: Ready,
    mut record: RequestRecord,
    divert: Option<&dyn Divert>,
) -> Result<Admit, GatewayError> {
    // Its body's bytes, held since they were read (else held below, while it waits): taken
    // out of the request, so they go at admission or refusal, never with a job or the relay.
    let early = ready.queued.take();
    // An honest early "no": a request whose predicted wait already misses its deadline is
    // refused now rather than after waiting for nothing.
    // It waits in its lane's line of long prompts (for prefill room and a seat) or in the
    // other (for a seat): each line has its own requests ahead and its own service rate.
    let lane = ready.class.lane;
    let line = Line::new(lane, ctx.admission().waits_for_prefill(ready.prefill));
    // The waiters fair queuing admits before it (every one, without tenants).
    let ahead =
        ctx.admission()
            .fair_ahead(lane, line.long, ready.tenant.as_ref().map(|t| t.0.as_str()));
    let predicted = ctx.metrics().admission_rate().predict(line, ahead);
    if let (Some(deadline), Some(wait)) = (ready.deadline, predicted) {
        let left = deadline.saturating_sub(record.arrival().elapsed());
        let margin = u32::from(ctx.config().admission.early_refusal_margin_percent);
        if wait.mul_f64(100.0 / f64::from(100 + margin)) > left {
            let over_share = ready
                .tenant
                .as_ref()
                .is_some_and(|t| ctx.admission().over_share(lane, &t.0));
            // The lane's miss only when the wait itself misses the lane's objective: a
            // client's own shorter deadline, or its tenant over its share, is its own doing.
            let objective = ctx.config().lanes.get(lane).ttft_slo.map(|o| o.target);
            if over_share || objective.is_none_or(|target| wait <= target) {
                record.not_the_lanes_miss();
            }
            ctx.metrics().admission_rate().refused(line, ahead, wait);
            let e = AdmissionError::WouldMissDeadline {
                lane,
                predicted: wait,
                deadline: left,
                over_share,
            };
            return Err(refused(record, e.into()));
        }
    }
    // A review whose predicted wait is already past `jobs.divert_large_after_ms` becomes a
    // job now rather than after waiting that long.
    let divert_after = match divert {
        Some(d) if lane == Lane::Large => ctx.config().jobs.divert_large_after.map(|a| (a, d)),
        _ => None,
    };
    let (ready, record) = match (divert_after, predicted) {
        (Some((after, d)), Some(wait)) if wait > after && d.has_room(ready.size) => {
            tracing::info!(request_id = %record.request_id(), predicted_wait_ms = wait.as_millis(), "diverting to a job up front");
            match d.divert(ready, record).await {
                Ok(mut job) => {
                    // Why now: the wait it was spared.
                    if let Some(obj) = job.as_object_mut() {
                        obj.insert(
                            "predicted_wait_ms".into(),
                            serde_json::json!(wait.as_millis()),
                        );
                    }
                    return Ok(Admit::Diverted(job));
                }
                Err(back) => {
                    tracing::info!(request_id = %back.record.request_id(), code = back.error.code(), "not diverted; it queues");
                    (back.ready, back.record)
                }
            }
        }
        _ => (ready, record),
    };
    // A pre-emptible large `/answer` (`jobs.preempt_answers`) first borrows an idle seat.
    if let Some(guard) = super::resume::borrow(ctx, &ready).await {
        drop(early);
        return Ok(Admit::Admitted(Admitted::new(ready, guard, record)));
    }
    // While it waits for a seat its body is held: all queued bodies together are bounded.
    let held = match early.map_or_else(
        || {
            ctx.queued_bytes()
                .hold(ready.tenant.as_ref().map(|t| t.0.as_str()), ready.size)
        },
        Ok,
    ) {
        Ok(h) => h,
        Err(e) => return Err(refused(record, e)),
    };
    let tenant = ready.tenant.clone();
    // Its place among its tenant's waiters of its lane: its own deadline, else its lane's
    // objective, from its arrival.
    let due = ready
        .deadline
        .or_else(|| ctx.config().lanes.get(lane).ttft_slo.map(|o| o.target))
        .and_then(|d| record.arrival().checked_add(d));
    let acquire = ctx.admission().acquire(
        Ask::new(ready.class.lane, ready.class.work)
            .with_prefill(ready.prefill)
            .for_tenant(tenant.as_ref().map(|t| t.0.as_str()))
            .due_at(due),
    );
    tokio::pin!(acquire);
    let (ready, mut record, guard) = match divert_after {
        // Leaving the queue on the deadline is cancel-safe: the waiter is taken out.
        Some((after, d)) => match tokio::time::timeout(after, &mut acquire).await {
            Ok(guard) => (ready, record, guard),
            Err(_) if d.has_room(ready.size) => {
                tracing::info!(request_id = %record.request_id(), "diverting to a job after waiting");
                // The place in the queue is kept (the acquire is not dropped) until the job
                // store has taken the request.
                match d.divert(ready, record).await {
                    Ok(job) => return Ok(Admit::Diverted(job)),
                    Err(back) => {
                        let NotTaken {
                            ready,
                            record,
                            error,
                        } = *back;
                        tracing::info!(request_id = %record.request_id(), code = error.code(), "not diverted; it keeps its place");
                        (ready, record, acquire.await)
                    }
                }
            }
            // No room for a job: keep the place in the queue.
            Err(_) => (ready, record, acquire.await),
        },
        None => (ready, record, acquire.await),
    };
    drop(held);
    if guard.is_err()
        && tenant
            .as_ref()
            .is_some_and(|t| ctx.admission().over_share(lane, &t.0))
    {
        // Timed out (or turned away) behind its own tenant's backlog: fair queuing put it
        // last, as it should, and that is no miss of the lane's.
        record.not_the_lanes_miss();
    }
    match guard {
        Ok(guard) => {
            if let Some(after_ask) = guard.admitted_after_ask() {
                ctx.metrics()
                    .jobs()
                    .made_room(ready.class.lane, guard.queue_wait(), after_ask);
            }
            if let Some(p) = predicted.filter(|_| ahead > 0) {
                ctx.metrics()
                    .admission_rate()
                    .observed(line, p, guard.queue_wait());
            }
            Ok(Admit::Admitted(Admitted::new(ready, guard, record)))
        }
        Err(e) => Err(refused(record, e.into())),
    }
}
