//! [`UpstreamStream`]: vLLM's SSE body read as parsed chunks, with timeouts, end-of-stream
//! rules, token counting, timings and the engine abort.
//!
//! # Timeouts (from `[upstream]`)
//! - first token: from sending the request until the first chunk that carries content (a
//!   role-only chunk does not count);
//! - idle: between two events once content has started (bytes that do not complete an event do
//!   not count, so a trickling upstream still times out);
//! - total: the whole request.
//!
//! # How a stream ends
//! - `[DONE]` after a finish reason: clean end.
//! - EOF, a broken connection or an idle timeout *after* a finish reason but before `[DONE]`:
//!   tolerated as a clean end (the answer is complete) and flagged by
//!   [`UpstreamStream::missing_done`] so it can be logged and counted.
//! - EOF before any finish reason: [`UpstreamError::ClosedEarly`].
//! - `[DONE]` before any finish reason: [`UpstreamError::Protocol`] (vLLM never does this).
//! - `data: {"error":...}`: [`UpstreamError::Engine`]; the stream is over.
//! - Non-JSON or oversized event: [`UpstreamError::Protocol`].
//!
//! After an error or `None`, [`UpstreamStream::next_event`] keeps returning `None`. On every
//! end other than a clean one the upstream connection is dropped at once and the engine abort
//! fires ([`super::AbortGuard`]); the finish reason disarms it. Dropping the stream early does
//! the same.

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use reqwest::header::HeaderMap;
use tokio::time::{Duration, Instant};

use super::abort::{AbortGuard, AbortState, AbortWatch};
use super::chunk::{parse_payload, Chunk, EngineMetrics, Payload, Usage};
use super::error::UpstreamError;
use super::replica::Ticket;
use super::sse::SseParser;
use crate::config::UpstreamConfig;

/// The response body as a stream of reads; errors are already described as text.
pub(crate) type Body = BoxStream<'static, Result<Bytes, String>>;

/// The three stream timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// `upstream.first_token_timeout`.
    pub first_token: Duration,
    /// `upstream.idle_timeout`.
    pub idle: Duration,
    /// `upstream.total_timeout`.
    pub total: Duration,
    /// `upstream.max_model_len`: a usage that counts more than it holds is not believed.
    pub max_len: u32,
}

impl StreamLimits {
    /// The limits configured in `[upstream]`.
    pub fn from_config(c: &UpstreamConfig) -> Self {
        Self {
            first_token: c.first_token_timeout,
            idle: c.idle_timeout,
            total: c.total_timeout,
            max_len: c.max_model_len.get(),
        }
    }

    /// The longest event the stream takes: 1 MiB, or 16 bytes a token of the model's context
    /// where that is more. vLLM's first chunk carries the whole prompt with `return_token_ids`
    /// (its ids, up to 7 bytes each in JSON) or a completion's `echo` (its text): a 200,000-token
    /// prompt is past 1 MiB there.
    pub fn event_bytes(&self) -> usize {
        let per_context = usize::try_from(self.max_len)
            .unwrap_or(usize::MAX)
            .saturating_mul(16);
        per_context.max(super::sse::DEFAULT_MAX_EVENT_BYTES)
    }

    /// The deadline before the first token, and the error it means.
    pub(crate) fn first_token_deadline(&self, sent_at: Instant) -> (Instant, UpstreamError) {
        let first = sent_at + self.first_token;
        let total = sent_at + self.total;
        if total < first {
            (total, UpstreamError::TotalTimeout(self.total))
        } else {
            (first, UpstreamError::FirstTokenTimeout(self.first_token))
        }
    }
}

/// When things happened, for telemetry (gateway-side TTFT, time in upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTimings {
    /// The request was handed to the connection pool.
    pub sent_at: Instant,
    /// vLLM's response headers arrived.
    pub headers_at: Instant,
    /// The first chunk carrying generated output arrived: the first token of any kind,
    /// reasoning included ([`Chunk::has_content`]). TTFT, the first-token timeout and the end
    /// of the prefill hold are measured to it.
    pub first_content_at: Option<Instant>,
    /// The first chunk carrying answer output (content or tool calls, [`Chunk::has_answer`])
    /// arrived: after a reasoning model's thinking; the same chunk as `first_content_at`
    /// otherwise.
    pub first_answer_at: Option<Instant>,
    /// The stream ended (cleanly, with an error, or by [`UpstreamStream::abort_now`]).
    pub ended_at: Option<Instant>,
}

/// Output tokens seen so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputTokens {
    /// The count.
    pub count: u32,
    /// True when it is vLLM's `usage.completion_tokens`. False when it counts content-carrying
    /// chunks instead: a lower bound, since vLLM may put several tokens in one chunk when the
    /// reader is slower than the engine.
    pub exact: bool,
}

/// A streaming response from vLLM. Read it with [`UpstreamStream::next_event`].
///
/// How long a stream may stay silent after its finish reason before it is taken as ended.
pub const AFTER_FINISH: std::time::Duration = std::time::Duration::from_secs(1);

/// Field order matters: the body (the connection) is dropped before the abort guard fires.
#[derive(Debug)]
pub struct UpstreamStream {
    body: Option<BodyDebug>,
    parser: SseParser,
    /// An error found while parsing a read; yielded after the events completed before it.
    pending_error: Option<UpstreamError>,
    abort: AbortGuard,
    request_id: String,
    headers: HeaderMap,
    limits: StreamLimits,
    timings: StreamTimings,
    last_event_at: Instant,
    /// When bytes last arrived from vLLM (for the relay's latency histogram).
    last_read_at: Option<Instant>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    /// Whether `usage` came from the final usage-only chunk (the only one where vLLM reports
    /// `cached_tokens`; `continuous_usage_stats` chunks never carry it).
    final_usage: bool,
    metrics: Option<EngineMetrics>,
    token_chunks: u32,
    missing_done: bool,
    ended: bool,
    /// The replica it runs on, counted in flight until the stream drops.
    ticket: Option<Ticket>,
    /// It continues an answer: reasoning text is the answer's ([`Chunk::reasoning_as_answer`]).
    continues_answer: bool,
}

/// [`Body`] with a `Debug` impl.
struct BodyDebug(Body);

impl std::fmt::Debug for BodyDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Body")
    }
}

impl UpstreamStream {
    pub(crate) fn new(
        request_id: String,
        headers: HeaderMap,
        body: Body,
        abort: AbortGuard,
        limits: StreamLimits,
        sent_at: Instant,
        headers_at: Instant,
    ) -> Self {
        Self {
            body: Some(BodyDebug(body)),
            parser: SseParser::new(limits.event_bytes()),
            pending_error: None,
            abort,
            request_id,
            headers,
            limits,
            timings: StreamTimings {
                sent_at,
                headers_at,
                first_content_at: None,
                first_answer_at: None,
                ended_at: None,
            },
            last_event_at: headers_at,
            last_read_at: None,
            finish_reason: None,
            usage: None,
            final_usage: false,
            metrics: None,
            token_chunks: 0,
            missing_done: false,
            ended: false,
            ticket: None,
            continues_answer: false,
        }
    }

    /// The same stream, continuing an answer (`continue_final_message` on an assistant message
    /// with text): what the engine labels reasoning is read as the answer's text.
    pub(crate) fn continuing_answer(mut self, yes: bool) -> Self {
        self.continues_answer = yes;
        self
    }

    /// The same stream, counted on `ticket`'s replica until it drops.
    pub(crate) fn with_ticket(mut self, ticket: Ticket) -> Self {
        self.ticket = Some(ticket);
        self
    }

    /// The name of the replica serving it (`None` for a stream built without one).
    pub fn replica(&self) -> Option<&str> {
        self.ticket.as_ref().map(|t| t.replica().name())
    }

    /// The next chunk; `None` once the stream has ended (cleanly, or after an error was
    /// returned). Role-only and usage chunks are yielded too (they are part of a faithful
    /// relay); [`Chunk::has_content`] tells tokens apart.
    ///
    /// Cancel-safe: dropping the future loses nothing and keeps the deadlines, so it can sit in
    /// a `select!` beside a client-disconnect signal.
    pub async fn next_event(&mut self) -> Option<Result<Chunk, UpstreamError>> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(data) = self.parser.pop() {
                return self.on_payload(data);
            }
            if let Some(err) = self.pending_error.take() {
                if self.finish_reason.is_some() {
                    return self.after_finish("an unreadable event");
                }
                return Some(Err(self.fail(err)));
            }
            let (deadline, timeout_error) = self.deadline();
            let body = &mut self.body.as_mut()?.0;
            match tokio::time::timeout_at(deadline, body.next()).await {
                Ok(Some(Ok(bytes))) => {
                    self.last_read_at = Some(Instant::now());
                    if let Err(e) = self.parser.feed(&bytes) {
                        self.pending_error = Some(UpstreamError::Protocol(e.to_string()));
                    }
                }
                Err(_) if self.finish_reason.is_none() => {
                    return Some(Err(self.fail(timeout_error)))
                }
                Ok(None) if self.finish_reason.is_none() => {
                    return Some(Err(self.fail(UpstreamError::ClosedEarly)))
                }
                Ok(Some(Err(e))) if self.finish_reason.is_none() => {
                    return Some(Err(self.fail(UpstreamError::Transport(e))))
                }
                // After the finish reason, the answer is complete: tolerate a missing `[DONE]`.
                // It ended with its last event, not after the silence waited out for `[DONE]`.
                Err(_) | Ok(None) | Ok(Some(Err(_))) => {
                    self.missing_done = true;
                    self.timings.ended_at.get_or_insert(self.last_event_at);
                    self.finish_clean();
                    return None;
                }
            }
        }
    }

    /// Ends the stream now: drops the connection and fires the engine abort (unless the
    /// request already finished cleanly). Later [`UpstreamStream::next_event`] calls return
    /// `None`.
    pub fn abort_now(&mut self) {
        self.body = None;
        self.abort.abort_now();
        self.end();
    }

    /// When bytes last arrived from vLLM (`None` before the first read).
    pub fn last_read_at(&self) -> Option<Instant> {
        self.last_read_at
    }

    /// The gateway request id this stream was sent with.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// vLLM's response headers (e.g. the echoed `x-request-id`).
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Output tokens so far: exact once vLLM sent usage, else the chunks that carried tokens
    /// ([`Chunk::has_token`]; a lower bound: a chunk can carry several).
    pub fn output_tokens(&self) -> OutputTokens {
        match self.usage {
            // An engine whose usage counts fewer tokens than the chunks it sent is not believed
            // below them.
            Some(u) => OutputTokens {
                count: u.completion_tokens.max(self.token_chunks),
                exact: true,
            },
            None => OutputTokens {
                count: self.token_chunks,
                exact: false,
            },
        }
    }

    /// The latest usage vLLM sent (final, or running with `continuous_usage_stats`).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether [`Self::usage`] is the final report (the usage-only chunk), the only one whose
    /// `cached_tokens` vLLM fills in.
    pub fn final_usage(&self) -> bool {
        self.final_usage
    }

    /// vLLM's per-request timings, when it sent them.
    pub fn engine_metrics(&self) -> Option<EngineMetrics> {
        self.metrics
    }

    /// The finish reason, once seen.
    pub fn finish_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }

    /// Timings recorded so far.
    pub fn timings(&self) -> StreamTimings {
        self.timings
    }

    /// True when the stream ended cleanly without `[DONE]` (EOF, broken connection or idle
    /// timeout after the finish reason): tolerated, worth a log line and a counter.
    pub fn missing_done(&self) -> bool {
        self.missing_done
    }

    /// Whether the stream is over.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Where the engine abort stands.
    pub fn abort_state(&self) -> AbortState {
        self.abort.state()
    }

    /// A view of the abort state that outlives the stream.
    pub fn abort_watch(&self) -> AbortWatch {
        self.abort.watch()
    }

    fn on_payload(&mut self, data: Bytes) -> Option<Result<Chunk, UpstreamError>> {
        let now = Instant::now();
        self.last_event_at = now;
        match parse_payload(data) {
            // vLLM's stream generator sends an exception raised after its loop (building the
            // final usage, a parser's end) as an error event, then `[DONE]`: after the finish
            // reason the answer is whole, and an error (or a broken event) does not unmake it.
            Err(_) if self.finish_reason.is_some() => self.after_finish("an unreadable event"),
            Ok(Payload::Error(_)) if self.finish_reason.is_some() => {
                self.after_finish("an error event")
            }
            Err(e) => Some(Err(self.fail(e))),
            Ok(Payload::Error(e)) => {
                // vLLM refuses some requests only as its engine takes them (a grammar its
                // backend cannot build, a token id past the vocabulary), after a streaming
                // answer began: its first event is then the 400 a whole answer would have had,
                // and the client gets that 400 (not a 502 its SDK would retry).
                let refused = e
                    .code
                    .as_deref()
                    .and_then(|c| c.parse::<u16>().ok())
                    .and_then(|c| reqwest::StatusCode::from_u16(c).ok())
                    .filter(|c| c.is_client_error() && self.token_chunks == 0);
                let err = match refused {
                    Some(status) => UpstreamError::Status { status, error: e },
                    None => UpstreamError::Engine(e),
                };
                Some(Err(self.fail(err)))
            }
            Ok(Payload::Done) if self.finish_reason.is_some() => {
                self.finish_clean();
                None
            }
            Ok(Payload::Done) => Some(Err(self.fail(UpstreamError::Protocol(
                "[DONE] before any finish reason".into(),
            )))),
            Ok(Payload::Chunk(chunk)) if self.past_finish(&chunk) => {
                // vLLM sends only the usage chunk and `[DONE]` after the finish reason: more
                // (an engine that keeps generating) would run past every bound, the guards
                // given back at the finish. The answer ended at its finish reason.
                tracing::warn!(
                    request_id = %self.request_id,
                    "the engine sent more after its finish reason: the stream ends there"
                );
                self.finish_clean();
                None
            }
            Ok(Payload::Chunk(mut chunk)) => {
                if self.continues_answer {
                    chunk.reasoning_as_answer();
                }
                if chunk.has_token {
                    self.token_chunks += 1;
                }
                if chunk.has_content {
                    self.timings.first_content_at.get_or_insert(now);
                }
                if chunk.has_answer {
                    self.timings.first_answer_at.get_or_insert(now);
                }
                if chunk.usage.is_some_and(|u| {
                    u64::from(u.prompt_tokens) + u64::from(u.completion_tokens)
                        > u64::from(self.limits.max_len)
                }) {
                    // No request holds more than the model's length: a usage that says so is
                    // not believed (it would bill the tenant and teach the estimate absurd
                    // counts); the chunks are counted instead.
                    chunk.usage = None;
                    chunk.usage_only = false;
                }
                if chunk.usage.is_some() {
                    self.usage = chunk.usage;
                    self.final_usage = chunk.usage_only;
                    // The replica's prefix hits: the final usage alone says what was cached.
                    if let (Some(t), Some(u), true) =
                        (&mut self.ticket, chunk.usage, chunk.usage_only)
                    {
                        t.set_usage(u);
                    }
                }
                if chunk.metrics.is_some() {
                    self.metrics = chunk.metrics;
                }
                if self.finish_reason.is_none() {
                    if let Some(reason) = &chunk.finish_reason {
                        self.finish_reason = Some(reason.clone());
                        self.abort.disarm();
                    }
                }
                Some(Ok(chunk))
            }
        }
    }

    /// The next deadline and the error it means. After the finish reason only `[DONE]` (and
    /// the usage chunk) may follow, which vLLM sends at once: a stream that stays silent
    /// [`AFTER_FINISH`] longer ends cleanly, without waiting out the idle timeout.
    fn deadline(&self) -> (Instant, UpstreamError) {
        let total = self.timings.sent_at + self.limits.total;
        if self.finish_reason.is_some() {
            let wait = self.limits.idle.min(AFTER_FINISH);
            let after = self.last_event_at + wait;
            if total < after {
                return (total, UpstreamError::TotalTimeout(self.limits.total));
            }
            return (after, UpstreamError::IdleTimeout(wait));
        }
        // (A token that decodes to no text is a first token too: the engine is generating.)
        if self.timings.first_content_at.is_none() && self.token_chunks == 0 {
            return self.limits.first_token_deadline(self.timings.sent_at);
        }
        let idle = self.last_event_at + self.limits.idle;
        if total <= idle {
            (total, UpstreamError::TotalTimeout(self.limits.total))
        } else {
            (idle, UpstreamError::IdleTimeout(self.limits.idle))
        }
    }

    /// Ends with an error: connection dropped, abort fired.
    fn fail(&mut self, err: UpstreamError) -> UpstreamError {
        self.abort_now();
        err
    }

    /// `what` came after the finish reason: the answer is complete, the stream ends cleanly
    /// there (the usage counted so far stands: vLLM sends it on every chunk, as the gateway asks).
    fn after_finish(&mut self, what: &str) -> Option<Result<Chunk, UpstreamError>> {
        tracing::warn!(
            request_id = %self.request_id,
            what,
            "the engine sent more than its usage after its finish reason: the answer is \
             complete and kept"
        );
        self.finish_clean();
        None
    }

    /// Whether `chunk` comes where vLLM sends none: after the finish reason, anything but the
    /// one usage-only chunk.
    fn past_finish(&self, chunk: &Chunk) -> bool {
        self.finish_reason.is_some() && (!chunk.usage_only || self.final_usage)
    }

    /// Ends cleanly. Reads the end of the body if it is already there, so the connection can
    /// go back to the pool; otherwise drops it.
    fn finish_clean(&mut self) {
        if let Some(mut body) = self.body.take() {
            let _ = body.0.next().now_or_never();
        }
        self.end();
    }

    fn end(&mut self) {
        self.ended = true;
        self.timings.ended_at.get_or_insert_with(Instant::now);
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
