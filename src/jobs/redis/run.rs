//! Taking the shared queue's head and running it here: the take script starts the head and
//! takes its large-lane seat in one step, only out of the fleet's idle capacity; the run
//! writes its pieces and its end only while it owns the job (its token).
//!
//! Idle capacity, fleet-wide: the take script starts the head only when its lease fits the
//! large lane's own seats (the Redis backend's reserved shares are caps: nothing to borrow)
//! and the token and prefill budgets, and no replica has an interactive large request waiting:
//! a large-lane acquire that is refused marks its replica in `:waiting:large` for a second,
//! renewed at every try and kept at a grant while more wait behind it. A job never queues
//! ahead of an interactive request on any replica.
//!
//! With `jobs.preempt` the take script may give a pre-emptible lease instead (any lane's idle
//! seat, while no interactive request of any lane waits anywhere), and a job handed back with
//! its text is continued by the run that takes it (see `mod.rs`, "Pre-emption").

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store::{store_down, RedisStore, Run};
use crate::admission::preempt::Preemptible;
use crate::error::GatewayError;
use crate::jobs::backend::{Claim, JobRun, Take};
use crate::jobs::entry::Ended;
use crate::jobs::runner::run_record;
use crate::lane::Lane;
use crate::pipeline::Ready;
use crate::telemetry::RequestRecord;

/// Removes ARGV[1] from the queue KEYS[1] only if its record KEYS[2] is still missing (a
/// submission under the same id cannot be dropped by a look that raced it).
const DROP_IF_GONE: &str = r"
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
";

/// Takes the queue's head to run here, when the fleet's idle capacity fits it.
pub async fn take(store: &Arc<RedisStore>) -> Take {
    let Ok(mut conn) = store.conn().await else {
        return Take::Idle;
    };
    let head: Result<Vec<String>, _> = redis::cmd("ZRANGE")
        .arg(store.queue_key())
        .arg(0)
        .arg(0)
        .query_async(&mut conn)
        .await;
    let Some(id) = head.ok().and_then(|h| h.into_iter().next()) else {
        return Take::Idle;
    };
    let need: Result<(Option<u32>, Option<u32>), _> = redis::cmd("HMGET")
        .arg(store.job_key(&id))
        .arg(&["work", "prefill"])
        .query_async(&mut conn)
        .await;
    let (work, prefill) = match need {
        Ok((Some(work), Some(prefill))) => (work, prefill),
        Ok(_) => {
            // Its record is gone (deleted or evicted from outside: the jobs' keys need Redis's
            // `noeviction`): nothing can ever run it, and as the head it held every job of the
            // fleet back. Out of the queue, if it is still the record-less head.
            tracing::warn!(job = %id, "a queued job's record is missing in Redis; dropping it from the queue");
            let _: Result<i64, _> = redis::Script::new(DROP_IF_GONE)
                .key(store.queue_key())
                .key(store.job_key(&id))
                .arg(&id)
                .invoke_async(&mut conn)
                .await;
            return Take::Idle;
        }
        Err(_) => return Take::Idle,
    };
    let (ttl, _) = store.admission.lease_timing();
    let keys = store.keys(Some(&id));
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let config = &store.ctx.config;
    let mut args = vec![
        store.base.clone(),
        id.clone(),
        config.max_running.to_string(),
        ttl.as_millis().to_string(),
    ];
    // jobs.preempt: a pre-emptible seat (any lane's idle one) while the job may still be
    // pre-empted; the handle through which an acquire anywhere asks it back.
    let handle = config.preempt.then(|| {
        args.push(config.max_preemptions.to_string());
        Preemptible::new(true)
    });
    if store.admission.degraded() {
        return Take::Idle;
    }
    // The script starts the job under this lease's id; should its reply be lost (Redis slower
    // than the call's timeout, a dropped connection, this future dropped at shutdown), no run
    // holds the job, and it goes back to the queue as it was.
    let lease = store.admission.next_id();
    let mut untake = Untake::armed(store, &id, &lease);
    let taken = store
        .admission
        .take_with(
            &store.scripts.take,
            &keys,
            &args,
            (Lane::Large, work, prefill),
            handle.as_ref(),
            lease,
        )
        .await;
    if matches!(taken, Some(Err(_))) {
        // Refused: the script changed nothing.
        untake.disarm();
    }
    match taken {
        Some(Ok(t)) => {
            let attempt = u64::try_from(t.rest.first().copied().unwrap_or(1))
                .unwrap_or(1)
                .max(1);
            let waited = Duration::from_millis(
                u64::try_from(t.rest.get(1).copied().unwrap_or(0)).unwrap_or(0),
            );
            // Handed back with its text: continued here.
            let resuming = t.rest.get(4) == Some(&1);
            // What the run sends, read before the job is this replica's: a Redis that does not
            // answer now (a timeout, a fall-back) leaves the job as it was before the take (the
            // take undone as below), never failed for good or its text started over.
            let resumed = match resuming {
                true => store.resumed(&id).await,
                false => Ok(None),
            };
            let (Ok(fields), Ok(resumed)) = (store.read_fields(&id).await, resumed) else {
                tracing::warn!(job = %id, "a taken job's record could not be read; given back to the queue");
                return Take::Idle;
            };
            // No await from here on: this replica runs the job (dropped before, the take is
            // undone as if its reply had been lost).
            untake.disarm();
            let run = Run {
                token: t.lease,
                cancel: CancellationToken::new(),
                lost: CancellationToken::new(),
            };
            // A run of this job still here (it lost the job while slow) stops now.
            if let Some(old) = store.running().insert(id.clone(), run.clone()) {
                old.lost.cancel();
            }
            if resuming && resumed.is_none() {
                // Its text is unreadable (not Redis: what it holds): this run stops at once
                // without writing, and the beat puts the job back when its runner lease lapses
                // (its text starts over).
                run.lost.cancel();
            }
            tracing::info!(job = %id, attempt, "job started");
            let (tx, rx) = mpsc::unbounded_channel::<String>();
            let writer = tokio::spawn(write_pieces(store.clone(), id.clone(), run.clone(), rx));
            Take::Started(Box::new(Claim {
                waited,
                guard: t.guard,
                preempt: handle.filter(|_| t.preemptible),
                resumed,
                run: Box::new(RedisRun {
                    store: store.clone(),
                    fields,
                    id,
                    attempt,
                    run,
                    started: Instant::now(),
                    tx: Some(tx),
                    writer,
                }),
            }))
        }
        Some(Err(-10)) => Take::Moved,
        // Refused for its tokens (the lane's budget, -1, or the global one, -2): a record
        // lowered below its reservation (a reload, `limits push`) would never let it run, and
        // every job behind it would wait for good. It fails as it would have on arrival.
        Some(Err(-1 | -2)) => {
            if let Err(too_large) = store.admission.never_fits_tokens(Lane::Large, work).await {
                let error = GatewayError::from(too_large);
                store.fail_queued(&id, error.code(), &error.message()).await;
                // The next job is the head now: tried at once, as in process.
                return Take::Moved;
            }
            Take::Idle
        }
        _ => Take::Idle,
    }
}

/// A take whose reply may be lost: dropped armed, it gives job `id` back to the queue as it was
/// before the take under lease `lease` (the end script's `untaken`, in the background, sent
/// until Redis answers, up to the run's lease lifetime; a cancel asked meanwhile ends it
/// cancelled). Without it the job
/// stayed "running" under a run that does not exist until its runner lease lapsed, and the beat
/// then counted a lost run against `jobs.max_attempts` (and a handed-back job's text started
/// over). A take that never ran leaves nothing to undo: the script changes only a job whose
/// runner is `lease`.
struct Untake {
    store: Option<Arc<RedisStore>>,
    id: String,
    lease: String,
}

impl Untake {
    fn armed(store: &Arc<RedisStore>, id: &str, lease: &str) -> Self {
        Self {
            store: Some(store.clone()),
            id: id.to_owned(),
            lease: lease.to_owned(),
        }
    }

    /// The reply was read: what it says stands.
    fn disarm(&mut self) {
        self.store = None;
    }
}

impl Drop for Untake {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (id, lease) = (
            std::mem::take(&mut self.id),
            std::mem::take(&mut self.lease),
        );
        let tasks = store.ctx.tasks.clone();
        tasks.spawn_on(untake(store, id, lease), &runtime);
    }
}

/// The end script's `untaken` for job `id` under `lease`, sent until Redis answers (a dropped
/// connection is what loses a reply, and it may take a while to come back) or until the run's
/// lease would have lapsed anyway: from then on the beat puts the job back, as a lost run.
async fn untake(store: Arc<RedisStore>, id: String, lease: String) {
    let (ttl, _) = store.admission.lease_timing();
    let until = Instant::now() + ttl;
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Ok(mut conn) = store.conn().await {
            let mut call = store.call(&store.scripts.end, Some(&id));
            call.arg(&id).arg(&lease).arg("untaken").arg("").arg(0);
            match call.invoke_async::<String>(&mut conn).await {
                // The take never ran (or another run owns the job): nothing to undo.
                Ok(status) if status.is_empty() => return,
                Ok(status) => {
                    tracing::info!(job = %id, status = status.as_str(), "a job's take went unanswered; the job is back as it was");
                    if status == "cancelled" {
                        store.notify_ended(&id).await;
                    }
                    return;
                }
                Err(e) => drop(store_down("untake", &e)),
            }
        }
        if Instant::now() >= until {
            tracing::warn!(job = %id, "a job's take went unanswered and Redis stayed away; the job goes back when its runner lease lapses");
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2).min(Duration::from_secs(1));
    }
}

/// Run `attempt` of job `id` on this replica: its pieces go to the job's text through the
/// writer task; its end is written only if it still owns the job.
struct RedisRun {
    store: Arc<RedisStore>,
    /// The job's record as the take read it (its stored request), until the run sends it.
    fields: Option<super::store::Fields>,
    id: String,
    attempt: u64,
    run: Run,
    started: Instant,
    /// The pieces for the writer (dropped at the end: the writer then finishes).
    tx: Option<mpsc::UnboundedSender<String>>,
    /// Pushes the pieces; the bytes pushed.
    writer: JoinHandle<u64>,
}

impl JobRun for RedisRun {
    fn work(&mut self) -> BoxFuture<'_, Result<(Ready, RequestRecord), Ended>> {
        async move {
            let fields = self.fields.take();
            let ready = fields
                .as_ref()
                .and_then(|f| f.get("request"))
                .and_then(|r| serde_json::from_str(r).ok())
                .and_then(|v| Ready::from_stored(&v))
                .ok_or_else(|| {
                    Ended::Failed(
                        "internal",
                        "the job's stored request could not be read".to_owned(),
                    )
                })?;
            // Each run is its own engine request (an abort of a lost run never reaches the
            // next one); the first keeps the job's id.
            let request_id = match self.attempt {
                1 => self.id.clone(),
                n => format!("{}-{n}", self.id),
            };
            // The run's record is new: it carries the submission's tenant and classification
            // (its lane label), as the in-process job's own record does.
            let mut record = run_record(&self.store.ctx.state, &ready, request_id);
            let traceparent = fields.as_ref().and_then(|f| f.get("traceparent"));
            record.link(traceparent.map(String::as_str), None);
            Ok((ready, record))
        }
        .boxed()
    }

    fn piece(&mut self, text: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(text.to_owned());
        }
    }

    fn hands_back(&self) -> bool {
        true
    }

    fn cancelled(&self) -> BoxFuture<'static, ()> {
        self.run.cancel.clone().cancelled_owned().boxed()
    }

    fn lost(&self) -> BoxFuture<'static, ()> {
        self.run.lost.clone().cancelled_owned().boxed()
    }

    fn finish(mut self: Box<Self>, outcome: Option<Ended>) -> BoxFuture<'static, ()> {
        async move {
            drop(self.tx.take());
            let text_bytes = (&mut self.writer).await.unwrap_or(0);
            let RedisRun {
                store, id, run, started, ..
            } = *self;
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
                        Ended::HandedBack(progress) => {
                            ("queued", progress.clone().unwrap_or_default())
                        }
                    };
                    end(&store, &id, &run.token, to, &result, text_bytes).await
                }
                None => None,
            };
            {
                let mut running = store.running();
                if running.get(&id).is_some_and(|r| r.token == run.token) {
                    running.remove(&id);
                }
            }
            let Some(status) = applied else {
                // Lost to another run, or the store stayed away: the runner lease lapses and
                // a beat puts the job back (or a newer run's outcome stands).
                tracing::warn!(job = %id, "job run stopped without an outcome: this run no longer owns the job");
                return;
            };
            tracing::info!(job = %id, status = status.as_str(), "job ended");
            if status == "queued" {
                return;
            }
            let ran = job_span(&store, &id).await.unwrap_or_else(|| started.elapsed());
            store.ctx.metrics().ran(ran);
            store.notify_ended(&id).await;
        }
        .boxed()
    }
}

/// Pushes the run's pieces to the job's text in batches (whatever arrived while the last call
/// was out), in order; returns the bytes pushed. A refusal (the job is no longer this run's),
/// or a store unreachable for 2 s, marks the run lost: it stops and writes nothing more.
async fn write_pieces(
    store: Arc<RedisStore>,
    id: String,
    run: Run,
    mut rx: mpsc::UnboundedReceiver<String>,
) -> u64 {
    let mut bytes = 0u64;
    // Each batch's number in this run: a retried batch whose first call went through (its
    // reply lost) is not appended twice (`jobs_push_v2.lua`).
    let mut seq = 0u64;
    while let Some(first) = rx.recv().await {
        seq += 1;
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        bytes += batch.iter().map(|p| p.len() as u64).sum::<u64>();
        let mut tries = 0;
        loop {
            let pushed = push(&store, &id, (&run.token, seq), &batch).await;
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

/// Pushes `pieces`, batch `seq` of the run holding `token`, to job `id`'s text: the pieces now
/// kept, or -1 when the run no longer owns the job.
pub(super) async fn push(
    store: &RedisStore,
    id: &str,
    (token, seq): (&str, u64),
    pieces: &[String],
) -> Result<i64, ()> {
    let mut conn = store.conn().await.map_err(|_| ())?;
    let mut call = store.call(&store.scripts.push, Some(id));
    call.arg(id).arg(token).arg(seq);
    for p in pieces {
        call.arg(p);
    }
    call.invoke_async(&mut conn)
        .await
        .map_err(|e| drop(store_down("push", &e)))
}

/// How long job `id` ran, from its first run's start (a job pre-empted or cut and continued
/// keeps it, on any replica) to its end, on Redis's clock as `GET /jobs/{id}` shows them; `None`
/// when the record cannot be read (this run's own time stands in).
async fn job_span(store: &RedisStore, id: &str) -> Option<Duration> {
    let mut conn = store.conn().await.ok()?;
    let (started, finished): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(store.job_key(id))
        .arg(&["started_ms", "finished_ms"])
        .query_async(&mut conn)
        .await
        .ok()?;
    Some(Duration::from_millis(finished?.checked_sub(started?)?))
}

/// Runs the end script (retried briefly while Redis is unreachable): the status the job now
/// has, or `None` when this run no longer owns it (or the store stayed away).
async fn end(
    store: &RedisStore,
    id: &str,
    token: &str,
    to: &str,
    result: &str,
    text_bytes: u64,
) -> Option<String> {
    for _ in 0..20 {
        if let Ok(mut conn) = store.conn().await {
            let mut call = store.call(&store.scripts.end, Some(id));
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
