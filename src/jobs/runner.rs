//! The scheduler, written once over [`JobBackend`]: queued jobs start oldest first, in the
//! large lane only, and only out of idle capacity (the backend's `take` asks admission for it:
//! [`crate::admission::Admission::try_acquire_idle`] in process, the take script in Redis);
//! and one job's run: sent through the pipeline, its pieces kept as they stream, ended done,
//! failed, cancelled, handed back, or lost.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::json;

use super::backend::{Claim, JobBackend, JobRun, Resumed, Take};
use super::context::Context;
use super::entry::{Answer, Ended};
use crate::admission::preempt::Preemptible;
use crate::admission::LaneGuard;
use crate::classify::Classification;
use crate::error::GatewayError;
use crate::pipeline::{self, Admitted, AppState, Ready, RequestCtx};
use crate::relay::{Collected, Format};
use crate::telemetry::{RequestRecord, Route};
use crate::upstream::{Chunk, ToolCallDelta};

/// Takes in a row when the head moved under us (someone else started or cancelled it).
const RETAKES: usize = 8;

/// While the engine is down, how often the scheduler looks again.
const ENGINE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the queue's head while it finds idle capacity; sleeps until woken (a job queued,
/// capacity back) or, for a backend that polls, its poll interval. The head never lets a
/// later job pass it (oldest first). Nothing starts while the engine is down (`/readyz`'s
/// check): with no interactive request waiting, an outage leaves every seat idle, and each job
/// taken failed at once (a refused connection), then the next: a whole queue failed within a
/// second. The queued jobs wait for the engine instead; runs under way when it went down go
/// on from their text once it is back (`jobs.engine_retries`).
pub async fn schedule(ctx: Arc<Context>, backend: Arc<dyn JobBackend>) {
    let poll = backend.poll_every();
    let mut engine = EngineWatch::default();
    loop {
        if let Some(wait) = engine.wait(&ctx).await {
            tokio::select! {
                _ = ctx.stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        let mut retakes = 0;
        // A gateway shutting down starts nothing more (it would only hand it back).
        // A pre-empted job waiting to resume goes first.
        while retakes < RETAKES
            && !ctx.stop.is_cancelled()
            && ctx.resuming.load(Ordering::SeqCst) == 0
        {
            match backend.take().await {
                Take::Started(claim) => {
                    retakes = 0;
                    // A panic past the run's own catch (storing its outcome) leaves the job's
                    // state unknown: the replica's probes go down, so that it is restarted
                    // (a job in Redis is then taken over once its lease, renewed until the
                    // restart, lapses; one in process is lost with the process).
                    let background = ctx.state.metrics().background();
                    ctx.tasks
                        .spawn(background.watch("job run", run(ctx.clone(), *claim)));
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

/// What the scheduler knows of the engine's readiness.
#[derive(Debug, Default)]
struct EngineWatch {
    /// It was found not ready (said once, when it becomes so).
    down: bool,
    /// When it was last found ready: the scheduler wakes at every seat given back, and asks
    /// again at most every [`ENGINE_RECHECK`] (a run that fails for the engine pauses it
    /// meanwhile, [`pause_for_engine`]).
    ready_at: Option<tokio::time::Instant>,
}

impl EngineWatch {
    /// How long to wait before taking a job: a moment after a run failed for the engine (the
    /// health known then may be from before), then while the engine is not ready; `None`:
    /// take.
    async fn wait(&mut self, ctx: &Context) -> Option<std::time::Duration> {
        let now = tokio::time::Instant::now();
        let paused = *ctx
            .engine_pause
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(until) = paused.filter(|until| *until > now) {
            self.ready_at = None;
            return Some(until - now);
        }
        if self
            .ready_at
            .is_some_and(|at| now.duration_since(at) < ENGINE_RECHECK)
        {
            return None;
        }
        match ctx.state.upstream().readiness().await {
            Ok(()) => {
                self.ready_at = Some(now);
                if std::mem::take(&mut self.down) {
                    tracing::info!("the engine is back: queued jobs start again");
                    ctx.metrics().engine_down(false);
                }
                None
            }
            Err(why) => {
                self.ready_at = None;
                if !std::mem::replace(&mut self.down, true) {
                    tracing::warn!(%why, "the engine is down: queued jobs wait for it");
                    ctx.metrics().engine_down(true);
                }
                Some(ENGINE_RECHECK)
            }
        }
    }
}

/// Runs one taken job to its end: sends it, keeps its text readable as it streams, and ends it
/// done, failed, cancelled (`DELETE`), handed back (shutdown) or lost (another run owns it).
/// A run the engine cuts (unreachable, a 5xx, a stream cut, a timeout) goes on from its text as
/// a pre-empted one does, once the engine is ready again, up to `jobs.engine_retries` times
/// (handed back with its progress where runs hand back); the next cut fails the job.
/// Dropping the stream aborts the engine's work and gives the seat back. A pre-emptible run
/// (`jobs.preempt`) asked for its seat drops its stream the same way, keeps its text, and
/// resumes as a continuation ([`Ready::continued`]) as soon as a seat is idle again, ahead of
/// the queued jobs; its readers see one answer. With a backend whose runs hand back
/// ([`JobRun::hands_back`]: Redis), it ends handed back with its progress instead, and the run
/// that takes it next, on any replica, starts from that progress (`Claim::resumed`).
async fn run(ctx: Arc<Context>, claim: Claim) {
    let Claim {
        waited,
        guard,
        preempt,
        resumed,
        mut run,
    } = claim;
    if resumed.is_none() {
        // A continued job's wait was counted when it first started.
        ctx.metrics().waited(waited);
    }
    // When it was submitted (it waited this long since), for the key that submitted it.
    let submitted_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(waited)
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    let run_cancelled = run.cancelled();
    let mut lost = run.lost();
    // The key that submitted it (`[auth]`), once the job is read; whether its revocation
    // (rather than a `DELETE`) ended the run.
    let by_revocation = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A panic inside the run (a bug) still ends the job, as failed: unwinding already gave the
    // seat, the tokens and the engine's work back (their guards drop), but the job itself
    // would stay `running` forever (in Redis, its lease renewed by this replica's beat).
    let outcome = std::panic::AssertUnwindSafe(async { match run.work().await {
        Err(ended) => Some(ended),
        Ok((ready, mut record)) => 'run: {
            let key = submitted_by(&ctx, &ready);
            if let Some((keys, id, tenant)) = &key {
                if !keys.in_force_since(id, tenant, submitted_ms) {
                    record.finish(
                        crate::telemetry::Outcome::Cancelled,
                        Some(KEY_REVOKED.0),
                        None,
                    );
                    break 'run Some(Ended::Failed(KEY_REVOKED.0, KEY_REVOKED.1.into()));
                }
            }
            // A revoked key ends the job as a cancel does (its stream dropped, the engine's
            // work aborted); told apart below.
            let revoked = match &key {
                Some((keys, id, tenant)) => keys.revoked(id, tenant),
                None => Box::pin(std::future::pending()),
            };
            let revocation = Arc::clone(&by_revocation);
            let mut cancelled = Box::pin(async move {
                if let futures::future::Either::Right(_) =
                    futures::future::select(run_cancelled, revoked).await
                {
                    revocation.store(true, Ordering::Relaxed);
                }
            });
            // What a continuation is built from.
            let resume = Resume {
                stored: ready.stored(),
                id: record.request_id().to_owned(),
                max_model_len: ctx.state.config().upstream.max_model_len.get(),
            };
            let class = ready.class;
            let mut progress = Progress::default();
            let mut next = (ready, guard, record, preempt);
            if let Some(resumed) = resumed {
                // Handed back with its text (Redis): this run continues the answer.
                progress = Progress::resumed(resumed);
                let (_, guard, record, preempt) = next;
                record.hand_over();
                let Some(ready) = resume.ready(&progress) else {
                    break 'run Some(Ended::Done(Box::new(progress.cut_answer(&class))));
                };
                let record = resume.record(&ctx.state, &ready, &progress);
                next = (ready, guard, record, preempt);
            }
            loop {
                let (ready, guard, record, handle) = next;
                let leave = handle.as_ref().map(|h| h.preempted());
                // The run's last token came (a chunk with its finish reason): the stream ends
                // at its `[DONE]`, and a seat asked back meanwhile is already given (the relay
                // gave it back with that chunk). The answer is complete: not pre-empted.
                let finished = std::sync::atomic::AtomicBool::new(false);
                let ended = {
                    let streamed = async {
                        let rctx = RequestCtx::snapshot(&ctx.state);
                        // Each run (a continuation too) is charged to its tenant's budget as
                        // it starts, settled to what the engine counted.
                        let mut ready = ready;
                        ready.charge_run(&rctx).await;
                        let relay =
                            pipeline::send(&rctx, Admitted::new(ready, guard, record), Format::Answer)
                                .await?;
                        relay
                            .collect_with(|chunk| {
                                if chunk.finish_reason.is_some() {
                                    finished.store(true, Ordering::Relaxed);
                                }
                                progress.chunk(chunk, &mut *run, handle.as_deref())
                            })
                            .await
                    };
                    let leave = async {
                        match leave {
                            Some(leave) => leave.await,
                            None => std::future::pending().await,
                        }
                        // Polled after the stream (biased below): a finish read in the same
                        // wake-up is seen here.
                        if finished.load(Ordering::Relaxed) {
                            std::future::pending::<()>().await;
                        }
                    };
                    tokio::select! {
                        // A stream that completes as a cancel arrives keeps its answer.
                        biased;
                        r = streamed => match r {
                            Ok(all) if all.finish_reason.as_deref() == Some("abort") => {
                                Step::End(Some(Ended::Failed(
                                    "engine_aborted",
                                    "the engine aborted the generation".to_owned(),
                                )))
                            }
                            Ok(all) => Step::End(Some(Ended::Done(Box::new(answer(&ctx, all, &class, &mut progress))))),
                            Err(e) => {
                                if e.outcome().is_fault() {
                                    pause_for_engine(&ctx);
                                }
                                if cut_by_engine(&e) && progress.engine_cuts < ctx.config.engine_retries {
                                    Step::EngineCut(e)
                                } else {
                                    Step::End(Some(failed(&e)))
                                }
                            }
                        },
                        _ = &mut lost => Step::End(None),
                        _ = &mut cancelled => Step::End(Some(Ended::Cancelled)),
                        _ = ctx.stop.cancelled() => Step::End(Some(Ended::HandedBack(
                            // A pre-emptible job's text is kept: any replica continues it.
                            (run.hands_back() && ctx.config.preempt && !progress.text.is_empty())
                                .then(|| progress.to_json().to_string()),
                        ))),
                        () = leave => Step::Preempted,
                    }
                };
                match ended {
                    Step::End(outcome) => break outcome,
                    Step::EngineCut(e) => {
                        progress.engine_cut(&ctx, &e);
                        // Waits here for the engine, also where runs hand back: handed back
                        // at once, the job was taken by another replica whose health had not
                        // seen the outage yet, failed there at once, and a single outage spent
                        // every retry.
                        match engine_back(&ctx, &mut lost, &mut cancelled).await {
                            Ok(()) => {}
                            Err(Some(Ended::HandedBack(None))) if run.hands_back() => {
                                break Some(Ended::HandedBack(Some(progress.to_json().to_string())));
                            }
                            Err(outcome) => break outcome,
                        }
                    }
                    Step::Preempted => {
                        // The stream is gone (the engine's work aborted, the seat back).
                        let Some(handle) = handle else {
                            break Some(Ended::Failed(
                                "internal",
                                "a job without a seat handle".into(),
                            ));
                        };
                        progress.preempted(&ctx, &handle);
                        run.preempted(progress.preempted);
                    }
                }
                // Cut (pre-empted, or by the engine): it goes on from its text.
                if run.hands_back() {
                    // Back to the shared queue with its text: whichever replica takes it next
                    // continues it.
                    break Some(Ended::HandedBack(Some(progress.to_json().to_string())));
                }
                let Some(ready) = resume.ready(&progress) else {
                    // Nothing left to generate (or nothing to continue): what it has is the answer.
                    break Some(Ended::Done(Box::new(progress.cut_answer(&class))));
                };
                // A job that is not pre-emptible (or no longer may be) resumes on its own
                // lane's seat, not pre-emptible.
                let eligible = ctx.config.preempt && progress.preempted < ctx.config.max_preemptions;
                let seat = reseat(&ctx, &ready, eligible, &mut lost, &mut cancelled).await;
                let (guard, handle) = match seat {
                    Ok(seat) => seat,
                    Err(outcome) => break outcome,
                };
                let record = resume.record(&ctx.state, &ready, &progress);
                next = (ready, guard, record, Some(handle));
            }
        }
    }})
    .catch_unwind()
    .await
    .unwrap_or_else(|_| {
        tracing::error!("a job's run panicked: the job ends failed");
        Some(Ended::Failed(
            "internal",
            "the job failed inside the gateway".into(),
        ))
    });
    let outcome = match outcome {
        Some(Ended::Cancelled) if by_revocation.load(Ordering::Relaxed) => {
            Some(Ended::Failed(KEY_REVOKED.0, KEY_REVOKED.1.into()))
        }
        other => other,
    };
    #[cfg(test)]
    crate::faults::job_finish(ctx.config.result_ttl);
    run.finish(outcome).await;
}

/// How one stream of a run ended.
enum Step {
    /// The run is over: its outcome (`None`: lost to another run).
    End(Option<Ended>),
    /// Asked for its seat back: it continues on another.
    Preempted,
    /// The engine cut it (`jobs.engine_retries` not spent): it continues once the engine is
    /// back.
    EngineCut(GatewayError),
}

/// Whether the engine, not the request, ended the run: unreachable, a 5xx, an error, an
/// unreadable or cut stream, silent past the first-token or idle timeout. Not a refusal of the
/// request (4xx), nor of the gateway's own key (401/403: an operator's problem that waiting does
/// not mend), nor the total timeout (retried, a job would run that long again).
fn cut_by_engine(e: &GatewayError) -> bool {
    use crate::upstream::UpstreamError as U;
    match e {
        GatewayError::Upstream(u) => match u {
            U::Status { status, .. } => status.is_server_error(),
            U::Unavailable(_)
            | U::Engine(_)
            | U::Protocol(_)
            | U::ClosedEarly
            | U::Transport(_)
            | U::FirstTokenTimeout(_)
            | U::IdleTimeout(_) => true,
            U::TotalTimeout(_) | U::ResponseTimeout(_) | U::InvalidRequestId => false,
        },
        _ => false,
    }
}

/// Waits for the engine after it cut a run: out the pause [`pause_for_engine`] set, then until
/// its readiness (`/readyz`'s check) answers, looked at every [`ENGINE_RECHECK`]. Ends with the
/// run's outcome instead when it is lost, cancelled or handed back (shutdown) first.
async fn engine_back(
    ctx: &Context,
    lost: &mut (impl std::future::Future<Output = ()> + Unpin),
    cancelled: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Result<(), Option<Ended>> {
    // It goes before the queued jobs once the engine is back.
    let _resuming = Resuming::new(ctx);
    loop {
        let now = tokio::time::Instant::now();
        let paused = *ctx
            .engine_pause
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let wait = match paused.filter(|until| *until > now) {
            Some(until) => until - now,
            None if ctx.state.upstream().readiness().await.is_ok() => return Ok(()),
            None => ENGINE_RECHECK,
        };
        tokio::select! {
            // One outcome when several come in one wake-up (a key revoked at shutdown ends
            // the job as its revocation, not handed back): lost, cancelled, stopped, then on.
            biased;
            () = &mut *lost => return Err(None),
            () = &mut *cancelled => return Err(Some(Ended::Cancelled)),
            () = ctx.stop.cancelled() => return Err(Some(Ended::HandedBack(None))),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// How a job whose key was revoked ends: `(code, message)`.
const KEY_REVOKED: (&str, &str) = (
    crate::telemetry::INVALID_API_KEY,
    "the API key that submitted this job was revoked",
);

/// The keys in force, and the key and tenant `ready` came with, when `[auth]` knows them.
fn submitted_by(
    ctx: &Context,
    ready: &Ready,
) -> Option<(
    Arc<dyn crate::pipeline::tenant::KeysInForce>,
    String,
    String,
)> {
    let keys = ctx.keys.as_ref()?;
    let id = ready.key_id()?;
    let tenant = ready.tenant()?;
    Some((Arc::clone(keys), id.to_owned(), tenant.0.clone()))
}

/// What a pre-emptible run's continuations are built from: the request as first sent, and the
/// job's request id (a continuation's is `<id>-p<n>`).
struct Resume {
    stored: serde_json::Value,
    id: String,
    /// `upstream.max_model_len` when the job started.
    max_model_len: u32,
}

impl Resume {
    /// The continuation of the answer so far (`None`: nothing is left to generate).
    fn ready(&self, progress: &Progress) -> Option<Ready> {
        Ready::continued(
            &self.stored,
            &progress.text,
            progress.generated,
            progress
                .first
                .map(|(prompt, _)| (prompt, self.max_model_len)),
        )
    }

    /// The record of that continuation's run, `<id>-p<n>`.
    fn record(&self, state: &AppState, ready: &Ready, progress: &Progress) -> RequestRecord {
        run_record(
            state,
            ready,
            format!("{}-p{}", self.id, progress.continued()),
        )
    }
}

/// A job's answer so far, across the runs of its pre-emptions.
#[derive(Default, Debug)]
struct Progress {
    /// The text so far.
    text: String,
    /// Pieces streamed so far.
    pieces: usize,
    /// Output tokens of the runs before this one.
    before: u32,
    /// Output tokens so far (the engine's running count).
    generated: u32,
    /// The first run's prompt and cached tokens, as the engine counted them.
    first: Option<(u32, Option<u32>)>,
    /// This run's prompt and cached tokens (`None` until its final usage reported them).
    this: Option<(u32, Option<u32>)>,
    /// Prompt tokens of resumed runs not served from the prefix cache.
    recomputed: u32,
    /// Prompt tokens of resumed runs whose cache hit the engine never reported: cut again
    /// before their final usage, the only chunk that carries it.
    unreported: u32,
    /// Times pre-empted.
    preempted: u32,
    /// Times a run was cut by the engine and the job went on (`jobs.engine_retries`).
    engine_cuts: u32,
    /// Where the last pre-emption cut its run: `prefill` (no token yet) or `decode`.
    stage: &'static str,
}

impl Progress {
    /// What a job handed back with its text carries to the replica that continues it (the
    /// text itself is the job's).
    fn to_json(&self) -> serde_json::Value {
        json!({
            "preempted": self.preempted,
            "engine_cuts": self.engine_cuts,
            "generated": self.generated,
            "pieces": self.pieces,
            "first": self.first.map(|(prompt, cached)| json!([prompt, cached])),
            "recomputed": self.recomputed,
            "unreported": self.unreported,
            "stage": self.stage,
        })
    }

    /// The progress of a job handed back with its text ([`Progress::to_json`]).
    fn resumed(resumed: Resumed) -> Self {
        let p = &resumed.progress;
        let number = |key: &str| {
            p.get(key)
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0)
        };
        let first = p.get("first").and_then(|f| {
            let prompt = u32::try_from(f.get(0)?.as_u64()?).ok()?;
            let cached = f
                .get(1)
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok());
            Some((prompt, cached))
        });
        let generated = number("generated");
        Self {
            text: resumed.text,
            pieces: usize::try_from(number("pieces")).unwrap_or(0),
            before: generated,
            generated,
            first,
            this: None,
            recomputed: number("recomputed"),
            unreported: number("unreported"),
            preempted: number("preempted"),
            engine_cuts: number("engine_cuts"),
            stage: match p.get("stage").and_then(serde_json::Value::as_str) {
                Some("prefill") => "prefill",
                _ => "decode",
            },
        }
    }

    /// One chunk of the current run: its text kept, its counts noted.
    fn chunk(&mut self, chunk: &Chunk, run: &mut dyn JobRun, handle: Option<&Preemptible>) {
        if !chunk.text.is_empty() {
            self.pieces += 1;
            self.text.push_str(&chunk.text);
            run.piece(&chunk.text);
        }
        if let Some(u) = chunk.usage {
            self.generated = self.before.saturating_add(u.completion_tokens);
            // Only the final usage chunk reports what was cached (left out when none was).
            let cached = chunk.usage_only.then(|| u.cached_tokens.unwrap_or(0));
            self.this = Some((u.prompt_tokens, cached));
            if let Some(h) = handle {
                h.generated(self.generated);
            }
        }
    }

    /// The current run ended: a resumed one's uncached prompt is counted, by the stage its
    /// previous run was pre-empted at. vLLM reports the cached tokens only in a stream's final
    /// usage (never in `continuous_usage_stats`), so a run cut again before its end has none:
    /// its prompt is counted as unreported, not as recomputed (with the prefix cache or KV
    /// offloading most of it was a hit; nobody can tell how much).
    fn run_ended(&mut self, ctx: &Context) {
        // The first run is the first that reported usage before any pre-emption: a run the
        // engine cut before it counted anything (refused at connect) did not take its place.
        let first = self.first.is_none() && self.preempted == 0;
        match (self.this.take(), first) {
            (Some(counts), true) => self.first = Some(counts),
            (Some((prompt, Some(cached))), false) => {
                let n = prompt.saturating_sub(cached);
                self.recomputed = self.recomputed.saturating_add(n);
                ctx.metrics().recomputed(self.stage, n);
            }
            (Some((prompt, None)), false) => {
                self.unreported = self.unreported.saturating_add(prompt);
                ctx.metrics().unreported(prompt);
            }
            (None, _) => {}
        }
    }

    /// Runs that continued the answer so far (after a pre-emption or an engine's cut).
    fn continued(&self) -> u32 {
        self.preempted.saturating_add(self.engine_cuts)
    }

    /// The current run was cut (pre-empted, or by the engine): its counts are closed, and the
    /// next run continues from the text.
    fn cut(&mut self, ctx: &Context) {
        self.run_ended(ctx);
        // Cut before its first token, the run's uncached prompt on resuming is partly work
        // never done (its prefill was cut), not only work done again.
        self.stage = if self.generated > self.before {
            "decode"
        } else {
            "prefill"
        };
        if self.text.is_empty() && self.generated > 0 {
            // No answer text yet (a reasoning model still reasoning): the continuation is the
            // request as first sent, which generates those tokens again; counted once, as the
            // run that is kept generates them.
            tracing::info!(
                tokens = self.generated,
                "cut before any answer text: its tokens are generated again"
            );
            self.generated = 0;
        }
        self.before = self.generated;
    }

    /// The current run was cut by the engine (`e`): it goes on once the engine is back.
    fn engine_cut(&mut self, ctx: &Context, e: &GatewayError) {
        self.cut(ctx);
        self.engine_cuts += 1;
        ctx.metrics().engine_cut();
        tracing::warn!(
            code = e.code(),
            error = %e.log_summary(),
            tokens = self.generated,
            times = self.engine_cuts,
            "a job's run was cut by the engine: it goes on from its text once the engine is ready"
        );
    }

    /// The current run was pre-empted for the request `handle` names.
    fn preempted(&mut self, ctx: &Context, handle: &Preemptible) {
        self.cut(ctx);
        self.preempted += 1;
        if let Some(cause) = handle.cause() {
            ctx.metrics().preempted(cause.lane, cause.reason);
        }
        tracing::info!(
            tokens = self.generated,
            times = self.preempted,
            "job pre-empted"
        );
    }

    /// The usage of the whole answer: the first run's prompt (the estimate when the engine sent
    /// none), every output token once, and what resuming recomputed.
    fn usage(&self, class: &Classification) -> serde_json::Value {
        let (input, cached) = self.first.unwrap_or((class.input_tokens_estimate, None));
        let mut usage = json!({
            "input_tokens": input,
            "output_tokens": self.generated.max(u32::try_from(self.pieces).unwrap_or(u32::MAX)),
            "cached_tokens": cached.unwrap_or(0),
        });
        if self.continued() > 0 {
            usage["recomputed_tokens"] = json!(self.recomputed);
        }
        if self.unreported > 0 {
            usage["unreported_prompt_tokens"] = json!(self.unreported);
        }
        usage
    }

    /// The answer of a job pre-empted when nothing was left to generate.
    fn cut_answer(&self, class: &Classification) -> Answer {
        Answer {
            finish_reason: Some("length".to_owned()),
            usage: self.usage(class),
            timings: crate::telemetry::LatencySplit::default(),
            tool_calls: Vec::new(),
        }
    }
}

/// Waits for a seat to resume `ready` on (see `run`): tried at once and whenever capacity may
/// have come back; meanwhile the scheduler starts no queued job. Ends with the run's outcome
/// instead when it is lost, cancelled or handed back first.
async fn reseat(
    ctx: &Context,
    ready: &Ready,
    eligible: bool,
    lost: &mut (impl std::future::Future<Output = ()> + Unpin),
    cancelled: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Result<(LaneGuard, Arc<Preemptible>), Option<Ended>> {
    let _resuming = Resuming::new(ctx);
    let admission = ctx.state.admission();
    let mut freed = admission.freed();
    loop {
        if let Some(f) = freed.as_mut() {
            f.borrow_and_update();
        }
        let handle = Preemptible::new(eligible);
        let (lane, work, prefill) = (ready.class.lane, ready.class.work, ready.prefill);
        // As the job first started: without jobs.preempt on an idle seat of its lane (no wait
        // for every queue to empty, nor for a pre-emption's cool-down).
        let guard = match ctx.config.preempt {
            true => admission.try_acquire_preemptible(lane, work, prefill, &handle),
            false => admission.try_acquire_idle(lane, work, prefill),
        };
        if let Some(guard) = guard {
            return Ok((guard, handle));
        }
        let changed = async {
            match freed.as_mut() {
                Some(f) => drop(f.changed().await),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // One outcome when several come in one wake-up (a key revoked at shutdown ends
            // the job as its revocation, not handed back): lost, cancelled, stopped, then on.
            biased;
            () = &mut *lost => return Err(None),
            () = &mut *cancelled => return Err(Some(Ended::Cancelled)),
            () = ctx.stop.cancelled() => return Err(Some(Ended::HandedBack(None))),
            () = changed => {}
        }
    }
}

/// A job waiting to resume (for a seat, or for the engine): while any does, the scheduler
/// starts no queued job.
struct Resuming<'a>(&'a Context);

impl<'a> Resuming<'a> {
    fn new(ctx: &'a Context) -> Self {
        ctx.resuming.fetch_add(1, Ordering::SeqCst);
        Resuming(ctx)
    }
}

impl Drop for Resuming<'_> {
    fn drop(&mut self) {
        self.0.resuming.fetch_sub(1, Ordering::SeqCst);
        // Queued jobs may start again.
        self.0.wake.notify_one();
    }
}

/// A run's record under request id `id`: the submission's tenant and classification (its lane
/// label) and the model's calibration, as the first run's own record has them.
pub(super) fn run_record(state: &AppState, ready: &Ready, id: String) -> RequestRecord {
    let mut record = state.record_as(Route::Job, id);
    if let Some(tenant) = ready.tenant() {
        record.tenant(&tenant.0);
    }
    record.classified(ready.class);
    let model = ready
        .model()
        .unwrap_or(&state.config().upstream.model)
        .to_owned();
    let tenant = ready.tenant().map(|t| t.0.as_str());
    // As the request's own record would (a job with `chat_template_kwargs` taught the shared
    // correction from text a template may drop).
    if ready.teaches() {
        record.calibrates(state.calibration(), &model, tenant);
    }
    record
}

/// A finished stream's answer: its finish reason, usage (the engine's, or the estimate and the
/// pieces streamed when it sent none; across pre-emptions, every output token once) and timings.
fn answer(
    ctx: &Context,
    all: Collected,
    class: &Classification,
    progress: &mut Progress,
) -> Answer {
    if let Some(u) = all.usage {
        progress.generated = progress.before.saturating_add(u.completion_tokens);
        progress.this = Some((u.prompt_tokens, u.cached_tokens));
    }
    progress.run_ended(ctx);
    Answer {
        finish_reason: all.finish_reason,
        usage: progress.usage(class),
        timings: all.timings,
        tool_calls: all.tool_calls.iter().map(ToolCallDelta::to_json).collect(),
    }
}

/// A run failed for the engine: no job starts until the engine's health is looked at again
/// (`upstream.health_cache_ms` from now, and a second).
fn pause_for_engine(ctx: &Context) {
    let until = tokio::time::Instant::now()
        + ctx.state.config().upstream.health_cache
        + std::time::Duration::from_secs(1);
    *ctx.engine_pause
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(until);
}

fn failed(e: &GatewayError) -> Ended {
    if e.outcome().is_fault() {
        tracing::warn!(code = e.code(), error = %e.log_summary(), "job failed");
    } else {
        tracing::info!(code = e.code(), error = %e.log_summary(), "job failed");
    }
    Ended::Failed(e.code(), e.message())
}
