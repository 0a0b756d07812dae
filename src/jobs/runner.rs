//! The scheduler (queued jobs start, oldest first, when the large lane has idle capacity), one
//! job's run, and the sweeper that expires results.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::time::Instant;

use super::entry::{Answer, Entry, Status};
use super::{Ended, Jobs};
use crate::admission::LaneGuard;
use crate::classify::Classification;
use crate::error::GatewayError;
use crate::lane::Lane;
use crate::pipeline::{self, Admitted, Ready, RequestCtx};
use crate::relay::{Collected, Format};
use crate::telemetry::RequestRecord;

/// Starts queued jobs while the head of the queue finds idle capacity; sleeps until a job is
/// queued or capacity comes back. The head never lets a later job pass it (oldest first).
pub(super) async fn schedule(jobs: Jobs) {
    let inner = &jobs.0;
    let Some(mut freed) = inner.state.admission().freed() else {
        return;
    };
    loop {
        freed.borrow_and_update();
        while let Some((entry, work, guard)) = next_startable(&jobs) {
            inner.tasks.spawn(run(jobs.clone(), entry, work, guard));
        }
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = inner.submitted.notified() => {}
            changed = freed.changed() => if changed.is_err() { return },
        }
    }
}

/// The head of the queue with its seat, taken out of the queue, when idle capacity fits it.
fn next_startable(jobs: &Jobs) -> Option<(Arc<Entry>, (Ready, RequestRecord), LaneGuard)> {
    let mut store = jobs.store();
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
        let max_running = jobs.0.config.max_running;
        if max_running > 0 && store.running >= max_running {
            return None;
        }
        let guard = jobs
            .0
            .state
            .admission()
            .try_acquire_idle(Lane::Large, work, prefill)?;
        store.start(&entry.id);
        let taken = entry.lock().work.take();
        match taken {
            Some(work) => {
                store.running += 1;
                return Some((entry, work, guard));
            }
            None => drop(guard),
        }
    }
}

/// Runs one admitted job to its end: sends it, keeps its text readable as it streams, and ends
/// it done, failed, or cancelled (`DELETE`, or shutdown: dropping the stream aborts the engine's
/// work and gives the seat back).
async fn run(jobs: Jobs, entry: Arc<Entry>, work: (Ready, RequestRecord), guard: LaneGuard) {
    let inner = &jobs.0;
    let (ready, record) = work;
    let started = (SystemTime::now(), Instant::now());
    entry.update(|s| {
        s.status = Status::Running;
        s.started = Some(started);
    });
    let metrics = inner.state.metrics().jobs();
    metrics.moved(Some("queued"), Some("running"));
    metrics.waited(started.1 - entry.submitted.1);
    let class = ready.class;
    let streamed = async {
        let relay = pipeline::send(
            &RequestCtx::snapshot(&inner.state),
            Admitted::new(ready, guard, record),
            Format::Answer,
        )
        .await?;
        relay
            .collect_with(|chunk| {
                if !chunk.text.is_empty() {
                    entry.update(|s| {
                        s.text.push_str(&chunk.text);
                        s.ends.push(s.text.len());
                    });
                }
            })
            .await
    };
    let ended = tokio::select! {
        // A stream that completes as a cancel arrives keeps its answer.
        biased;
        r = streamed => match r {
            Ok(all) => {
                let pieces = entry.lock().ends.len();
                Ended::Done(answer(all, &class, pieces))
            }
            Err(e) => failed(&e),
        },
        _ = entry.cancel.cancelled() => Ended::Cancelled,
        _ = inner.stop.cancelled() => Ended::Cancelled,
    };
    jobs.end(&entry, ended);
}

/// A finished stream's answer: its finish reason, usage (the engine's, or the estimate and the
/// `pieces` streamed when it sent none) and timings.
pub(super) fn answer(all: Collected, class: &Classification, pieces: usize) -> Answer {
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

pub(super) fn failed(e: &GatewayError) -> Ended {
    tracing::warn!(code = e.code(), error = %e.log_summary(), "job failed");
    Ended::Failed(e.code(), e.message())
}

/// Expires results `jobs.result_ttl` after their job ended (text and answer dropped, bytes
/// given back, status `expired`) and forgets expired ids as long again after that.
pub(super) async fn sweep(jobs: Jobs) {
    let ttl = jobs.0.config.result_ttl;
    let every = (ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = jobs.0.stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = Instant::now();
        let ended = jobs.store().ended();
        for entry in ended {
            let Some((_, finished)) = entry.lock().finished else {
                continue;
            };
            let status = entry.lock().status;
            if status == Status::Expired && now >= finished + ttl * 2 {
                let mut store = jobs.store();
                store.forget(&entry.id);
                store.expired -= 1;
                jobs.0.state.metrics().jobs().moved(Some("expired"), None);
            } else if status != Status::Expired && now >= finished + ttl {
                let mut store = jobs.store();
                let freed = entry.update(|s| {
                    s.status = Status::Expired;
                    s.text = String::new();
                    s.ends = Vec::new();
                    s.answer = None;
                    s.error = None;
                    std::mem::take(&mut s.bytes)
                });
                store.bytes = store.bytes.saturating_sub(freed);
                store.expired += 1;
                drop(store);
                let metrics = jobs.0.state.metrics().jobs();
                metrics.moved(Some(status.as_str()), Some("expired"));
            }
        }
    }
}
