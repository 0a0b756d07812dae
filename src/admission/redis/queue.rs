//! A lane's local wait line in front of the shared quota.
//!
//! Only the line's head talks to Redis. The order is the local backend's: start-time fair
//! queuing between tenants ([`Fair`], turns weighted by `auth.tenant_shares`), and within a
//! tenant its waiter due first ([`edf_place`]; FIFO among equal dues, so one tenant alone with
//! no deadlines, or `[auth]` off, is plain FIFO). A waiter that arrives with an earlier tag
//! than the head's takes the turn at the head's next refused try. The head retries the acquire
//! script when a release is announced (this replica's own releases, and every replica's through
//! the pub/sub channel) or after a jittered, exponentially growing backoff (5 ms to 250 ms), so
//! an idle wait costs a few calls a second and a missed notification costs at most one backoff.
//! Fairness holds within a replica's line; across replicas, heads race for a freed seat (see
//! the module doc of `redis/`).
//!
//! The head may ask for the waiters behind it in the same script call ([`Turn::behind`]): the
//! script grants in the line's order and stops at the first that does not fit, and the head
//! hands each granted lease to its waiter ([`Turn::hand`]), which leaves the line with it. A
//! burst in line then costs one round trip, not one per request. A waiter that left the line
//! while the call ran (timed out, gone) is not there to take its lease: the lease is dropped,
//! which gives it back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;

use crate::admission::fair::{edf_place, room_for, Due, Fair, Room};

/// First retry delay after a refused acquire.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_millis(250);

/// A waiter's place in the order: its start tag (a non-negative float's bits order as the
/// float does) and its arrival number plus [`HEAD_ROOM`] (a continuation joining at the head
/// takes the number just below the first waiter's).
type Key = (u64, u64);

/// Room below the arrival numbers in [`Key`] for continuations joining at the head.
const HEAD_ROOM: u64 = 1 << 32;

/// A tenant's service counted fleet-wide (`service`), which orders a line by tokens.
#[derive(Clone)]
pub(crate) struct Rank(Arc<dyn Fn(&str) -> f64 + Send + Sync>);

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rank")
    }
}

/// What a waiter asks for: (tokens, prompt tokens), as the acquire script takes them.
pub(crate) type Need = (u32, u32);

/// Where a head puts a lease it took for a waiter behind it; dropping an unclaimed one (its
/// waiter left) gives the lease back.
type Slot<H> = Arc<Mutex<Option<H>>>;

/// A waiter in a [`Line`]: the place of arrival number `id`.
#[derive(Debug)]
struct Seat<H> {
    id: u64,
    tenant: Option<Arc<str>>,
    due: Due,
    /// What it asks for; `None`: only its own turn's call may take it.
    need: Option<Need>,
    wake: Arc<Notify>,
    /// Set when it was pushed out for another tenant's request: its tenant's (held, places).
    out: Arc<OnceLock<(u32, u32)>>,
    handed: Slot<H>,
    /// Joined at the head ([`LaneQueue::join_first`]): first whatever the order, never moved
    /// back by a later waiter of its tenant.
    head: bool,
    /// Admitted ([`Place::admitted`]): its turn was used, and is not given back as it leaves.
    served: bool,
}

#[derive(Debug)]
struct Line<H> {
    fair: Fair,
    /// Waiters in fair order (a key is a turn; a waiter moved ahead by its deadline takes an
    /// earlier turn of its tenant's).
    order: BTreeMap<Key, Seat<H>>,
    /// Each waiter's key in `order`, by arrival number.
    keys: HashMap<u64, Key>,
    /// The arrival number of the waiter whose turn it is (the one talking to Redis).
    turn: Option<u64>,
    arrivals: u64,
    /// The fleet's service counters, when the line may be ordered by them.
    rank: Option<Rank>,
    /// Whether the last arrival asked for that order (`auth.fleet_fairness`, reloadable).
    ranked: bool,
}

impl<H> Default for Line<H> {
    fn default() -> Self {
        Self {
            fair: Fair::default(),
            order: BTreeMap::new(),
            keys: HashMap::new(),
            turn: None,
            arrivals: 0,
            rank: None,
            ranked: false,
        }
    }
}

impl<H> Line<H> {
    /// Wakes the waiter whose turn it is ([`Line::first`]: ordered by fleet service, that may
    /// not be the earliest arrival) when nobody has the turn.
    fn wake_first(&self) {
        if self.turn.is_none() {
            self.wake(self.first());
        }
    }

    /// Wakes the waiter `id`, if it still waits.
    fn wake(&self, id: Option<u64>) {
        if let Some(seat) = id.and_then(|id| self.order.values().find(|s| s.id == id)) {
            seat.wake.notify_one();
        }
    }

    /// Puts `seat` at `key` (its tenant's newest turn), then ahead of the waiters of its
    /// tenant due later: each of those moves one of the tenant's turns back.
    fn insert(&mut self, key: Key, seat: Seat<H>) {
        let kin: Vec<Key> = self
            .order
            .iter()
            .filter(|(_, s)| s.tenant == seat.tenant && !s.head)
            .map(|(k, _)| *k)
            .collect();
        let place = edf_place(kin.iter().map(|k| self.order[k].due), seat.due);
        let mut moving = seat;
        for k in &kin[place..] {
            if let Some(seat) = self.order.get_mut(k) {
                self.keys.insert(moving.id, *k);
                moving = std::mem::replace(seat, moving);
            }
        }
        self.keys.insert(moving.id, key);
        self.order.insert(key, moving);
    }

    /// Takes waiter `id` out (admitted, or leaving unserved: then see [`Line::pass_down`]).
    fn remove(&mut self, id: u64) {
        if let Some(key) = self.keys.remove(&id) {
            if let Some(seat) = self.order.remove(&key) {
                if !seat.head && !seat.served {
                    self.pass_down(key, &seat.tenant);
                }
            }
        }
        if self.turn == Some(id) {
            self.turn = None;
        }
    }

    /// The turn at `free`, left unserved by a waiter of `tenant`, passes to its tenant's next
    /// waiter, that one's to the next, and so on; the tenant's newest turn is free again. A
    /// tenant whose requests gave up (timed out, their clients went away, pushed out) keeps
    /// the turns they did not use, where its next request used to queue behind every other
    /// tenant's turns as many as had left.
    fn pass_down(&mut self, mut free: Key, tenant: &Option<Arc<str>>) {
        let later: Vec<Key> = self
            .order
            .range((std::ops::Bound::Excluded(free), std::ops::Bound::Unbounded))
            .filter(|(_, s)| &s.tenant == tenant && !s.head)
            .map(|(k, _)| *k)
            .collect();
        for k in later {
            if let Some(seat) = self.order.remove(&k) {
                self.keys.insert(seat.id, free);
                self.order.insert(free, seat);
                free = k;
            }
        }
        self.fair.give_back(tenant, f64::from_bits(free.0));
    }

    /// Pushes out the newest waiter of `tenant` (it held `held`, its places are `places`);
    /// never a continuation (an answer that already streamed always keeps its place).
    fn push_out(&mut self, tenant: &Arc<str>, held: u32, places: u32) {
        let newest = self
            .order
            .values()
            .filter(|s| !s.head && s.tenant.as_ref() == Some(tenant))
            .map(|s| s.id)
            .max();
        let Some(id) = newest else { return };
        if let Some(key) = self.keys.remove(&id) {
            if let Some(seat) = self.order.remove(&key) {
                let _ = seat.out.set((held, places));
                seat.wake.notify_one();
                if !seat.head {
                    self.pass_down(key, &seat.tenant);
                }
            }
        }
        if self.turn == Some(id) {
            self.turn = None;
        }
    }

    /// The arrival number of the first waiter: in the tags' order, or, ordered by the fleet's
    /// service counters, the first waiter of the waiting tenant with the least service now
    /// (ties: the earlier tag). The counters move while requests wait (admissions here and on
    /// other replicas), so a tenant's tag, fixed at its arrival, cannot say who is behind now.
    fn first(&self) -> Option<u64> {
        let mut waiting = self.order.values();
        let first = waiting.next()?;
        if first.head {
            return Some(first.id);
        }
        let Some(Rank(rank)) = self.rank.as_ref().filter(|_| self.ranked) else {
            return Some(first.id);
        };
        let of = |s: &Seat<H>| s.tenant.as_deref().map_or(f64::INFINITY, |t| rank(t));
        let mut best = (of(first), first.id);
        let mut seen: Vec<&Arc<str>> = first.tenant.iter().collect();
        for seat in waiting {
            let Some(t) = &seat.tenant else { continue };
            if seen.contains(&t) {
                continue;
            }
            seen.push(t);
            let r = of(seat);
            if r < best.0 {
                best = (r, seat.id);
            }
        }
        Some(best.1)
    }
}

/// One lane's wait line; `H`: a lease its head takes for a waiter behind it.
#[derive(Debug)]
pub(crate) struct LaneQueue<H> {
    /// Requests waiting (queue length checks and the snapshot).
    waiting: AtomicU32,
    line: Mutex<Line<H>>,
    /// A release in this lane was seen (stores one permit if nobody waits yet).
    released: Notify,
}

impl<H> Default for LaneQueue<H> {
    fn default() -> Self {
        Self {
            waiting: AtomicU32::new(0),
            line: Mutex::new(Line::default()),
            released: Notify::new(),
        }
    }
}

/// A place in a [`LaneQueue`]; dropping it leaves the line.
pub(crate) struct Place<'a, H> {
    queue: &'a LaneQueue<H>,
    /// Its arrival number.
    id: u64,
    wake: Arc<Notify>,
    /// Set when it was pushed out: its tenant's (held, places).
    out: Arc<OnceLock<(u32, u32)>>,
    /// Where the head puts a lease it took for this waiter.
    handed: Slot<H>,
}

/// The turn of a [`Place`]: while held, this waiter is the only one of its line calling Redis.
pub(crate) struct Turn<'p, 'a, H> {
    place: &'p Place<'a, H>,
}

/// Why a waiter left its line without a turn.
#[derive(Debug)]
pub(crate) enum Left<H> {
    /// Pushed out for another tenant's request: its tenant's (held, places).
    PushedOut(u32, u32),
    /// The head took its lease for it, in the head's own call.
    Handed(H),
}

impl<H> Drop for Place<'_, H> {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
        let mut line = self.queue.lock();
        line.remove(self.id);
        line.wake_first();
    }
}

impl<H> Drop for Turn<'_, '_, H> {
    fn drop(&mut self) {
        let mut line = self.place.queue.lock();
        if line.turn == Some(self.place.id) {
            line.turn = None;
        }
        line.wake_first();
    }
}

impl<H> LaneQueue<H> {
    fn lock(&self) -> MutexGuard<'_, Line<H>> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets the line be ordered by `rank` (a tenant's fleet service) while its arrivals ask for
    /// it ([`LaneQueue::join_costed`] with a cost).
    pub fn rank_by(&self, rank: Arc<dyn Fn(&str) -> f64 + Send + Sync>) {
        self.lock().rank = Some(Rank(rank));
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Joins the line (of at most `len` waiters) for `tenant` (whose share of turns is
    /// `share`; every tenant's from `share_of`), due at `due`. A full line makes room as
    /// [`room_for`] says: it may push out the newest waiter of a tenant above its places (that
    /// waiter's [`Place::turn`] then answers its tenant's numbers); `Err` is the refusal's.
    #[cfg(test)]
    pub fn join(
        &self,
        len: usize,
        (tenant, share): (Option<&str>, f64),
        due: Due,
        share_of: impl Fn(&str) -> f64,
    ) -> Result<Place<'_, H>, Room> {
        self.join_costed(len, (tenant, share), None, due, None, share_of)
    }

    /// [`LaneQueue::join`] with the arrival's `(cost, floor)` when the line orders by tokens
    /// against the fleet's service counters ([`Fair::tag_at_least`]; `None`: one turn each),
    /// and what it asks for when a head may take its lease for it (`need`; `None`: only its
    /// own turn).
    pub fn join_costed(
        &self,
        len: usize,
        (tenant, share): (Option<&str>, f64),
        costed: Option<(f64, f64)>,
        due: Due,
        need: Option<Need>,
        share_of: impl Fn(&str) -> f64,
    ) -> Result<Place<'_, H>, Room> {
        let mut line = self.lock();
        // Continuations are not counted: they are not pushed out either.
        match room_for(
            len,
            line.order
                .values()
                .filter(|s| !s.head)
                .map(|s| s.tenant.as_ref()),
            tenant,
            share_of,
        ) {
            Room::Enter => {}
            Room::PushOut {
                tenant: over,
                held,
                places,
            } => line.push_out(&over, held, places),
            refuse @ Room::Refuse { .. } => return Err(refuse),
        }
        // The pushed-out waiter leaves the count when its place drops (at once).
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let tenant: Option<Arc<str>> = tenant.map(Arc::from);
        line.ranked = costed.is_some();
        let tag = match costed {
            None => line.fair.tag(tenant.clone(), share),
            Some((cost, floor)) => line.fair.tag_at_least(tenant.clone(), share, cost, floor),
        };
        line.arrivals += 1;
        let id = line.arrivals;
        let key = (tag.max(0.0).to_bits(), HEAD_ROOM + id);
        let wake = Arc::new(Notify::new());
        let out = Arc::new(OnceLock::new());
        let handed: Slot<H> = Arc::new(Mutex::new(None));
        let seat = Seat {
            id,
            tenant,
            due,
            need,
            wake: wake.clone(),
            out: out.clone(),
            handed: handed.clone(),
            head: false,
            served: false,
        };
        line.insert(key, seat);
        line.wake_first();
        Ok(Place {
            queue: self,
            id,
            wake,
            out,
            handed,
        })
    }

    /// Joins the line at its head, however long it is: a pre-empted request's continuation
    /// (it ran a moment ago, and there are at most as many as borrowed seats). Its turn is
    /// no later than the first waiter's and takes no new turn of its tenant's; it stays first
    /// while the line is ordered by the fleet's service counters, and a later waiter of its
    /// tenant due earlier does not move it back. A second continuation joins ahead of the first.
    pub fn join_first(&self, tenant: Option<&str>, need: Option<Need>) -> Place<'_, H> {
        let mut line = self.lock();
        self.waiting.fetch_add(1, Ordering::AcqRel);
        line.arrivals += 1;
        let id = line.arrivals;
        let now = line.fair.virtual_time().max(0.0);
        let key = match line.order.keys().next() {
            Some(&(tag, order)) if f64::from_bits(tag) <= now && order > 0 => (tag, order - 1),
            _ => (now.to_bits(), HEAD_ROOM + id),
        };
        let wake = Arc::new(Notify::new());
        let out = Arc::new(OnceLock::new());
        let handed: Slot<H> = Arc::new(Mutex::new(None));
        let seat = Seat {
            id,
            tenant: tenant.map(Arc::from),
            due: None,
            need,
            wake: wake.clone(),
            out: out.clone(),
            handed: handed.clone(),
            head: true,
            served: false,
        };
        line.keys.insert(id, key);
        line.order.insert(key, seat);
        line.wake_first();
        Place {
            queue: self,
            id,
            wake,
            out,
            handed,
        }
    }

    /// The tenant of each waiter.
    pub fn tenants(&self) -> Vec<Option<Arc<str>>> {
        self.lock()
            .order
            .values()
            .map(|s| s.tenant.clone())
            .collect()
    }

    /// Announces a release in this lane.
    pub fn notify(&self) {
        self.released.notify_one();
    }

    /// Waits for a release announcement or the backoff, whichever comes first, and returns the
    /// next backoff and whether a release was announced.
    pub async fn pause(&self, backoff: Duration) -> (Duration, bool) {
        let jittered = rand::rng().random_range(backoff / 2..=backoff);
        tokio::select! {
            () = self.released.notified() => (BACKOFF_MIN, true),
            () = tokio::time::sleep(jittered) => ((backoff * 2).min(BACKOFF_MAX), false),
        }
    }

    /// The first backoff.
    pub const fn first_backoff() -> Duration {
        BACKOFF_MIN
    }
}

impl<'a, H> Place<'a, H> {
    /// Waits until this waiter is first in the fair order and nobody else has the turn; `Err`
    /// when it was pushed out meanwhile, or a head took its lease for it.
    pub async fn turn(&self) -> Result<Turn<'_, 'a, H>, Left<H>> {
        loop {
            {
                let mut line = self.queue.lock();
                if let Some(handed) = self
                    .handed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                {
                    return Err(Left::Handed(handed));
                }
                if let Some((held, places)) = self.pushed_out() {
                    return Err(Left::PushedOut(held, places));
                }
                if line.turn.is_none() {
                    match line.first() {
                        Some(id) if id == self.id => {
                            line.turn = Some(self.id);
                            return Ok(Turn { place: self });
                        }
                        // Woken while another is first now (the fleet's service moved since
                        // the wake-up): pass it on, or nobody would take the free turn.
                        first => line.wake(first),
                    }
                }
            }
            // A stored permit covers a wake-up sent between the check and this wait.
            self.wake.notified().await;
        }
    }

    /// Whether it was pushed out for another tenant's request: its tenant's (held, places).
    pub fn pushed_out(&self) -> Option<(u32, u32)> {
        self.out.get().copied()
    }

    /// This waiter was admitted: the fair order's virtual time moves on to its turn's tag.
    pub fn admitted(&self) {
        let mut line = self.queue.lock();
        if let Some(key) = line.keys.get(&self.id).copied() {
            line.fair.admitted(f64::from_bits(key.0));
            if let Some(seat) = line.order.get_mut(&key) {
                seat.served = true;
            }
        }
    }
}

impl<H> Turn<'_, '_, H> {
    /// Whether this turn's waiter is still first (a waiter with an earlier tag, or of its
    /// tenant and due earlier, may have joined; it should then get the turn).
    pub fn still_first(&self) -> bool {
        self.place.queue.lock().first() == Some(self.place.id)
    }

    /// Up to `most` waiters behind this turn's, in the line's order, for one script call with
    /// it: their arrival numbers and needs. It stops at a waiter that did not say its need.
    /// None while the line is ordered by the fleet's service counters (that order moves with
    /// every admission anywhere, so it is asked one turn at a time).
    pub fn behind(&self, most: usize) -> Vec<(u64, Need)> {
        let line = self.place.queue.lock();
        if line.ranked && line.rank.is_some() {
            return Vec::new();
        }
        line.order
            .values()
            .filter(|s| s.id != self.place.id)
            .map_while(|s| s.need.map(|need| (s.id, need)))
            .take(most)
            .collect()
    }

    /// Hands each lease in `granted` (taken for the waiter with that arrival number, one of
    /// [`Turn::behind`]'s) to its waiter, which leaves the line with it; the fair order's
    /// virtual time moves on to its turn. A lease whose waiter left meanwhile is dropped here
    /// (given back).
    pub fn hand(&self, granted: Vec<(u64, H)>) {
        let mut unclaimed = Vec::new();
        {
            let mut line = self.place.queue.lock();
            for (id, lease) in granted {
                let Some(key) = line.keys.remove(&id) else {
                    unclaimed.push(lease);
                    continue;
                };
                let Some(seat) = line.order.remove(&key) else {
                    unclaimed.push(lease);
                    continue;
                };
                line.fair.admitted(f64::from_bits(key.0));
                *seat.handed.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease);
                seat.wake.notify_one();
            }
        }
        drop(unclaimed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(_: &str) -> f64 {
        1.0
    }

    #[tokio::test]
    async fn turns_follow_the_fair_order_and_pass_on_when_a_place_leaves() {
        let q = LaneQueue::<()>::default();
        let a1 = q.join(10, (Some("A"), 1.0), None, one).unwrap();
        let a2 = q.join(10, (Some("A"), 1.0), None, one).unwrap();
        let a3 = q.join(10, (Some("A"), 1.0), None, one).unwrap();
        let turn = a1.turn().await.unwrap();
        // B arrives last but its start tag is the virtual time: it goes before A's second.
        let b1 = q.join(10, (Some("B"), 1.0), None, one).unwrap();
        assert!(turn.still_first(), "A's first keeps its place");
        a1.admitted();
        drop(turn);
        drop(a1);
        let turn = b1.turn().await.unwrap();
        assert!(q.lock().first().is_none_or(|id| id != a2.id));
        b1.admitted();
        drop(turn);
        drop(b1);
        assert_eq!(q.waiting(), 2);
        let t2 = a2.turn().await.unwrap();
        drop(t2);
        drop(a2);
        let t3 = a3.turn().await.unwrap();
        assert!(t3.still_first());
        drop(t3);
        drop(a3);
        assert_eq!(q.waiting(), 0);
        assert!(q.lock().order.is_empty() && q.lock().turn.is_none());
        // The bound holds.
        let p: Vec<_> = (0..2).map(|_| q.join(2, (None, 1.0), None, one)).collect();
        assert!(p.iter().all(Result::is_ok));
        assert!(q.join(2, (None, 1.0), None, one).is_err());
    }

    #[tokio::test]
    async fn a_continuation_joins_a_full_line_at_its_head_and_stays_there() {
        let served: Arc<Mutex<HashMap<String, f64>>> = Arc::default();
        let q = LaneQueue::<()>::default();
        let view = served.clone();
        q.rank_by(Arc::new(move |t: &str| {
            view.lock().unwrap().get(t).copied().unwrap_or(0.0)
        }));
        served.lock().unwrap().insert("B".into(), 1_000.0);
        let a1 = q.join(2, (Some("A"), 1.0), None, one).unwrap();
        let a2 = q.join(2, (Some("A"), 1.0), None, one).unwrap();
        assert!(q.join(2, (Some("A"), 1.0), None, one).is_err(), "full");
        // B's continuation: first, in a full line, though B has had the most service.
        let b = q.join_first(Some("B"), None);
        assert_eq!(q.waiting(), 3);
        assert_eq!(q.lock().first(), Some(b.id));
        q.lock().ranked = true;
        assert_eq!(q.lock().first(), Some(b.id), "ordered by service too");
        q.lock().ranked = false;
        // A later waiter of B's due at once does not move it back; a second continuation goes
        // ahead of it.
        let due = Some(tokio::time::Instant::now());
        let _b2 = q
            .join_costed(9, (Some("B"), 1.0), None, due, None, one)
            .unwrap();
        assert_eq!(q.lock().first(), Some(b.id));
        let c = q.join_first(None, None);
        assert_eq!(q.lock().first(), Some(c.id));
        let turn = c.turn().await.unwrap();
        c.admitted();
        drop(turn);
        drop(c);
        assert_eq!(q.lock().first(), Some(b.id));
        drop(b);
        assert_eq!(q.lock().first(), Some(a1.id), "then the line as it was");
        drop((a1, a2));
    }

    /// Ordered by fleet service, the waiter whose turn it is may have arrived after others: a
    /// free turn wakes it, not the earliest arrival (which found itself not first and slept
    /// again, leaving the lane idle with requests waiting until their queue timeout).
    #[tokio::test]
    async fn a_free_turn_wakes_the_waiter_it_belongs_to() {
        let served: Arc<Mutex<HashMap<String, f64>>> = Arc::default();
        let q = LaneQueue::<()>::default();
        let view = served.clone();
        q.rank_by(Arc::new(move |t: &str| {
            view.lock().unwrap().get(t).copied().unwrap_or(0.0)
        }));
        served.lock().unwrap().insert("A".into(), 900.0);
        let costed = |t: &str| {
            q.join_costed(10, (Some(t), 1.0), Some((100.0, 0.0)), None, None, one)
                .unwrap()
        };
        let (a, b) = (costed("A"), costed("B"));
        assert_eq!(q.lock().first(), Some(b.id), "B has had less service");
        // A holds the turn (as a head's call might), both wait; the turn is given back.
        q.lock().turn = Some(a.id);
        let (mut a_turn, mut b_turn) = (Box::pin(a.turn()), Box::pin(b.turn()));
        let pending = |r: Option<_>| r.is_none();
        assert!(pending(futures::FutureExt::now_or_never(&mut a_turn)));
        assert!(pending(futures::FutureExt::now_or_never(&mut b_turn)));
        {
            let mut line = q.lock();
            line.turn = None;
            line.wake_first();
        }
        let turn = tokio::time::timeout(Duration::from_secs(5), b_turn)
            .await
            .expect("the waiter whose turn it is was woken")
            .unwrap();
        assert_eq!(q.lock().turn, Some(b.id));
        drop(turn);
        drop(a_turn);
        drop((a, b));
    }

    #[tokio::test]
    async fn ordered_by_fleet_service_the_tenant_served_least_now_goes_first() {
        let served: Arc<Mutex<HashMap<String, f64>>> = Arc::default();
        let q = LaneQueue::<()>::default();
        let view = served.clone();
        q.rank_by(Arc::new(move |t: &str| {
            view.lock().unwrap().get(t).copied().unwrap_or(0.0)
        }));
        let set = |t: &str, v: f64| {
            served.lock().unwrap().insert(t.to_owned(), v);
        };
        set("A", 0.0);
        set("B", 500.0);
        fn costed<'q>(q: &'q LaneQueue<()>, t: &str) -> Place<'q, ()> {
            q.join_costed(10, (Some(t), 1.0), Some((100.0, 0.0)), None, None, one)
                .unwrap()
        }
        let a1 = costed(&q, "A");
        let a2 = costed(&q, "A");
        let b1 = costed(&q, "B");
        assert_eq!(q.lock().first(), Some(a1.id), "A has had less");
        // B's service elsewhere is settled down below A's: B's waiter is first now, although
        // its tag (fixed at its arrival) is later; A's own order is kept.
        set("B", 50.0);
        set("A", 300.0);
        assert_eq!(q.lock().first(), Some(b1.id));
        set("B", 301.0);
        assert_eq!(q.lock().first(), Some(a1.id));
        // A1 is admitted (its turn used) and leaves.
        a1.admitted();
        drop(a1);
        assert_eq!(q.lock().first(), Some(a2.id));
        // An arrival that does not ask for it (fleet fairness off) orders the line by tags.
        set("B", 1_000.0);
        assert_eq!(q.lock().first(), Some(a2.id), "ordered by service");
        let _b2 = q.join(10, (Some("B"), 1.0), None, one).unwrap();
        assert_eq!(q.lock().first(), Some(b1.id), "B's tag is the earliest");
        drop((a2, b1));
    }

    /// A lease handed in a test: counts its drops (a lease given back).
    #[derive(Debug)]
    struct Lease(Arc<AtomicU32>);

    impl Drop for Lease {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::AcqRel);
        }
    }

    #[tokio::test]
    async fn a_head_takes_the_waiters_behind_it_in_order_and_hands_them_their_leases() {
        let q = LaneQueue::<Lease>::default();
        let join = |need: Option<Need>| {
            q.join_costed(10, (None, 1.0), None, None, need, one)
                .unwrap()
        };
        let head = join(Some((10, 1)));
        let b1 = join(Some((20, 2)));
        let b2 = join(Some((30, 3)));
        let long = join(None);
        let b3 = join(Some((40, 4)));
        let turn = head.turn().await.unwrap();
        // In the line's order, not the head itself, and never past a waiter that did not say
        // what it needs (a long prompt, asked one turn at a time): the order holds.
        assert_eq!(turn.behind(10), vec![(b1.id, (20, 2)), (b2.id, (30, 3))]);
        assert_eq!(turn.behind(1), vec![(b1.id, (20, 2))]);
        let given_back = Arc::new(AtomicU32::new(0));
        let lease = || Lease(given_back.clone());
        // b2 leaves (timed out) while the head's call runs: its lease is given back at once.
        let b2_id = b2.id;
        drop(b2);
        turn.hand(vec![(b1.id, lease()), (b2_id, lease())]);
        assert_eq!(
            given_back.load(Ordering::Acquire),
            1,
            "b2's lease went back"
        );
        match b1.turn().await {
            Err(Left::Handed(_)) => {}
            _ => panic!("b1 got its lease from the head"),
        }
        assert_eq!(
            given_back.load(Ordering::Acquire),
            2,
            "b1's, dropped by the test"
        );
        drop(b1);
        // A waiter handed its lease but gone before it claimed it gives it back with its place.
        let b4 = join(Some((50, 5)));
        let b4_id = b4.id;
        turn.hand(vec![(b4_id, lease())]);
        assert_eq!(given_back.load(Ordering::Acquire), 2);
        drop(b4);
        assert_eq!(
            given_back.load(Ordering::Acquire),
            3,
            "b4's unclaimed lease went back"
        );
        drop(turn);
        drop(head);
        // The long prompt is next; then b3.
        assert!(long.turn().await.is_ok());
        drop(long);
        assert!(b3.turn().await.is_ok());
        drop(b3);
        assert_eq!(q.waiting(), 0);
        assert!(q.lock().order.is_empty() && q.lock().keys.is_empty());
    }

    #[tokio::test]
    async fn a_line_ordered_by_fleet_service_is_asked_one_turn_at_a_time() {
        let q = LaneQueue::<()>::default();
        q.rank_by(Arc::new(|_: &str| 0.0));
        let a = q
            .join_costed(
                10,
                (Some("A"), 1.0),
                Some((1.0, 0.0)),
                None,
                Some((1, 1)),
                one,
            )
            .unwrap();
        let _b = q
            .join_costed(
                10,
                (Some("B"), 1.0),
                Some((1.0, 0.0)),
                None,
                Some((1, 1)),
                one,
            )
            .unwrap();
        let turn = a.turn().await.unwrap();
        assert!(turn.behind(10).is_empty());
    }

    #[tokio::test]
    async fn a_full_line_pushes_out_the_newest_waiter_of_the_tenant_over_its_places() {
        let q = LaneQueue::<()>::default();
        let a: Vec<_> = (0..3)
            .map(|_| q.join(3, (Some("A"), 1.0), None, one).unwrap())
            .collect();
        // B's request finds the line full of A's: A's newest leaves, naming A's numbers.
        let b = q.join(3, (Some("B"), 1.0), None, one).unwrap();
        assert_eq!(a[2].pushed_out(), Some((3, 1)));
        assert!(matches!(a[2].turn().await, Err(Left::PushedOut(3, 1))));
        assert_eq!(a[0].pushed_out(), None);
        // A, over its places, is refused; B (1 of its 1) too.
        assert!(matches!(
            q.join(3, (Some("A"), 1.0), None, one),
            Err(Room::Refuse { held: 2, places: 1 })
        ));
        drop(a);
        assert_eq!(q.waiting(), 1);
        assert!(b.turn().await.is_ok());
    }

    /// A continuation (an answer that already streamed) is never pushed out for another
    /// tenant, nor counted in its tenant's places: A's newest request that never ran goes, and
    /// a lone continuation leaves a full line's place to B.
    #[tokio::test]
    async fn a_full_line_never_pushes_out_a_continuation() {
        let q = LaneQueue::<()>::default();
        let _a1 = q.join(2, (Some("A"), 1.0), None, one).unwrap();
        let a2 = q.join(2, (Some("A"), 1.0), None, one).unwrap();
        let cont = q.join_first(Some("A"), None);
        let _b = q.join(2, (Some("B"), 1.0), None, one).unwrap();
        assert_eq!(cont.pushed_out(), None);
        assert_eq!(a2.pushed_out(), Some((2, 1)));
        let q = LaneQueue::<()>::default();
        let _cont = q.join_first(Some("A"), None);
        assert!(q.join(1, (Some("B"), 1.0), None, one).is_ok());
    }
}
