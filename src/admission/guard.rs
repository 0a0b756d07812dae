//! [`LaneGuard`]: the admitted request's slot and token reservation, given back on drop, and
//! its prefill reservation, given back at the first token ([`LaneGuard::prefill_done`]) or on
//! drop, whichever comes first.
//!
//! The guard knows its backend only through [`Reservation`], which the local counters
//! (`local.rs`) and a Redis lease (`redis/shared.rs`) implement; so this file imports neither.

use std::time::Duration;

use std::sync::Arc;

use futures::future::BoxFuture;

use super::preempt::Preemptible;

use crate::lane::Lane;

/// Where a reservation lives and goes back to: the local counters or a lease in the shared
/// quota.
pub(crate) trait Reservation: Send + Sync {
    /// Moves `tokens` in `from` to lane `to`, grown to `grown`, if `to` has room; all or nothing.
    fn promote(&self, from: Lane, tokens: u32, to: Lane, grown: u32) -> BoxFuture<'_, Move>;
    /// Gives one slot and `tokens` in `lane` back (a lease's release may run in the background);
    /// `served`: the prompt + output tokens the engine counted for the request, when known.
    fn release(self: Box<Self>, lane: Lane, tokens: u32, served: Option<u64>);
    /// Gives back `tokens` of prefill reservation (the request's prefill ended). Backends that
    /// keep no prefill budget never hand out one, so they keep this no-op.
    fn prefill_done(&self, _tokens: u32) {}
    /// Gives back `tokens` of prefill reservation of a request that ends before its first
    /// token (its prefill was cut, not done); by default as [`Reservation::prefill_done`].
    fn prefill_abandoned(&self, tokens: u32) {
        self.prefill_done(tokens);
    }
}

/// What an attempt to move (or grow) a reservation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Moved: the reservation is in its new lane, at its new size.
    Done,
    /// No room, and none coming: nothing changed.
    Full,
    /// No room yet, but pre-emptible work (jobs, marked answers) holding what it needs was
    /// asked to leave for it (`jobs.preempt`): room comes within moments. Nothing changed.
    Asked,
}

/// Proof of admission: holds one request slot and `tokens` of token budget in `lane`.
///
/// Dropping it gives both back and admits the next waiters that now fit. That happens on every
/// path: normal completion, an error, a panic that unwinds through the owner, or the owning
/// future being dropped (a client disconnect). Move it into the task that streams the response.
#[must_use = "dropping the guard immediately gives the slot back"]
pub struct LaneGuard {
    lane: Lane,
    tokens: u32,
    queue_wait: Duration,
    /// Prefill reservation still held (estimated prompt tokens); 0 once given back.
    prefill: u32,
    prefill_wait: Option<Duration>,
    release: Option<Box<dyn Reservation>>,
    /// Prompt + output tokens the engine counted ([`LaneGuard::served`]).
    served: Option<u64>,
    /// Pre-emptible work was asked to leave for this request (`preempt.rs`).
    made_room: Option<Duration>,
    /// A pre-emptible seat's handle (`preempt.rs`).
    preemptible: Option<Arc<Preemptible>>,
}

impl LaneGuard {
    /// A guard for a reservation already taken: one slot and `tokens` in `lane`.
    pub(super) fn new(
        reservation: Box<dyn Reservation>,
        lane: Lane,
        tokens: u32,
        queue_wait: Duration,
    ) -> Self {
        Self {
            lane,
            tokens,
            queue_wait,
            prefill: 0,
            prefill_wait: None,
            release: Some(reservation),
            served: None,
            made_room: None,
            preemptible: None,
        }
    }

    /// The same guard, on a pre-emptible seat asked back through `handle`.
    pub(super) fn with_preemptible(mut self, handle: Arc<Preemptible>) -> Self {
        self.preemptible = Some(handle);
        self
    }

    /// Whether this is a pre-emptible seat that admission asked back (its holder is to let
    /// its stream go: the engine's work is aborted, and that is no client's cancel).
    pub fn is_preempted(&self) -> bool {
        self.preemptible.as_ref().is_some_and(|h| h.is_preempted())
    }

    /// Whether this is a borrowed (pre-emptible) seat, whether or not it may still be asked
    /// back: such a seat cannot grow or move where it is.
    pub fn is_borrowed(&self) -> bool {
        self.preemptible.is_some()
    }

    /// The handle of a seat that may still be asked back (`preempt.rs`); `None` for any other.
    pub fn preemptible(&self) -> Option<&Arc<Preemptible>> {
        self.preemptible.as_ref().filter(|h| h.is_eligible())
    }

    /// Why a pre-emptible seat was asked back (`None`: it was not, or it is no such seat).
    pub fn preemptible_cause(&self) -> Option<super::preempt::Cause> {
        self.preemptible.as_ref().and_then(|h| h.cause())
    }

    /// The same guard, for a request that pre-emptible work was asked to leave for, admitted
    /// `after_ask` after it first asked (`None`: it asked none).
    pub(super) fn with_made_room(mut self, after_ask: Option<Duration>) -> Self {
        self.made_room = after_ask;
        self
    }

    /// Whether pre-emptible work (a job on a borrowed seat) was asked to leave for this request
    /// (`jobs.preempt`); its queue wait is then the time that took.
    pub fn made_room(&self) -> bool {
        self.made_room.is_some()
    }

    /// How long after it first asked pre-emptible work to leave it was admitted (`None`: it
    /// asked none). Its queue wait less this is how long it waited before any could be asked.
    pub fn admitted_after_ask(&self) -> Option<Duration> {
        self.made_room
    }

    /// The request was served `tokens` (prompt + output, as the engine counted them): what its
    /// tenant's fleet service counter settles to at release (`auth.fleet_fairness`). Without
    /// it, the request counts as never served.
    pub fn served(&mut self, tokens: u64) {
        self.served = Some(tokens);
    }

    /// The same guard holding `prefill` tokens of prefill reservation (already taken), after
    /// `prefill_wait` waiting for prefill room (`None`: the request did not have to wait for it,
    /// being short or under no budget).
    pub(super) fn with_prefill(mut self, prefill: u32, prefill_wait: Option<Duration>) -> Self {
        self.prefill = prefill;
        self.prefill_wait = prefill_wait;
        self
    }

    /// Prefill tokens still reserved (0 after [`LaneGuard::prefill_done`]).
    pub fn prefill(&self) -> u32 {
        self.prefill
    }

    /// How long a long prompt waited for room in the prefill budget (part of
    /// [`LaneGuard::queue_wait`]); `None` for prompts that never wait for it.
    pub fn prefill_wait(&self) -> Option<Duration> {
        self.prefill_wait
    }

    /// The request's prefill ended (its first token came): gives its prefill reservation back
    /// and lets long prompts waiting for prefill room in. Idempotent; the seat and the token
    /// reservation stay until the guard drops.
    pub fn prefill_done(&mut self) {
        let tokens = std::mem::take(&mut self.prefill);
        if tokens > 0 {
            if let Some(reservation) = &self.release {
                reservation.prefill_done(tokens);
            }
        }
    }

    /// The lane the request was admitted to.
    pub fn lane(&self) -> Lane {
        self.lane
    }

    /// Tokens reserved (input estimate + output budget).
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// How long the request waited in the gateway's queue before admission (M1); zero when
    /// admitted on arrival.
    pub fn queue_wait(&self) -> Duration {
        self.queue_wait
    }

    /// Moves this reservation to lane `to`, growing it to `tokens` (never shrinking it), if `to`
    /// has a free slot and token room; the old slot is free again at once. Otherwise nothing
    /// changed ([`Move::Full`], or [`Move::Asked`]: pre-emptible work was asked to leave for it,
    /// so trying again in a moment may move it).
    pub async fn promote(&mut self, to: Lane, tokens: u32) -> Move {
        let tokens = tokens.max(self.tokens);
        let moved = match &self.release {
            Some(reservation) => {
                reservation
                    .promote(self.lane, self.tokens, to, tokens)
                    .await
            }
            None => Move::Full,
        };
        if moved == Move::Done {
            self.lane = to;
            self.tokens = tokens;
        }
        moved
    }

    /// Forgets the reservation without giving it back, for a caller that already gave it back
    /// under its own lock (the grant that found its waiter gone).
    pub(super) fn disarm(mut self) {
        self.release = None;
    }
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        // Ended before its first token (error, disconnect during prefill, engine error).
        let prefill = std::mem::take(&mut self.prefill);
        if let Some(reservation) = self.release.take() {
            if prefill > 0 {
                reservation.prefill_abandoned(prefill);
            }
            reservation.release(self.lane, self.tokens, self.served);
        }
    }
}

impl std::fmt::Debug for LaneGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneGuard")
            .field("lane", &self.lane)
            .field("tokens", &self.tokens)
            .field("queue_wait", &self.queue_wait)
            .field("prefill", &self.prefill)
            .field("prefill_wait", &self.prefill_wait)
            .field("armed", &self.release.is_some())
            .finish()
    }
}
