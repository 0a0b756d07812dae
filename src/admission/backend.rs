//! What every admission backend answers to: one [`Ask`] in, one [`LaneGuard`] out.
//!
//! [`Backend`] is implemented by the in-process [`crate::admission::LocalAdmission`] and by the
//! Redis-shared [`crate::admission::RedisAdmission`]; [`crate::admission::Admission`] picks one
//! from the config and forwards to it, so the pipeline, `/tokenize` and the tests call one
//! `acquire` whatever the backend.

use futures::future::BoxFuture;

use super::error::AdmissionError;
use super::fair::Due;
use super::guard::LaneGuard;
use crate::config::{Config, Policy};
use crate::lane::Lane;
use crate::telemetry::AdmissionSnapshot;

/// What a request asks of admission: a seat in `lane`, `work` tokens of budget (input estimate
/// plus output budget, [`crate::classify::Classification::work`]) and, until its first token,
/// `prefill` tokens of the prefill budget; `tenant` takes its turns in a queue by its share, and
/// among its tenant's waiters of its lane it goes earliest `due` first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The lane whose seat it takes.
    pub lane: Lane,
    /// Tokens reserved in the lane's and the global budget while it runs.
    pub work: u32,
    /// Estimated prompt tokens held in the prefill budget until the first token (0: none).
    pub prefill: u32,
    /// The tenant whose share orders its turn in a queue (`None`: share 1).
    pub tenant: Option<&'a str>,
    /// When its first token stops being useful: its place among its tenant's waiters of its
    /// lane (earliest first; `None`: after those with a deadline, in arrival order).
    pub due: Due,
    /// A pre-empted request going on (in process): it waits at the head of its lane's queue,
    /// even a full one, ahead of the requests that never ran.
    pub continuing: bool,
}

impl<'a> Ask<'a> {
    /// A seat in `lane` and `work` tokens; no prefill reservation, no tenant.
    pub fn new(lane: Lane, work: u32) -> Self {
        Self {
            lane,
            work,
            prefill: 0,
            tenant: None,
            due: None,
            continuing: false,
        }
    }

    /// The same ask with a prefill reservation of `prefill` (estimated prompt) tokens.
    #[must_use]
    pub fn with_prefill(self, prefill: u32) -> Self {
        Self { prefill, ..self }
    }

    /// The same ask on behalf of `tenant`.
    #[must_use]
    pub fn for_tenant(self, tenant: Option<&'a str>) -> Self {
        Self { tenant, ..self }
    }

    /// The same ask, due at `due` (see [`Ask::due`]).
    #[must_use]
    pub fn due_at(self, due: Due) -> Self {
        Self { due, ..self }
    }

    /// The same ask for a pre-empted request's continuation (see [`Ask::continuing`]).
    #[must_use]
    pub fn continuing(self) -> Self {
        Self {
            continuing: true,
            ..self
        }
    }
}

/// Whether admission works as configured (for `/readyz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionHealth {
    /// As configured.
    Ok,
    /// Redis is down and `fail_open` admits under the local fallback limits.
    Degraded,
    /// Redis is down and `fail_closed` refuses new requests.
    Unavailable,
}

/// What a reload did to the admission limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitsChange {
    /// In force in this process (the in-process backend).
    InForce,
    /// The shared record is left as it is: the file's limits did not change.
    Unchanged,
    /// Written as a new version of the shared record (at once when Redis answers, else by the
    /// next heartbeat).
    Pushing,
    /// Not written: the shared record in force came from `tutor-gateway limits push`; a reload
    /// replaces it only with force (`POST /admin/reload?force=true`).
    KeptPushed {
        /// The record's version.
        version: u64,
        /// Who wrote it.
        origin: String,
    },
}

impl LimitsChange {
    /// One line for the reload's answer and log.
    pub fn describe(&self) -> String {
        match self {
            LimitsChange::InForce => "in force in this process".into(),
            LimitsChange::Unchanged => "unchanged: the shared limits record was not written".into(),
            LimitsChange::Pushing => "written as a new version of the shared limits record".into(),
            LimitsChange::KeptPushed { version, origin } => format!(
                "not written: the shared limits record (version {version}) came from `{origin}`; \
                 reload with force (POST /admin/reload?force=true) or run `tutor-gateway limits \
                 push` with this file to replace it"
            ),
        }
    }
}

/// An admission backend: the contract both quota backends keep (the same errors, the same
/// decisions; `decision_tests.rs` checks their rule against one table).
pub trait Backend: Send + Sync {
    /// Waits for `ask`'s seat, tokens and prefill room, taken together.
    ///
    /// Errors: [`AdmissionError::QueueFull`] when its queue is full,
    /// [`AdmissionError::Timeout`] after the queue's timeout, [`AdmissionError::TooLarge`] when
    /// `ask.work` could never fit, [`AdmissionError::QuotaUnavailable`] when a shared quota is
    /// unreachable under `fail_closed`. Cancel-safe: dropping the future leaves the queue, and a
    /// seat granted in that instant is given back.
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<LaneGuard, AdmissionError>>;

    /// Puts the limits of `config` in force (a reload): lane limits, budgets, seats, ceilings,
    /// lending, queues, tenant shares. Running requests keep their seats; a lane above a
    /// lowered limit admits no one until it is under it. The policy and backend stay. `force`:
    /// a shared record written by `tutor-gateway limits push` is replaced too.
    fn set_limits(&self, config: &Config, force: bool) -> LimitsChange;

    /// Consistent counters of every lane (this replica's part, for a shared quota).
    fn snapshot(&self) -> AdmissionSnapshot;

    /// Whether a prompt of `prompt` (estimated, uncached) tokens waits for prefill room under
    /// the limits in force: a long prompt under a prefill budget, queued in its lane's line of
    /// long prompts.
    fn waits_for_prefill(&self, prompt: u32) -> bool;

    /// Whether `tenant` holds more than its share of the requests waiting in `lane`'s queue
    /// (see [`super::fair::over_share`]; with Redis, this replica's lines).
    fn over_share(&self, lane: Lane, tenant: &str) -> bool;

    /// How many of the requests waiting in `lane`'s line of long prompts (`long`) or its other
    /// line fair queuing admits before an arrival of `tenant` (see [`super::fair::fair_ahead`];
    /// with Redis, this replica's lines).
    fn fair_ahead(&self, lane: Lane, long: bool, tenant: Option<&str>) -> u32;

    /// The policy in force.
    fn policy(&self) -> Policy;

    /// Whether it works as configured.
    fn health(&self) -> AdmissionHealth;
}
