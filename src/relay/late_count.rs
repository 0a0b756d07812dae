//! The engine's count of a prompt it never reported (`classify.count_unreported_prompts`).
//!
//! vLLM reports a prompt's tokens (`usage.prompt_tokens`) with the first token at the
//! earliest. A request that ends before it (its client gone, a timeout, an engine error) used
//! to teach the estimate's correction nothing and to settle its tenant's budget to the
//! estimate: a client sending text the estimate counts short (made-up words under the
//! heuristic) and leaving just before each first token stayed admitted short for good, its
//! prefills on everyone's time and not on its budget. Such a request's prompt is counted by
//! vLLM's `/tokenize` once it ended, in the background: the count teaches the correction as
//! usage would (and is a sample of `tutor_gateway_estimate_error_ratio`), and the tenant's
//! budget settles to it plus the output streamed.
//!
//! Bounds: the `/tokenize` body (the prompt's JSON; a request with media parts is not kept) is
//! kept from the send until the engine reports the prompt (or the end), at most [`KEPT_BYTES`]
//! for all requests at once (past them a request is not kept and settles to its estimate); at
//! most [`MAX_OUT`] counts are out at once; each waits at most `classify.exact_count_timeout_ms`
//! (and [`MOST_WAIT`]), its tenant's reservation held meanwhile; on any failure the budget
//! settles to the estimate.
//! A request whose `/tokenize` ids are not its prompt's (`truncate_prompt_tokens`,
//! `reasoning_effort`, `tool_choice: "none"` with tools) is not kept.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admission::tenant_budget::BudgetHold;
use crate::classify::{Calibration, KindCounts};
use crate::telemetry::estimate_metrics::{EstimateMetrics, ExactOutcome};
use crate::upstream::UpstreamClient;

/// Bytes of `/tokenize` bodies kept at once for late counts, all requests together.
pub const KEPT_BYTES: usize = 64 << 20;

/// Late counts out at once per gateway (their own: clients leaving early never make the
/// exact counts of `classify.exact_count` busy).
pub const MAX_OUT: usize = 16;

/// The longest a late count waits for `/tokenize` (at most `classify.exact_count_timeout_ms`):
/// within what a shutdown waits for the upstream's tracked tasks, so the settlement is made.
pub const MOST_WAIT: Duration = Duration::from_secs(2);

/// Whom a count teaches: the correction, for a model and a tenant.
pub type Lesson = (Arc<Calibration>, String, Option<String>);

/// A sent request's prompt, kept to be counted if the engine never reports it.
#[derive(Debug)]
pub struct LateCount {
    body: Bytes,
    _kept: OwnedSemaphorePermit,
    upstream: UpstreamClient,
    counts_out: Arc<Semaphore>,
    timeout: Duration,
    counts: KindCounts,
    lesson: Option<Lesson>,
    metrics: EstimateMetrics,
}

/// What a late count needs besides the body: where to ask, the counts out at once, how long.
pub struct Asking {
    /// The engine's API server.
    pub upstream: UpstreamClient,
    /// Late counts out at once ([`MAX_OUT`]).
    pub counts_out: Arc<Semaphore>,
    /// The longest wait for the count (`classify.exact_count_timeout_ms`, at most
    /// [`MOST_WAIT`]).
    pub timeout: Duration,
    /// Where counts and the estimate's error are told.
    pub metrics: EstimateMetrics,
}

impl LateCount {
    /// Keeps `body` (a `/tokenize` body) for a request counted as `counts` that teaches
    /// `lesson`, when `kept` (the bytes of [`KEPT_BYTES`]) has room for it; `None` otherwise.
    pub fn keep(
        body: Bytes,
        kept: &Arc<Semaphore>,
        counts: KindCounts,
        lesson: Option<Lesson>,
        asking: Asking,
    ) -> Option<Self> {
        let n = u32::try_from(body.len()).ok()?;
        let permit = Arc::clone(kept).try_acquire_many_owned(n).ok()?;
        Some(Self {
            body,
            _kept: permit,
            upstream: asking.upstream,
            counts_out: asking.counts_out,
            timeout: asking.timeout.min(MOST_WAIT),
            counts,
            lesson,
            metrics: asking.metrics,
        })
    }

    /// The request ended without the engine's count, having streamed `produced` output
    /// tokens on an `estimate`: counts its prompt in the background, then teaches the
    /// correction and settles `budget` to the count plus `produced` (to `estimate +
    /// produced` when no count comes).
    pub fn count(self, budget: Option<BudgetHold>, estimate: u32, produced: u32) {
        let settle = Settle {
            budget,
            fallback: u64::from(estimate).saturating_add(u64::from(produced)),
            produced,
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let Ok(permit) = Arc::clone(&self.counts_out).try_acquire_owned() else {
            self.metrics.unreported_count(ExactOutcome::Busy);
            return;
        };
        let upstream = self.upstream.clone();
        upstream.spawn_tracked(async move {
            let (outcome, count) = self.upstream.prompt_count(self.body, self.timeout).await;
            drop(permit);
            self.metrics.unreported_count(outcome);
            if let Some(n) = count {
                self.metrics
                    .observe(Some(self.counts.dominant()), estimate, n);
                if let Some((calibration, model, tenant)) = &self.lesson {
                    calibration.observe_for(model, tenant.as_deref(), &self.counts, n);
                }
                tracing::debug!(
                    input_tokens_estimated = estimate,
                    input_tokens = n,
                    "a prompt the engine never reported, counted"
                );
            }
            settle.to(count);
        });
    }
}

/// A tenant's budget to settle: to the count when one comes, else (dropped, or no count) to
/// the estimate.
struct Settle {
    budget: Option<BudgetHold>,
    fallback: u64,
    produced: u32,
}

impl Settle {
    fn to(mut self, prompt: Option<u32>) {
        if let Some(budget) = self.budget.take() {
            budget.settle(prompt.map_or(self.fallback, |n| {
                u64::from(n).saturating_add(u64::from(self.produced))
            }));
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.settle(self.fallback);
        }
    }
}
