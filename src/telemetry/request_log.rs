//! The structured request log: one JSON line per finished request, on stdout (diagnostic logs go
//! to stderr). Request id, lane, outcome, token counts, fingerprint and timings; never prompt
//! text (`telemetry.request_log` in config).

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::latency::{LatencySplit, StageSplit};

/// Where finished requests are logged.
#[derive(Debug, Clone, Default)]
pub enum RequestLog {
    /// Not logged.
    Off,
    /// One JSON line each on stdout.
    #[default]
    Stdout,
    /// Kept in memory (tests).
    Memory(Arc<Mutex<Vec<serde_json::Value>>>),
}

/// One finished request.
#[derive(Debug, Clone, Serialize)]
pub struct RequestLogLine<'a> {
    /// Unix time of the end, milliseconds.
    pub ts_ms: u64,
    /// The gateway's request id.
    pub request_id: &'a str,
    /// `answer`, `chat_completions`, `completions`.
    pub route: &'a str,
    /// Lane, when classified: the final one, after any mid-stream promotion.
    pub lane: Option<&'a str>,
    /// The lane it was admitted to, when a mid-stream promotion moved it (its queue wait and
    /// first token are that lane's); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promoted_from: Option<&'a str>,
    /// `tutor_gateway_requests_total`'s outcome.
    pub outcome: &'a str,
    /// Where a cancelled request was (`queued`, `prefill`, `decode`).
    pub cancelled_at: Option<&'a str>,
    /// Error code, for failed requests.
    pub error_code: Option<&'a str>,
    /// Input tokens estimated by classification: the count corrected by what the engine's
    /// counts taught, the engine's own count (`classify.exact_count`), or a byte-length upper
    /// bound.
    pub input_tokens_estimated: Option<u32>,
    /// Whether the input was counted (false: a byte-length upper bound decided).
    pub input_tokens_exact: Option<bool>,
    /// The gateway's own count before the correction (template overhead included); absent when
    /// byte length decided.
    pub input_tokens_counted: Option<u32>,
    /// Tokens reserved at admission: the input estimate plus the output budget (the
    /// client's limit, or `classify.default_output_tokens`). A later promotion raises the
    /// reservation to the new lane's work bound; this field keeps the first.
    pub tokens_reserved: Option<u32>,
    /// Input tokens vLLM reported.
    pub input_tokens: Option<u32>,
    /// Output tokens (exact when vLLM reported usage).
    pub output_tokens: Option<u32>,
    /// Prompt tokens served from vLLM's prefix cache.
    pub cached_tokens: Option<u32>,
    /// The prefill reservation admission took: the input estimate less the tokens the prompt's
    /// fingerprint was expected to find cached (`admission.prefill_discount_cached`).
    pub prefill_tokens_reserved: Option<u32>,
    /// Prompt fingerprint (M18).
    pub fingerprint: Option<&'a str>,
    /// The tenant its API key belongs to (`[auth]`), if any.
    pub tenant: Option<&'a str>,
    /// vLLM's finish reason.
    pub finish_reason: Option<&'a str>,
    /// The latency split.
    pub timings: LatencySplit,
    /// Where the time to the first byte went inside the gateway.
    pub stages_us: StageSplit,
}

impl RequestLog {
    /// A log kept in memory, and the handle to read it.
    pub fn memory() -> (Self, Arc<Mutex<Vec<serde_json::Value>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        (Self::Memory(lines.clone()), lines)
    }

    /// Writes one line.
    pub fn write(&self, line: &RequestLogLine<'_>) {
        match self {
            RequestLog::Off => {}
            RequestLog::Stdout => {
                if let Ok(text) = serde_json::to_string(line) {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{text}");
                }
            }
            RequestLog::Memory(lines) => {
                if let Ok(v) = serde_json::to_value(line) {
                    lines.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
            }
        }
    }
}
