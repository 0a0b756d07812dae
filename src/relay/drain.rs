//! Shutdown's hold on the streams still open: a [`Drain`] is shared by one gateway's listeners,
//! its `/readyz` and every relay its handlers start.
//!
//! Two steps, each once: [`Drain::begin`] when the shutdown starts (`/readyz` answers 503
//! `draining` from then on), [`Drain::end_streams`] when the grace period is over (every relay
//! still streaming ends with a `shutdown` error, aborts its engine work and gives its seat
//! back; see [`super::Relay`]).
//!
//! The pipeline builds each relay without knowing about shutdown, so a relay finds its gateway's
//! drain in the task that handles the request: the server runs every handler inside
//! [`Drain::scope`], and [`super::Relay::new`] reads [`Drain::current`]. A relay started
//! outside a handler (a background job: jobs stop through their own token at shutdown) has none
//! and is not ended by it.

use std::future::Future;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

tokio::task_local! {
    static CURRENT: Drain;
}

/// One gateway's shutdown state, seen by its `/readyz` and its relays. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Drain {
    /// Cancelled when the shutdown starts.
    draining: CancellationToken,
    /// Cancelled when the grace period is over: open streams end now.
    end: CancellationToken,
}

impl Drain {
    /// Not draining.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shutdown started: `/readyz` answers 503 `draining` from now on.
    pub fn begin(&self) {
        self.draining.cancel();
    }

    /// Whether the shutdown started.
    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// The grace period is over: every stream still open ends with a `shutdown` error. Implies
    /// [`Drain::begin`].
    pub fn end_streams(&self) {
        self.draining.cancel();
        self.end.cancel();
    }

    /// Whether open streams must end now.
    pub fn streams_ending(&self) -> bool {
        self.end.is_cancelled()
    }

    /// Cancelled when open streams must end (for a request's record: a request dropped after
    /// that was ended by the shutdown, not by its client).
    pub fn end_token(&self) -> CancellationToken {
        self.end.clone()
    }

    /// Resolves when the shutdown starts (owned: for a response body that outlives its
    /// handler).
    pub fn draining_owned(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.draining.clone().cancelled_owned()
    }

    /// Resolves when open streams must end.
    pub fn ending(&self) -> WaitForCancellationFuture<'_> {
        self.end.cancelled()
    }

    /// Runs `fut` (a request's handler) with this drain as [`Drain::current`].
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self.clone(), fut)
    }

    /// The drain of the gateway whose handler runs this code, if any.
    pub fn current() -> Option<Drain> {
        CURRENT.try_with(Drain::clone).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::Drain;

    #[tokio::test]
    async fn a_handler_sees_its_gateways_drain_and_nothing_outside_it() {
        assert!(Drain::current().is_none());
        let drain = Drain::new();
        let seen = drain.scope(async { Drain::current() }).await.unwrap();
        assert!(!seen.is_draining());
        drain.begin();
        assert!(seen.is_draining() && !seen.streams_ending());
        drain.end_streams();
        assert!(seen.streams_ending());
        seen.ending().await;
        // A task spawned from a handler does not inherit it.
        let spawned = drain
            .scope(async { tokio::spawn(async { Drain::current() }).await.unwrap() })
            .await;
        assert!(spawned.is_none());
    }
}
