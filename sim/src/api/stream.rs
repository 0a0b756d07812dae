//! The SSE body: `data: <json>\n\n` per chunk, `data: [DONE]\n\n` at the end, no other lines.
//!
//! Tokens the engine produced since the last write go out as one chunk (several tokens per chunk
//! when the client reads slower than the engine). Dropping the body (the client went away)
//! aborts the request in the engine through [`AbortGuard`].

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc::UnboundedReceiver;

use super::chunks::{logprobs, with_logprobs, ResponseId, Usage};
use super::error::ApiError;
use super::request::Api;
use crate::engine::sequence::{EngineEvent, Finished};
use crate::engine::Engine;
use crate::text::{words, FaultPlan};

/// Aborts the engine's sequence when dropped before [`AbortGuard::disarm`].
#[derive(Debug)]
pub struct AbortGuard {
    engine: Engine,
    seq_no: u64,
    armed: bool,
}

impl AbortGuard {
    /// Guards sequence `seq_no`.
    pub fn new(engine: Engine, seq_no: u64) -> Self {
        Self {
            engine,
            seq_no,
            armed: true,
        }
    }

    /// The sequence finished on its own: nothing to abort.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// Aborts the sequence now.
    pub fn abort(&mut self) {
        if self.armed {
            self.armed = false;
            self.engine.abort_seq(self.seq_no);
        }
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        self.abort();
    }
}

/// What the stream needs besides the engine's events.
#[derive(Debug)]
pub struct StreamSpec {
    /// Chunk identity.
    pub rid: ResponseId,
    /// Prompt length, for running usage.
    pub prompt_tokens: u32,
    /// Final usage chunk.
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous_usage: bool,
    /// `prompt_tokens_details` in usage.
    pub prompt_details: bool,
    /// Per-request `metrics` on the usage chunk.
    pub per_request_metrics: bool,
    /// Injected faults.
    pub faults: FaultPlan,
    /// The first output tokens that are reasoning (`delta.reasoning`); 0 for completions.
    pub reasoning_tokens: u32,
    /// The output position the answer's text starts at (a continued message: its words so far).
    pub first_word: u32,
    /// The answer goes out as `delta.reasoning`: a reasoning model's continued answer, which
    /// vLLM's parser takes for reasoning (`--template-closes-reasoning` off).
    pub answer_as_reasoning: bool,
    /// A named tool choice: the answer goes out as this function's call
    /// ([`ResponseId::tool_call_chunk`]).
    pub tool_call: Option<String>,
    /// The call is the model's choice (`--call-tools`): its finish is `tool_calls`, as vLLM's
    /// serving_chat says when its tool parser found a call (`auto_tools_called`).
    pub auto_call: bool,
    /// Log-probabilities on the answer's chunks, with this many alternatives
    /// ([`super::chunks::logprobs`]).
    pub logprobs: Option<u32>,
    /// The answer's tokens decode to no text ([`super::request::Generation::silent`]).
    pub silent: bool,
}

/// Collects the events available now: (plain tokens, finish).
pub async fn next_batch(
    rx: &mut UnboundedReceiver<EngineEvent>,
) -> Option<(u32, Option<Finished>)> {
    let first = rx.recv().await?;
    let mut tokens = 0;
    let mut event = Some(first);
    while let Some(ev) = event.take() {
        match ev {
            EngineEvent::Token => tokens += 1,
            EngineEvent::Finished(f) => return Some((tokens, Some(f))),
        }
        event = rx.try_recv().ok();
    }
    Some((tokens, None))
}

struct State {
    spec: StreamSpec,
    rx: UnboundedReceiver<EngineEvent>,
    guard: AbortGuard,
    sent: u32,
    /// Bytes of answer text sent (completions' `text_offset`).
    answer_bytes: usize,
    done: bool,
    stalled: bool,
    /// `--chatter-after-finish`: finished, and sending on.
    chattering: bool,
}

fn frame(out: &mut String, json: &str) {
    out.push_str("data: ");
    out.push_str(json);
    out.push_str("\n\n");
}

/// The SSE body of a streaming request.
pub fn sse_body(
    spec: StreamSpec,
    rx: UnboundedReceiver<EngineEvent>,
    guard: AbortGuard,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let state = State {
        spec,
        rx,
        guard,
        sent: 0,
        answer_bytes: 0,
        done: false,
        stalled: false,
        chattering: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        if st.stalled {
            futures::future::pending::<()>().await;
        }
        let mut out = String::new();
        if st.chattering {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            frame(&mut out, &st.spec.rid.text_chunk(" more", None, None));
            return Some((Ok(Bytes::from(out)), st));
        }
        let batch = next_batch(&mut st.rx).await;
        let Some((plain, finished)) = batch else {
            // The engine dropped the request without finishing it: report it as vLLM would.
            frame(
                &mut out,
                &ApiError::internal("request ended unexpectedly").to_json(),
            );
            out.push_str("data: [DONE]\n\n");
            st.done = true;
            return Some((Ok(Bytes::from(out)), st));
        };
        let with_last = finished.as_ref().is_some_and(|f| f.with_token);
        let mut new = plain + u32::from(with_last);
        let spec = &st.spec;
        let f = spec.faults;

        // Faults that cut the stream short.
        let stall_at = f.stall_after.filter(|s| st.sent + new > *s);
        // The error comes once the answer passes the threshold, also when the same batch
        // finishes it (a slow reader gets the threshold and the finish together); an answer of
        // exactly the threshold's length that finishes there ends normally.
        let error_at = f.error_after.filter(|e| {
            let reached = st.sent + new;
            reached > *e || (reached == *e && finished.is_none())
        });
        if let Some(limit) = stall_at.or(error_at) {
            new = limit.saturating_sub(st.sent);
        }
        let cut = stall_at.is_some() || error_at.is_some();

        let usage_now = |n: u32| {
            spec.continuous_usage
                .then(|| Usage::new(spec.prompt_tokens, n))
        };
        let first_write = st.sent == 0 && (new > 0 || finished.is_some());
        if first_write && spec.rid.api == Api::Chat {
            frame(&mut out, &spec.rid.role_chunk(usage_now(0)));
        }
        if first_write && f.garbage && !cut {
            // A non-JSON line in the middle of the stream, before the first tokens.
            out.push_str("data: {\"truncated\": tru\n\n");
        }
        let finish = if cut {
            None
        } else {
            finished.as_ref().map(|f| match spec.auto_call {
                true => "tool_calls",
                false => f.reason.as_str(),
            })
        };
        // Reasoning first (`delta.reasoning`), then the answer; a batch that crosses from one
        // to the other is two chunks. The finish reason rides on the last chunk written.
        let end = st.sent + new;
        let thinking_end = end.min(spec.reasoning_tokens).max(st.sent);
        let answer_follows = end > thinking_end;
        if thinking_end > st.sent {
            let text = if spec.silent {
                String::new()
            } else {
                words(st.sent, thinking_end)
            };
            st.sent = thinking_end;
            let finish = if answer_follows { None } else { finish };
            frame(
                &mut out,
                &spec.rid.reasoning_chunk(&text, finish, usage_now(st.sent)),
            );
        } else if !answer_follows && finish.is_some() {
            // A finish with no new token: an empty answer chunk carries it (a tool call's
            // closes its arguments).
            let chunk = match &spec.tool_call {
                Some(_) => spec.rid.tool_call_chunk(
                    None,
                    ResponseId::ARGUMENTS_CLOSE,
                    finish,
                    usage_now(st.sent),
                ),
                None => spec.rid.text_chunk("", finish, usage_now(st.sent)),
            };
            frame(&mut out, &chunk);
        }
        if answer_follows {
            let first = spec.first_word;
            let text = if spec.silent {
                String::new()
            } else {
                words(first.saturating_add(st.sent), first.saturating_add(end))
            };
            // The answer's first words: after the reasoning (at most `reasoning_tokens`).
            let opening = st.sent == spec.reasoning_tokens;
            let from = first.saturating_add(st.sent);
            st.sent = end;
            let chunk = if let Some(name) = &spec.tool_call {
                let open = if opening {
                    ResponseId::ARGUMENTS_OPEN
                } else {
                    ""
                };
                let close = if finish.is_some() {
                    ResponseId::ARGUMENTS_CLOSE
                } else {
                    ""
                };
                spec.rid.tool_call_chunk(
                    opening.then_some(name.as_str()),
                    &format!("{open}{text}{close}"),
                    finish,
                    usage_now(st.sent),
                )
            } else if spec.answer_as_reasoning {
                spec.rid.reasoning_chunk(&text, finish, usage_now(st.sent))
            } else {
                spec.rid.text_chunk(&text, finish, usage_now(st.sent))
            };
            let chunk = match spec.logprobs {
                Some(top) => with_logprobs(
                    &chunk,
                    logprobs(
                        spec.rid.api,
                        from,
                        first.saturating_add(end),
                        top,
                        st.answer_bytes,
                    ),
                ),
                None => chunk,
            };
            st.answer_bytes += text.len();
            let chunk = match f.padding {
                0 => chunk,
                n => format!("{{\"x_padding\":\"{}\",{}", "a".repeat(n), &chunk[1..]),
            };
            frame(&mut out, &chunk);
        }
        if stall_at.is_some() {
            // Keep the connection open and send nothing more, like a hung engine.
            st.guard.abort();
            st.stalled = true;
            return Some((Ok(Bytes::from(out)), st));
        }
        if error_at.is_some() {
            st.guard.abort();
            frame(
                &mut out,
                &ApiError::internal("injected engine error").to_json(),
            );
            out.push_str("data: [DONE]\n\n");
            st.done = true;
            return Some((Ok(Bytes::from(out)), st));
        }
        if let Some(fin) = finished {
            st.guard.disarm();
            if f.error_after_finish {
                // vLLM's stream generator: an exception after its loop is sent as an error
                // event where the usage chunk would have been, and `[DONE]` follows.
                frame(
                    &mut out,
                    &ApiError::internal("injected error after the finish").to_json(),
                );
                out.push_str("data: [DONE]\n\n");
                st.done = true;
                return Some((Ok(Bytes::from(out)), st));
            }
            if spec.include_usage {
                let metrics = spec
                    .per_request_metrics
                    .then(|| fin.timings.per_request_metrics(fin.output_tokens));
                let usage = Usage::final_of(&fin, spec.prompt_details);
                frame(&mut out, &spec.rid.usage_chunk(usage, metrics));
            }
            // A chattering engine never says `[DONE]`: it goes on instead.
            if !f.omit_done && !f.chatter_after_finish {
                out.push_str("data: [DONE]\n\n");
            }
            if f.chatter_after_finish {
                st.chattering = true;
            } else if f.hang_after_finish {
                st.stalled = true;
            } else {
                st.done = true;
            }
        }
        Some((Ok(Bytes::from(out)), st))
    })
}
