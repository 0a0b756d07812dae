//! A lane's local wait line in front of the shared quota.
//!
//! Waiters of one replica take turns in FIFO order (a fair `tokio` mutex): only the head talks
//! to Redis. The head retries the acquire script when a release is announced (this replica's
//! own releases, and every replica's through the pub/sub channel) or after a jittered,
//! exponentially growing backoff (5 ms to 250 ms), so an idle wait costs a few calls a second
//! and a missed notification costs at most one backoff.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Mutex, Notify};

/// First retry delay after a refused acquire.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_millis(250);

/// One lane's wait line.
#[derive(Debug, Default)]
pub(crate) struct LaneQueue {
    /// Requests waiting (queue length checks and the snapshot).
    waiting: AtomicU32,
    /// Held by the head of the line; `tokio`'s mutex is fair, so the line is FIFO.
    head: Mutex<()>,
    /// A release in this lane was seen (stores one permit if nobody waits yet).
    released: Notify,
}

/// A place in a [`LaneQueue`]; dropping it leaves the line.
pub(crate) struct Place<'a> {
    queue: &'a LaneQueue,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl LaneQueue {
    /// Requests waiting now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Joins the line unless it already holds `max` waiters.
    pub fn join(&self, max: usize) -> Option<Place<'_>> {
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place { queue: self })
    }

    /// Waits to be the head of the line; the returned guard is the turn.
    pub async fn head(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.head.lock().await
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
