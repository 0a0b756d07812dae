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

/// A waiter at `pos` of `queue` (kept in tag order) leaves unserved: its turn passes to the
/// next of its kin (its tenant's later waiters, `kin`), that one's to the next, and so on,
/// each taking the place and tag of the one before it. Returns where the leaver is now: at its
/// tenant's newest turn, which the caller removes and gives back ([`Fair::give_back`]).
pub fn pass_down<T>(
    queue: &mut std::collections::VecDeque<T>,
    pos: usize,
    kin: impl Fn(&T) -> bool,
    tag: impl Fn(&mut T) -> &mut f64,
) -> usize {
    let mut at = pos;
    for next in pos + 1..queue.len() {
        if !kin(&queue[next]) {
            continue;
        }
        queue.swap(at, next);
        let (a, b) = (*tag(&mut queue[at]), *tag(&mut queue[next]));
        *tag(&mut queue[at]) = b;
        *tag(&mut queue[next]) = a;
        at = next;
    }
    at
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
    /// The start tag of an arrival of `tenant` with `share` (one turn each).
    pub fn tag(&mut self, tenant: Option<Arc<str>>, share: f64) -> f64 {
        self.tag_at_least(tenant, share, 1.0, 0.0)
    }

    /// The start tag of an arrival of `tenant` with `share` that costs `cost` (tokens), never
    /// below `floor` (its tenant's service counted elsewhere, in the same units: the fleet's
    /// counter, `crate::admission::redis::service`): `max(V, F[t], floor)`, and `F[t]` moves to
    /// that plus `cost / share`.
    pub fn tag_at_least(
        &mut self,
        tenant: Option<Arc<str>>,
        share: f64,
        cost: f64,
        floor: f64,
    ) -> f64 {
        if self.finish.len() > 1024 {
            // Tenants whose last request is already behind the virtual time are idle.
            let v = self.virtual_time;
            self.finish.retain(|_, f| *f > v);
        }
        let finish = self.finish.entry(tenant).or_insert(0.0);
        let start = finish.max(self.virtual_time).max(floor);
        *finish = start + cost / share.max(0.001);
        start
    }
}

impl Fair {
    /// A waiter of `tenant` left unserved and its tenant's newest turn, starting at `start`,
    /// is free again (each of its tenant's later waiters took the turn before its own): the
    /// tenant's next arrival starts there (or at the virtual time, when that is later).
    pub fn give_back(&mut self, tenant: &Option<Arc<str>>, start: f64) {
        if let Some(finish) = self.finish.get_mut(tenant) {
            if *finish > start {
                *finish = start;
            }
        }
    }

    /// The virtual time: the tag of the last waiter admitted.
    pub fn virtual_time(&self) -> f64 {
        self.virtual_time
    }

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

/// What a full queue does with an arrival (`[auth]` tenants only; see [`room_for`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Room {
    /// The queue has room: the arrival waits.
    Enter,
    /// The arrival's tenant holds fewer than its places: the newest waiter of this tenant (the
    /// one most above its own places) leaves with [`AdmissionError::TenantQueueFull`], and the
    /// arrival waits.
    ///
    /// [`AdmissionError::TenantQueueFull`]: super::AdmissionError::TenantQueueFull
    PushOut {
        /// That tenant.
        tenant: Arc<str>,
        /// Waiters it held.
        held: u32,
        /// Places it may hold.
        places: u32,
    },
    /// The arrival's tenant already holds its places (or the queue is full of requests without a
    /// tenant, or has no places at all: `places` 0): refused.
    Refuse {
        /// Waiters its tenant holds.
        held: u32,
        /// Places its tenant may hold while these tenants wait.
        places: u32,
    },
}

/// Waiters per tenant in a queue (`None`: requests without a tenant), and in all.
struct Tally<'a> {
    held: HashMap<Option<&'a str>, u32>,
    total: u32,
}

impl<'a> Tally<'a> {
    fn of(waiting: impl Iterator<Item = Option<&'a Arc<str>>>) -> Self {
        let mut held: HashMap<Option<&str>, u32> = HashMap::new();
        let mut total = 0u32;
        for t in waiting {
            *held.entry(t.map(|t| &**t)).or_default() += 1;
            total = total.saturating_add(1);
        }
        Self { held, total }
    }

    /// Waiters of `tenant`.
    fn of_tenant(&self, tenant: Option<&str>) -> u32 {
        self.held.get(&tenant).copied().unwrap_or(0)
    }

    /// The shares of the tenants waiting, `tenant`'s included whether it waits or not.
    fn present(&self, tenant: &str, share: impl Fn(Option<&str>) -> f64) -> f64 {
        self.held
            .keys()
            .filter(|t| **t != Some(tenant))
            .map(|t| share(*t))
            .sum::<f64>()
            + share(Some(tenant))
    }
}

/// How many of a line's waiters (`waiting`: each waiter's tenant) fair queuing admits before
/// an arrival of `tenant` (`None`: a request without one, all such taken as one tenant): every
/// waiter of its own tenant, and of each other tenant at most the turns its share gives it
/// while the arrival's tenant takes its own and the arrival's (rounded up). The waiters ahead
/// in time order counted one tenant's backlog against everyone: a tenant that parked 200
/// requests made every other tenant's deadline look 200 admissions away, though its turn came
/// within a few.
pub fn fair_ahead<'a>(
    waiting: impl Iterator<Item = Option<&'a Arc<str>>>,
    tenant: Option<&str>,
    share_of: impl Fn(&str) -> f64,
) -> u32 {
    let tally = Tally::of(waiting);
    let share = |t: Option<&str>| t.map_or(1.0, &share_of);
    let own = tally.of_tenant(tenant);
    let rounds = f64::from(own) + 1.0;
    let mine = share(tenant).max(f64::MIN_POSITIVE);
    let others = tally
        .held
        .iter()
        .filter(|(t, _)| **t != tenant)
        .map(|(t, n)| {
            let turns = (rounds * share(*t) / mine).ceil();
            // A float of at most the waiters' count: the cast cannot wrap.
            f64::from(*n).min(turns) as u32
        })
        .fold(0u32, u32::saturating_add);
    own.saturating_add(others).min(tally.total)
}

/// A tenant's places in a full queue of `len`: its share of `len` among the tenants waiting
/// (the arrival's included), rounded down, at least 1.
fn places(len: usize, share: f64, shares_present: f64) -> u32 {
    let p = (len as f64 * share / shares_present.max(f64::MIN_POSITIVE)).floor();
    u32::try_from(p as u64).unwrap_or(u32::MAX).max(1)
}

/// The queue's tenants' share of its `len` places. Below `len` waiters (`waiting`: each
/// waiter's tenant) anyone may wait: a tenant alone borrows the whole queue. Full, an arrival
/// of `tenant` (share from `share_of`) that holds fewer than its places pushes out the newest
/// waiter of the tenant most above its own places; one that holds its places is refused. So a
/// burst of one tenant can fill an idle queue but never keeps another tenant out of its share.
/// Requests without a tenant (`[auth]` off) are refused when the queue is full, as before.
pub fn room_for<'a>(
    len: usize,
    waiting: impl Iterator<Item = Option<&'a Arc<str>>>,
    tenant: Option<&str>,
    share_of: impl Fn(&str) -> f64,
) -> Room {
    let tally = Tally::of(waiting);
    if (tally.total as usize) < len {
        return Room::Enter;
    }
    if len == 0 {
        // A queue of no places ("never wait"): nobody's share.
        return Room::Refuse { held: 0, places: 0 };
    }
    let Some(tenant) = tenant else {
        return Room::Refuse {
            held: tally.of_tenant(None),
            places: u32::try_from(len).unwrap_or(u32::MAX),
        };
    };
    let share = |t: Option<&str>| t.map_or(1.0, &share_of);
    let present = tally.present(tenant, share);
    let mine = tally.of_tenant(Some(tenant));
    let my_places = places(len, share(Some(tenant)), present);
    if mine >= my_places {
        return Room::Refuse {
            held: mine,
            places: my_places,
        };
    }
    let over = tally
        .held
        .iter()
        .filter_map(|(t, n)| {
            let t = (*t)?;
            let p = places(len, share(Some(t)), present);
            let excess = i64::from(*n) - i64::from(p);
            (excess > 0).then_some((excess, t, *n, p))
        })
        .max();
    match over {
        Some((_, t, held, places)) => Room::PushOut {
            tenant: Arc::from(t),
            held,
            places,
        },
        // Every tenant within its places (rounding): nobody to push out.
        None => Room::Refuse {
            held: mine,
            places: my_places,
        },
    }
}

/// Whether `tenant` holds more than its share (`share_of`, by `auth.tenant_shares`) of the
/// requests waiting (`waiting`: each waiter's tenant): its waiters over all of them above its
/// share over the shares of the tenants waiting (its own included). A tenant alone is never
/// over its share. The early "no" answers such a tenant 429: its wait is its own backlog.
pub fn over_share<'a>(
    waiting: impl Iterator<Item = Option<&'a Arc<str>>>,
    tenant: &str,
    share_of: impl Fn(&str) -> f64,
) -> bool {
    let tally = Tally::of(waiting);
    let share = |t: Option<&str>| t.map_or(1.0, &share_of);
    f64::from(tally.of_tenant(Some(tenant))) * tally.present(tenant, share)
        > f64::from(tally.total) * share(Some(tenant))
}
