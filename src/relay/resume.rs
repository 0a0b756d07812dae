//! A pre-emptible `/answer` stream (`jobs.preempt_answers`, either quota backend): when
//! admission asks its borrowed seat back, the relay lets the engine's request go (it is
//! aborted, the seat comes back at once) and goes on with a continuation the pipeline sends
//! ([`Continuation`]: the messages and the text the client has, continued), so the client sees
//! one answer: its token events go on numbered where they stopped, with a `meta` event
//! `{"preempted": n}` between the runs when `jobs.preempt_notice` says so. The request is one
//! request in the metrics and the request log: the first run's prompt usage and first token,
//! every run's output tokens, the last run's end.

use futures::future::BoxFuture;

use crate::admission::LaneGuard;
use crate::error::GatewayError;
use crate::telemetry::{Metrics, UpstreamView};
use crate::upstream::UpstreamStream;

/// How a pre-empted stream goes on (built by the pipeline, which can wait for a seat and send).
pub trait Continuation: Send + Sync + std::fmt::Debug {
    /// Waits for a seat and sends the answer so far as a continuation: `text` (what the client
    /// has), `generated` output tokens, pre-empted `times` times so far (this one included),
    /// the engine's count of the request's own prompt from its first run (`prompt_counted`,
    /// when it reported one). `Ok(None)`: nothing is left to generate.
    fn resume<'a>(
        &'a mut self,
        text: &'a str,
        generated: u32,
        times: u32,
        prompt_counted: Option<u32>,
    ) -> BoxFuture<'a, Result<Option<(UpstreamStream, LaneGuard)>, GatewayError>>;
}

/// A pre-emptible stream's state across its runs.
#[derive(Debug)]
pub(super) struct Resumable {
    pub how: Box<dyn Continuation>,
    /// The text sent to the client so far.
    pub text: String,
    /// Output tokens of the runs before the current one.
    pub before: u32,
    /// The first run's view (its prompt usage, first token, engine timings), once pre-empted.
    pub first: Option<UpstreamView>,
    /// Times pre-empted so far.
    pub times: u32,
    /// Where the last pre-emption cut its run: `prefill` (no token yet) or `decode`.
    pub stage: &'static str,
    /// The current run is a continuation whose recomputed prompt is not counted yet.
    continuing: bool,
    /// Tell the client with a `meta` event.
    pub notice: bool,
}

impl Resumable {
    /// State for a stream that has not been pre-empted yet.
    pub fn new(how: Box<dyn Continuation>, notice: bool) -> Self {
        Self {
            how,
            text: String::new(),
            before: 0,
            first: None,
            times: 0,
            stage: "decode",
            continuing: false,
            notice,
        }
    }

    /// The whole answer's view, from the current run's: the first run's prompt usage, first
    /// token and engine timings; every run's output; the current run's end and finish reason.
    pub fn merged(&self, current: UpstreamView) -> UpstreamView {
        let Some(first) = &self.first else {
            return current;
        };
        UpstreamView {
            output_tokens: self.before.saturating_add(current.output_tokens),
            exact_output: first.exact_output && current.exact_output,
            // A first run cut before its first chunk never told its prompt; the continuation
            // then is the request as first sent, whose count is the prompt's.
            usage: first.usage.or(current.usage),
            engine: first.engine,
            first_content_at: first.first_content_at.or(current.first_content_at),
            first_answer_at: first.first_answer_at.or(current.first_answer_at),
            ended_at: current.ended_at,
            finish_reason: current.finish_reason,
        }
    }

    /// The current run ended with `current`: when it was a continuation, the prompt tokens it
    /// did not find in the prefix cache are counted as recomputed, by the stage the pre-emption
    /// before it cut (once per run); when the engine never reported its cached tokens (cut
    /// again before its final usage), its prompt is counted as unreported.
    pub fn run_ended(&mut self, current: &UpstreamView, metrics: &Metrics) {
        if !std::mem::take(&mut self.continuing) {
            return;
        }
        if let Some(u) = current.usage {
            if u.reported {
                let cached = u.cached_tokens.unwrap_or(0);
                metrics
                    .jobs()
                    .recomputed(self.stage, u.prompt_tokens.saturating_sub(cached));
            } else {
                metrics.jobs().unreported(u.prompt_tokens);
            }
        }
    }

    /// The current run, `current`, was pre-empted: counted, and noted as the stage this
    /// pre-emption cut. Returns the times so far.
    pub fn cut(&mut self, current: UpstreamView, metrics: &Metrics) -> u32 {
        self.run_ended(&current, metrics);
        self.stage = if current.output_tokens > 0 {
            "decode"
        } else {
            "prefill"
        };
        self.first.get_or_insert(current);
        self.times += 1;
        self.times
    }

    /// A continuation took over from the run cut after `generated` output tokens in all.
    pub fn continued(&mut self, generated: u32) {
        self.before = generated;
        self.continuing = true;
    }
}
