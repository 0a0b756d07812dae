//! The mutable bookkeeping behind one lock: per-lane usage and the wait queues.
//!
//! Plain data, no async: every method runs inside one short critical section of
//! [`super::local`], which is what makes "slot + tokens" one atomic step.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::budget::Usage;
use super::fair::Fair;
use super::guard::LaneGuard;
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
    pub grant: oneshot::Sender<LaneGuard>,
}

pub(super) struct State {
    pub usage: [Usage; 3],
    /// Estimated prompt tokens of admitted requests that have no first token yet.
    pub prefill: u64,
    queued: [u32; 3],
    pub queues: Vec<VecDeque<Waiter>>,
    fair: Vec<Fair>,
    next_id: u64,
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
        }
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

    /// Puts a waiter of `tenant` (with `share`) into queue `queue` at its fair place (see
    /// [`Fair`]); returns its id.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &mut self,
        queue: usize,
        lane: Lane,
        tokens: u32,
        prefill: u32,
        tenant: Option<Arc<str>>,
        share: f64,
        grant: oneshot::Sender<LaneGuard>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.queued[lane.index()] += 1;
        let tag = self.fair[queue].tag(tenant, share);
        let q = &mut self.queues[queue];
        let pos = q.partition_point(|w| w.tag <= tag);
        q.insert(
            pos,
            Waiter {
                id,
                lane,
                tokens,
                prefill,
                enqueued_at: Instant::now(),
                prefill_blocked_at: None,
                tag,
                grant,
            },
        );
        id
    }

    /// Removes and returns the waiter at `pos` of `queue` (0: the head).
    pub fn take_at(&mut self, queue: usize, pos: usize) -> Option<Waiter> {
        let waiter = self.queues[queue].remove(pos)?;
        self.queued[waiter.lane.index()] -= 1;
        self.fair[queue].admitted(waiter.tag);
        Some(waiter)
    }

    /// Removes waiter `id` from `queue` if it is still there; true when it was.
    pub fn remove(&mut self, queue: usize, id: u64) -> bool {
        let q = &mut self.queues[queue];
        match q.iter().position(|w| w.id == id) {
            Some(pos) => {
                if let Some(w) = q.remove(pos) {
                    self.queued[w.lane.index()] -= 1;
                }
                true
            }
            None => false,
        }
    }

    pub fn snapshot(&self) -> AdmissionSnapshot {
        AdmissionSnapshot {
            lanes: Lane::ALL.map(|lane| LaneSnapshot {
                lane,
                in_flight: self.usage[lane.index()].in_flight,
                reserved_tokens: self.usage[lane.index()].tokens,
                queue_depth: self.queued[lane.index()],
            }),
            prefill_tokens: self.prefill,
        }
    }
}
