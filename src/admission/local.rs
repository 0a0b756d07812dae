//! In-process admission (one gateway replica): a mutex-protected [`State`] and FIFO queues
//! whose waiters are handed their [`LaneGuard`] through a oneshot channel.
//!
//! Cancellation safety: a queued waiter holds a [`QueueTicket`]; dropping the waiting future
//! (client gone, timeout) drops the ticket, which takes the waiter out of its queue. A guard
//! granted in the instant before is either returned by the failed send (and undone under the
//! same lock) or dropped with the receiver, which gives it back like any other guard.
//!
//! Prefill budget ([`PrefillLimit`]): a long prompt waits for prefill room *before* it takes a
//! seat, in its own lane's queue, so while it waits it holds nothing (no seat of its own lane
//! or of another). Seat, tokens and prefill reservation are taken together under the lock. In a
//! queue, long prompts waiting for prefill room keep their order among themselves (FIFO); a
//! short prompt behind them is not held back by them (short prompts never wait for the prefill
//! budget), but it does wait behind any waiter that lacks a seat or tokens (strict FIFO per
//! queue, as before). The prefill reservation is given back at the first token
//! ([`LaneGuard::prefill_done`]) or when the guard drops, whichever comes first.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::backend::{AdmissionHealth, Ask, Backend, LimitsChange};
use super::budget::{Limits, PrefillLimit, Usage};
use super::error::AdmissionError;
use super::fair::{over_share, room_for, Room};
use super::guard::{LaneGuard, Move, Reservation};
use super::preempt::{candidates, victims, Borrower, Cause, Preemptible};
use super::state::{State, Waiter};
use crate::config::{Config, Policy};
use crate::lane::Lane;
use crate::telemetry::AdmissionSnapshot;

/// The limits in force: replaced whole by a reload ([`LocalAdmission::set_limits`]).
struct Rules {
    limits: Limits,
    prefill: PrefillLimit,
    /// Each tenant's share of a queue's turns (`auth.tenant_shares`; 1 when not listed).
    shares: std::collections::HashMap<String, f64>,
    /// `jobs.preempt_prefill_grace_tokens`.
    grace: u32,
    /// `jobs.preempt_cooldown_ms`.
    cooldown: Duration,
}

impl Rules {
    fn from_config(config: &Config) -> Self {
        Self {
            limits: Limits::from_config(config),
            prefill: PrefillLimit::from_config(config),
            shares: crate::admission::fair::shares(config),
            grace: config.jobs.preempt_prefill_grace_tokens,
            cooldown: config.jobs.preempt_cooldown,
        }
    }
}

/// The state shared by [`LocalAdmission`] handles and their guards.
pub(crate) struct Shared {
    /// Read under `state`'s lock or alone; written only under `state`'s lock (so a reload and
    /// an admission never interleave).
    rules: RwLock<Arc<Rules>>,
    state: Mutex<State>,
    /// Bumped whenever a seat, tokens or prefill room come back, or a waiter leaves.
    freed: watch::Sender<u64>,
}

/// In-process admission for one replica. Cheap to clone; clones share the same lanes.
#[derive(Clone)]
pub struct LocalAdmission {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LocalAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalAdmission")
            .field("policy", &self.shared.rules().limits.policy())
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl LocalAdmission {
    /// Admission with the policy and limits of `config`.
    pub fn from_config(config: &Config) -> Self {
        let rules = Rules::from_config(config);
        let state = Mutex::new(State::new(rules.limits.queue_count()));
        Self {
            shared: Arc::new(Shared {
                rules: RwLock::new(Arc::new(rules)),
                state,
                freed: watch::Sender::new(0),
            }),
        }
    }

    /// Puts the lane limits, budgets, seats, ceilings, lending, queues and tenant shares of
    /// `config` in force (a reload; the policy stays, see `crate::config::reload`). Nothing
    /// running is cut: a lane above a lowered limit admits no one until it is under it. Waiters
    /// that now fit are admitted at once.
    pub fn set_limits(&self, config: &Config) {
        let rules = Rules::from_config(config);
        let shared = &self.shared;
        let mut state = shared.lock();
        if rules.limits.queue_count() != state.queues.len() {
            // A different policy's queue layout: left to a restart (the reload reports it).
            return;
        }
        // A waiter the new limits can never admit (its reservation is now above its lane's
        // budget) is refused at once, as it would be on arrival: left in, it would block its
        // queue until its timeout.
        for queue in 0..state.queues.len() {
            let mut pos = 0;
            while let Some(w) = state.queues[queue].get(pos) {
                match rules.limits.admissible(w.lane, w.tokens) {
                    Ok(()) => pos += 1,
                    Err(too_large) => {
                        if let Some(w) = state.leave_at(queue, pos) {
                            let _ = w.grant.send(Err(too_large));
                        }
                    }
                }
            }
        }
        *shared.rules.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
        shared.dispatch(&mut state);
        drop(state);
        shared.freed.send_modify(|n| *n += 1);
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.shared.rules().limits.policy()
    }

    /// Consistent counters of every lane.
    pub fn snapshot(&self) -> AdmissionSnapshot {
        let prefill = self.shared.rules().prefill;
        self.shared.lock().snapshot(|prompt| prefill.waits(prompt))
    }

    /// Whether a prompt of `prompt` tokens waits for prefill room under the limits in force.
    pub fn waits_for_prefill(&self, prompt: u32) -> bool {
        self.shared.rules().prefill.waits(prompt)
    }

    /// Waits for `ask`'s seat, `ask.work` tokens of budget and its prefill room, taken in
    /// one step.
    ///
    /// Admitted at once when the lane's queue is empty and all fit; otherwise waits behind
    /// earlier requests of the same queue, up to the queue's timeout: the tenants present take
    /// turns in proportion to their shares, and a tenant's turn in a lane goes to its waiter
    /// due first, FIFO among equal dues (see `fair.rs`). A
    /// prompt of `ask.prefill` tokens above `admission.long_prompt_tokens`, under a prefill
    /// budget, waits for prefill room first (see the module doc). Errors:
    /// [`AdmissionError::QueueFull`] when the queue is at `queue_len`,
    /// [`AdmissionError::Timeout`] after `queue_timeout`, [`AdmissionError::TooLarge`] when
    /// `ask.work` could never fit. Cancel-safe: dropping the future leaves the queue.
    pub async fn acquire(&self, ask: Ask<'_>) -> Result<LaneGuard, AdmissionError> {
        let Ask {
            lane,
            work: tokens,
            prefill: prompt,
            tenant,
            ..
        } = ask;
        let shared = &self.shared;
        let (mut receiver, ticket, timeout) = {
            let mut state = shared.lock();
            // The rules read under the state's lock: a reload swaps them under it (and refuses
            // the waiters its limits can never admit), so an arrival is checked against the
            // rules it will wait under, not enqueued past that purge to block its queue.
            let rules = shared.rules();
            let limits = &rules.limits;
            limits.admissible(lane, tokens)?;
            let queue = limits.queue_of(lane);
            let queue_limit = limits.queue(queue);
            if shared.admits_now(&state, queue, lane, tokens, prompt) {
                state.take(lane, tokens);
                state.take_prefill(prompt);
                let waited = shared
                    .rules()
                    .prefill
                    .waits(prompt)
                    .then_some(Duration::ZERO);
                return Ok(
                    LaneGuard::new(Box::new(shared.clone()), lane, tokens, Duration::ZERO)
                        .with_prefill(prompt, waited),
                );
            }
            let retry_after = Duration::from_secs(queue_limit.timeout.as_secs().max(1));
            // A continuation ran a moment ago: it always gets a place (there are at most as
            // many as pre-emptible seats).
            let room = if ask.continuing {
                Room::Enter
            } else {
                // Continuations are not counted: they are not pushed out either.
                room_for(
                    queue_limit.len,
                    state.queues[queue]
                        .iter()
                        .filter(|w| !w.continuing)
                        .map(|w| w.tenant.as_ref()),
                    tenant,
                    |t| rules.shares.get(t).copied().unwrap_or(1.0),
                )
            };
            match room {
                Room::Enter => {}
                Room::PushOut {
                    tenant: over,
                    held,
                    places,
                } => {
                    if let Some(out) = state.push_out(queue, &over) {
                        let _ = out.grant.send(Err(AdmissionError::TenantQueueFull {
                            lane: out.lane,
                            tenant: over.to_string(),
                            held,
                            places,
                            retry_after,
                        }));
                    }
                }
                Room::Refuse { held, places } => {
                    if queue_limit.len == 0 {
                        // A lane that never waits: the borrowed seats it could have had are
                        // asked back for the next request (none waits to ask for them), and no
                        // job borrows within the cool-down.
                        state.last_waited = Some(Instant::now());
                        if !state.borrowers.is_empty() {
                            let refused = Need {
                                id: None,
                                lane,
                                tokens,
                                prefill: prompt,
                            };
                            shared.preempt_for(&mut state, Some(refused));
                        }
                    }
                    return Err(match tenant.filter(|_| places > 0) {
                        Some(t) => AdmissionError::TenantQueueFull {
                            lane,
                            tenant: t.to_owned(),
                            held,
                            places,
                            retry_after,
                        },
                        None => AdmissionError::QueueFull { lane, retry_after },
                    });
                }
            }
            let (sender, receiver) = oneshot::channel();
            let share = tenant
                .and_then(|t| rules.shares.get(t))
                .copied()
                .unwrap_or(1.0);
            let id = state.enqueue(queue, &ask, share, sender);
            // Notes when a long prompt starts waiting for prefill room alone (it admits no one:
            // whoever could go was admitted before this arrival).
            shared.dispatch(&mut state);
            let ticket = QueueTicket {
                shared: shared.clone(),
                queue,
                id,
            };
            (receiver, ticket, queue_limit.timeout)
        };
        let started = Instant::now();
        let outcome = tokio::time::timeout(timeout, &mut receiver).await;
        // Leave the queue (if still in it) before looking at the outcome; a guard granted in
        // the meantime sits in `receiver` and is given back when `receiver` drops.
        drop(ticket);
        match outcome {
            Ok(Ok(granted)) => granted,
            // The sender was dropped without a grant: only on a removal, which is ours.
            Ok(Err(_)) | Err(_) => Err(AdmissionError::Timeout {
                lane,
                waited: started.elapsed(),
            }),
        }
    }
}

impl Backend for LocalAdmission {
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<LaneGuard, AdmissionError>> {
        Box::pin(LocalAdmission::acquire(self, ask))
    }

    fn set_limits(&self, config: &Config, _force: bool) -> LimitsChange {
        LocalAdmission::set_limits(self, config);
        LimitsChange::InForce
    }

    fn snapshot(&self) -> AdmissionSnapshot {
        LocalAdmission::snapshot(self)
    }

    fn waits_for_prefill(&self, prompt: u32) -> bool {
        LocalAdmission::waits_for_prefill(self, prompt)
    }

    fn over_share(&self, lane: Lane, tenant: &str) -> bool {
        let rules = self.shared.rules();
        let queue = rules.limits.queue_of(lane);
        let state = self.shared.lock();
        over_share(
            state.queues[queue].iter().map(|w| w.tenant.as_ref()),
            tenant,
            |t| rules.shares.get(t).copied().unwrap_or(1.0),
        )
    }

    fn fair_ahead(&self, lane: Lane, long: bool, tenant: Option<&str>) -> u32 {
        let rules = self.shared.rules();
        let state = self.shared.lock();
        super::fair::fair_ahead(
            state
                .queues
                .iter()
                .flatten()
                .filter(|w| w.lane == lane && rules.prefill.waits(w.prefill) == long)
                .map(|w| w.tenant.as_ref()),
            tenant,
            |t| rules.shares.get(t).copied().unwrap_or(1.0),
        )
    }

    fn policy(&self) -> Policy {
        LocalAdmission::policy(self)
    }

    fn health(&self) -> AdmissionHealth {
        AdmissionHealth::Ok
    }
}

impl LocalAdmission {
    /// A seat and `tokens` in `lane` taken whatever the limits say: the Redis backend's
    /// fallback counts, this way, the leases its replica still holds in Redis when Redis goes
    /// away (those requests run on; the fallback's share must include them).
    pub fn force_take(&self, lane: Lane, tokens: u32) -> LaneGuard {
        self.shared.lock().take(lane, tokens);
        LaneGuard::new(Box::new(self.shared.clone()), lane, tokens, Duration::ZERO)
    }

    /// As [`LocalAdmission::force_take`] for a borrowed (pre-emptible) lease: a seat of `seat`,
    /// `tokens` counted in `lane`, as this backend counts its own borrowed seats.
    pub fn force_take_apart(&self, seat: Lane, lane: Lane, tokens: u32) -> LaneGuard {
        self.shared.lock().take_apart(seat, lane, tokens);
        let apart = TakenApart {
            shared: self.shared.clone(),
            seat,
        };
        LaneGuard::new(Box::new(apart), lane, tokens, Duration::ZERO)
    }

    /// `Err(TooLarge)` when a reservation of `tokens` in `lane` could never be admitted under the
    /// limits in force (a reload lowered them below it), as on arrival.
    pub fn admissible(&self, lane: Lane, tokens: u32) -> Result<(), AdmissionError> {
        self.shared.rules().limits.admissible(lane, tokens)
    }

    /// A seat in `lane` for background work, only if it is idle capacity: `lane` has one of its
    /// own seats free (nothing borrowed), nobody waits in its queue, and `tokens` and the
    /// `prompt`'s prefill fit their budgets. Never waits; `None` when any of that fails.
    pub fn try_acquire_idle(&self, lane: Lane, tokens: u32, prompt: u32) -> Option<LaneGuard> {
        let shared = &self.shared;
        let mut state = shared.lock();
        let queue = shared.rules().limits.queue_of(lane);
        let idle = state.queues[queue].is_empty()
            && shared.rules().limits.fits_own(&state.usage, lane, tokens)
            && shared.rules().prefill.fits(state.prefill, prompt);
        if !idle {
            return None;
        }
        state.take(lane, tokens);
        state.take_prefill(prompt);
        let waited = shared
            .rules()
            .prefill
            .waits(prompt)
            .then_some(Duration::ZERO);
        Some(
            LaneGuard::new(Box::new(shared.clone()), lane, tokens, Duration::ZERO)
                .with_prefill(prompt, waited),
        )
    }

    /// A pre-emptible seat for background work whose `tokens` count in `lane` (see
    /// `preempt.rs`): `lane`'s own seat, else medium's, else small's (largest first, so the
    /// small lane's seats go last; a handle no longer eligible for pre-emption: `lane`'s own
    /// seat only), only when idle: one of that lane's own seats free, nobody waiting in any
    /// queue, the tokens within `lane`'s and the global budgets,
    /// and the `prompt`'s prefill room. Never waits. The seat is asked back through `handle`
    /// when an interactive request needs it.
    pub fn try_acquire_preemptible(
        &self,
        lane: Lane,
        tokens: u32,
        prompt: u32,
        handle: &Arc<Preemptible>,
    ) -> Option<LaneGuard> {
        let shared = &self.shared;
        let mut state = shared.lock();
        // Under the state's lock, as `acquire` reads them: a reload swaps them under it.
        let rules = shared.rules();
        // Background work never starts while an interactive request waits, in any lane (it
        // would take engine time that request is waiting for), nor within the cool-down after
        // one last waited.
        if state.queues.iter().any(|q| !q.is_empty()) || !rules.prefill.fits(state.prefill, prompt)
        {
            return None;
        }
        if let Some(end) = state
            .last_waited
            .map(|t| t + rules.cooldown)
            .filter(|end| *end > Instant::now())
        {
            shared.wake_after_cooldown(&mut state, end);
            return None;
        }
        // A job that may no longer be pre-empted keeps to its own lane's seats: it would hold a
        // borrowed one against the lane's own requests.
        let seat = [Lane::Large, Lane::Medium, Lane::Small]
            .into_iter()
            .filter(|s| *s <= lane && (handle.is_eligible() || *s == lane))
            .find(|&seat| rules.limits.fits_borrowed(&state.usage, seat, lane, tokens))?;
        state.take_apart(seat, lane, tokens);
        state.take_prefill(prompt);
        let id = state.next_id();
        state.borrowers.push(Borrower {
            id,
            seat,
            tokens,
            prefill: prompt,
            since: Instant::now(),
            handle: handle.clone(),
        });
        let waited = rules.prefill.waits(prompt).then_some(Duration::ZERO);
        let reservation = BorrowedSeat {
            shared: shared.clone(),
            id,
            seat,
        };
        Some(
            LaneGuard::new(Box::new(reservation), lane, tokens, Duration::ZERO)
                .with_prefill(prompt, waited)
                .with_preemptible(handle.clone()),
        )
    }

    /// A receiver that wakes whenever capacity may have come back (a guard dropped, a first
    /// token, a waiter left), for background work waiting for
    /// [`LocalAdmission::try_acquire_idle`]. A change is never missed: it stays marked until
    /// seen.
    pub fn freed(&self) -> watch::Receiver<u64> {
        self.shared.freed.subscribe()
    }
}

impl Shared {
    /// Wakes the background work refused for the cool-down (`freed`) when it ends at `end`; one
    /// wake pending at a time (a cool-down extended meanwhile is seen by the retry, which arms
    /// the next).
    fn wake_after_cooldown(self: &Arc<Self>, state: &mut State, end: Instant) {
        if state.cooldown_wake {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        state.cooldown_wake = true;
        let shared = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep_until(end).await;
            if let Some(shared) = shared.upgrade() {
                shared.lock().cooldown_wake = false;
                shared.freed.send_modify(|v| *v = v.wrapping_add(1));
            }
        });
    }

    /// The limits in force.
    fn rules(&self) -> Arc<Rules> {
        self.rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections never panic half-way, so a poisoned lock still holds valid counts.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves a reservation from `from` to `to` (growing it to `to_tokens`) if `to` has room
    /// once the old reservation is given back; all or nothing, under one lock. Promotion does
    /// not queue behind `to`'s waiters: the request's work is already running on the GPU.
    /// Refused, it asks pre-emptible borrowers to leave for it as a refused arrival does (a
    /// student's answer outgrowing its lane goes before background work), and starts the
    /// cool-down; [`Move::Asked`] when one is leaving.
    pub(super) fn promote(
        self: &Arc<Self>,
        from: Lane,
        from_tokens: u32,
        to: Lane,
        to_tokens: u32,
    ) -> Move {
        let mut state = self.lock();
        state.give_back(from, from_tokens);
        // Growing where it is needs tokens only: it keeps its seat (which, with lent seats
        // taken back, a fresh arrival might not get).
        let fits = if from == to {
            self.rules().limits.fits_tokens(&state.usage, to, to_tokens)
        } else {
            self.rules().limits.fits(&state.usage, to, to_tokens)
        };
        if fits {
            state.take(to, to_tokens);
            // `from` lost a request: its waiters may fit now.
            self.dispatch(&mut state);
            return Move::Done;
        }
        // (Growing where it is asks nobody: it holds its seat, and a job's leaving gives
        // a seat back, not the tokens a seat rule would count.)
        let moved = if from != to && !state.borrowers.is_empty() {
            self.ask_room_for_move(&mut state, to, to_tokens)
        } else {
            Move::Full
        };
        state.take(from, from_tokens);
        moved
    }

    /// A refused move of a running request to `to` with `tokens` (its old reservation given
    /// back in `state`): pre-emptible borrowers holding that room are asked to leave for it, as
    /// for an arrival, but only where their leaving lets it in once the requests queued
    /// everywhere are served (they go first when room comes); never for the engine's time
    /// alone, nor again while those already asked make the room. [`Move::Asked`] when room is
    /// coming; the cool-down starts when one is asked.
    fn ask_room_for_move(self: &Arc<Self>, state: &mut State, to: Lane, tokens: u32) -> Move {
        let rules = self.rules();
        let limits = &rules.limits;
        let free = |usage: &mut [Usage; 3], b: &Borrower| {
            let seat = &mut usage[b.seat.index()].in_flight;
            *seat = seat.saturating_sub(1);
            let held = &mut usage[Lane::Large.index()].tokens;
            *held = held.saturating_sub(u64::from(b.tokens));
        };
        let mut after = state.usage;
        for w in state.queues.iter().flatten() {
            after[w.lane.index()].in_flight += 1;
            after[w.lane.index()].tokens += u64::from(w.tokens);
        }
        for b in state.borrowers.iter().filter(|b| b.leaving()) {
            free(&mut after, b);
        }
        if limits.fits(&after, to, tokens) {
            return Move::Asked;
        }
        let now = Instant::now();
        let leave = {
            let candidates = candidates(&state.borrowers, now, state.prefill_rate, rules.grace);
            let without = |set: &[usize]| {
                let mut u = after;
                for &i in set {
                    free(&mut u, &state.borrowers[i]);
                }
                limits.fits(&u, to, tokens)
            };
            victims(&candidates, without)
        };
        let Some(leave) = leave else {
            return Move::Full;
        };
        let reason = if limits.fits(&after, to, 0) {
            "tokens"
        } else {
            "seat"
        };
        for &i in &leave {
            state.borrowers[i].preempt(Cause { lane: to, reason });
        }
        state.last_waited = Some(now);
        Move::Asked
    }

    /// Gives back a guard's slot and tokens and admits the waiters that now fit.
    pub(super) fn release(self: &Arc<Self>, lane: Lane, tokens: u32) {
        let mut state = self.lock();
        state.give_back(lane, tokens);
        self.dispatch(&mut state);
    }

    /// Whether an arrival can be admitted at once, ahead of nobody it must queue behind: it
    /// fits (seat, tokens and, for a long prompt, prefill room) and every waiter of its queue
    /// is a long prompt held back only by the prefill budget, which a short prompt passes (a
    /// long arrival waits behind any waiter).
    fn admits_now(
        &self,
        state: &State,
        queue: usize,
        lane: Lane,
        tokens: u32,
        prompt: u32,
    ) -> bool {
        if !self.rules().limits.fits(&state.usage, lane, tokens)
            || !self.rules().prefill.fits(state.prefill, prompt)
        {
            return false;
        }
        if self.rules().prefill.waits(prompt) {
            return state.queues[queue].is_empty();
        }
        state.queues[queue].iter().all(|w| {
            self.rules().prefill.waits(w.prefill)
                && self.rules().limits.fits(&state.usage, w.lane, w.tokens)
        })
    }

    /// Admits waiters while they fit, in queue order (small's queue first under `lanes`). A
    /// waiter that lacks a seat or tokens blocks the rest of its queue (strict FIFO per queue).
    /// A long prompt that has its seat and tokens but no prefill room stays, and so do the long
    /// prompts behind it (FIFO among long prompts); short prompts behind it go on.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        self.freed.send_modify(|v| *v = v.wrapping_add(1));
        let now = Instant::now();
        for queue in 0..state.queues.len() {
            let mut pos = 0;
            let mut long_held = false;
            while let Some(w) = state.queues[queue].get(pos) {
                if !self.rules().limits.fits(&state.usage, w.lane, w.tokens) {
                    break;
                }
                if self.rules().prefill.waits(w.prefill)
                    && (long_held || !self.rules().prefill.fits(state.prefill, w.prefill))
                {
                    long_held = true;
                    let w = &mut state.queues[queue][pos];
                    w.prefill_blocked_at.get_or_insert(now);
                    pos += 1;
                    continue;
                }
                let Some(waiter) = state.take_at(queue, pos) else {
                    break;
                };
                self.grant(state, waiter);
            }
        }
        if !state.borrowers.is_empty() {
            self.preempt(state);
        }
    }

    /// Asks pre-emptible borrowers to leave for the waiters that cannot get in otherwise (see
    /// `preempt.rs`): in queue order, counting the seats of borrowers already leaving as free
    /// and each waiter that fits as taken; a waiter that no borrower's leaving lets in asks one
    /// to leave all the same (`pressure`).
    fn preempt(self: &Arc<Self>, state: &mut State) {
        self.preempt_for(state, None);
    }

    /// [`Shared::preempt`] for the waiters and, after them, `refused`: a request refused
    /// where it may not wait (`queue_len = 0`).
    fn preempt_for(self: &Arc<Self>, state: &mut State, refused: Option<Need>) {
        let rules = self.rules();
        let (limits, prefill_limit) = (&rules.limits, rules.prefill);
        let mut usage = state.usage;
        let mut prefill = state.prefill;
        let free = |usage: &mut [Usage; 3], prefill: &mut u64, b: &Borrower| {
            let (seat, tokens) = (b.seat, b.tokens);
            usage[seat.index()].in_flight = usage[seat.index()].in_flight.saturating_sub(1);
            let t = &mut usage[Lane::Large.index()].tokens;
            *t = t.saturating_sub(u64::from(tokens));
            *prefill = prefill.saturating_sub(u64::from(b.prefill));
        };
        for b in state.borrowers.iter().filter(|b| b.leaving()) {
            free(&mut usage, &mut prefill, b);
        }
        let now = Instant::now();
        let mut candidates = candidates(&state.borrowers, now, state.prefill_rate, rules.grace);
        if candidates.is_empty() {
            return;
        }
        // Those spared for now: in their prefill grace, asked at their first token.
        let spared: Vec<usize> = (0..state.borrowers.len())
            .filter(|i| {
                let b = &state.borrowers[*i];
                b.handle.is_eligible() && !b.leaving() && !candidates.contains(i)
            })
            .collect();
        let fits = |usage: &[Usage; 3], prefill: u64, w: &Need| {
            limits.fits(usage, w.lane, w.tokens) && prefill_limit.fits(prefill, w.prefill)
        };
        let needs: Vec<Need> = state
            .queues
            .iter()
            .flatten()
            .map(|w| Need {
                id: Some(w.id),
                lane: w.lane,
                tokens: w.tokens,
                prefill: w.prefill,
            })
            .chain(refused)
            .collect();
        let mut made_room = Vec::new();
        for w in &needs {
            if !fits(&usage, prefill, w) {
                let without = |set: &[usize]| {
                    let (mut u, mut p) = (usage, prefill);
                    for &i in set {
                        free(&mut u, &mut p, &state.borrowers[i]);
                    }
                    fits(&u, p, w)
                };
                let Some(leave) = victims(&candidates, without) else {
                    // A job still in its prefill grace would let it in, with the others: it
                    // waits for that one's first token (where it is asked), and asks none
                    // to leave for nothing.
                    if !spared.is_empty() && without(&[&candidates[..], &spared[..]].concat()) {
                        continue;
                    }
                    // No job's leaving lets it in (its lane is at its own limits): what it
                    // waits for is the engine's time, which the job that loses least gives
                    // back. It is not admitted by that: the requests behind it in its queue
                    // cannot pass it, so each of them asks one more.
                    let Some(&first) = candidates.first() else {
                        break;
                    };
                    state.borrowers[first].preempt(Cause {
                        lane: w.lane,
                        reason: "pressure",
                    });
                    candidates.remove(0);
                    continue;
                };
                let reason =
                    if prefill_limit.waits(w.prefill) && !prefill_limit.fits(prefill, w.prefill) {
                        "prefill"
                    } else if !limits.fits(&usage, w.lane, 0) {
                        "seat"
                    } else {
                        "tokens"
                    };
                for &i in &leave {
                    let b = &state.borrowers[i];
                    free(&mut usage, &mut prefill, b);
                    b.preempt(Cause {
                        lane: w.lane,
                        reason,
                    });
                }
                candidates.retain(|c| !leave.contains(c));
                made_room.extend(w.id);
            }
            usage[w.lane.index()].in_flight += 1;
            usage[w.lane.index()].tokens += u64::from(w.tokens);
            prefill += u64::from(w.prefill);
        }
        for w in state.queues.iter_mut().flatten() {
            if made_room.contains(&w.id) {
                w.made_room.get_or_insert(now);
            }
        }
    }

    /// Gives back a pre-emptible seat (`seat`'s seat, `tokens` in `lane`) and admits the
    /// waiters that now fit.
    fn release_borrowed(self: &Arc<Self>, id: u64, seat: Lane, lane: Lane, tokens: u32) {
        let mut state = self.lock();
        state.borrowers.retain(|b| b.id != id);
        state.give_back_apart(seat, lane, tokens);
        self.dispatch(&mut state);
    }

    /// A pre-emptible seat's prefill ended: its reservation back, and at a first token
    /// (`first_token`; not when the prefill was cut) the prefill rate it ran at noted for the
    /// grace.
    fn borrowed_prefill_done(self: &Arc<Self>, id: u64, tokens: u32, first_token: bool) {
        let mut state = self.lock();
        if let Some(b) = state.borrowers.iter_mut().find(|b| b.id == id) {
            let took = b.since.elapsed().as_secs_f64();
            let rate =
                (first_token && took > 0.0 && b.prefill > 0).then(|| f64::from(b.prefill) / took);
            b.prefilled();
            if rate.is_some() {
                state.prefill_rate = rate;
            }
        }
        state.give_back_prefill(tokens);
        self.dispatch(&mut state);
    }

    /// Takes `waiter`'s seat, tokens and prefill reservation and hands it its guard; undoes it
    /// when the waiter is gone.
    fn grant(self: &Arc<Self>, state: &mut State, waiter: Waiter) {
        state.take(waiter.lane, waiter.tokens);
        state.take_prefill(waiter.prefill);
        let prefill_wait = self.rules().prefill.waits(waiter.prefill).then(|| {
            waiter
                .prefill_blocked_at
                .map_or(Duration::ZERO, |t| t.elapsed())
        });
        let guard = LaneGuard::new(
            Box::new(self.clone()),
            waiter.lane,
            waiter.tokens,
            waiter.enqueued_at.elapsed(),
        )
        .with_prefill(waiter.prefill, prefill_wait)
        .with_made_room(waiter.made_room.map(|t| t.elapsed()));
        if let Err(Ok(guard)) = waiter.grant.send(Ok(guard)) {
            // The waiter is gone: undo here, under the lock we hold.
            let (lane, tokens, prefill) = (guard.lane(), guard.tokens(), guard.prefill());
            guard.disarm();
            state.give_back(lane, tokens);
            state.give_back_prefill(prefill);
        }
    }

    /// Gives back `tokens` of prefill reservation and admits the waiters that now fit.
    fn prefill_done(self: &Arc<Self>, tokens: u32) {
        let mut state = self.lock();
        state.give_back_prefill(tokens);
        self.dispatch(&mut state);
    }
}

/// What a request needs to get in, for the pre-emption dry run: a waiter's (its `id`) or a
/// refused arrival's.
#[derive(Debug, Clone, Copy)]
struct Need {
    id: Option<u64>,
    lane: Lane,
    tokens: u32,
    prefill: u32,
}

/// A queued waiter's place in line; dropping it leaves the queue.
struct QueueTicket {
    shared: Arc<Shared>,
    queue: usize,
    id: u64,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        if state.remove(self.queue, self.id) {
            // The departed waiter may have been a head that blocked others.
            self.shared.dispatch(&mut state);
        }
    }
}

/// A pre-emptible seat's way back: the borrower leaves admission's record with its seat.
struct BorrowedSeat {
    shared: Arc<Shared>,
    id: u64,
    seat: Lane,
}

impl Reservation for BorrowedSeat {
    fn promote(&self, _: Lane, _: u32, _: Lane, _: u32) -> BoxFuture<'_, Move> {
        // Background work runs in the lane it was given.
        Box::pin(futures::future::ready(Move::Full))
    }

    fn release(self: Box<Self>, lane: Lane, tokens: u32, _served: Option<u64>) {
        self.shared
            .release_borrowed(self.id, self.seat, lane, tokens);
    }

    fn prefill_done(&self, tokens: u32) {
        self.shared.borrowed_prefill_done(self.id, tokens, true);
    }

    fn prefill_abandoned(&self, tokens: u32) {
        // A cut prefill says nothing of the prefill rate.
        self.shared.borrowed_prefill_done(self.id, tokens, false);
    }
}

/// A seat of `seat` with its tokens counted in another lane, taken whatever the limits say
/// ([`LocalAdmission::force_take_apart`]).
struct TakenApart {
    shared: Arc<Shared>,
    seat: Lane,
}

impl Reservation for TakenApart {
    fn promote(&self, _: Lane, _: u32, _: Lane, _: u32) -> BoxFuture<'_, Move> {
        Box::pin(futures::future::ready(Move::Full))
    }

    fn release(self: Box<Self>, lane: Lane, tokens: u32, _served: Option<u64>) {
        let mut state = self.shared.lock();
        state.give_back_apart(self.seat, lane, tokens);
        self.shared.dispatch(&mut state);
    }
}

impl Reservation for Arc<Shared> {
    fn promote(&self, from: Lane, tokens: u32, to: Lane, grown: u32) -> BoxFuture<'_, Move> {
        let moved = Shared::promote(self, from, tokens, to, grown);
        Box::pin(futures::future::ready(moved))
    }

    fn release(self: Box<Self>, lane: Lane, tokens: u32, _served: Option<u64>) {
        Shared::release(&self, lane, tokens);
    }

    fn prefill_done(&self, tokens: u32) {
        Shared::prefill_done(self, tokens);
    }
}
