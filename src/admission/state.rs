//! The mutable bookkeeping behind one lock: per-lane usage and the wait queues.
//!
//! Plain data, no async: every method runs inside one short critical section of
//! [`super::local`], which is what makes "slot + tokens" one atomic step.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::backend::Ask;
use super::budget::Usage;
use super::error::AdmissionError;
use super::fair::{edf_place, pass_down, Due, Fair};
use super::guard::LaneGuard;
use super::preempt::Borrower;
use crate::lane::Lane;
use crate::telemetry::{AdmissionSnapshot, LaneSnapshot};

/// A request waiting in a queue. Admission hands it a [`LaneGuard`] through `grant`.
pub(super) struct Waiter {
    pub id: u64,
    pub lane: Lane,
    pub tokens: u32,
    /// Estimated prompt tokens: its prefill reservation once admitted.
    pub prefill: u32,
    pub enqueued_at: Instant,
    /// When admission first found its seat and tokens free but no prefill room (long prompts).
    pub prefill_blocked_at: Option<Instant>,
    /// Its start tag in the queue's fair order (see [`Fair`]).
    pub tag: f64,
    /// Its tenant: whose turn its tag is.
    pub tenant: Option<Arc<str>>,
    /// When its first token stops being useful (earliest first among its tenant's waiters of
    /// its lane, see [`edf_place`]).
    pub due: Due,
    /// Its guard, or why it left the queue without one (pushed out for another tenant).
    pub grant: oneshot::Sender<Result<LaneGuard, AdmissionError>>,
    /// When pre-emptible borrowers were first asked to leave for it (`preempt.rs`).
    pub made_room: Option<Instant>,
    /// A continuation put at the head: it took no turn of its tenant's.
    pub continuing: bool,
}

impl Waiter {
    /// `ask`'s waiter, id `id`, at `tag` in its queue's fair order.
    fn new(
        id: u64,
        ask: &Ask<'_>,
        tag: f64,
        tenant: Option<Arc<str>>,
        grant: oneshot::Sender<Result<LaneGuard, AdmissionError>>,
    ) -> Self {
        Self {
            id,
            lane: ask.lane,
            tokens: ask.work,
            prefill: ask.prefill,
            enqueued_at: Instant::now(),
            prefill_blocked_at: None,
            tag,
            tenant,
            due: ask.due,
            grant,
            made_room: None,
            continuing: ask.continuing,
        }
    }
}

pub(super) struct State {
    pub usage: [Usage; 3],
    /// Estimated prompt tokens of admitted requests that have no first token yet.
    pub prefill: u64,
    queued: [u32; 3],
    pub queues: Vec<VecDeque<Waiter>>,
    fair: Vec<Fair>,
    next_id: u64,
    /// Pre-emptible seats held now (`preempt.rs`).
    pub borrowers: Vec<Borrower>,
    /// Prompt tokens per second the last borrower's prefill ran at (first token over time
    /// since it was sent), for the pre-emption grace.
    pub prefill_rate: Option<f64>,
    /// When an interactive request last waited in a queue (it was queued, admitted from a
    /// queue or left one): the start of `jobs.preempt_cooldown_ms`.
    pub last_waited: Option<Instant>,
    /// A wake for the end of the cool-down is pending.
    pub cooldown_wake: bool,
}

impl State {
    pub fn new(queue_count: usize) -> Self {
        Self {
            usage: [Usage::default(); 3],
            prefill: 0,
            queued: [0; 3],
            queues: (0..queue_count).map(|_| VecDeque::new()).collect(),
            fair: (0..queue_count).map(|_| Fair::default()).collect(),
            next_id: 0,
            borrowers: Vec::new(),
            prefill_rate: None,
            last_waited: None,
            cooldown_wake: false,
        }
    }

    /// A fresh id (waiters and borrowers).
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Takes a seat of `seat` and `tokens` counted in `lane` (a borrowed seat).
    pub fn take_apart(&mut self, seat: Lane, lane: Lane, tokens: u32) {
        self.usage[seat.index()].in_flight += 1;
        self.usage[lane.index()].tokens += u64::from(tokens);
    }

    /// Gives back what [`State::take_apart`] took.
    pub fn give_back_apart(&mut self, seat: Lane, lane: Lane, tokens: u32) {
        let s = &mut self.usage[seat.index()];
        debug_assert!(s.in_flight > 0);
        s.in_flight = s.in_flight.saturating_sub(1);
        let l = &mut self.usage[lane.index()];
        debug_assert!(l.tokens >= u64::from(tokens));
        l.tokens = l.tokens.saturating_sub(u64::from(tokens));
    }

    /// Takes a slot and `tokens` for `lane`.
    pub fn take(&mut self, lane: Lane, tokens: u32) {
        let u = &mut self.usage[lane.index()];
        u.in_flight += 1;
        u.tokens += u64::from(tokens);
    }

    /// Gives back what [`State::take`] took.
    pub fn give_back(&mut self, lane: Lane, tokens: u32) {
        let u = &mut self.usage[lane.index()];
        debug_assert!(u.in_flight > 0 && u.tokens >= u64::from(tokens));
        u.in_flight = u.in_flight.saturating_sub(1);
        u.tokens = u.tokens.saturating_sub(u64::from(tokens));
    }

    /// Counts `tokens` of prompt as prefilling.
    pub fn take_prefill(&mut self, tokens: u32) {
        self.prefill += u64::from(tokens);
    }

    /// Gives back what [`State::take_prefill`] took (at the first token or the end).
    pub fn give_back_prefill(&mut self, tokens: u32) {
        debug_assert!(self.prefill >= u64::from(tokens));
        self.prefill = self.prefill.saturating_sub(u64::from(tokens));
    }

    /// Puts `ask`'s waiter (its tenant's share of turns `share`) into queue `queue`: it takes
    /// its tenant's next turn in the fair order (see [`Fair`]) and then goes ahead of the
    /// waiters of its tenant and lane due later, which each move one of their tenant's turns
    /// later ([`edf_place`]). Returns its id.
    pub fn enqueue(
        &mut self,
        queue: usize,
        ask: &Ask<'_>,
        share: f64,
        grant: oneshot::Sender<Result<LaneGuard, AdmissionError>>,
    ) -> u64 {
        let id = self.next_id();
        self.queued[ask.lane.index()] += 1;
        self.last_waited = Some(Instant::now());
        let tenant = ask.tenant.map(Arc::from);
        if ask.continuing {
            // At the head, at a tag no later than the first waiter's (the queue stays in tag
            // order), and no new turn of its tenant's (its turn was taken when it first ran).
            let v = self.fair[queue].virtual_time();
            let q = &mut self.queues[queue];
            let tag = q.front().map_or(v, |w| w.tag.min(v));
            q.push_front(Waiter::new(id, ask, tag, tenant, grant));
            return id;
        }
        let tag = self.fair[queue].tag(tenant.clone(), share);
        let q = &mut self.queues[queue];
        let pos = q.partition_point(|w| w.tag <= tag);
        // Not a continuation: it holds the head, ahead of every request that never ran, and
        // took no turn to trade (an arrival due sooner used to take its place and push it to
        // its tenant's newest turn, again at each such arrival).
        let kin: Vec<usize> = (0..pos)
            .filter(|&i| q[i].lane == ask.lane && q[i].tenant == tenant && !q[i].continuing)
            .collect();
        let place = edf_place(kin.iter().map(|&i| q[i].due), ask.due);
        q.insert(pos, Waiter::new(id, ask, tag, tenant, grant));
        // Move the arrival forward to its place, each kin due later one of the turns back.
        let mut at = pos;
        for &before in kin[place..].iter().rev() {
            q.swap(before, at);
            let (a, b) = (q[before].tag, q[at].tag);
            q[before].tag = b;
            q[at].tag = a;
            at = before;
        }
        id
    }

    /// Removes and returns the newest waiter of `tenant` in `queue` (pushed out for another
    /// tenant's request: `crate::admission::fair::room_for`); never a continuation (an answer
    /// that already streamed always keeps its place).
    pub fn push_out(&mut self, queue: usize, tenant: &Arc<str>) -> Option<Waiter> {
        let pos = self.queues[queue]
            .iter()
            .enumerate()
            .filter(|(_, w)| w.tenant.as_ref() == Some(tenant) && !w.continuing)
            .max_by_key(|(_, w)| w.id)?
            .0;
        self.leave_at(queue, pos)
    }

    /// Removes and returns the waiter at `pos` of `queue`, which leaves unserved. Its turn
    /// passes to its tenant's next waiter in the queue, that one's to the next, and so on, and
    /// the tenant's newest turn is free again: a tenant whose requests gave up (timed out,
    /// their clients went away, pushed out) keeps the turns they did not use, where its next
    /// request used to queue behind every other tenant's turns as many as had left. A
    /// continuation took no turn, and gives none back.
    pub fn leave_at(&mut self, queue: usize, pos: usize) -> Option<Waiter> {
        let q = &mut self.queues[queue];
        let leaving = q.get(pos)?;
        let at = if leaving.continuing {
            pos
        } else {
            let tenant = leaving.tenant.clone();
            let kin = |w: &Waiter| w.tenant == tenant && !w.continuing;
            pass_down(q, pos, kin, |w| &mut w.tag)
        };
        let waiter = q.remove(at)?;
        if !waiter.continuing {
            self.fair[queue].give_back(&waiter.tenant, waiter.tag);
        }
        self.queued[waiter.lane.index()] -= 1;
        self.last_waited = Some(Instant::now());
        Some(waiter)
    }

    /// Removes and returns the waiter at `pos` of `queue` (0: the head).
    pub fn take_at(&mut self, queue: usize, pos: usize) -> Option<Waiter> {
        let waiter = self.queues[queue].remove(pos)?;
        self.queued[waiter.lane.index()] -= 1;
        self.fair[queue].admitted(waiter.tag);
        // The pre-emption cool-down counts from the admission too: a wait longer than the
        // cool-down used to leave none after it.
        self.last_waited = Some(Instant::now());
        Some(waiter)
    }

    /// Removes waiter `id` from `queue` if it is still there (it leaves unserved, see
    /// [`State::leave_at`]); true when it was.
    pub fn remove(&mut self, queue: usize, id: u64) -> bool {
        match self.queues[queue].iter().position(|w| w.id == id) {
            Some(pos) => {
                self.leave_at(queue, pos);
                self.last_waited = Some(Instant::now());
                true
            }
            None => false,
        }
    }

    /// The counters; `long` tells the waiters that wait for prefill room (by their prompt).
    pub fn snapshot(&self, long: impl Fn(u32) -> bool) -> AdmissionSnapshot {
        let mut long_queued = [0u32; 3];
        for w in self.queues.iter().flatten().filter(|w| long(w.prefill)) {
            long_queued[w.lane.index()] += 1;
        }
        AdmissionSnapshot {
            lanes: Lane::ALL.map(|lane| LaneSnapshot {
                lane,
                in_flight: self.usage[lane.index()].in_flight,
                reserved_tokens: self.usage[lane.index()].tokens,
                queue_depth: self.queued[lane.index()],
                long_queue_depth: long_queued[lane.index()],
            }),
            prefill_tokens: self.prefill,
        }
    }
}
