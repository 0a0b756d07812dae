//! One job: its status, its text as it streams, its answer or error, its webhook attempts, and
//! the channel that tells its event streams something changed (the in-process store's record;
//! [`Status`], [`Answer`], [`Webhook`] and [`Ended`] are both backends' words).
//!
//! Everything mutable sits behind one short mutex; every change bumps a `watch` version, so an
//! event stream that wakes up reads all that happened since it last looked and misses nothing.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::classify::Classification;
use crate::pipeline::Ready;
use crate::telemetry::{LatencySplit, RequestRecord};

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting for idle large-lane capacity.
    Queued,
    /// Streaming from the engine.
    Running,
    /// Finished; the answer is readable until it expires.
    Done,
    /// The engine or the gateway failed it; the error is readable until it expires.
    Failed,
    /// Cancelled by `DELETE /jobs/{id}` (or the gateway shut down).
    Cancelled,
    /// Ended longer than `jobs.result_ttl` ago, or dropped by a `DELETE` after it ended: the
    /// result is gone.
    Expired,
}

impl Status {
    /// The API's and the metric label's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Expired => "expired",
        }
    }

    /// The status named `name` (as [`Status::as_str`] writes it).
    pub fn parse(name: &str) -> Option<Self> {
        [
            Status::Queued,
            Status::Running,
            Status::Done,
            Status::Failed,
            Status::Cancelled,
            Status::Expired,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// Whether the job has ended (nothing more will stream).
    pub const fn is_final(self) -> bool {
        !matches!(self, Status::Queued | Status::Running)
    }
}

/// A finished job's answer (what `/answer`'s `done` event says).
#[derive(Debug, Clone)]
pub struct Answer {
    /// Why generation stopped (`length` when cut at the lane's limit).
    pub finish_reason: Option<String>,
    /// `{"input_tokens","output_tokens","cached_tokens"}`.
    pub usage: Value,
    /// The latency split (from submission: its queue time included).
    pub timings: LatencySplit,
    /// The tool calls of a course with tools, joined from their pieces as a whole `/v1` answer
    /// lists them (empty: none).
    pub tool_calls: Vec<Value>,
}

impl Answer {
    /// What the `done` event says (and a shared store keeps): finish reason, usage, timings.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "timings": self.timings,
        });
        if !self.tool_calls.is_empty() {
            v["tool_calls"] = Value::Array(self.tool_calls.clone());
        }
        v
    }
}

/// One webhook delivery attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// When it was made, Unix seconds.
    pub at: f64,
    /// The receiver's HTTP status, when it answered.
    pub status: Option<u16>,
    /// `timeout` or `connect` when it did not (`no_client`: the webhook client could not be
    /// built at start-up, logged then; `busy`: not made, as
    /// [`super::webhook::MAX_ATTEMPTS_OUT`] attempts were out).
    pub error: Option<&'static str>,
}

/// What happened to a job's webhook.
#[derive(Debug, Clone, Default)]
pub struct Webhook {
    /// Attempts so far, oldest first.
    pub attempts: Vec<Attempt>,
    /// `Some(true)`: delivered; `Some(false)`: given up; `None`: in progress or not yet due.
    pub delivered: Option<bool>,
}

impl Webhook {
    /// The `webhook` part of a job's status.
    pub fn to_json(&self) -> Value {
        json!({
            "delivered": self.delivered,
            "attempts": self.attempts.iter().map(|a| json!({
                "at": a.at,
                "status": a.status,
                "error": a.error,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The mutable part of a job.
#[derive(Debug)]
pub struct State {
    /// Where it stands.
    pub status: Status,
    /// The classified request and its record, until the runner takes them.
    pub work: Option<(Ready, RequestRecord)>,
    /// The text so far.
    pub text: String,
    /// Where each streamed piece of `text` ends: piece `i` (event id `i + 1`) is
    /// `text[ends[i-1]..ends[i]]`.
    pub ends: Vec<usize>,
    /// The answer, once done.
    pub answer: Option<Answer>,
    /// `(code, message)`, once failed.
    pub error: Option<(&'static str, String)>,
    /// When it started.
    pub started: Option<(SystemTime, Instant)>,
    /// When it ended.
    pub finished: Option<(SystemTime, Instant)>,
    /// When its result was dropped (expired, or a `DELETE` after it ended): it is forgotten
    /// `jobs.result_ttl` after that.
    pub expired: Option<Instant>,
    /// Where to POST the result.
    pub notify: Option<reqwest::Url>,
    /// The webhook's attempts.
    pub webhook: Webhook,
    /// Bytes counted against `jobs.max_bytes` (request body and text).
    pub bytes: u64,
    /// Times it was pre-empted and resumed (`jobs.preempt`).
    pub preempted: u32,
}

/// One job.
#[derive(Debug)]
pub struct Entry {
    /// Its id (32 hex characters, the request id of its run).
    pub id: String,
    /// When it was submitted.
    pub submitted: (SystemTime, Instant),
    /// Its classification at submission (lane `large`, estimates, reservation).
    pub class: Classification,
    /// The tenant that submitted it (`[auth]`): only that tenant may read or cancel it.
    pub tenant: Option<String>,
    state: Mutex<State>,
    version: watch::Sender<u64>,
    /// Cancelled by `DELETE` (or shutdown): a running job drops its stream, aborting the
    /// engine's work.
    pub cancel: CancellationToken,
}

impl Entry {
    /// A queued job.
    pub fn new(
        id: String,
        class: Classification,
        work: (Ready, RequestRecord),
        notify: Option<reqwest::Url>,
        bytes: u64,
    ) -> Self {
        let tenant = work.0.tenant().map(|t| t.0.clone());
        Self {
            id,
            submitted: (SystemTime::now(), Instant::now()),
            class,
            tenant,
            state: Mutex::new(State {
                status: Status::Queued,
                work: Some(work),
                text: String::new(),
                ends: Vec::new(),
                answer: None,
                error: None,
                started: None,
                finished: None,
                expired: None,
                notify,
                webhook: Webhook::default(),
                bytes,
                preempted: 0,
            }),
            version: watch::Sender::new(0),
            cancel: CancellationToken::new(),
        }
    }

    /// Reads the state (short critical sections only; nothing awaits under it).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the state under the lock, then wakes the job's event streams.
    pub fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.lock());
        self.version.send_modify(|v| *v += 1);
        out
    }

    /// A receiver that wakes on every [`Entry::update`].
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The JSON of `GET /jobs/{id}` (and of the webhook), `position` jobs ahead when queued.
    pub fn view(&self, position: Option<usize>) -> Value {
        let s = self.lock();
        let mut v = json!({
            "id": self.id,
            "status": s.status.as_str(),
            "submitted_at": unix(self.submitted.0),
            "started_at": s.started.map(|t| unix(t.0)),
            "finished_at": s.finished.map(|t| unix(t.0)),
            "lane": self.class.lane.as_str(),
            "estimated_input_tokens": self.class.input_tokens_estimate,
            "output_budget": self.class.output_budget,
        });
        if let Some(p) = position.filter(|_| s.status == Status::Queued) {
            v["position"] = json!(p);
        }
        if s.status == Status::Running {
            v["output_pieces"] = json!(s.ends.len());
        }
        if s.preempted > 0 {
            v["preempted"] = json!(s.preempted);
        }
        if let Some(a) = &s.answer {
            let mut answer = a.to_json();
            answer["text"] = json!(s.text);
            v["answer"] = answer;
        }
        if let Some((code, message)) = &s.error {
            v["error"] = json!({ "code": code, "message": message });
        }
        if s.notify.is_some() {
            v["webhook"] = s.webhook.to_json();
        }
        v
    }
}

/// `t` as Unix seconds (milliseconds precision).
pub fn unix(t: SystemTime) -> f64 {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    (d.as_millis() as f64) / 1000.0
}

/// How a run of a job ended (what the runner hands its backend).
#[derive(Debug)]
pub enum Ended {
    /// The stream completed: the answer.
    Done(Box<Answer>),
    /// The engine or the gateway failed it: `(code, message)`.
    Failed(&'static str, String),
    /// `DELETE /jobs/{id}`.
    Cancelled,
    /// The gateway is shutting down, or (Redis, `jobs.preempt`) the run was pre-empted: in
    /// Redis the job goes back to the queue for another replica, its text kept with the run's
    /// progress when given (then it is continued, see `runner.rs`); in process it has nowhere
    /// to go and ends cancelled.
    HandedBack(Option<String>),
}
