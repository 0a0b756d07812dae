//! The stream pump: reads vLLM's chunks, forwards them to the client, counts tokens, and on every
//! end gives the lane slot back.
//!
//! - `/v1` streams ([`Format::OpenAi`]) are relayed faithfully: the client sees vLLM's own
//!   `data:` payloads; the final usage-only chunk is dropped when the client did not ask for
//!   usage (the gateway always asks vLLM for it, to count tokens exactly).
//! - `/answer` streams ([`Format::Answer`]) become typed SSE events (`meta`, `token`, `done`,
//!   `error`; see the README).
//!
//! A [`Relay`] owns the [`LaneGuard`] and the [`UpstreamStream`]. When the client goes away the
//! HTTP server drops the response body and with it the relay: the upstream connection closes,
//! the engine abort fires once (the upstream stream's own guard), the slot and tokens come
//! back, and `cancelled_after_tokens` is recorded.

mod answer;
mod collect;

use std::convert::Infallible;

use bytes::Bytes;
use futures::{FutureExt, Stream};
use tokio::time::Instant;

pub use collect::Collected;

use crate::admission::LaneGuard;
use crate::api::GatewayError;
use crate::classify::Classification;
use crate::telemetry::{LatencySplit, Outcome, RequestRecord, UpstreamView};
use crate::upstream::{Chunk, UpstreamError, UpstreamStream};

/// How the client wants the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// vLLM's chunks as they are.
    OpenAi {
        /// Whether the client asked for the final usage chunk.
        include_usage: bool,
    },
    /// The `/answer` event stream.
    Answer,
}

/// One admitted request on its way back to the client.
#[derive(Debug)]
pub struct Relay {
    upstream: UpstreamStream,
    guard: Option<LaneGuard>,
    class: Classification,
    format: Format,
    record: RequestRecord,
    done: bool,
}

impl Relay {
    /// A relay for `upstream`, holding `guard` until the stream ends; `record` is written then.
    pub fn new(
        upstream: UpstreamStream,
        guard: LaneGuard,
        class: Classification,
        format: Format,
        record: RequestRecord,
    ) -> Self {
        Self {
            upstream,
            guard: Some(guard),
            class,
            format,
            record,
            done: false,
        }
    }

    /// The gateway's request id.
    pub fn request_id(&self) -> &str {
        self.upstream.request_id()
    }

    /// Marks the end: writes the record and frees the slot.
    fn finish(&mut self, outcome: Outcome, error_code: Option<&str>) {
        if self.done {
            return;
        }
        self.done = true;
        self.guard = None;
        let view = UpstreamView::of(&self.upstream);
        self.record.finish(outcome, error_code, Some(&view));
    }

    /// The next upstream event, noting the first token.
    async fn next_event(&mut self) -> Option<Result<Chunk, UpstreamError>> {
        let ev = self.upstream.next_event().await;
        if let Some(Ok(chunk)) = &ev {
            if chunk.has_content {
                self.record.first_token();
            }
        }
        ev
    }

    /// The next piece of the SSE body, or `None` at the end. Waits for one event that renders
    /// to something, then takes every event already available without waiting, so a client (or
    /// a gateway) that fell behind catches up in one write instead of one write per chunk.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        while out.is_empty() && !self.done {
            let ev = self.next_event().await;
            self.render(ev, &mut out);
        }
        while !self.done {
            match self.next_event().now_or_never() {
                Some(ev) => self.render(ev, &mut out),
                None => break,
            }
        }
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
                tracing::warn!(request_id = %self.request_id(), code = err.code(), error = %err, "stream ended with an error");
                match self.format {
                    Format::OpenAi { .. } => out.extend_from_slice(
                        format!("data: {}\n\ndata: [DONE]\n\n", err.body()).as_bytes(),
                    ),
                    Format::Answer => out.extend_from_slice(err.sse_event().as_bytes()),
                }
                self.finish(err.outcome(), Some(err.code()));
            }
        }
    }

    fn render_chunk(&self, chunk: &Chunk) -> Option<Bytes> {
        match self.format {
            Format::OpenAi { include_usage } => {
                if !include_usage && chunk.usage.is_some() && collect::has_no_choices(chunk) {
                    return None;
                }
                let mut out = Vec::with_capacity(chunk.raw.len() + 8);
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&chunk.raw);
                out.extend_from_slice(b"\n\n");
                Some(Bytes::from(out))
            }
            Format::Answer => answer::token_event(chunk),
        }
    }

    fn render_end(&self) -> Bytes {
        match self.format {
            Format::OpenAi { .. } => Bytes::from_static(b"data: [DONE]\n\n"),
            Format::Answer => answer::done_event(&self.upstream, &self.class, self.timings()),
        }
    }

    /// The latency split so far.
    pub fn timings(&self) -> LatencySplit {
        let view = UpstreamView::of(&self.upstream);
        LatencySplit::compute(
            self.record.arrival(),
            self.record.admitted_at(),
            Some(&view),
            Instant::now(),
        )
    }

    /// The SSE body; the first event of an `/answer` stream is `meta`.
    pub fn into_sse(self) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
        let first = match self.format {
            Format::Answer => Some(answer::meta_event(
                self.request_id(),
                &self.class,
                self.timings(),
            )),
            Format::OpenAi { .. } => None,
        };
        futures::stream::unfold((self, first), |(mut relay, first)| async move {
            if let Some(meta) = first {
                return Some((Ok(meta), (relay, None)));
            }
            let bytes = relay.next_bytes().await?;
            Some((Ok(bytes), (relay, None)))
        })
    }

    /// Reads the whole answer (non-streaming `/v1`).
    pub async fn collect(mut self) -> Result<Collected, GatewayError> {
        let mut acc = Collected::default();
        loop {
            match self.next_event().await {
                Some(Ok(chunk)) => acc.add(&chunk),
                None => {
                    acc.usage = self.upstream.usage();
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

impl Drop for Relay {
    fn drop(&mut self) {
        if !self.done {
            // The client went away: the upstream stream's guard aborts the engine's work when
            // it drops right after this.
            self.finish(Outcome::Cancelled, None);
        }
    }
}
