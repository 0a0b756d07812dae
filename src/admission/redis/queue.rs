//! A lane's local wait line in front of the shared quota.
//!
//! Only the line's head talks to Redis. The order is the local backend's start-time fair
//! queuing ([`Fair`]): FIFO within a tenant, tenants in turns weighted by `auth.tenant_shares`
//! (one tenant alone, or `[auth]` off: plain FIFO). A waiter that arrives with an earlier tag
//! than the head's takes the turn at the head's next refused try. The head retries the acquire
//! script when a release is announced (this replica's own releases, and every replica's through
//! the pub/sub channel) or after a jittered, exponentially growing backoff (5 ms to 250 ms), so
//! an idle wait costs a few calls a second and a missed notification costs at most one backoff.
//! Fairness holds within a replica's line; across replicas, heads race for a freed seat (see
//! the module doc of `redis/`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;

use crate::admission::fair::Fair;

/// First retry delay after a refused acquire.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_millis(250);

/// A waiter's place in the order: its start tag (a non-negative float's bits order as the
/// float does) and its arrival number.
type Key = (u64, u64);

#[derive(Debug, Default)]
struct Line {
    fair: Fair,
    /// Waiters in fair order, each with its wake-up.
    order: BTreeMap<Key, Arc<Notify>>,
    /// The waiter whose turn it is (the one talking to Redis).
    turn: Option<Key>,
    arrivals: u64,
}

impl Line {
    /// Wakes the first waiter when nobody has the turn.
    fn wake_first(&self) {
        if self.turn.is_none() {
            if let Some(first) = self.order.values().next() {
                first.notify_one();
            }
        }
    }
}

/// One lane's wait line.
#[derive(Debug, Default)]
pub(crate) struct LaneQueue {
    /// Requests waiting (queue length checks and the snapshot).
    waiting: AtomicU32,
    line: Mutex<Line>,
    /// A release in this lane was seen (stores one permit if nobody waits yet).
    released: Notify,
}

/// A place in a [`LaneQueue`]; dropping it leaves the line.
pub(crate) struct Place<'a> {
    queue: &'a LaneQueue,
    key: Key,
    tag: f64,
    wake: Arc<Notify>,
}

/// The turn of a [`Place`]: while held, this waiter is the only one of its line calling Redis.
pub(crate) struct Turn<'p, 'a> {
    place: &'p Place<'a>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
        let mut line = self.queue.lock();
        line.order.remove(&self.key);
        if line.turn == Some(self.key) {
            line.turn = None;
        }
        line.wake_first();
    }
}

impl Drop for Turn<'_, '_> {
    fn drop(&mut self) {
        let mut line = self.place.queue.lock();
        if line.turn == Some(self.place.key) {
            line.turn = None;
        }
        line.wake_first();
    }
}

impl LaneQueue {
    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Joins the line for `tenant` (whose share of turns is `share`) unless it already holds
    /// `max` waiters.
    pub fn join(&self, max: usize, tenant: Option<&str>, share: f64) -> Option<Place<'_>> {
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        let mut line = self.lock();
        let tag = line.fair.tag(tenant.map(Arc::from), share);
        line.arrivals += 1;
        let key = (tag.max(0.0).to_bits(), line.arrivals);
        let wake = Arc::new(Notify::new());
        line.order.insert(key, wake.clone());
        line.wake_first();
        Some(Place {
            queue: self,
            key,
            tag,
            wake,
        })
    }

    /// Announces a release in this lane.
    pub fn notify(&self) {
        self.released.notify_one();
    }

    /// Waits for a release announcement or the backoff, whichever comes first, and returns the
    /// next backoff.
    pub async fn pause(&self, backoff: Duration) -> Duration {
        let jittered = rand::rng().random_range(backoff / 2..=backoff);
        tokio::select! {
            () = self.released.notified() => BACKOFF_MIN,
            () = tokio::time::sleep(jittered) => (backoff * 2).min(BACKOFF_MAX),
        }
    }

    /// The first backoff.
    pub const fn first_backoff() -> Duration {
        BACKOFF_MIN
    }
}

impl<'a> Place<'a> {
    /// Waits until this waiter is first in the fair order and nobody else has the turn.
    pub async fn turn(&self) -> Turn<'_, 'a> {
        loop {
            {
                let mut line = self.queue.lock();
                let first = line.order.keys().next().copied();
                if line.turn.is_none() && first == Some(self.key) {
                    line.turn = Some(self.key);
                    return Turn { place: self };
                }
            }
            // A stored permit covers a wake-up sent between the check and this wait.
            self.wake.notified().await;
        }
    }

    /// This waiter was admitted: the fair order's virtual time moves on to its tag.
    pub fn admitted(&self) {
        self.queue.lock().fair.admitted(self.tag);
    }
}

impl Turn<'_, '_> {
    /// Whether this turn's waiter is still first (a waiter with an earlier tag may have
    /// joined; it should then get the turn).
    pub fn still_first(&self) -> bool {
        self.place.queue.lock().order.keys().next() == Some(&self.place.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_follow_the_fair_order_and_pass_on_when_a_place_leaves() {
        let q = LaneQueue::default();
        let a1 = q.join(10, Some("A"), 1.0).unwrap();
        let a2 = q.join(10, Some("A"), 1.0).unwrap();
        let a3 = q.join(10, Some("A"), 1.0).unwrap();
        let turn = a1.turn().await;
        // B arrives last but its start tag is the virtual time: it goes before A's second.
        let b1 = q.join(10, Some("B"), 1.0).unwrap();
        assert!(turn.still_first(), "A's first keeps its place");
        a1.admitted();
        drop(turn);
        drop(a1);
        let turn = b1.turn().await;
        assert!(q.lock().order.keys().next().is_none_or(|k| *k != a2.key));
        b1.admitted();
        drop(turn);
        drop(b1);
        assert_eq!(q.waiting(), 2);
        let t2 = a2.turn().await;
        drop(t2);
        drop(a2);
        let t3 = a3.turn().await;
        assert!(t3.still_first());
        drop(t3);
        drop(a3);
        assert_eq!(q.waiting(), 0);
        assert!(q.lock().order.is_empty() && q.lock().turn.is_none());
        // The bound holds.
        let p: Vec<_> = (0..2).map(|_| q.join(2, None, 1.0)).collect();
        assert!(p.iter().all(Option::is_some));
        assert!(q.join(2, None, 1.0).is_none());
    }
}
