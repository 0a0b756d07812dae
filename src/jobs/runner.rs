//! The scheduler, written once over [`JobBackend`]: queued jobs start oldest first, in the
//! large lane only, and only out of idle capacity (the backend's `take` asks admission for it:
//! [`crate::admission::Admission::try_acquire_idle`] in process, the take script in Redis);
//! and one job's run: sent through the pipeline, its pieces kept as they stream, ended done,
//! failed, cancelled, handed back, or lost.

use std::sync::Arc;

use serde_json::json;

use super::backend::{Claim, JobBackend, Take};
use super::context::Context;
use super::entry::{Answer, Ended};
use crate::classify::Classification;
use crate::error::GatewayError;
use crate::pipeline::{self, Admitted, RequestCtx};
use crate::relay::{Collected, Format};

/// Takes in a row when the head moved under us (someone else started or cancelled it).
const RETAKES: usize = 8;

/// Starts the queue's head while it finds idle capacity; sleeps until woken (a job queued,
/// capacity back) or, for a backend that polls, its poll interval. The head never lets a
/// later job pass it (oldest first).
pub async fn schedule(ctx: Arc<Context>, backend: Arc<dyn JobBackend>) {
    let poll = backend.poll_every();
    loop {
        let mut retakes = 0;
        // A gateway shutting down starts nothing more (it would only hand it back).
        while retakes < RETAKES && !ctx.stop.is_cancelled() {
            match backend.take().await {
                Take::Started(claim) => {
                    retakes = 0;
                    ctx.tasks.spawn(run(ctx.clone(), claim));
                }
                Take::Moved => retakes += 1,
                Take::Idle => break,
            }
        }
        let sleep = async {
            match poll {
                Some(every) => tokio::time::sleep(every).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ctx.stop.cancelled() => return,
            _ = ctx.wake.notified() => {}
            _ = sleep => {}
        }
    }
}

/// Runs one taken job to its end: sends it, keeps its text readable as it streams, and ends it
/// done, failed, cancelled (`DELETE`), handed back (shutdown) or lost (another run owns it).
/// Dropping the stream aborts the engine's work and gives the seat back.
async fn run(ctx: Arc<Context>, claim: Claim) {
    let Claim {
        waited,
        guard,
        mut run,
    } = claim;
    ctx.metrics().waited(waited);
    let cancelled = run.cancelled();
    let lost = run.lost();
    let outcome = match run.work().await {
        Err(ended) => Some(ended),
        Ok((ready, record)) => {
            let class = ready.class;
            let mut pieces = 0usize;
            let streamed = async {
                let relay = pipeline::send(
                    &RequestCtx::snapshot(&ctx.state),
                    Admitted::new(ready, guard, record),
                    Format::Answer,
                )
                .await?;
                relay
                    .collect_with(|chunk| {
                        if !chunk.text.is_empty() {
                            pieces += 1;
                            run.piece(&chunk.text);
                        }
                    })
                    .await
            };
            tokio::select! {
                // A stream that completes as a cancel arrives keeps its answer.
                biased;
                r = streamed => Some(match r {
                    Ok(all) if all.finish_reason.as_deref() == Some("abort") => Ended::Failed(
                        "engine_aborted",
                        "the engine aborted the generation".to_owned(),
                    ),
                    Ok(all) => Ended::Done(answer(all, &class, pieces)),
                    Err(e) => failed(&e),
                }),
                _ = lost => None,
                _ = cancelled => Some(Ended::Cancelled),
                _ = ctx.stop.cancelled() => Some(Ended::HandedBack),
            }
        }
    };
    run.finish(outcome).await;
}

/// A finished stream's answer: its finish reason, usage (the engine's, or the estimate and the
/// `pieces` streamed when it sent none) and timings.
fn answer(all: Collected, class: &Classification, pieces: usize) -> Answer {
    let usage = all.usage;
    Answer {
        finish_reason: all.finish_reason,
        usage: json!({
            "input_tokens": usage.map_or(class.input_tokens_estimate, |u| u.prompt_tokens),
            "output_tokens": usage.map_or(pieces as u32, |u| u.completion_tokens),
            "cached_tokens": usage.and_then(|u| u.cached_tokens).unwrap_or(0),
        }),
        timings: all.timings,
    }
}

fn failed(e: &GatewayError) -> Ended {
    tracing::warn!(code = e.code(), error = %e.log_summary(), "job failed");
    Ended::Failed(e.code(), e.message())
}
