//! The latency split of one request (M1, M2): never one merged "response time".

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// What the upstream stream knew when the request ended, as plain values (the upstream module
/// builds it; telemetry never reads the stream itself).
#[derive(Debug, Clone, Default)]
pub struct UpstreamView {
    /// Output tokens: exact from usage, else content chunks (a lower bound).
    pub output_tokens: u32,
    /// Whether `output_tokens` came from vLLM's usage.
    pub exact_output: bool,
    /// vLLM's prompt usage, when it arrived.
    pub usage: Option<PromptUsage>,
    /// vLLM's per-request timings (`--enable-per-request-metrics`), when sent.
    pub engine: Option<EngineTimings>,
    /// First chunk of generated output of any kind (reasoning included): the first token.
    pub first_content_at: Option<Instant>,
    /// First chunk of answer output (content or tool calls), after any reasoning.
    pub first_answer_at: Option<Instant>,
    /// End of the stream.
    pub ended_at: Option<Instant>,
    /// vLLM's finish reason.
    pub finish_reason: Option<String>,
}

/// The prompt side of vLLM's usage report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptUsage {
    /// Prompt tokens as vLLM counted them.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache; `None` when vLLM does not report it.
    pub cached_tokens: Option<u32>,
    /// Whether this came from the stream's final usage chunk: vLLM reports `cached_tokens`
    /// there only (left out when zero), never on `continuous_usage_stats` chunks, so a stream
    /// cut before its end never says what was cached.
    pub reported: bool,
}

/// The engine's own timings for one request, milliseconds (`None`: not reported).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineTimings {
    /// Engine arrival to first token.
    pub time_to_first_token_ms: Option<f64>,
    /// Engine arrival to first scheduling (the engine's own queue).
    pub queue_time_ms: Option<f64>,
}

/// Per-request timings in milliseconds (`None`: not reached, or not measurable).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatencySplit {
    /// Waiting for a lane slot and token budget in the gateway.
    pub queue_wait_ms: Option<f64>,
    /// Admission to first token: engine queue + prefill (+ the hop to vLLM).
    pub ttft_ms: Option<f64>,
    /// Arrival to first token: what the student felt. The first generated token of any kind:
    /// a reasoning model's first reasoning token counts (the engine's prefill is over then).
    pub time_to_first_token_ms: Option<f64>,
    /// Arrival to the first token of the answer proper (content or tool calls), after any
    /// reasoning; equal to `time_to_first_token_ms` for a model that does not reason.
    pub time_to_first_answer_ms: Option<f64>,
    /// The engine's own queue (vLLM's per-request `queue_time_ms`), when vLLM reports it.
    pub engine_queue_ms: Option<f64>,
    /// Prefill: vLLM's `time_to_first_token_ms - queue_time_ms` when vLLM reports them;
    /// otherwise admission to first token (engine queue and prefill together).
    pub prefill_ms: Option<f64>,
    /// Mean time per output token after the first (decode time / (tokens - 1)).
    pub time_per_output_token_ms: Option<f64>,
    /// Output tokens after the first per second of decode (first token to end); `None` with
    /// fewer than two tokens or a zero-length decode: never a division by zero.
    pub decode_tps: Option<f64>,
    /// Arrival to end.
    pub total_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl LatencySplit {
    /// The split of a request that arrived at `arrival`, was admitted at `admitted` after
    /// `queue_wait`, and streamed as `up` says; `now` closes a request still running.
    pub fn compute(
        arrival: Instant,
        admitted: Option<(Instant, Duration)>,
        up: Option<&UpstreamView>,
        now: Instant,
    ) -> Self {
        let first = up.and_then(|u| u.first_content_at);
        let end = up.and_then(|u| u.ended_at).unwrap_or(now);
        let engine = up.and_then(|u| u.engine);
        let engine_queue_ms = engine.and_then(|e| e.queue_time_ms);
        let engine_prefill =
            engine.and_then(|e| Some(e.time_to_first_token_ms? - e.queue_time_ms?));
        let ttft_ms = match (first, admitted) {
            (Some(f), Some((a, _))) => Some(ms(f.saturating_duration_since(a))),
            _ => None,
        };
        let tokens = up.map_or(0, |u| u.output_tokens);
        let decode = first.map(|f| end.saturating_duration_since(f));
        let (tpot, tps) = match decode {
            Some(d) if tokens > 1 && d > Duration::ZERO => {
                let after_first = f64::from(tokens - 1);
                (
                    Some(ms(d) / after_first),
                    Some(after_first / d.as_secs_f64()),
                )
            }
            _ => (None, None),
        };
        Self {
            queue_wait_ms: admitted.map(|(_, w)| ms(w)),
            ttft_ms,
            time_to_first_token_ms: first.map(|f| ms(f.saturating_duration_since(arrival))),
            time_to_first_answer_ms: up
                .and_then(|u| u.first_answer_at)
                .map(|f| ms(f.saturating_duration_since(arrival))),
            engine_queue_ms,
            prefill_ms: engine_prefill.map(|p| p.max(0.0)).or(ttft_ms),
            time_per_output_token_ms: tpot,
            decode_tps: tps,
            total_ms: ms(end.saturating_duration_since(arrival)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_or_an_instant_decode_never_divides_by_zero() {
        let t0 = Instant::now();
        let one = UpstreamView {
            output_tokens: 1,
            first_content_at: Some(t0 + Duration::from_millis(50)),
            ended_at: Some(t0 + Duration::from_millis(50)),
            ..UpstreamView::default()
        };
        let s = LatencySplit::compute(
            t0,
            Some((t0 + Duration::from_millis(10), Duration::from_millis(10))),
            Some(&one),
            t0,
        );
        assert_eq!(s.decode_tps, None);
        assert_eq!(s.time_per_output_token_ms, None);
        assert_eq!(s.time_to_first_token_ms, Some(50.0));
        assert_eq!(s.time_to_first_answer_ms, None, "no answer chunk seen");
        assert_eq!(s.ttft_ms, Some(40.0));
        assert_eq!(
            s.prefill_ms,
            Some(40.0),
            "without engine timings prefill is admission to first token"
        );
    }

    #[test]
    fn engine_timings_split_engine_queue_from_prefill() {
        let t0 = Instant::now();
        let up = UpstreamView {
            output_tokens: 11,
            first_content_at: Some(t0 + Duration::from_millis(100)),
            ended_at: Some(t0 + Duration::from_millis(300)),
            engine: Some(EngineTimings {
                time_to_first_token_ms: Some(90.0),
                queue_time_ms: Some(30.0),
            }),
            ..UpstreamView::default()
        };
        let s = LatencySplit::compute(t0, Some((t0, Duration::ZERO)), Some(&up), t0);
        assert_eq!(s.engine_queue_ms, Some(30.0));
        assert_eq!(s.prefill_ms, Some(60.0));
        assert_eq!(
            s.decode_tps,
            Some(50.0),
            "10 tokens after the first in 200 ms"
        );
        assert_eq!(s.time_per_output_token_ms, Some(20.0));
        assert_eq!(s.total_ms, 300.0);
    }
}

/// Points on a request's way through the gateway, in order: the stage breakdown of its first
/// byte ([`StageSplit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The request is validated and its upstream body built.
    Parsed,
    /// Its lane is decided (tokenized when byte length did not settle it).
    Classified,
    /// It holds its seat and reservations (the gateway's queue wait included).
    Admitted,
    /// vLLM answered with response headers (connect, write, the engine accepting it).
    Sent,
    /// The first body bytes arrived from vLLM.
    FirstUpstreamByte,
    /// The first relayed bytes were handed to the client's connection.
    FirstClientByte,
}

impl Mark {
    /// Every mark, in order.
    pub const ALL: [Mark; 6] = [
        Mark::Parsed,
        Mark::Classified,
        Mark::Admitted,
        Mark::Sent,
        Mark::FirstUpstreamByte,
        Mark::FirstClientByte,
    ];

    /// Position in [`Mark::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Where a request's time went before its first byte reached the client: microseconds from the
/// previous mark reached (from arrival for the first), `None` for a mark not reached. The
/// gateway's own cost is everything but `admit_us` (its queue) and `first_upstream_byte_us`
/// (vLLM's queue and prefill, up to its first chunk).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct StageSplit {
    /// Arrival (body read) to a validated request with its upstream body.
    pub parse_us: Option<f64>,
    /// To the lane decision.
    pub classify_us: Option<f64>,
    /// To admission.
    pub admit_us: Option<f64>,
    /// To vLLM's response headers.
    pub send_us: Option<f64>,
    /// To vLLM's first body bytes.
    pub first_upstream_byte_us: Option<f64>,
    /// To the first bytes handed to the client (the relay's parse, count and render).
    pub first_client_byte_us: Option<f64>,
}

impl StageSplit {
    /// The split of a request that arrived at `arrival` and reached `marks` (by [`Mark::index`]).
    pub fn from_marks(arrival: Instant, marks: &[Option<Instant>; 6]) -> Self {
        let mut prev = arrival;
        let mut us = [None; 6];
        for (slot, mark) in us.iter_mut().zip(marks) {
            if let Some(at) = mark {
                *slot = Some(at.saturating_duration_since(prev).as_secs_f64() * 1e6);
                prev = prev.max(*at);
            }
        }
        let [parse_us, classify_us, admit_us, send_us, first_upstream_byte_us, first_client_byte_us] =
            us;
        Self {
            parse_us,
            classify_us,
            admit_us,
            send_us,
            first_upstream_byte_us,
            first_client_byte_us,
        }
    }
}

#[cfg(test)]
mod stage_tests {
    use super::*;

    #[test]
    fn each_stage_runs_from_the_previous_mark_reached() {
        let t0 = Instant::now();
        let at = |ms: u64| Some(t0 + Duration::from_millis(ms));
        // Classified and sent, but no upstream byte (the engine failed after the headers).
        let marks = [at(1), at(3), None, at(10), None, None];
        let s = StageSplit::from_marks(t0, &marks);
        assert_eq!(s.parse_us, Some(1_000.0));
        assert_eq!(s.classify_us, Some(2_000.0));
        assert_eq!(s.admit_us, None);
        assert_eq!(s.send_us, Some(7_000.0));
        assert_eq!(
            (s.first_upstream_byte_us, s.first_client_byte_us),
            (None, None)
        );
    }
}
