//! The shared store's tasks on each replica: the scheduler (the queue's head starts here when
//! the fleet's large lane has idle capacity), one job's run, the beat (runner leases, lost
//! runners, result expiry, the status gauge) and the listener (announcements).
//!
//! Idle capacity, fleet-wide: the take script starts the head only when its lease fits the
//! large lane's own seats (the Redis backend's reserved shares are caps: nothing to borrow)
//! and the token and prefill budgets, and no replica has an interactive large request waiting:
//! a large-lane acquire that is refused marks its replica in `:waiting:large` for a second,
//! renewed at every try and kept at a grant while more wait behind it. A job never queues
//! ahead of an interactive request on any replica.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{store_down, Fields, Run, SharedJobs};
use crate::admission::LaneGuard;
use crate::jobs::runner::{answer, failed};
use crate::jobs::{webhook, Ended, Jobs};
use crate::lane::Lane;
use crate::pipeline::{self, Admitted, Ready, RequestCtx, Tenant};
use crate::relay::Format;
use crate::telemetry::Route;

/// Take calls in a row when the head moved under us (someone else started or cancelled it).
const RETAKES: usize = 8;

/// Starts the queue's head whenever it finds idle capacity; wakes on submissions, on any
/// replica's releases, and at least every heartbeat.
pub async fn schedule(jobs: Jobs, shared: Arc<SharedJobs>) {
    let (_, heartbeat) = shared.admission.lease_timing();
    loop {
        let mut retakes = 0;
        while retakes < RETAKES {
            match start_head(&jobs, &shared).await {
                Start::Started => retakes = 0,
                Start::Moved => retakes += 1,
                Start::Not => break,
            }
        }
        tokio::select! {
            _ = jobs.0.stop.cancelled() => return,
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(heartbeat) => {}
        }
    }
}

enum Start {
    Started,
    /// The head changed between reading it and taking it.
    Moved,
    /// Nothing to start now (no job, no idle capacity, or Redis unreachable).
    Not,
}

async fn start_head(jobs: &Jobs, shared: &Arc<SharedJobs>) -> Start {
    // A gateway shutting down starts nothing more (it would only hand it back).
    if jobs.0.stop.is_cancelled() {
        return Start::Not;
    }
    let Ok(mut conn) = shared.conn().await else {
        return Start::Not;
    };
    let head: Result<Vec<String>, _> = redis::cmd("ZRANGE")
        .arg(shared.queue_key())
        .arg(0)
        .arg(0)
        .query_async(&mut conn)
        .await;
    let Some(id) = head.ok().and_then(|h| h.into_iter().next()) else {
        return Start::Not;
    };
    let need: Result<(Option<u32>, Option<u32>), _> = redis::cmd("HMGET")
        .arg(shared.job_key(&id))
        .arg(&["work", "prefill"])
        .query_async(&mut conn)
        .await;
    let Ok((Some(work), Some(prefill))) = need else {
        return Start::Not;
    };
    let config = &jobs.0.config;
    let (ttl, _) = shared.admission.lease_timing();
    let keys = shared.keys(Some(&id));
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let args = [
        shared.base.clone(),
        id.clone(),
        config.max_running.to_string(),
        ttl.as_millis().to_string(),
    ];
    let taken = shared
        .admission
        .take_with(
            &shared.scripts.take,
            &keys,
            &args,
            (Lane::Large, work, prefill),
        )
        .await;
    match taken {
        Some(Ok(t)) => {
            let attempt = u64::try_from(t.rest.first().copied().unwrap_or(1))
                .unwrap_or(1)
                .max(1);
            let waited = Duration::from_millis(
                u64::try_from(t.rest.get(1).copied().unwrap_or(0)).unwrap_or(0),
            );
            let run = Run {
                token: t.lease,
                cancel: CancellationToken::new(),
                lost: CancellationToken::new(),
            };
            // A run of this job still here (it lost the job while slow) stops now.
            if let Some(old) = shared.running().insert(id.clone(), run.clone()) {
                old.lost.cancel();
            }
            tracing::info!(job = %id, attempt, "job started");
            jobs.0.tasks.spawn(self::run(
                jobs.clone(),
                shared.clone(),
                (id, attempt),
                run,
                waited,
                t.guard,
            ));
            Start::Started
        }
        Some(Err(-10)) => Start::Moved,
        _ => Start::Not,
    }
}

/// Runs job `id` (its run `attempt`) under `guard` to its end, or hands it back to the queue
/// at shutdown.
async fn run(
    jobs: Jobs,
    shared: Arc<SharedJobs>,
    (id, attempt): (String, u64),
    run: Run,
    waited: Duration,
    guard: LaneGuard,
) {
    let inner = &jobs.0;
    let metrics = inner.state.metrics().jobs();
    metrics.waited(waited);
    let started = Instant::now();
    let fields = read_fields(&shared, &id).await;
    let ready = fields
        .as_ref()
        .and_then(|f| f.get("request"))
        .and_then(|r| serde_json::from_str(r).ok())
        .and_then(|v| Ready::from_stored(&v));
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(write_pieces(shared.clone(), id.clone(), run.clone(), rx));
    // `None`: the run no longer owns the job, or the store stayed unreachable: nothing is
    // written; the runner lease lapses and a beat puts the job back.
    let outcome: Option<Ended> = match ready {
        None => Some(Ended::Failed(
            "internal",
            "the job's stored request could not be read".to_owned(),
        )),
        Some(ready) => {
            // Each run is its own engine request (an abort of a lost run never reaches the
            // next one); the first keeps the job's id.
            let request_id = match attempt {
                1 => id.clone(),
                n => format!("{id}-{n}"),
            };
            let mut record = inner.state.record_as(Route::Job, request_id);
            let traceparent = fields.as_ref().and_then(|f| f.get("traceparent"));
            record.link(traceparent.map(String::as_str), None);
            let class = ready.class;
            let mut pieces = 0usize;
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
                            pieces += 1;
                            let _ = tx.send(chunk.text.clone());
                        }
                    })
                    .await
            };
            tokio::select! {
                biased;
                r = streamed => Some(match r {
                    Ok(all) if all.finish_reason.as_deref() == Some("abort") => Ended::Failed(
                        "engine_aborted",
                        "the engine aborted the generation".to_owned(),
                    ),
                    Ok(all) => Ended::Done(answer(all, &class, pieces)),
                    Err(e) => failed(&e),
                }),
                _ = run.lost.cancelled() => None,
                _ = run.cancel.cancelled() => Some(Ended::Cancelled),
                _ = inner.stop.cancelled() => Some(Ended::HandedBack),
            }
        }
    };
    drop(tx);
    let text_bytes = writer.await.unwrap_or(0);
    // The writer may have found the job lost while the stream was ending.
    let ended = outcome.filter(|_| !run.lost.is_cancelled());
    let applied = match &ended {
        Some(e) => {
            let (to, result) = match e {
                Ended::Done(a) => ("done", a.to_json().to_string()),
                Ended::Failed(code, message) => (
                    "failed",
                    json!({ "code": code, "message": message }).to_string(),
                ),
                Ended::Cancelled => ("cancelled", String::new()),
                Ended::HandedBack => ("queued", String::new()),
            };
            end(&shared, &id, &run.token, to, &result, text_bytes).await
        }
        None => None,
    };
    {
        let mut running = shared.running();
        if running.get(&id).is_some_and(|r| r.token == run.token) {
            running.remove(&id);
        }
    }
    let Some(status) = applied else {
        // Lost to another run, or the store stayed away: the runner lease lapses and a beat
        // puts the job back (or a newer run's outcome stands).
        tracing::warn!(job = %id, "job run stopped without an outcome: this run no longer owns the job");
        return;
    };
    tracing::info!(job = %id, status = status.as_str(), "job ended");
    if status == "queued" {
        return;
    }
    metrics.ran(started.elapsed());
    notify_ended(&jobs, &shared, &id).await;
}

/// Sends job `id`'s webhook, if it has one (it just ended: done, failed or cancelled).
pub(crate) async fn notify_ended(jobs: &Jobs, shared: &Arc<SharedJobs>, id: &str) {
    let Some(fields) = read_fields(shared, id).await else {
        return;
    };
    let Some(url) = fields
        .get("notify")
        .and_then(|u| reqwest::Url::parse(u).ok())
    else {
        return;
    };
    // The job's status as its own tenant reads it.
    let tenant = fields
        .get("tenant")
        .filter(|t| !t.is_empty())
        .map(|t| Tenant(t.clone()));
    let Ok(status) = shared.status(id, tenant.as_ref()).await else {
        return;
    };
    let body = status.to_string();
    let (jobs, shared, id) = (jobs.clone(), shared.clone(), id.to_owned());
    let tasks = jobs.0.tasks.clone();
    tasks.spawn(async move {
        webhook::send(&jobs, &id, url, body, |w| {
            let shared = shared.clone();
            let id = id.clone();
            async move { shared.set_webhook(&id, &w).await }
        })
        .await;
    });
}

async fn read_fields(shared: &SharedJobs, id: &str) -> Option<Fields> {
    let mut conn = shared.conn().await.ok()?;
    let fields: Fields = redis::cmd("HGETALL")
        .arg(shared.job_key(id))
        .query_async(&mut conn)
        .await
        .ok()?;
    (!fields.is_empty()).then_some(fields)
}

/// Pushes the run's pieces to the job's text in batches (whatever arrived while the last call
/// was out), in order; returns the bytes pushed. A refusal (the job is no longer this run's),
/// or a store unreachable for 2 s, marks the run lost: it stops and writes nothing more.
async fn write_pieces(
    shared: Arc<SharedJobs>,
    id: String,
    run: Run,
    mut rx: mpsc::UnboundedReceiver<String>,
) -> u64 {
    let mut bytes = 0u64;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        bytes += batch.iter().map(|p| p.len() as u64).sum::<u64>();
        let mut tries = 0;
        loop {
            let pushed = push(&shared, &id, &run.token, &batch).await;
            match pushed {
                Ok(n) if n >= 0 => break,
                Ok(_) => {
                    run.lost.cancel();
                    return bytes;
                }
                Err(()) if tries < 20 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(()) => {
                    // Redis stayed away: the runner lease lapses and the job runs again.
                    run.lost.cancel();
                    return bytes;
                }
            }
        }
    }
    bytes
}

async fn push(shared: &SharedJobs, id: &str, token: &str, pieces: &[String]) -> Result<i64, ()> {
    let mut conn = shared.conn().await.map_err(|_| ())?;
    let mut call = shared.call(&shared.scripts.push, Some(id));
    call.arg(id).arg(token);
    for p in pieces {
        call.arg(p);
    }
    call.invoke_async(&mut conn)
        .await
        .map_err(|e| drop(store_down("push", &e)))
}

/// Runs the end script (retried briefly while Redis is unreachable): the status the job now
/// has, or `None` when this run no longer owns it (or the store stayed away).
async fn end(
    shared: &SharedJobs,
    id: &str,
    token: &str,
    to: &str,
    result: &str,
    text_bytes: u64,
) -> Option<String> {
    for _ in 0..20 {
        if let Ok(mut conn) = shared.conn().await {
            let mut call = shared.call(&shared.scripts.end, Some(id));
            call.arg(id).arg(token).arg(to).arg(result).arg(text_bytes);
            match call.invoke_async::<String>(&mut conn).await {
                Ok(status) => return Some(status).filter(|s| !s.is_empty()),
                Err(e) => drop(store_down("end", &e)),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Every heartbeat: renews this replica's runner leases, lets the beat script put lost jobs
/// back and expire results, sets the status gauge to the fleet's counts, and cancels the runs
/// whose cancel was asked (should the announcement have been missed).
pub async fn beat(jobs: Jobs, shared: Arc<SharedJobs>) {
    let (ttl, heartbeat) = shared.admission.lease_timing();
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = jobs.0.stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Ok(mut conn) = shared.conn().await else {
            continue;
        };
        let mine: Vec<(String, String)> = shared
            .running()
            .iter()
            .map(|(id, run)| (id.clone(), run.token.clone()))
            .collect();
        let mut call = shared.call(&shared.scripts.beat, None);
        call.arg(ttl.as_millis().to_string())
            .arg(jobs.0.config.max_attempts)
            .arg(shared.result_ttl_ms);
        for (id, token) in &mine {
            call.arg(id).arg(token);
        }
        let reply: Vec<redis::Value> = match call.invoke_async(&mut conn).await {
            Ok(r) => r,
            Err(e) => {
                store_down("beat", &e);
                continue;
            }
        };
        let n = |i: usize| {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value::<i64>(v).ok())
                .unwrap_or(0)
        };
        let (requeued, lost) = (n(0), n(1));
        if requeued > 0 || lost > 0 {
            tracing::warn!(
                requeued,
                lost,
                "jobs whose gateway stopped: put back in the queue, or failed after jobs.max_attempts runs"
            );
            shared.wake.notify_one();
        }
        let metrics = jobs.0.state.metrics().jobs();
        let statuses = [
            "queued",
            "running",
            "done",
            "failed",
            "cancelled",
            "expired",
        ];
        let mut live: usize = 0;
        for (i, status) in statuses.iter().enumerate() {
            let count = n(5 + i).max(0);
            metrics.set(status, count);
            if *status != "expired" {
                live = usize::try_from(count).map_or(live, |c| live.saturating_add(c));
            }
        }
        *shared
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            (live, u64::try_from(n(4)).unwrap_or(0));
        let ids = |i: usize| -> Vec<String> {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value(v).ok())
                .unwrap_or_default()
        };
        // Cancels asked (should the announcement have been missed); runs that lost their job.
        for id in ids(11) {
            if let Some(run) = shared.running().get(&id) {
                run.cancel.cancel();
            }
        }
        for id in ids(12) {
            if let Some(run) = shared.running().get(&id) {
                run.lost.cancel();
            }
        }
        // Jobs this beat ended (cancelled after their gateway died, or runner_lost).
        for id in ids(13) {
            notify_ended(&jobs, &shared, &id).await;
        }
    }
}

/// Forwards `:jobs:changed` announcements to this replica's streams and runs (a `cancel <id>`
/// cancels the run here, if it is here), and wakes the scheduler on any replica's releases
/// (the quota's `released` channel) and submissions. Reconnects after errors.
pub async fn listen(jobs: Jobs, shared: Arc<SharedJobs>) {
    let (_, heartbeat) = shared.admission.lease_timing();
    let released = shared.admission.keys().released.clone();
    loop {
        let listening = async {
            let mut pubsub = shared.admission.client().get_async_pubsub().await?;
            pubsub.subscribe(&shared.channel).await?;
            pubsub.subscribe(&released).await?;
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let what: String = msg.get_payload().unwrap_or_default();
                if msg.get_channel_name() == released {
                    shared.wake.notify_one();
                    continue;
                }
                if let Some(id) = what.strip_prefix("cancel ") {
                    if let Some(run) = shared.running().get(id) {
                        run.cancel.cancel();
                    }
                    let _ = shared.changes.send(Arc::from(id));
                } else {
                    // (Not a wake-up for the scheduler: pieces are announced too; another
                    // replica's submission is seen at the next heartbeat.)
                    let _ = shared.changes.send(Arc::from(what.as_str()));
                }
            }
            Ok::<(), redis::RedisError>(())
        };
        tokio::select! {
            _ = jobs.0.stop.cancelled() => return,
            _ = listening => {}
        }
        tokio::select! {
            _ = jobs.0.stop.cancelled() => return,
            _ = tokio::time::sleep(heartbeat) => {}
        }
    }
}
