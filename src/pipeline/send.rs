//! The send step: an [`Admitted`] request goes to vLLM ([`crate::upstream`]) and its stream
//! to a [`Relay`], which owns the guard from here to the end.

use std::sync::atomic::{AtomicBool, Ordering};

use super::admit::Admitted;
use super::classify::Ready;
use super::ctx::RequestCtx;
use super::pieces;
use super::respond::refused;
use super::resume::Resume;
use super::tokenize::tokenize_body;
use crate::admission::tenant_budget::BudgetHold;
use crate::admission::LaneGuard;
use crate::classify::Classification;
use crate::error::GatewayError;
use crate::relay::late_count::{Asking, LateCount};
use crate::relay::{Format, Relay, RelayContext};
use crate::telemetry::{Mark, RequestRecord, Route};
use crate::upstream::UpstreamRequest;

/// Sends `admitted` with the request's upstream client (its seat and token reservation given
/// back when the guard drops, the prefill reservation at the first token), a long prompt first
/// prefilled in pieces when `admission.prefill_piece_tokens` (a job's: `jobs.prefill_piece_tokens`)
/// says so ([`pieces`]), and hands
/// the stream to a [`Relay`] under the request's lane rules.
pub async fn send(
    ctx: &RequestCtx,
    admitted: Admitted,
    format: Format,
) -> Result<Relay, GatewayError> {
    // A pre-emptible `/answer` on a borrowed seat goes on when the seat is asked back.
    let resume = (format == Format::Answer
        && admitted.ready.preemptible
        && admitted.guard.preemptible().is_some())
    .then(|| {
        let record = &admitted.record;
        Resume::new(
            ctx,
            &admitted.ready,
            record.request_id(),
            record.upstream_traceparent(),
        )
    });
    let Admitted {
        ready:
            Ready {
                endpoint,
                body,
                class,
                hold,
                budget,
                affinity,
                focus,
                ..
            },
        guard,
        mut record,
    } = admitted;
    // A guard that tells its prefill wait came from the line of long prompts.
    record.admitted(
        guard.queue_wait(),
        guard.prefill(),
        guard.prefill_wait().is_some(),
    );
    if let Some(waited) = guard.prefill_wait() {
        record.prefill_waited(waited);
    }
    // A job's continuation after a pre-emption (a client's `/v1` continuation is its own).
    let continues_answer = matches!(record.route(), Route::Answer | Route::Job)
        && crate::upstream::request::continues_answer(&body);
    // What the engine may generate at most: vLLM's chat reads `max_completion_tokens` first;
    // its completions read `max_tokens` only.
    let cap_fields: &[&str] = match endpoint {
        crate::upstream::Endpoint::ChatCompletions => &["max_completion_tokens", "max_tokens"],
        crate::upstream::Endpoint::Completions => &["max_tokens"],
    };
    let engine_cap = cap_fields
        .iter()
        .find_map(|f| body.get(*f).and_then(serde_json::Value::as_u64))
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    #[cfg(test)]
    crate::faults::before_send(engine_cap);
    let mut request = UpstreamRequest {
        endpoint,
        request_id: record.request_id().to_owned(),
        traceparent: record.upstream_traceparent(),
        body,
        affinity,
        pin: None,
        continues_answer,
    };
    // Kept to be counted if the engine never reports it; until the engine has it, a drop
    // (its client gone) charges the budget nothing unless pieces of it were prefilled.
    let unreported = Unreported {
        late: late_count(ctx, &request, &class, &record, budget.is_some()),
        guard: Some(guard),
        budget,
        estimate: class.input_tokens_estimate,
        pieces_sent: AtomicBool::new(false),
    };
    // A job's prompt in its own pieces when `jobs.prefill_piece_tokens` says so.
    let piece = match ctx.config().jobs.prefill_piece_tokens {
        n if n > 0 && record.route() == Route::Job => n,
        _ => ctx.piece_tokens(),
    };
    let estimate = class.input_tokens_estimate;
    if let Some(p) = pieces::prefill(ctx, &request, piece, estimate, &unreported.pieces_sent).await
    {
        request.pin.clone_from(&p.replica);
        record.pieced(p.prefix, p.reports_cached);
    }
    let upstream = match ctx.upstream().stream(request).await {
        Ok(upstream) => upstream,
        Err(e) => return Err(refused(record, e.into())),
    };
    let (guard, late_count, budget) = unreported.sent();
    record.mark(Mark::Sent);
    tracing::debug!(request_id = %record.request_id(), lane = %class.lane, work = class.work, exact = class.exact(), "admitted");
    let relay = RelayContext {
        rules: ctx.rules(),
        metrics: ctx.metrics().clone(),
        session: hold,
        budget,
        focus,
        engine_cap,
        late_count,
    };
    let relay = Relay::new(upstream, guard, class, format, record, relay);
    Ok(match resume {
        Some(resume) => relay.resumable(Box::new(resume), ctx.config().jobs.preempt_notice),
        None => relay,
    })
}

/// A request's late count (`crate::relay::late_count`) when it can have one: on, counted (not
/// decided by bytes), with something to teach or a tenant's budget to settle, no media, and a
/// `/tokenize` body whose ids are its prompt's.
fn late_count(
    ctx: &RequestCtx,
    request: &UpstreamRequest,
    class: &Classification,
    record: &RequestRecord,
    budget: bool,
) -> Option<LateCount> {
    let config = ctx.config();
    let counts = class.counts?;
    let lesson = record.lesson();
    if !config.classify.count_unreported_prompts
        || (lesson.is_none() && !budget)
        || pieces::has_media(&request.body)
        || !pieces::ids_match(&request.body)
    {
        return None;
    }
    let body = tokenize_body(request.endpoint, &request.body)?;
    let asking = Asking {
        upstream: ctx.upstream().clone(),
        counts_out: ctx.late_counts().clone(),
        timeout: config.classify.exact_count_timeout,
        metrics: ctx.metrics().estimate().clone(),
    };
    LateCount::keep(body, ctx.kept_for_counts(), counts, lesson, asking)
}

/// A sent request's seat, late count and budget until the engine has the request: dropped there
/// (its client gone), the budget is charged nothing and the tenant's fleet service nothing, or,
/// once pieces of its prompt were prefilled, the engine's count of it (the service: the
/// estimate).
struct Unreported {
    late: Option<LateCount>,
    guard: Option<LaneGuard>,
    budget: Option<BudgetHold>,
    estimate: u32,
    /// Set by [`pieces::prefill`] before its first piece goes.
    pieces_sent: AtomicBool,
}

impl Unreported {
    /// The engine has the request: the relay settles from here.
    fn sent(mut self) -> (LaneGuard, Option<LateCount>, Option<BudgetHold>) {
        let guard = self.guard.take().expect("the seat is held until sent");
        (guard, self.late.take(), self.budget.take())
    }
}

impl Drop for Unreported {
    fn drop(&mut self) {
        if !self.pieces_sent.load(Ordering::Acquire) {
            return;
        }
        if let Some(guard) = self.guard.as_mut() {
            guard.served(u64::from(self.estimate));
        }
        let budget = self.budget.take();
        // Pre-empted meanwhile (a job asked to leave): its continuation is charged and
        // counted, as the relay leaves a pre-empted run's.
        let preempted = self.guard.as_ref().is_some_and(LaneGuard::is_preempted);
        match self.late.take().filter(|_| !preempted) {
            Some(late) => late.count(budget, self.estimate, 0),
            None => {
                if let Some(budget) = budget {
                    budget.settle(u64::from(self.estimate));
                }
            }
        }
    }
}
