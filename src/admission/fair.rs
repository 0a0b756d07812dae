//! [`Fair`]: the order of a queue shared by several tenants (lane queues, the job queue), and
//! [`edf_place`]: earliest deadline first among one tenant's waiters of one lane.
//!
//! The two compose: the fair order hands out *turns* (start tags) between tenants; which of a
//! tenant's waiters of a lane uses its next turn is the one due first. An arrival takes its
//! tenant's newest turn and is then moved, with its turn's tag left behind, ahead of the
//! waiters of its tenant and lane that are due later (each of those moves one of their turns
//! later). Tenants keep exactly the turns they had: a tenant that marks every request urgent
//! overtakes only itself.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

/// When a waiter's first token stops being useful: `x-tutor-deadline-ms` after its arrival,
/// or its lane's `ttft_slo_ms`; `None` (no deadline, no objective) is due after every
/// deadline, in arrival order.
pub type Due = Option<Instant>;

/// Where an arrival due at `due` goes among the waiters of its tenant and lane, given their
/// dues in queue order (the arrival not among them): before the first one due later (ties keep
/// arrival order; `None` is latest). `dues.len()`: behind them all, its own turn.
pub fn edf_place(dues: impl IntoIterator<Item = Due>, due: Due) -> usize {
    let later = |d: Due| match (d, due) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(d), Some(due)) => d > due,
    };
    let mut n = 0;
    for d in dues {
        if later(d) {
            return n;
        }
        n += 1;
    }
    n
}

/// Fair order between tenants inside one queue: start-time fair queuing. An arrival of tenant
/// `t` with share `w` gets the start tag `max(V, F[t])` and moves `F[t]` to that plus `1 / w`,
/// where `V` is the tag of the last waiter admitted; the queue is kept sorted by tag (ties in
/// arrival order). One tenant alone (or requests without a tenant) keeps plain FIFO order; a
/// tenant with 200 waiting cannot push another tenant's next request behind all of them.
#[derive(Debug, Default)]
pub struct Fair {
    /// The tag of the last waiter admitted.
    virtual_time: f64,
    /// Each tenant's last finish tag (`None`: requests without a tenant).
    finish: HashMap<Option<Arc<str>>, f64>,
}

impl Fair {
    /// The start tag of an arrival of `tenant` with `share`.
    pub fn tag(&mut self, tenant: Option<Arc<str>>, share: f64) -> f64 {
        if self.finish.len() > 1024 {
            // Tenants whose last request is already behind the virtual time are idle.
            let v = self.virtual_time;
            self.finish.retain(|_, f| *f > v);
        }
        let finish = self.finish.entry(tenant).or_insert(0.0);
        let start = finish.max(self.virtual_time);
        *finish = start + 1.0 / share.max(0.001);
        start
    }
}

impl Fair {
    /// A waiter with start tag `tag` was admitted: the virtual time moves up to it.
    pub fn admitted(&mut self, tag: f64) {
        self.virtual_time = self.virtual_time.max(tag);
    }
}

/// Each tenant's share of a queue's turns, from `auth.tenant_shares` (1 for a tenant not
/// listed): what both backends' queues weigh their tags by.
pub fn shares(config: &crate::config::Config) -> std::collections::HashMap<String, f64> {
    config
        .auth
        .tenant_shares
        .iter()
        .map(|(t, s)| (t.clone(), f64::from(*s)))
        .collect()
}
