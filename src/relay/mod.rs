//! The stream pump: reads vLLM's chunks, forwards them to the client, counts tokens, and on every
//! end gives the lane slot back.
//!
//! - `/v1` streams ([`Format::OpenAi`]) are relayed faithfully: the client sees vLLM's own
//!   `data:` payloads; the final usage-only chunk is dropped when the client did not ask for
//!   usage (the gateway always asks vLLM for it, to count tokens exactly).
//! - `/answer` streams ([`Format::Answer`]) become typed SSE events (`meta`, `token`, `done`,
//!   `error`; see the README).
//!
//! A [`Relay`] owns the [`LaneGuard`] and the [`UpstreamStream`]. A streamed response runs it in
//! a task of its own on the gateway's task tracker ([`Relay::into_sse`], the `pump` module)
//! that reads vLLM at the engine's pace into a bounded per-stream buffer
//! (`server.client_buffer_bytes`, the `client` module) which the response body drains as the
//! client reads: counting, promotion, cuts, the upstream timeouts (their timers run whether or
//! not the client reads) and the seat's release follow the engine, never the client. A client
//! that falls more than the buffer behind, or takes nothing for
//! `server.client_write_timeout_ms` while bytes wait, is cut with the code `client_too_slow`
//! and the engine's work aborted. When the client goes away the response body drops and the
//! pump sees it at once: it drops the relay, the upstream connection closes, the engine abort
//! fires once (the upstream stream's own guard), the slot and tokens come back, and
//! `cancelled_after_tokens` is recorded. At the first token it gives the guard's prefill
//! reservation back ([`LaneGuard::prefill_done`]); the seat and tokens stay until the chunk
//! with the finish reason (the engine is done then), whether or not `[DONE]` follows, and
//! whatever the client has read by then. A non-streaming answer ([`Relay::collect`]) is read
//! whole in its handler, at the engine's pace too.
//!
//! Mid-stream limits (M14, [`LaneRules`]): the relay counts output tokens itself (vLLM's chunks
//! and usage); past its lane's limit a request's reservation moves to the next lane without a
//! pause the client could notice, or the stream is cut with a clear message (`/answer`: a `cut`
//! event before `done`; `/v1`: a last chunk with `finish_reason: "length"` and a
//! `"tutor_gateway": {"cut": "lane_limit", ...}` object) and the engine's work is aborted.
//!
//! Shutdown ([`Drain`]): a relay started by a request handler ends when its gateway's grace
//! period is over. It aborts the engine's work, gives its seat and tokens back, records the
//! request with the error code `shutdown`, and tells the client as any mid-stream error:
//! `/answer` gets an `error` event `{"code":"shutdown","message":…}`, a `/v1` stream a
//! `data: {"error": …}` event then `data: [DONE]`, a non-streaming `/v1` request a 503.
//!
//! A panic (a bug) while a stream is read ends it the same way with the code `internal`
//! (`pump`): the engine's work aborted, the seat and tokens given back, the request recorded
//! `internal` and counted in `tutor_gateway_panics_total{at="relay"}`. A relay unwound by a
//! panic in its handler (a non-streaming answer read there) records `internal` as it drops.

mod answer;
mod client;
mod collect;
mod cut;
mod drain;
pub mod held;
pub mod late_count;
mod pump;
mod resume;

use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use tokio::time::Instant;

pub use answer::error_event_with;
pub use client::{ClientBody, ClientLimits, ConnectionCloser};
pub use collect::Collected;
pub use drain::Drain;
pub use resume::Continuation;

use crate::admission::preempt::Cause;
use crate::admission::session::SessionHold;
use crate::admission::tenant_budget::BudgetHold;
use crate::admission::{LaneGuard, Move};
use crate::classify::decision::prompt_slack;
use crate::classify::{Classification, LaneRules};
use crate::config::WhenFull;
use crate::error::GatewayError;
use crate::telemetry::{LatencySplit, Mark, Metrics, Outcome, RequestRecord, UpstreamView};
use crate::upstream::{Chunk, ToolCallDelta, UpstreamError, UpstreamStream};

/// How the client wants the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// vLLM's chunks as they are.
    OpenAi {
        /// Whether the client asked for the final usage chunk.
        include_usage: bool,
        /// Whether the client asked for running usage on every chunk (the gateway always asks
        /// vLLM for it, to count tokens exactly, and strips it otherwise).
        continuous_usage: bool,
    },
    /// The `/answer` event stream.
    Answer,
}

/// What the relay needs besides the stream: the rules and where to count.
#[derive(Debug)]
pub struct RelayContext {
    /// The lane rules (mid-stream limits, next lane, reservation).
    pub rules: LaneRules,
    /// Metrics (promotions, cuts).
    pub metrics: Metrics,
    /// The reservation in the session this request continues, settled with its output.
    pub session: Option<SessionHold>,
    /// Its tenant's budget charge, settled with its prompt + output tokens.
    pub budget: Option<BudgetHold>,
    /// The `focus` object of the `/answer` `meta` event, for course requests with code (M11).
    pub focus: Option<serde_json::Value>,
    /// The output tokens the engine may generate at most (the `max_tokens` sent: the client's,
    /// or the gateway's cap): what a promotion needs to reserve beyond the prompt (`None`: up
    /// to the next lane's work bound).
    pub engine_cap: Option<u32>,
    /// Its prompt, counted by the engine if the request ends before vLLM reports it
    /// ([`late_count`]).
    pub late_count: Option<late_count::LateCount>,
}

/// One admitted request on its way back to the client.
#[derive(Debug)]
pub struct Relay {
    upstream: UpstreamStream,
    guard: Option<LaneGuard>,
    class: Classification,
    format: Format,
    record: RequestRecord,
    ctx: RelayContext,
    first_chunk: Option<cut::ChunkIdentity>,
    cut: Option<cut::CutInfo>,
    /// `/answer` token and tool-call events sent (their ids).
    pieces: u32,
    /// `/answer`: the tool calls streamed so far, joined (its `done` event lists them).
    calls: Vec<ToolCallDelta>,
    /// The steps this stream lived through (`crate::telemetry::step_window`).
    steps: Steps,
    done: bool,
    /// The shutdown of the gateway whose handler started this relay (none for a job's).
    drain: Option<Drain>,
    /// A pre-emptible `/answer` stream's way on and its state across runs (`resume.rs`).
    resume: Option<resume::Resumable>,
    /// Events already arrived taken since its seat was asked back (at most
    /// [`EVENTS_AFTER_ASK`]).
    events_after_ask: u8,
}

/// Events a pre-emptible stream whose seat was asked back may still take when they have
/// already arrived (a finish among them ends the answer): a bound, so an engine or a burst
/// that keeps one waiting cannot put the seat's return off.
const EVENTS_AFTER_ASK: u8 = 16;

/// A stream's content chunks in time: first, last, how many, the longest gap between two.
#[derive(Debug, Default)]
struct Steps {
    first: Option<Instant>,
    last: Option<Instant>,
    chunks: u32,
    longest: Duration,
}

impl Steps {
    fn chunk(&mut self, at: Instant) {
        if let Some(last) = self.last {
            self.longest = self.longest.max(at.saturating_duration_since(last));
        }
        self.first.get_or_insert(at);
        self.last = Some(at);
        self.chunks = self.chunks.saturating_add(1);
    }

    /// Leaves the stream's sample for the autopilot.
    fn observe(&self, metrics: &Metrics) {
        if let (Some(first), Some(last)) = (self.first, self.last) {
            metrics.step_window().observe(
                first,
                self.chunks,
                last.saturating_duration_since(first),
                self.longest,
            );
        }
    }
}

/// What ended a wait for the next upstream event.
// One per upstream event, moved once into `step`: boxing the chunk would allocate per token.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// The event (or the end of the stream).
    Event(Option<Result<Chunk, UpstreamError>>),
    /// The gateway's grace period is over: the stream ends now.
    Shutdown,
    /// Admission asked a pre-emptible stream's seat back: it goes on as a continuation.
    Preempted,
}

impl Relay {
    /// A relay for `upstream`, holding `guard` until the stream ends; `record` is written then.
    /// Started inside a request handler, it ends when that gateway's grace period is over
    /// ([`Drain::current`]).
    pub fn new(
        upstream: UpstreamStream,
        guard: LaneGuard,
        class: Classification,
        format: Format,
        record: RequestRecord,
        ctx: RelayContext,
    ) -> Self {
        Self {
            upstream,
            guard: Some(guard),
            class,
            format,
            record,
            ctx,
            first_chunk: None,
            cut: None,
            pieces: 0,
            calls: Vec::new(),
            steps: Steps::default(),
            done: false,
            drain: Drain::current(),
            resume: None,
            events_after_ask: 0,
        }
    }

    /// The same relay, pre-emptible (`jobs.preempt_answers`): asked for its seat, it goes on
    /// through `how` (see `resume.rs`); `notice`: the client gets a `meta` event then.
    pub fn resumable(mut self, how: Box<dyn Continuation>, notice: bool) -> Self {
        self.resume = Some(resume::Resumable::new(how, notice));
        self
    }

    /// What the engine told so far, for the whole answer (across a pre-empted stream's runs).
    fn view(&self) -> UpstreamView {
        let current = self.upstream.view();
        match &self.resume {
            Some(r) => r.merged(current),
            None => current,
        }
    }

    /// The gateway's request id.
    pub fn request_id(&self) -> &str {
        self.upstream.request_id()
    }

    /// Output tokens counted so far (exact once vLLM sent usage, else the chunks that carried
    /// tokens).
    fn produced(&self) -> u32 {
        let before = self.resume.as_ref().map_or(0, |r| r.before);
        before.saturating_add(self.upstream.output_tokens().count)
    }

    /// What the engine served so far: its usage's prompt (else the estimate) and the output.
    fn served(&self) -> u64 {
        let prompt = self
            .view()
            .usage
            .map_or(self.class.input_tokens_estimate, |u| u.prompt_tokens);
        u64::from(prompt).saturating_add(u64::from(self.produced()))
    }

    /// Marks the end: writes the record, counts the session's output and frees the slot.
    fn finish(&mut self, outcome: Outcome, error_code: Option<&str>) {
        if self.done {
            return;
        }
        self.done = true;
        let served = self.served();
        if let Some(mut guard) = self.guard.take() {
            // Its tenant's fleet service settles to it (`auth.fleet_fairness`).
            guard.served(served);
        }
        if let Some(hold) = self.ctx.session.take() {
            hold.settle(self.produced());
        }
        // Ended before the engine reported its prompt (a pre-empted request's continuation
        // reports it): counted now, its budget settled to the count.
        let late = self
            .ctx
            .late_count
            .take()
            .filter(|_| outcome != Outcome::Preempted && self.view().usage.is_none());
        match late {
            Some(late) => late.count(
                self.ctx.budget.take(),
                self.class.input_tokens_estimate,
                self.produced(),
            ),
            None => {
                if let Some(budget) = self.ctx.budget.take() {
                    budget.settle(served);
                }
            }
        }
        if let Some(replica) = self.upstream.replica() {
            self.record.served_by(replica);
        }
        if outcome == Outcome::Ok {
            self.steps.observe(&self.ctx.metrics);
        }
        let current = self.upstream.view();
        if let Some(r) = self.resume.as_mut() {
            r.run_ended(&current, &self.ctx.metrics);
        }
        let view = self.view();
        self.record.finish(outcome, error_code, Some(&view));
    }

    /// The next upstream event, noting the first token and its chunk identity.
    async fn next_event(&mut self) -> Option<Result<Chunk, UpstreamError>> {
        #[cfg(test)]
        crate::faults::mid_stream(self.ctx.engine_cap, self.steps.chunks);
        let ev = self.upstream.next_event().await;
        if self.ctx.late_count.is_some() && self.view().usage.is_some() {
            // The engine reported the prompt: its kept body and bytes go now, not at the end.
            self.ctx.late_count = None;
        }
        if let Some(Ok(chunk)) = &ev {
            if self.first_chunk.is_none() {
                self.first_chunk = cut::ChunkIdentity::of(chunk);
            }
            if chunk.has_content {
                self.steps.chunk(Instant::now());
                self.record.first_token();
            }
            if chunk.has_token {
                // Its prefill is over: long prompts waiting for prefill room may go.
                if let Some(guard) = self.guard.as_mut() {
                    guard.prefill_done();
                }
            }
            if chunk.finish_reason.is_some() {
                // The engine is done with it: the seat and tokens are free now, whatever
                // follows (the usage chunk, `[DONE]`, or nothing). Its tenant's fleet service
                // settles to what was counted by now (the usage when it came with this chunk).
                let served = self.served();
                if let Some(mut guard) = self.guard.take() {
                    guard.served(served);
                }
            }
        }
        ev
    }

    /// [`Relay::next_event`], unless the gateway's grace period is over first.
    async fn next_or_shutdown(&mut self) -> Next {
        // A pre-emptible stream's seat asked back (only one that can go on).
        let leave = self
            .guard
            .as_ref()
            .filter(|_| self.resume.is_some())
            .and_then(LaneGuard::preemptible)
            .map(|h| h.preempted());
        if self.drain.is_none() && leave.is_none() {
            return Next::Event(self.next_event().await);
        }
        let drain = self.drain.clone();
        let ending = ending(drain.as_ref());
        let leave = async {
            match leave {
                Some(l) => l.await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            biased;
            () = ending => Next::Shutdown,
            () = leave => Next::Preempted,
            ev = self.next_event() => Next::Event(ev),
        };
        if matches!(next, Next::Preempted) && self.events_after_ask < EVENTS_AFTER_ASK {
            // Events the engine already sent come first, a few at most (the ask stays until
            // the seat is given): a finish among them is a complete answer, its seat given
            // back with it, not a run to continue.
            if let Some(ev) = futures::FutureExt::now_or_never(self.next_event()) {
                self.events_after_ask = self.events_after_ask.saturating_add(1);
                return Next::Event(ev);
            }
        }
        next
    }

    /// Lets the engine's request go (its seat was asked back) and goes on with a continuation
    /// sent in its place (`resume.rs`): the client's stream carries on, with a `meta` event
    /// into `out` when so configured. When the continuation cannot be had (no seat in time, the
    /// engine unreachable), the stream ends with that error.
    async fn go_on(&mut self, out: &mut Vec<u8>) {
        if self.resume.is_none() {
            return;
        }
        let generated = self.produced();
        let cause = self.guard.as_ref().and_then(|g| g.preemptible_cause());
        // The engine's work is aborted and the seat comes back now: the request that asked
        // for it gets it.
        self.upstream.abort_now();
        drop(self.guard.take());
        self.events_after_ask = 0;
        // The autopilot's step sample is the kept run's alone: the pause until a continuation
        // gets a seat is no engine step.
        self.steps = Steps::default();
        if let Some(cause) = cause {
            self.ctx.metrics.jobs().preempted(cause.lane, cause.reason);
        }
        let current = self.upstream.view();
        let Some(r) = self.resume.as_mut() else {
            return;
        };
        let times = r.cut(current, &self.ctx.metrics);
        // The engine's count of the request's own prompt, from the first run's usage.
        let prompt_counted = r
            .first
            .as_ref()
            .and_then(|v| v.usage)
            .map(|u| u.prompt_tokens);
        tracing::info!(request_id = %self.upstream.request_id(), tokens = generated, times, "answer pre-empted; it goes on as a continuation");
        // Until a continuation takes over, the cut run stays the current one, so the answer's
        // view (and a record ended meanwhile, the client gone) is the runs so far.
        let text = std::mem::take(&mut r.text);
        // A continuation carries the text, not tool calls: a call under way is generated again
        // from its first piece (which has its `id`), and `done` lists the calls of the runs
        // that follow.
        self.calls.clear();
        // No answer text yet (a reasoning model still reasoning, which `/answer` does not
        // relay): the continuation is the request as first sent, which generates those tokens
        // again; the answer counts them once, as the run that is kept generates them.
        let kept = if text.is_empty() { 0 } else { generated };
        if kept < generated {
            tracing::info!(request_id = %self.upstream.request_id(), tokens = generated, "pre-empted before any answer text: its tokens are generated again");
        }
        // The continuation waits for a seat, which may take the lane's whole queue timeout
        // (held by another replica's streams): the end of the grace ends that wait too.
        let drain = self.drain.clone();
        let next = tokio::select! {
            biased;
            () = ending(drain.as_ref()) => Err(GatewayError::Shutdown),
            next = r.how.resume(&text, kept, times, prompt_counted) => next,
        };
        r.text = text;
        match next {
            Ok(Some((upstream, guard))) => {
                r.continued(kept);
                if r.notice {
                    out.extend_from_slice(&answer::preempted_event(times));
                }
                self.upstream = upstream;
                self.guard = Some(guard);
            }
            Ok(None) => {
                // Nothing was left to generate: what the client has is the answer.
                let view = self.view();
                out.extend_from_slice(&answer::done_event_with(
                    &view,
                    &self.class,
                    self.timings(),
                    &self.calls,
                    Some("length"),
                ));
                self.finish(Outcome::Ok, None);
            }
            Err(err) => {
                tracing::warn!(request_id = %self.request_id(), code = err.code(), "a pre-empted answer could not go on");
                self.render_error(&err, out);
                self.finish(err.outcome(), Some(err.code()));
            }
        }
    }

    /// Whether the gateway's grace period is over.
    fn shutting_down(&self) -> bool {
        self.drain.as_ref().is_some_and(Drain::streams_ending)
    }

    /// Ends the request because the gateway is shutting down: aborts the engine's work, frees
    /// the seat and ends the record. The caller tells the client with the error returned.
    fn end_for_shutdown(&mut self) -> GatewayError {
        let err = GatewayError::Shutdown;
        tracing::info!(request_id = %self.request_id(), lane = %self.class.lane, tokens = self.produced(), "stream ended: the gateway is shutting down");
        self.upstream.abort_now();
        self.finish(err.outcome(), Some(err.code()));
        err
    }

    /// Keeps the request's reservation covering what it holds in the engine
    /// ([`LaneRules::bound_move`]): grows it in its lane when its output passed what was
    /// reserved, and moves it to the next lane while it has outgrown the current one; in a lane
    /// it cannot outgrow, grows it when the engine counted its prompt well past the estimate
    /// ([`LaneRules::prompt_growth`]); `false` when it must be cut (the lane it needs stayed
    /// full). The prompt is the larger of the estimate and the engine's count.
    async fn keep_in_bounds(&mut self) -> bool {
        let rules = self.ctx.rules;
        let drain = self.drain.clone();
        loop {
            let from = self.class.lane;
            let produced = self.produced();
            let estimate = self.class.input_tokens_estimate;
            // The engine's exact count of the prompt, on every chunk of its running usage: what
            // the request holds, where the estimate counted it well short (within the slack, an
            // honest estimate's miss, the estimate stands).
            let counted = self.view().usage.map_or(0, |u| u.prompt_tokens);
            let input = if counted > estimate.saturating_add(prompt_slack(estimate)) {
                counted
            } else {
                estimate
            };
            let output_budget = self.class.output_budget;
            let Some(guard) = self.guard.as_mut() else {
                return true;
            };
            let reserved = guard.tokens();
            // A borrowed (pre-emptible) seat cannot grow where it is: it leaves when its lane's
            // own requests need it. (One no longer asked back, past `jobs.max_preemptions`,
            // is still borrowed: it was cut at its first token.)
            let borrowed = guard.is_borrowed();
            if borrowed
                && rules
                    .prompt_growth(from, estimate, input, output_budget, reserved)
                    .is_some()
            {
                // It holds far more than it borrowed its seat with, and cannot grow there:
                // while it may still leave, it does, and its continuation reserves the
                // engine's count (`Ready::continued`). (It went on holding it to its end.)
                if let Some(handle) = guard.preemptible() {
                    handle.ask(Cause::counted(from));
                }
            }
            let Some((to, tokens)) = rules
                .bound_move(from, input, produced, reserved)
                // Moved to the next lane, it holds at most its prompt and what the engine may
                // still generate: a declared limit far under that lane's bound reserves only
                // that (it reserved the whole bound, and was cut where that much had no room).
                .map(|(to, tokens)| match self.ctx.engine_cap {
                    Some(cap) if to != from => {
                        (to, tokens.min(input.saturating_add(cap)).max(reserved))
                    }
                    _ => (to, tokens),
                })
                .or_else(|| {
                    (!borrowed)
                        .then(|| {
                            rules.prompt_growth(from, estimate, input, output_budget, reserved)
                        })
                        .flatten()
                })
            else {
                return true;
            };
            let deadline = Instant::now() + rules.wait;
            // Counted while it waits for room (`tutor_gateway_promotions_waiting`).
            let mut waiting = None;
            loop {
                match guard.promote(to, tokens).await {
                    Move::Done => break,
                    // Pre-emptible work is leaving for it (a job asked back): its room comes
                    // within moments, so the stream waits for it (at most `rules.wait`)
                    // whatever `when_full` says, rather than be cut for background work.
                    Move::Asked => {}
                    Move::Full if rules.when_full == WhenFull::Cut => return false,
                    Move::Full => {}
                }
                if Instant::now() >= deadline {
                    return false;
                }
                waiting.get_or_insert_with(|| self.ctx.metrics.promotion().waiting(to));
                // Paused: vLLM keeps generating into the connection's buffers meanwhile. The
                // end of the grace ends the wait: the stream ends with `shutdown` at its next
                // event ([`Relay::next_or_shutdown`]), not cut, nor held to `rules.wait`.
                tokio::select! {
                    biased;
                    () = ending(drain.as_ref()) => return true,
                    () = tokio::time::sleep(std::time::Duration::from_millis(25)) => {}
                }
            }
            drop(waiting);
            self.record.reserved(guard.tokens());
            if to == from {
                tracing::info!(request_id = %self.request_id(), lane = %from, reserved = tokens, tokens = produced, "reservation grown mid-stream");
                continue;
            }
            tracing::info!(request_id = %self.request_id(), %from, %to, tokens = produced, "promoted mid-stream");
            self.ctx.metrics.promotion().promoted(from, to);
            self.class.lane = to;
            self.record.promoted(from, to);
        }
    }

    /// Cuts the stream at its lane's limit: aborts the engine's work and ends the record.
    fn cut_here(&mut self) -> cut::CutInfo {
        let info = cut::CutInfo::new(self.class.lane, self.produced());
        tracing::info!(request_id = %self.request_id(), lane = %self.class.lane, after_tokens = info.after_tokens, "stream cut at the lane limit");
        self.ctx.metrics.promotion().cut(self.class.lane);
        self.upstream.abort_now();
        self.cut = Some(info.clone());
        info
    }

    /// Handles one event into `out`; with tokens (or a count of them), enforces the lane limit.
    async fn step(&mut self, ev: Option<Result<Chunk, UpstreamError>>, out: &mut Vec<u8>) {
        let counted = matches!(&ev, Some(Ok(c)) if c.counts_output());
        self.render(ev, out);
        if counted && !self.done && !self.keep_in_bounds().await {
            let info = self.cut_here();
            match self.format {
                Format::OpenAi { include_usage, .. } => {
                    out.extend_from_slice(&cut::final_chunk(self.first_chunk.as_ref(), &info));
                    if include_usage {
                        // The usage chunk vLLM would have sent last, as the engine counted so
                        // far (the prompt from its running usage, else the estimate).
                        let usage = self.view().usage;
                        let prompt =
                            usage.map_or(self.class.input_tokens_estimate, |u| u.prompt_tokens);
                        let cached = usage.and_then(|u| u.cached_tokens);
                        out.extend_from_slice(&cut::usage_chunk(
                            self.first_chunk.as_ref(),
                            prompt,
                            info.after_tokens,
                            cached,
                        ));
                    }
                    out.extend_from_slice(b"data: [DONE]\n\n");
                }
                Format::Answer => {
                    out.extend_from_slice(&cut::cut_event(&info));
                    out.extend_from_slice(&answer::done_event_with(
                        &self.view(),
                        &self.class,
                        self.timings(),
                        &self.calls,
                        Some("length"),
                    ));
                }
            }
            self.finish(Outcome::Cut, Some(cut::CODE));
        }
    }

    /// The next piece of the SSE body, or `None` at the end. Waits for one event that renders
    /// to something, then takes every event already available without waiting, so a client (or
    /// a gateway) that fell behind catches up in one write instead of one write per chunk.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let read_before = self.upstream.last_read_at();
        let mut out = Vec::new();
        while out.is_empty() && !self.done {
            match self.next_or_shutdown().await {
                Next::Event(ev) => self.step(ev, &mut out).await,
                Next::Shutdown => {
                    let err = self.end_for_shutdown();
                    self.render_error(&err, &mut out);
                }
                Next::Preempted => self.go_on(&mut out).await,
            }
        }
        // What is already here goes in the same write; its clock started at the read above.
        let read_at = self.upstream.last_read_at();
        while !self.done && !self.shutting_down() {
            match self.next_event().now_or_never() {
                Some(ev) => self.step(ev, &mut out).await,
                None => break,
            }
        }
        if let Some(read_at) = read_at {
            // The gateway's own time from a read to its write: a write with no new read (a
            // timeout's error, the end after a silent engine) did not wait on the gateway.
            if read_before != Some(read_at) {
                self.ctx.metrics.relay().observe(read_at.elapsed());
            }
            self.record.mark_at(Mark::FirstUpstreamByte, read_at);
        }
        self.record.mark(Mark::FirstClientByte);
        Some(Bytes::from(out))
    }

    /// Renders one upstream event (or the end) into `out`, finishing the relay at the end.
    fn render(&mut self, ev: Option<Result<Chunk, UpstreamError>>, out: &mut Vec<u8>) {
        match ev {
            Some(Ok(chunk)) => {
                if let Some(bytes) = self.render_chunk(&chunk) {
                    out.extend_from_slice(&bytes);
                }
            }
            None => {
                out.extend_from_slice(&self.render_end());
                self.finish(Outcome::Ok, None);
            }
            Some(Err(e)) => {
                let err = GatewayError::from(e);
                // A request the engine refused in its stream (a grammar it cannot build) is
                // the client's: counted, not a warning.
                if err.outcome().is_fault() {
                    tracing::warn!(request_id = %self.request_id(), code = err.code(), error = %err.log_summary(), "stream ended with an error");
                } else {
                    tracing::debug!(request_id = %self.request_id(), code = err.code(), error = %err.log_summary(), "stream ended with an error");
                }
                self.render_error(&err, out);
                self.finish(err.outcome(), Some(err.code()));
            }
        }
    }

    /// A mid-stream error as the client's format shows it: on `/v1` a `data: {"error": …}`
    /// event then `data: [DONE]` (as vLLM does), on `/answer` an `error` event.
    fn render_error(&self, err: &GatewayError, out: &mut Vec<u8>) {
        match self.format {
            Format::OpenAi { .. } => out
                .extend_from_slice(format!("data: {}\n\ndata: [DONE]\n\n", err.body()).as_bytes()),
            Format::Answer => {
                out.extend_from_slice(&answer::error_event(err.code(), &err.message()))
            }
        }
    }

    fn render_chunk(&mut self, chunk: &Chunk) -> Option<Bytes> {
        match self.format {
            Format::OpenAi {
                include_usage,
                continuous_usage,
            } => {
                let payload = if chunk.usage.is_some() {
                    collect::usage_for_client(chunk, include_usage, continuous_usage)?
                } else {
                    chunk.raw.clone()
                };
                let mut out = Vec::with_capacity(payload.len() + 8);
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&payload);
                out.extend_from_slice(b"\n\n");
                Some(Bytes::from(out))
            }
            Format::Answer => {
                let token = answer::token_event(chunk, self.pieces.saturating_add(1));
                if token.is_some() {
                    self.pieces = self.pieces.saturating_add(1);
                }
                if let Some(r) = self.resume.as_mut() {
                    r.text.push_str(&chunk.text);
                }
                if chunk.tool_calls.is_empty() {
                    return token;
                }
                // Tool-call pieces, numbered after the chunk's text.
                let mut out = token.map(Vec::from).unwrap_or_default();
                for piece in &chunk.tool_calls {
                    self.pieces = self.pieces.saturating_add(1);
                    out.extend_from_slice(&answer::tool_call_event(piece, self.pieces));
                    ToolCallDelta::join_into(&mut self.calls, piece);
                }
                Some(Bytes::from(out))
            }
        }
    }

    fn render_end(&self) -> Bytes {
        match self.format {
            Format::OpenAi { .. } => Bytes::from_static(b"data: [DONE]\n\n"),
            Format::Answer => {
                answer::done_event(&self.view(), &self.class, self.timings(), &self.calls)
            }
        }
    }

    /// The latency split so far.
    pub fn timings(&self) -> LatencySplit {
        let view = self.view();
        LatencySplit::compute(
            self.record.arrival(),
            self.record.admitted_at(),
            Some(&view),
            Instant::now(),
        )
    }

    /// Reads the whole answer (non-streaming `/v1`), under the same lane limits.
    pub async fn collect(self) -> Result<Collected, GatewayError> {
        self.collect_with(|_| {}).await
    }

    /// [`Relay::collect`], showing each chunk to `on_chunk` as it arrives (a job keeps its
    /// text so far readable). Dropping the future mid-way ends the request as a client
    /// disconnect does: the engine's work is aborted and everything is given back. When the
    /// gateway's grace period is over first, the same happens and it fails with
    /// [`GatewayError::Shutdown`].
    pub async fn collect_with(
        mut self,
        mut on_chunk: impl FnMut(&Chunk) + Send,
    ) -> Result<Collected, GatewayError> {
        let mut acc = Collected::default();
        // What the engine sent, bytes: a whole answer is held in memory, so it may not pass
        // what `max_model_len` tokens take at most (their text and log-probabilities).
        let (mut received, most) = (0u64, collect::most_bytes(self.ctx.rules.max_model_len()));
        loop {
            let ev = match self.next_or_shutdown().await {
                Next::Event(ev) => ev,
                Next::Shutdown => return Err(self.end_for_shutdown()),
                // (A collected relay is never resumable: a job's runner handles its own.)
                Next::Preempted => continue,
            };
            match ev {
                Some(Ok(chunk)) => {
                    received = received.saturating_add(chunk.raw.len() as u64);
                    if received > most {
                        self.upstream.abort_now();
                        let err = GatewayError::from(UpstreamError::Protocol(format!(
                            "the engine's answer passed {most} bytes, more than \
                             upstream.max_model_len tokens take"
                        )));
                        self.finish(err.outcome(), Some(err.code()));
                        return Err(err);
                    }
                    on_chunk(&chunk);
                    acc.add(&chunk);
                    if chunk.counts_output() && !self.keep_in_bounds().await {
                        let info = self.cut_here();
                        acc.finish_reason = Some("length".into());
                        acc.cut = Some(info);
                        acc.usage = self.upstream.usage();
                        acc.timings = self.timings();
                        self.finish(Outcome::Cut, Some(cut::CODE));
                        return Ok(acc);
                    }
                }
                None => {
                    acc.usage = self.upstream.usage();
                    acc.timings = self.timings();
                    self.finish(Outcome::Ok, None);
                    return Ok(acc);
                }
                Some(Err(e)) => {
                    let err = GatewayError::from(e);
                    self.finish(err.outcome(), Some(err.code()));
                    return Err(err);
                }
            }
        }
    }
}

/// Resolves when `drain`'s grace period is over; never without a drain (a job's relay).
async fn ending(drain: Option<&Drain>) {
    match drain {
        Some(d) => d.ending().await,
        None => std::future::pending().await,
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if !self.done {
            // The client went away (or a pre-empted job let its stream go): the upstream
            // stream's guard aborts the engine's work when it drops right after this.
            // (A resumable stream dropped is its client gone, asked back or not.)
            let preempted =
                self.resume.is_none() && self.guard.as_ref().is_some_and(LaneGuard::is_preempted);
            if std::thread::panicking() {
                // Unwound by a panic (a bug) in its handler: not its client's doing.
                let err = GatewayError::Internal;
                self.finish(err.outcome(), Some(err.code()));
            } else if preempted {
                self.finish(Outcome::Preempted, None);
            } else if self.record.key_revoked() {
                // Its key revoked: the auth layer ended the stream, its client did not go.
                self.finish(Outcome::Cancelled, Some(crate::telemetry::INVALID_API_KEY));
            } else {
                self.finish(Outcome::Cancelled, None);
            }
        }
    }
}
