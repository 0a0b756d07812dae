//! [`LaneGuard`]: the admitted request's slot and token reservation, given back on drop.

use std::sync::Arc;
use std::time::Duration;

use super::local::Shared;
use super::redis::LeaseRelease;
use crate::classify::Lane;

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
    release: Option<Release>,
}

/// Where the reservation goes back to.
enum Release {
    Local(Arc<Shared>),
    /// A lease in the shared quota; its release runs in the background.
    Redis(LeaseRelease),
}

impl LaneGuard {
    pub(super) fn local(
        shared: Arc<Shared>,
        lane: Lane,
        tokens: u32,
        queue_wait: Duration,
    ) -> Self {
        Self {
            lane,
            tokens,
            queue_wait,
            release: Some(Release::Local(shared)),
        }
    }

    pub(super) fn redis(
        release: LeaseRelease,
        lane: Lane,
        tokens: u32,
        queue_wait: Duration,
    ) -> Self {
        Self {
            lane,
            tokens,
            queue_wait,
            release: Some(Release::Redis(release)),
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
    /// has a free slot and token room; the old slot is free again at once. `false`: no room, and
    /// nothing changed.
    pub async fn promote(&mut self, to: Lane, tokens: u32) -> bool {
        let tokens = tokens.max(self.tokens);
        let moved = match &self.release {
            Some(Release::Local(shared)) => shared.promote(self.lane, self.tokens, to, tokens),
            Some(Release::Redis(lease)) => {
                lease
                    .shared
                    .promote(&lease.id, self.lane, self.tokens, to, tokens)
                    .await
            }
            None => false,
        };
        if moved {
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
        match self.release.take() {
            Some(Release::Local(shared)) => shared.release(self.lane, self.tokens),
            Some(Release::Redis(lease)) => lease.shared.release(lease.id, self.lane),
            None => {}
        }
    }
}

impl std::fmt::Debug for LaneGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneGuard")
            .field("lane", &self.lane)
            .field("tokens", &self.tokens)
            .field("queue_wait", &self.queue_wait)
            .field("armed", &self.release.is_some())
            .finish()
    }
}
