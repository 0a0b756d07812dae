//! Admission (M8, M13): a request needs a request slot AND a token reservation, taken together.
//!
//! # Policies
//! - `lanes` (the product, work-conserving in the style of Kubernetes APF): each [`Lane`]'s
//!   `max_concurrency` is a reserved share that is always there for it; above it a lane that may
//!   `borrow` takes idle seats, up to its `ceiling`, while fewer than `admission.seats` are taken
//!   (not counting the idle reservations of lanes that do not `lend`). Small does not lend, so
//!   long work never sits in its reservation; large does not borrow, so long work stays bounded.
//!   A lent seat returns to its owner's next request at once; nothing is pre-empted. Token
//!   budgets per lane and global hold throughout (see `budget.rs`).
//! - `strict`: the seed's literal caps: `max_concurrency` is a hard cap per lane.
//! - `fifo` (the baseline): one queue, one concurrency limit or none; no token budget. Counters
//!   are still kept per lane, so metrics compare the policies lane by lane.
//!
//! Reservation = input estimate + output budget ([`crate::classify::Classification::work`]).
//! Known trade-off of the shared global token budget: a steady stream of small requests can
//! keep a large request that waits only on global tokens waiting until its timeout. The Redis
//! backend applies the same rules fleet-wide, from one versioned limits record in Redis (see
//! [`redis`]); `decision_tests.rs` checks both backends against one table of decisions.
//!
//! # Prefill budget
//! `admission.prefill_budget_tokens` (policies `lanes` and `strict`, both backends): the
//! estimated prompt tokens of requests between dispatch and first token. A prompt above
//! `admission.long_prompt_tokens` waits for room *before* it takes a seat, in its own lane's
//! queue (FIFO among long prompts), holding nothing; shorter prompts are counted and never wait.
//! A prompt larger than the budget runs when nothing else prefills. The reservation is given
//! back at the first token ([`LaneGuard::prefill_done`], called by the relay) or when the guard
//! drops. See `local.rs` and `budget.rs` (`PrefillLimit`); the Redis backend keeps one budget
//! for every replica in front of the engine (`redis/`, the acquire and prefill-done scripts).
//!
//! # Queues
//! A request waits only behind earlier requests of its own queue (strict FIFO per queue; a head
//! that does not fit holds back the ones behind it). Full queue: [`AdmissionError::QueueFull`]
//! (HTTP 429, `Retry-After`). Waiting longer than the queue timeout:
//! [`AdmissionError::Timeout`] (HTTP 503).
//!
//! # Giving back
//! [`LaneGuard`] returns the slot and the tokens on drop, on every path (completion, error,
//! panic, cancellation). A waiter whose future is dropped leaves its queue at once.
//!
//! # Backends
//! Both backends implement one trait, [`Backend`] (`backend.rs`): a request states what it
//! needs as one [`Ask`] (`lane`, `work`, `prefill`, `tenant`) and gets a [`LaneGuard`].
//! [`Admission`] picks the backend the config names: [`LocalAdmission`] (in-process, one
//! replica) or [`RedisAdmission`] (`quota.backend = "redis"`: the same limits shared by every
//! replica through Redis, with a local fallback while Redis is down; see [`redis`]).
//!
//! Files: `backend.rs` (the contract: [`Ask`], [`Backend`]), `budget.rs` (the seat and token budget check: what fits), `state.rs` (counters and
//! queues), `local.rs` (waiting and handing out guards), `guard.rs` (the RAII guard and the
//! trait its backends implement), `session.rs` (output per session, for continuations),
//! `error.rs`, `redis/` (the shared quota). Counters leave as a plain
//! [`AdmissionSnapshot`] (defined in telemetry, which renders it).

mod backend;
mod budget;
mod error;
pub mod fair;
mod guard;
mod local;
pub mod preempt;
pub mod redis;
pub mod session;
mod state;
pub mod tenant_budget;

#[cfg(test)]
mod backend_tests;
#[cfg(test)]
mod conserving_tests;
#[cfg(test)]
mod decision_tests;
#[cfg(test)]
mod fair_tests;
#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod prefill_tests;
#[cfg(test)]
mod tests;

pub use crate::telemetry::{AdmissionSnapshot, LaneSnapshot};
pub use backend::{AdmissionHealth, Ask, Backend, LimitsChange};
pub use error::{retry_secs, AdmissionError};
pub use guard::{LaneGuard, Move};
pub use local::LocalAdmission;
pub use redis::RedisAdmission;
pub use session::SessionLedger;

use crate::config::{Config, Policy, QuotaBackend};
use crate::lane::Lane;
use crate::telemetry::QuotaMetrics;

/// The admission backend in use.
#[derive(Debug, Clone)]
pub enum Admission {
    /// In-process lanes or FIFO, for one replica.
    Local(LocalAdmission),
    /// The quota shared by all replicas, in Redis.
    Redis(RedisAdmission),
}

impl Admission {
    /// The in-process backend with the policy and limits of `config`.
    pub fn from_config(config: &Config) -> Self {
        Admission::Local(LocalAdmission::from_config(config))
    }

    /// The backend `config.quota.backend` names; the Redis backend reports to `metrics`.
    /// Needs a Tokio runtime for the Redis backend's background tasks.
    pub fn build(config: &Config, metrics: QuotaMetrics) -> Result<Self, ::redis::RedisError> {
        Ok(match config.quota.backend {
            QuotaBackend::Local => Admission::Local(LocalAdmission::from_config(config)),
            QuotaBackend::Redis => Admission::Redis(RedisAdmission::from_config(config, metrics)?),
        })
    }

    /// The backend in use, behind the contract both keep.
    pub fn backend(&self) -> &dyn Backend {
        match self {
            Admission::Local(local) => local,
            Admission::Redis(redis) => redis,
        }
    }

    /// Whether admission works as configured.
    pub fn health(&self) -> AdmissionHealth {
        self.backend().health()
    }

    /// Waits for `ask`'s seat, tokens and prefill room; see [`Backend::acquire`] (and
    /// [`LocalAdmission::acquire`], [`RedisAdmission::acquire`]: the same contract, fleet-wide).
    pub async fn acquire(&self, ask: Ask<'_>) -> Result<LaneGuard, AdmissionError> {
        self.backend().acquire(ask).await
    }

    /// The shared quota, when Redis is the backend (background jobs then take their seats
    /// with [`RedisAdmission::take_with`], in the same script that starts them).
    pub fn shared(&self) -> Option<&RedisAdmission> {
        match self {
            Admission::Local(_) => None,
            Admission::Redis(redis) => Some(redis),
        }
    }

    /// A seat in `lane` for background work (jobs), only out of idle capacity; see
    /// [`LocalAdmission::try_acquire_idle`]. Always `None` with the Redis backend (see
    /// [`Admission::shared`]).
    pub fn try_acquire_idle(&self, lane: Lane, tokens: u32, prompt: u32) -> Option<LaneGuard> {
        match self {
            Admission::Local(local) => local.try_acquire_idle(lane, tokens, prompt),
            Admission::Redis(_) => None,
        }
    }

    /// Whether background work of `tokens` in `lane` could ever take a seat under the limits in
    /// force ([`LocalAdmission::admissible`]); always `Ok` with the Redis backend, whose jobs
    /// are taken by the shared store's scripts.
    pub fn admissible(&self, lane: Lane, tokens: u32) -> Result<(), AdmissionError> {
        match self {
            Admission::Local(local) => local.admissible(lane, tokens),
            Admission::Redis(_) => Ok(()),
        }
    }

    /// A pre-emptible seat of any lane for background work (`jobs.preempt`); see
    /// [`LocalAdmission::try_acquire_preemptible`]. Always `None` with the Redis backend.
    pub fn try_acquire_preemptible(
        &self,
        lane: Lane,
        tokens: u32,
        prompt: u32,
        handle: &std::sync::Arc<preempt::Preemptible>,
    ) -> Option<LaneGuard> {
        match self {
            Admission::Local(local) => local.try_acquire_preemptible(lane, tokens, prompt, handle),
            Admission::Redis(_) => None,
        }
    }

    /// A pre-emptible seat for interactive work that gives it back when asked
    /// (`jobs.preempt_answers`), on either backend: [`LocalAdmission::try_acquire_preemptible`]
    /// in process, [`RedisAdmission::borrow`] fleet-wide. Never waits; `None`: the request
    /// queues as any other (always for a `handle` that may no longer be pre-empted).
    pub async fn borrow(
        &self,
        lane: Lane,
        tokens: u32,
        prompt: u32,
        handle: &std::sync::Arc<preempt::Preemptible>,
    ) -> Option<LaneGuard> {
        match self {
            // As the Redis backend: an answer that may no longer be pre-empted queues for a
            // seat of its own lane, which can grow or move mid-stream (a borrowed one cannot:
            // its growth would be cut).
            Admission::Local(_) if !handle.is_eligible() => None,
            Admission::Local(local) => local.try_acquire_preemptible(lane, tokens, prompt, handle),
            Admission::Redis(redis) => redis.borrow(lane, tokens, prompt, handle).await,
        }
    }

    /// A receiver that wakes when capacity may have come back (see [`LocalAdmission::freed`]);
    /// `None` with the Redis backend.
    pub fn freed(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Admission::Local(local) => Some(local.freed()),
            Admission::Redis(_) => None,
        }
    }

    /// Puts the limits of `config` in force (a reload); see [`Backend::set_limits`].
    pub fn set_limits(&self, config: &Config, force: bool) -> LimitsChange {
        self.backend().set_limits(config, force)
    }

    /// Consistent counters of every lane, for metrics.
    pub fn snapshot(&self) -> AdmissionSnapshot {
        self.backend().snapshot()
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.backend().policy()
    }

    /// Whether a prompt of `prompt` tokens waits for prefill room; see
    /// [`Backend::waits_for_prefill`].
    pub fn waits_for_prefill(&self, prompt: u32) -> bool {
        self.backend().waits_for_prefill(prompt)
    }

    /// Whether `tenant` holds more than its share of `lane`'s waiters; see
    /// [`Backend::over_share`].
    pub fn over_share(&self, lane: Lane, tenant: &str) -> bool {
        self.backend().over_share(lane, tenant)
    }

    /// The requests of a line fair queuing admits before an arrival of `tenant`; see
    /// [`Backend::fair_ahead`].
    pub fn fair_ahead(&self, lane: Lane, long: bool, tenant: Option<&str>) -> u32 {
        self.backend().fair_ahead(lane, long, tenant)
    }
}
