//! The structured request log: one JSON line per finished request, on stdout (diagnostic logs go
//! to stderr). Request id, lane, outcome, token counts, fingerprint and timings; never prompt
//! text (`telemetry.request_log` in config).

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::latency::{LatencySplit, StageSplit};

/// Lines waiting to be written before new ones are dropped (a few MB; a minute of a busy
/// gateway's requests).
pub const QUEUED_LINES: usize = 16_384;

/// Where finished requests are logged.
#[derive(Debug, Clone)]
pub enum RequestLog {
    /// Not logged.
    Off,
    /// One JSON line each on stdout, written by a thread of its own ([`LineSink`]).
    Stdout(LineSink),
    /// Kept in memory (tests).
    Memory(Arc<Mutex<Vec<serde_json::Value>>>),
}

/// Lines written by a thread of their own, so a writer that blocks (a log shipper behind on
/// reading the container's stdout) never holds a request's task: beyond [`QUEUED_LINES`]
/// waiting, a line is dropped and counted (`tutor_gateway_request_log_dropped_total`).
#[derive(Debug, Clone)]
pub struct LineSink {
    tx: SyncSender<String>,
    /// Lines dropped because the queue was full.
    dropped: Arc<AtomicU64>,
    /// Lines queued and not yet written.
    pending: Arc<AtomicUsize>,
}

impl LineSink {
    /// Lines written to `out`, at most `capacity` waiting.
    pub fn new(out: impl Write + Send + 'static, capacity: usize) -> Self {
        Self::named("request-log", out, capacity)
    }

    /// [`LineSink::new`], its writer thread named `name`.
    pub fn named(name: &str, mut out: impl Write + Send + 'static, capacity: usize) -> Self {
        let (tx, rx) = sync_channel::<String>(capacity);
        let pending = Arc::new(AtomicUsize::new(0));
        let written = Arc::clone(&pending);
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for line in rx {
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                    written.fetch_sub(1, Ordering::AcqRel);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "the request log's writer thread did not start");
        }
        Self {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            pending,
        }
    }

    /// Queues `line`, or drops and counts it when the queue is full.
    fn send(&self, line: String) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(line) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lines dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits (blocking, at most `within`) until every queued line is written. Whether all were.
    pub fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.pending.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

/// One diagnostic log event's bytes, queued on its [`LineSink`] as one line when the `tracing`
/// formatter is done with it (the formatter's newline is the sink's).
#[derive(Debug)]
pub struct EventLine {
    sink: LineSink,
    bytes: Vec<u8>,
}

impl Write for EventLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventLine {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.bytes);
        let line = text.strip_suffix('\n').unwrap_or(&text);
        if !line.is_empty() {
            self.sink.send(line.to_owned());
        }
    }
}

/// A [`LineSink`] as the diagnostic log's writer: the `tracing` formatter writes each event
/// into an [`EventLine`], so a request's task never blocks on stderr (a log pipe read slowly);
/// beyond the sink's queue, events are dropped and counted.
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LineSink {
    type Writer = EventLine;

    fn make_writer(&'a self) -> Self::Writer {
        EventLine {
            sink: self.clone(),
            bytes: Vec::new(),
        }
    }
}

impl RequestLog {
    /// One JSON line each on stdout.
    pub fn stdout() -> Self {
        Self::Stdout(LineSink::new(std::io::stdout(), QUEUED_LINES))
    }

    /// Lines dropped so far because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        match self {
            Self::Stdout(sink) => sink.dropped(),
            _ => 0,
        }
    }

    /// Waits (blocking, at most `within`) until every queued line is written: at shutdown, so
    /// the last requests' lines are not lost with the process. Whether all were.
    pub fn flush(&self, within: Duration) -> bool {
        match self {
            Self::Stdout(sink) => sink.flush(within),
            _ => true,
        }
    }
}

/// One finished request.
#[derive(Debug, Clone, Serialize)]
pub struct RequestLogLine<'a> {
    /// Unix time of the end, milliseconds.
    pub ts_ms: u64,
    /// The gateway's request id.
    pub request_id: &'a str,
    /// `answer`, `chat_completions`, `completions`, `job`.
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
    /// client's limit, or `classify.default_output_tokens`), or what it held at the end when a
    /// promotion raised it (to the new lane's work bound) mid-stream.
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
            RequestLog::Stdout(sink) => {
                if let Ok(text) = serde_json::to_string(line) {
                    sink.send(text);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer stuck (a log shipper not reading) until `open` says go; what it wrote.
    struct Stuck {
        open: std::sync::mpsc::Receiver<()>,
        waited: bool,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Stuck {
        /// A stuck writer, the sender that lets it go, and what it wrote.
        fn new() -> (Self, std::sync::mpsc::Sender<()>, Arc<Mutex<Vec<u8>>>) {
            let (go, open) = std::sync::mpsc::channel();
            let out = Arc::new(Mutex::new(Vec::new()));
            let stuck = Stuck {
                open,
                waited: false,
                out: Arc::clone(&out),
            };
            (stuck, go, out)
        }
    }

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !self.waited {
                let _ = self.open.recv();
                self.waited = true;
            }
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A writer that does not keep up never holds the request that logs: its lines queue up to
    /// the bound, the rest are dropped and counted, and every queued line is written once the
    /// writer moves again (the shutdown's flush waits for them).
    #[test]
    fn a_stuck_writer_never_holds_a_request_and_its_lines_are_kept_or_counted() {
        let (stuck, go, out) = Stuck::new();
        let log = RequestLog::Stdout(LineSink::new(stuck, 4));
        let RequestLog::Stdout(sink) = &log else {
            unreachable!()
        };
        // Each send returns at once (this test would hang otherwise).
        for i in 0..20 {
            sink.send(format!("line {i}"));
        }
        let dropped = log.dropped();
        assert!((15..=16).contains(&dropped), "{dropped} dropped");
        assert!(!log.flush(Duration::from_millis(50)), "the writer is stuck");
        go.send(()).unwrap();
        assert!(log.flush(Duration::from_secs(60)), "written once it moves");
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count() as u64, 20 - dropped, "{text}");
        assert!(text.starts_with("line 0\n"), "in order: {text}");
    }

    /// The diagnostic log through a sink: a stderr that is not read never holds the task that
    /// logs (events past the queue are dropped and counted), and each event is one line.
    #[test]
    fn diagnostic_events_through_a_stuck_sink_never_block_and_each_is_one_line() {
        let (stuck, go, out) = Stuck::new();
        let sink = LineSink::named("test-diagnostic-log", stuck, 4);
        let subscriber = tracing_subscriber::fmt()
            .with_writer(sink.clone())
            .with_ansi(false)
            .finish();
        // Each event returns at once (this test would hang otherwise).
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..20 {
                tracing::warn!(i, "refused");
            }
        });
        let dropped = sink.dropped();
        assert!((15..=16).contains(&dropped), "{dropped} dropped");
        go.send(()).unwrap();
        assert!(sink.flush(Duration::from_secs(60)), "written once it moves");
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count() as u64, 20 - dropped, "{text}");
        assert!(
            text.lines()
                .all(|l| l.contains("WARN") && l.contains("refused")),
            "{text}"
        );
    }
}
