//! State shared by [`super::RedisAdmission`] handles, their guards and background tasks: the
//! connection, the leases this replica holds, the wait lines and the degraded flag.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redis::aio::ConnectionManager;
use redis::RedisError;
use tokio::sync::{mpsc, watch};

use super::keys::Keys;
use super::queue::LaneQueue;
use super::scripts::{
    AcquireArgs, AcquireReply, Behind, LimitsRecord, LimitsWrite, MoveReply, Scripts, Verdict,
    AUTOPILOT_ORIGIN, PUSH_ORIGIN,
};
use crate::admission::backend::LimitsChange;
use crate::admission::guard::{Move, Reservation};
use crate::admission::preempt::{Cause, Preemptible};
use crate::admission::{LaneGuard, LocalAdmission};
use crate::lane::Lane;
use crate::telemetry::throttle::Throttle;
use crate::telemetry::QuotaMetrics;

/// Calls that must fail in a row (or one heartbeat) before a replica counts Redis as down and
/// falls back: one slow call is not an outage.
pub(crate) const DEGRADE_AFTER: u32 = 3;

/// Where the `fail_open` fallback stands for the requests it admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackState {
    /// The replica is on Redis: a request the fallback admits now asks Redis instead.
    Off,
    /// The replica is degraded: the fallback admits and books.
    Open,
    /// Degraded, and the registration before leaving is out: what the fallback admits waits.
    Closing,
}

/// Opens the fallback again when dropped while it is closing and the replica still degraded.
struct Reopen<'a>(&'a Shared);

impl Drop for Reopen<'_> {
    fn drop(&mut self) {
        let _shadows = self.0.shadows();
        if self.0.degraded() && *self.0.fallback_state.borrow() == FallbackState::Closing {
            self.0.fallback_state.send_replace(FallbackState::Open);
        }
    }
}

/// What became of a guard the fallback handed out ([`Shared::fallback_guard`]).
pub enum Booking {
    /// Booked as a fallback admission.
    Booked(LaneGuard),
    /// The replica left the fallback: its seat there is given back; ask Redis.
    Left,
    /// The registration before leaving is out: wait for its outcome, then book again.
    Closing(LaneGuard),
}

/// How long a refused large-lane acquire marks this replica as having a large request waiting,
/// ms: longer than a line head's longest backoff (250 ms) between two tries, so the mark holds
/// while anyone waits, and short enough that a crashed replica's mark holds jobs back briefly.
const WAIT_MARK_MS: u64 = 1_000;

/// A lease this replica holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    /// The lane of its seat.
    pub lane: Lane,
    pub tokens: u32,
    /// Prefill reservation still held (0 after the first token).
    pub prefill: u32,
    /// A pre-emptible lease's token lane (`jobs.preempt`: its tokens count there, its seat in
    /// `lane`).
    pub budget: Option<Lane>,
}

impl Held {
    /// The lease's lane field as Redis keeps it (`<seat>@<budget>` for a pre-emptible one).
    pub fn field(&self) -> String {
        match self.budget {
            Some(b) => format!("{}@{}", self.lane.as_str(), b.as_str()),
            None => self.lane.as_str().to_owned(),
        }
    }
}

/// What a [`Lease`] message gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Give {
    /// The whole lease (a dropped guard).
    Lease,
    /// Only its prefill reservation (the request's first token came).
    Prefill,
}

/// A lease, or its prefill reservation, to give back (sent to the release task, in order).
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub id: String,
    pub lane: Lane,
    pub give: Give,
    /// With [`Give::Prefill`]: when its first token came (`None` when not known), so that the
    /// prefill rate Redis learns from a borrower does not count the time the give-back waited.
    pub first_token: Option<Instant>,
}

/// What one acquire call got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Take {
    /// A lease with this id, and how many of the requests behind it were granted too (the
    /// first ones of those asked for, booked as this replica's like it).
    Granted(String, usize),
    /// No room; why, and whether it asked pre-emptible work to leave (`jobs.preempt`).
    Refused(Verdict, bool),
    /// The call failed, but Redis is not counted as down yet (fewer than
    /// [`DEGRADE_AFTER`] failures in a row): wait and try again.
    Failed,
    /// Redis could not be reached (now degraded).
    Down,
}

pub(crate) struct Shared {
    pub client: redis::Client,
    /// `None` until the first connection; the manager reconnects by itself afterwards.
    pub conn: watch::Sender<Option<ConnectionManager>>,
    /// The tenants' service counted fleet-wide (`auth.fleet_fairness`).
    pub service: Arc<super::service::FleetService>,
    pub scripts: Scripts,
    pub keys: Keys,
    /// This replica's limits: what it writes as the shared record (at start when there is
    /// none, and on a reload), and its local view of the prefill budget.
    limits: std::sync::RwLock<LimitsRecord>,
    /// The shared record's version as last seen (0: not yet).
    pub limits_version: AtomicU64,
    /// The record in force changed (a `limits push`, another replica's write), or this
    /// replica's file did under a pushed record: the next beat compares them again, so
    /// `tutor_gateway_quota_limits_differ` follows (it stayed 1 after the fix).
    pub limits_recheck: AtomicBool,
    /// A reload changed the limits (or forces them): written now, or by the next heartbeat.
    pending_limits: Mutex<Option<LimitsWrite>>,
    /// Who wrote the shared record as last seen (`limits push ...`, `reload <replica>`...).
    limits_origin: Mutex<String>,
    pub ttl_ms: u64,
    pub heartbeat: Duration,
    /// Leases one acquire or release call carries at most (`quota.batch_max`).
    pub batch_max: usize,
    pub replica: String,
    /// Per lane, this replica's member in the "request waiting" marks: its id for the large
    /// lane, `<replica> <lane>` for the others.
    marks: [String; 3],
    /// `jobs.preempt`: every lane marks its waiting requests (background work waits for all),
    /// and this replica listens for asks to leave.
    pub marks_every_lane: bool,
    /// This replica's pre-emptible leases (`jobs.preempt`), by lease id: their handles, through
    /// which an ask to leave reaches the job's run.
    preemptible: Mutex<HashMap<String, Arc<Preemptible>>>,
    next_id: AtomicU64,
    held: Mutex<HashMap<String, Held>>,
    /// Per lane: the line of requests that never wait for prefill room.
    pub queues: [LaneQueue<Handed>; 3],
    /// Per lane: long prompts under a prefill budget (FIFO among themselves; a short prompt is
    /// never held back by one).
    pub long_lines: [LaneQueue<Handed>; 3],
    degraded: AtomicBool,
    /// Calls failed in a row (reset by any success).
    failures: std::sync::atomic::AtomicU32,
    /// The epoch of Redis's data as last seen (`quota_epoch_v2.lua`).
    epoch: Mutex<Option<String>>,
    /// Set by [`super::RedisAdmission::abandon`]: behave like a killed process.
    pub abandoned: AtomicBool,
    /// Heartbeats run to their end, gone through or not (tests wait for the start-up beat).
    pub beats: AtomicU64,
    pub releases: mpsc::UnboundedSender<Lease>,
    pub metrics: QuotaMetrics,
    /// The `fail_open` fallback (`None` under `fail_closed`).
    pub fallback: Option<LocalAdmission>,
    /// While degraded: the fallback's copies of the leases this replica holds in Redis (their
    /// requests run on, so the fallback's share counts them), by lease id.
    shadows: Mutex<HashMap<String, LaneGuard>>,
    /// Requests the fallback admitted, by id (`<replica>:f<n>`); `true` once their
    /// registration was sent to Redis (from then on a request that ends sends a release, which
    /// Redis applies after the registration; once registered they are also in `held`, renewed
    /// and released like any lease).
    fallback_leases: Mutex<HashMap<String, (Held, bool)>>,
    /// Where the fallback stands for the requests it admits; written under the shadows' lock.
    pub fallback_state: watch::Sender<FallbackState>,
    /// Calls sent in the background for requests that ended (a tenant's budget settled, a
    /// session's output, a tenant's fleet service): a shutdown waits for them, bounded, as for
    /// the releases.
    pub background: tokio_util::task::TaskTracker,
    /// Cancelled when the replica stops: background calls still retrying try once more, then
    /// give up.
    pub stopping: tokio_util::sync::CancellationToken,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: redis::Client,
        keys: Keys,
        limits: LimitsRecord,
        (ttl, heartbeat, batch_max): (Duration, Duration, u32),
        releases: mpsc::UnboundedSender<Lease>,
        metrics: QuotaMetrics,
        fallback: Option<LocalAdmission>,
        preempt: bool,
    ) -> Self {
        let replica = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let service = Arc::new(super::service::FleetService::new(&keys.base, &replica));
        let queues: [LaneQueue<Handed>; 3] = Default::default();
        let long_lines: [LaneQueue<Handed>; 3] = Default::default();
        for line in queues.iter().chain(long_lines.iter()) {
            let service = service.clone();
            line.rank_by(Arc::new(move |tenant: &str| service.of(tenant)));
        }
        Self {
            client,
            service,
            conn: watch::Sender::new(None),
            scripts: Scripts::default(),
            keys,
            limits: std::sync::RwLock::new(limits),
            limits_version: AtomicU64::new(0),
            limits_recheck: AtomicBool::new(false),
            pending_limits: Mutex::new(None),
            limits_origin: Mutex::new(String::new()),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            heartbeat,
            batch_max: usize::try_from(batch_max).unwrap_or(1).max(1),
            marks: Lane::ALL.map(|lane| match lane {
                Lane::Large => replica.clone(),
                other => format!("{replica} {}", other.as_str()),
            }),
            marks_every_lane: preempt,
            preemptible: Mutex::new(HashMap::new()),
            replica,
            next_id: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            queues,
            long_lines,
            degraded: AtomicBool::new(false),
            failures: std::sync::atomic::AtomicU32::new(0),
            epoch: Mutex::new(None),
            abandoned: AtomicBool::new(false),
            beats: AtomicU64::new(0),
            background: tokio_util::task::TaskTracker::new(),
            stopping: tokio_util::sync::CancellationToken::new(),
            releases,
            metrics,
            fallback,
            shadows: Mutex::new(HashMap::new()),
            fallback_leases: Mutex::new(HashMap::new()),
            fallback_state: watch::Sender::new(FallbackState::Off),
        }
    }

    fn shadows(&self) -> MutexGuard<'_, HashMap<String, LaneGuard>> {
        self.shadows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fallback_leases(&self) -> MutexGuard<'_, HashMap<String, (Held, bool)>> {
        self.fallback_leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether lease `id` is also counted in the fallback's own usage (a shadow, or a fallback
    /// admission registered in Redis): a snapshot counts it once.
    pub fn counted_by_fallback(&self, id: &str) -> bool {
        self.shadows().contains_key(id) || self.fallback_leases().contains_key(id)
    }

    /// Books a guard the fallback handed out: the request is known by an id, so that when Redis
    /// is back it is registered there as a lease ([`Shared::adopt_fallback`]). Under the
    /// shadows' lock, as the state changes: an admission booked while the replica is on its
    /// fallback is in the list the registration before leaving takes.
    /// - [`Booking::Left`] when the replica is no longer degraded (the request waited in the
    ///   fallback's queue while Redis came back): its fallback seat is given back and the caller
    ///   asks Redis, else it would run beside what Redis admits, counted nowhere in the fleet.
    /// - [`Booking::Closing`] (the guard back) while the registration before leaving is out:
    ///   the caller waits for its outcome, then books again.
    pub fn fallback_guard(self: &Arc<Self>, inner: LaneGuard) -> Booking {
        let shadows = self.shadows();
        if !self.degraded() {
            drop(shadows);
            drop(inner);
            return Booking::Left;
        }
        if *self.fallback_state.borrow() == FallbackState::Closing {
            return Booking::Closing(inner);
        }
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}:f{n}", self.replica);
        let held = Held {
            lane: inner.lane(),
            tokens: inner.tokens(),
            prefill: inner.prefill(),
            budget: None,
        };
        // Lock order: the shadows', the fallback's, then `held`.
        self.fallback_leases().insert(id.clone(), (held, false));
        drop(shadows);
        let (lane, tokens, waited) = (inner.lane(), inner.tokens(), inner.queue_wait());
        let (prefill, prefill_wait) = (inner.prefill(), inner.prefill_wait());
        let lease = FallbackLease {
            shared: self.clone(),
            id,
            guard: Mutex::new(Some(inner)),
        };
        Booking::Booked(
            LaneGuard::new(Box::new(lease), lane, tokens, waited)
                .with_prefill(prefill, prefill_wait),
        )
    }

    /// Registers the fallback's admissions (and `lost`: leases this replica holds that Redis
    /// no longer has) as leases in Redis, so its counters show what really runs once it is
    /// back.
    ///
    /// No lease outlives its request, whatever the interleaving. An admission is marked sent
    /// before the first call that may register it and stays so (a call that timed out may still
    /// run later): from then on its request's end sends a release. It is sent again on every
    /// beat until a call is known to have registered it (registering is idempotent); then it
    /// is booked in `held` under the fallback's lock, so a request ending at that moment either
    /// finds it booked or is already gone. Those that ended while the call was out get a second
    /// release after the reply, in case theirs reached Redis before the registration (a script
    /// reloaded after `NOSCRIPT` is sent again behind it); so do the `lost` leases whose
    /// requests ended meanwhile.
    ///
    /// True when everything pending is registered (or nothing was); false when the call could
    /// not be made or failed (the next beat sends it again).
    pub async fn adopt_fallback(&self, lost: &[String]) -> bool {
        // Each with whether it is a first registration (a fallback's lease not yet in `held`)
        // or a lost lease registered again (as `held` books it).
        let pending: Vec<(String, Lane, u32, u32, String, bool)> = {
            // Lock order: the fallback's, then `held`.
            let mut fallback = self.fallback_leases();
            let held = self.held();
            let mut pending = Vec::new();
            for (id, (h, sent)) in fallback.iter_mut() {
                if !held.contains_key(id) {
                    *sent = true;
                    pending.push((id.clone(), h.lane, h.tokens, h.prefill, h.field(), true));
                }
            }
            for id in lost {
                if let Some(h) = held.get(id) {
                    pending.push((id.clone(), h.lane, h.tokens, h.prefill, h.field(), false));
                }
            }
            pending
        };
        if pending.is_empty() {
            return true;
        }
        let Some(mut conn) = self.connection() else {
            return false;
        };
        #[cfg(test)]
        crate::faults::at(crate::faults::Point::Adopting, &self.replica);
        let leases: Vec<(String, String, u32, u32)> = pending
            .iter()
            .map(|(id, _, tokens, prefill, field, _)| {
                (id.clone(), field.clone(), *tokens, *prefill)
            })
            .collect();
        let reply = self
            .scripts
            .adopt(&mut conn, &self.keys, self.ttl_ms, &leases)
            .await;
        let n = match reply {
            Ok(n) => n,
            Err(err) => {
                self.failed("adopt", &err);
                return false;
            }
        };
        if n > 0 {
            tracing::info!(
                registered = n,
                "requests admitted while Redis was away are now counted there"
            );
        }
        let mut gives = Vec::new();
        let mut moves = Vec::new();
        {
            let fallback = self.fallback_leases();
            for (id, lane, registered_tokens, registered_prefill, _, first) in &pending {
                if !first || !is_fallback(id) {
                    // A lease Redis had lost (a fallback's one included, once registered: its
                    // lane and tokens are `held`'s, which a move on Redis may have changed from
                    // the fallback's own record), registered again. Its request ended while
                    // the call was out: its release may have reached Redis before the
                    // registration (a script sent again after `NOSCRIPT`, a reconnect), which
                    // would leave the registered lease to no one until it expired: released
                    // again. Its first token came meanwhile: the same for its prefill.
                    let held = self.held().get(id).map(|h| (h.lane, h.prefill));
                    match held {
                        None => gives.push((id.clone(), *lane, Give::Lease)),
                        Some((now, 0)) if *registered_prefill > 0 => {
                            gives.push((id.clone(), now, Give::Prefill));
                        }
                        Some(_) => {}
                    }
                    continue;
                }
                match fallback.get(id) {
                    Some((h, _)) => {
                        // Booked as registered; a promotion while the call was out (not sent
                        // to Redis then) is asked of Redis below.
                        self.hold(id, *lane, *registered_tokens, h.prefill);
                        if (h.lane, h.tokens) != (*lane, *registered_tokens) {
                            moves.push((
                                id.clone(),
                                (*lane, *registered_tokens),
                                (h.lane, h.tokens),
                            ));
                        }
                        // Its first token came while the call was out.
                        // (When is not known: no prefill rate is learnt from it.)
                        if *registered_prefill > 0 && h.prefill == 0 {
                            gives.push((id.clone(), h.lane, Give::Prefill));
                        }
                    }
                    None => gives.push((id.clone(), *lane, Give::Lease)),
                }
            }
        }
        for (id, lane, give) in gives {
            self.send(Lease {
                id,
                lane,
                give,
                first_token: None,
            });
        }
        // Bookkeeping of moves already made: nobody is asked to leave for them.
        for (id, (from, from_tokens), (to, tokens)) in moves {
            self.promote(&id, from, from_tokens, (to, tokens), false)
                .await;
        }
        true
    }

    /// This replica's limits.
    pub fn limits(&self) -> LimitsRecord {
        *self.limits.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// New limits for this replica (a reload). The shared record is written only when they
    /// differ from this replica's previous ones (or with `force`), and never over a record
    /// that `tutor-gateway limits push` wrote unless forced; see [`LimitsChange`].
    pub fn set_limits(&self, limits: LimitsRecord, force: bool) -> LimitsChange {
        let changed = {
            let mut mine = self.limits.write().unwrap_or_else(PoisonError::into_inner);
            let changed = *mine != limits;
            *mine = limits;
            changed
        };
        if !changed && !force {
            return LimitsChange::Unchanged;
        }
        let origin = self.limits_origin();
        if !force && origin.starts_with(PUSH_ORIGIN) {
            // Not written over the push, but compared with it again.
            self.limits_recheck.store(true, Ordering::Release);
            return LimitsChange::KeptPushed {
                version: self.limits_version.load(Ordering::Acquire),
                origin,
            };
        }
        *self
            .pending_limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(if force {
            LimitsWrite::Force
        } else {
            LimitsWrite::Reload
        });
        LimitsChange::Pushing
    }

    /// Whether a reload's limits wait to be written.
    pub fn limits_pending(&self) -> bool {
        self.pending_limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Writes the limits a reload left pending, if any (else nothing). False when the call
    /// failed (they stay pending for the next heartbeat).
    pub async fn write_pending_limits(&self) -> bool {
        let pending = self
            .pending_limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(mode) = pending else {
            return true;
        };
        if self.write_limits(mode).await.is_some() {
            return true;
        }
        self.pending_limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(mode);
        false
    }

    /// The origin of the records this replica writes as the autopilot's leader.
    pub fn autopilot_origin(&self) -> String {
        format!("{AUTOPILOT_ORIGIN}{}", self.replica)
    }

    /// Publishes `record` as the autopilot's leader: this replica's limits from now on, written
    /// at once (not over a `limits push`). Whether it is the record in force now (`None`: the
    /// call failed).
    pub async fn publish(&self, record: LimitsRecord) -> Option<bool> {
        *self.limits.write().unwrap_or_else(PoisonError::into_inner) = record;
        self.write_limits(LimitsWrite::Autopilot).await?;
        Some(self.limits_origin() == self.autopilot_origin())
    }

    /// Who wrote the shared record, as last seen.
    pub fn limits_origin(&self) -> String {
        self.limits_origin
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Writes this replica's limits as the shared record, as `mode` says. Returns the record's
    /// version (`None`: the call failed).
    pub async fn write_limits(&self, mode: LimitsWrite) -> Option<u64> {
        let mut conn = self.connection()?;
        let record = self.limits();
        let origin = match mode {
            LimitsWrite::Ensure => format!("start {}", self.replica),
            LimitsWrite::Reload => format!("reload {}", self.replica),
            LimitsWrite::Force => format!("reload {} (forced)", self.replica),
            LimitsWrite::Autopilot => self.autopilot_origin(),
        };
        match self
            .scripts
            .limits(&mut conn, &self.keys, mode, &record, &origin)
            .await
        {
            Ok(reply) => {
                self.succeeded();
                // Whether this replica's file's limits are not the ones in force (checked at
                // start and after Redis lost the record; a write puts them in force). Set
                // before the version is, which says the record was seen.
                // An autopilot's paced record differs from every file by design: not told.
                let differs = reply.differs && !reply.origin.starts_with(AUTOPILOT_ORIGIN);
                let differed = self.metrics.limits_differ();
                if mode == LimitsWrite::Ensure || reply.written {
                    self.metrics.set_limits_differ(differs);
                }
                self.saw_limits(reply.version, &reply.origin);
                if reply.written {
                    tracing::info!(version = reply.version, origin = %reply.origin, "shared quota limits written");
                } else if differs && mode == LimitsWrite::Ensure && differed {
                    // Said when it began.
                } else if differs {
                    tracing::warn!(
                        version = reply.version,
                        origin = %reply.origin,
                        "this replica's file sets other limits (lanes, budgets, jobs.preempt_*) than \
                         the shared record in force, which a start never replaces: to put the \
                         file's in force, run `tutor-gateway limits push --config FILE` or reload \
                         with force (POST /admin/reload?force=true)"
                    );
                } else if mode == LimitsWrite::Autopilot {
                    tracing::warn!(
                        version = reply.version,
                        origin = %reply.origin,
                        "the autopilot's paced limits were not written: the shared record came from \
                         `tutor-gateway limits push`, which the autopilot does not override"
                    );
                } else if mode == LimitsWrite::Reload {
                    tracing::warn!(
                        version = reply.version,
                        origin = %reply.origin,
                        "the reloaded file's limits were not written: the shared record came from \
                         `tutor-gateway limits push`; reload with force (POST /admin/reload?force=true) \
                         or push the file to replace it"
                    );
                }
                Some(reply.version)
            }
            Err(err) => {
                self.failed("limits", &err);
                None
            }
        }
    }

    /// The shared record is `version`, written by `origin` (seen in a reply or a read).
    pub fn saw_limits(&self, version: u64, origin: &str) {
        {
            let mut seen = self
                .limits_origin
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *seen != origin {
                origin.clone_into(&mut seen);
            }
        }
        let before = self.limits_version.swap(version, Ordering::AcqRel);
        if before != version {
            self.metrics.set_limits_version(version);
            if before != 0 {
                self.limits_recheck.store(true, Ordering::Release);
            }
        }
    }

    pub fn held(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn connection(&self) -> Option<ConnectionManager> {
        self.conn.borrow().clone()
    }

    pub fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Acquire)
    }

    /// Enters or leaves the fallback; logs and sets the gauge on a change. Entering counts
    /// the entry and shadows the leases this replica holds in Redis before the flag is set, so
    /// no request is admitted by a fallback that does not yet count them.
    pub fn set_degraded(&self, degraded: bool) {
        // The shadows' lock orders the transitions.
        self.set_degraded_under(self.shadows(), degraded);
    }

    /// Leaves the fallback when every request it admitted is registered in Redis; false (still
    /// degraded) when one was admitted after the last [`Shared::adopt_fallback`] took its list.
    /// Leaving with it unregistered would let Redis admit against counts that miss it.
    pub fn leave_fallback(&self) -> bool {
        let shadows = self.shadows();
        if self.degraded() {
            // Lock order: the shadows', the fallback's, then `held`.
            let fallback = self.fallback_leases();
            let held = self.held();
            if fallback.keys().any(|id| !held.contains_key(id)) {
                return false;
            }
        }
        self.set_degraded_under(shadows, false);
        true
    }

    /// Back on Redis once a beat found it well: what the fallback admitted (and `lost`, leases
    /// this replica holds that Redis no longer has) is registered there, then the replica leaves
    /// the fallback, not before (it would admit through Redis against counts that miss those
    /// requests). While the registration is out the fallback books nothing new
    /// ([`FallbackState::Closing`]: what it admits meanwhile waits for the registration's
    /// calls, then goes to Redis or is booked), so the list the call sends is the whole of it,
    /// however busy the replica. False when the replica is still degraded (the registration
    /// failed): the next beat tries again.
    pub async fn back_on_redis(&self, lost: &[String]) -> bool {
        {
            let _shadows = self.shadows();
            if self.degraded() {
                self.fallback_state.send_replace(FallbackState::Closing);
            }
        }
        // Open again unless it left, however this ends (a call that failed, or this future
        // dropped midway): a fallback left closing would hold its admissions to their timeouts.
        let _reopen = Reopen(self);
        self.adopt_fallback(lost).await && self.leave_fallback()
    }

    fn set_degraded_under(
        &self,
        mut shadows: MutexGuard<'_, HashMap<String, LaneGuard>>,
        degraded: bool,
    ) {
        if self.degraded.load(Ordering::Acquire) == degraded {
            return;
        }
        if degraded {
            self.metrics.fell_back();
            // The requests this replica admitted through Redis run on: its fallback counts
            // them, so the replica stays within its share.
            // A request the fallback admitted in an earlier outage, registered since, still
            // holds its fallback seat: it is counted there already.
            if let Some(fallback) = &self.fallback {
                let held: Vec<(String, Held)> =
                    self.held().iter().map(|(id, h)| (id.clone(), *h)).collect();
                let booked = self.fallback_leases();
                for (id, h) in held {
                    // (Unless Redis moved it where its fallback seat could not follow: then
                    // the fallback counts it where it runs as well.)
                    if booked
                        .get(&id)
                        .is_some_and(|(b, _)| (b.lane, b.tokens) == (h.lane, h.tokens))
                    {
                        continue;
                    }
                    Self::shadow(&mut shadows, fallback, &id, h.lane, h.budget, h.tokens);
                }
            }
            self.degraded.store(true, Ordering::Release);
            self.fallback_state.send_replace(FallbackState::Open);
            drop(shadows);
            tracing::error!("shared quota unreachable: running on the fallback");
        } else {
            self.degraded.store(false, Ordering::Release);
            self.fallback_state.send_replace(FallbackState::Off);
            // Back on Redis: its counters cover those requests again.
            let gone = std::mem::take(&mut *shadows);
            drop(shadows);
            drop(gone);
            tracing::info!("shared quota reachable again: back on Redis");
        }
        self.metrics.set_degraded(degraded);
    }

    /// Whether Redis lost its data since the last look (restarted without persistence,
    /// flushed, failed over to an empty replica): its epoch changed. The first look, and a
    /// call that fails, say no.
    pub async fn data_lost(&self) -> bool {
        let Some(mut conn) = self.connection() else {
            return false;
        };
        let fresh = uuid::Uuid::new_v4().simple().to_string();
        match self.scripts.epoch(&mut conn, &self.keys, &fresh).await {
            Ok(epoch) => {
                let mut seen = self.epoch.lock().unwrap_or_else(PoisonError::into_inner);
                let before = seen.replace(epoch.clone());
                before.is_some_and(|b| b != epoch)
            }
            Err(err) => {
                self.failed("epoch", &err);
                false
            }
        }
    }

    /// A call succeeded: the failures in a row start again from zero.
    pub fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
    }

    /// Counts a failed call; marks the quota degraded after [`DEGRADE_AFTER`] calls a request
    /// waits on (`acquire`, `job_take`, `borrow`, `move`, `limits`) or the heartbeat (`connect`,
    /// `renew`, `epoch`) failed in a row, at once when the heartbeat could not reach Redis at
    /// all (connection refused or dropped), and at once when Redis refused the call's writes
    /// (out of memory, read-only, no permission, authentication). A heartbeat call that only
    /// timed out counts like any other: a busy replica (its answer read late) is not an outage,
    /// and its leases live on for `lease_ttl_ms` (at least three beats). Background calls (`release`, `prefill_done`)
    /// are retried by the heartbeat and decide nothing on their own.
    pub fn failed(&self, op: &str, err: &RedisError) {
        // Redis answers but takes no writes, or not ours: out of memory under `noeviction`,
        // a failing disk (MISCONF), a read-only replica, a user without permission, a wrong
        // password. No waiting request is helped by asking again.
        let refused = matches!(
            err.code(),
            Some("OOM" | "MISCONF" | "READONLY" | "NOPERM" | "WRONGPASS" | "NOAUTH")
        ) || err.kind() == redis::ErrorKind::AuthenticationFailed;
        let kind = if err.is_timeout() {
            "timeout"
        } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
            "connection"
        } else if refused {
            "refused"
        } else {
            "other"
        };
        self.metrics.error(kind);
        // The error text names the server but never the password. Once per request while Redis
        // answers with errors: a line a second, with the count held back (all counted in
        // tutor_gateway_quota_errors_total).
        static LOG: Throttle = Throttle::new(std::time::Duration::from_secs(1));
        if let Some(held_back) = LOG.allow() {
            tracing::warn!(op, kind, error = %err, held_back, "quota call failed");
        }
        let background = matches!(op, "release" | "prefill_done");
        let unreachable = matches!(op, "connect" | "renew") && kind == "connection";
        if unreachable || (refused && !background) {
            self.set_degraded(true);
        } else if !background {
            let in_a_row = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
            if in_a_row >= DEGRADE_AFTER {
                self.set_degraded(true);
            }
        }
    }

    /// Whether a prompt of `prompt` tokens waits for prefill room (a long prompt under a
    /// budget); such requests wait in [`Shared::long_lines`].
    pub fn waits_for_prefill(&self, prompt: u32) -> bool {
        self.limits().prefill.waits(prompt)
    }

    /// The line a request of `lane` with a prompt of `prompt` tokens waits in.
    pub fn line(&self, lane: Lane, prompt: u32) -> &LaneQueue<Handed> {
        if self.waits_for_prefill(prompt) {
            &self.long_lines[lane.index()]
        } else {
            &self.queues[lane.index()]
        }
    }

    /// A new lease id (`<replica>:<n>`).
    pub fn next_lease_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.replica)
    }

    /// Books lease `id` as this replica's (renewed by the heartbeat from now on).
    pub fn hold(&self, id: &str, lane: Lane, tokens: u32, prompt: u32) {
        self.hold_as(id, lane, tokens, prompt, None);
    }

    /// [`Shared::hold`] of a lease whose tokens count in `budget` (a pre-emptible one) when
    /// given.
    pub fn hold_as(&self, id: &str, lane: Lane, tokens: u32, prompt: u32, budget: Option<Lane>) {
        let held = Held {
            lane,
            tokens,
            prefill: prompt,
            budget,
        };
        self.held().insert(id.to_owned(), held);
    }

    /// [`Shared::hold_as`] of a lease Redis just granted. When the replica went degraded
    /// while the call was out, the fallback had already counted `held` as it was then: this
    /// lease is counted there at once (a shadow, as `set_degraded` makes), else the fallback
    /// would admit its whole share beside a request it does not know runs. Under the shadows'
    /// lock, as `set_degraded` (shadows, then held): one or the other counts it.
    pub fn hold_granted(
        &self,
        id: &str,
        lane: Lane,
        tokens: u32,
        prompt: u32,
        budget: Option<Lane>,
    ) {
        let mut shadows = self.shadows();
        self.hold_as(id, lane, tokens, prompt, budget);
        if self.degraded() {
            if let Some(fallback) = &self.fallback {
                Self::shadow(&mut shadows, fallback, id, lane, budget, tokens);
            }
        }
    }

    /// Counts lease `id` (a seat of `lane`, `tokens` in `budget` for a borrowed one, else in
    /// `lane`) in the fallback's own usage, once, until the replica is back on Redis: its
    /// request runs on while the fallback admits beside it. A borrowed lease counts as the
    /// fallback counts its own borrowed seats: a job's large-lane tokens on a small seat,
    /// counted in the small lane, would fill its share and refuse every question meanwhile.
    fn shadow(
        shadows: &mut HashMap<String, LaneGuard>,
        fallback: &LocalAdmission,
        id: &str,
        lane: Lane,
        budget: Option<Lane>,
        tokens: u32,
    ) {
        shadows
            .entry(id.to_owned())
            .or_insert_with(|| match budget {
                Some(budget) if budget != lane => fallback.force_take_apart(lane, budget, tokens),
                _ => fallback.force_take(lane, tokens),
            });
    }

    /// Keeps a pre-emptible lease's handle until the lease is given back.
    pub fn hold_preemptible(&self, id: &str, handle: Arc<Preemptible>) {
        self.preemptibles().insert(id.to_owned(), handle);
    }

    fn preemptibles(&self) -> MutexGuard<'_, HashMap<String, Arc<Preemptible>>> {
        self.preemptible
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// An ask to leave (`<lease id> <lane> <reason>`, from any replica's acquire): the lease's
    /// run is signalled when it is this replica's.
    pub fn asked_to_leave(&self, what: &str) {
        let mut parts = what.split(' ');
        let (Some(id), Some(lane), Some(reason)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let Some(handle) = self.preemptibles().get(id).cloned() else {
            return;
        };
        let lane = Lane::ALL
            .into_iter()
            .find(|l| l.as_str() == lane)
            .unwrap_or(Lane::Small);
        let reason = Cause::REASONS
            .into_iter()
            .find(|r| *r == reason)
            .unwrap_or("pressure");
        handle.ask(Cause { lane, reason });
    }

    /// Requests of `lane` waiting in this replica's lines.
    pub fn waiting_in(&self, lane: Lane) -> u32 {
        self.queues[lane.index()].waiting() + self.long_lines[lane.index()].waiting()
    }

    /// Wakes the heads a release in `lane` may let in: both of its lines, and every long line
    /// when prefill room came back.
    pub fn notify(&self, lane: Option<Lane>, prefill: bool) {
        if let Some(lane) = lane {
            self.queues[lane.index()].notify();
            self.long_lines[lane.index()].notify();
        }
        if prefill {
            for line in &self.long_lines {
                line.notify();
            }
        }
    }

    /// Runs the acquire script once for a slot and `tokens` in `lane` and a prefill
    /// reservation of `prompt` tokens, then for the requests `behind` it in its line, in order,
    /// up to the first that does not fit; `in_line`: the caller holds a place in one of the
    /// lane's lines (a large request refused, or granted with others behind it, keeps this
    /// replica's "large request waiting" mark, which holds background jobs back).
    ///
    /// Cancel-safe: dropped while the call runs, it gives back whatever the call may take.
    pub async fn try_take(
        &self,
        lane: Lane,
        (tokens, prompt): (u32, u32),
        in_line: bool,
        behind: &[Behind],
    ) -> Take {
        // While degraded, the heartbeat alone probes Redis: waiters go to the fallback at once
        // instead of each waiting out a failing call.
        if self.degraded() {
            return Take::Down;
        }
        let Some(mut conn) = self.connection() else {
            self.set_degraded(true);
            return Take::Down;
        };
        let id = self.next_lease_id();
        let asked =
            u32::from(in_line).saturating_add(u32::try_from(behind.len()).unwrap_or(u32::MAX));
        let ask = AcquireArgs {
            id: &id,
            lane,
            tokens,
            prompt,
            ttl_ms: self.ttl_ms,
            wait_mark_ms: if lane == Lane::Large || self.marks_every_lane {
                WAIT_MARK_MS
            } else {
                0
            },
            replica: &self.marks[lane.index()],
            others_waiting: self.waiting_in(lane) > asked,
            behind,
        };
        // Until the reply is read, every lease the call may take goes back if this is dropped
        // or the call fails (a call that timed out may still have run; release is idempotent
        // and runs after it on the same connection).
        let mut pending = Pending {
            shared: self,
            lane,
            ids: std::iter::once(id.clone())
                .chain(behind.iter().map(|b| b.id.clone()))
                .collect(),
        };
        let started = Instant::now();
        let mut reply = self.scripts.acquire(&mut conn, &self.keys, &ask).await;
        if matches!(&reply, Ok(r) if r.verdict == Verdict::NoLimits) {
            // Redis lost the record (a restart): this replica's limits until someone pushes.
            self.write_limits(LimitsWrite::Ensure).await;
            reply = self.scripts.acquire(&mut conn, &self.keys, &ask).await;
        }
        self.metrics
            .observe("acquire", started.elapsed().as_secs_f64());
        match reply {
            Ok(AcquireReply {
                verdict,
                reaped,
                behind: granted,
                asked,
            }) => {
                pending.ids.clear();
                self.succeeded();
                self.metrics.reaped(reaped);
                if verdict == Verdict::Granted {
                    self.hold_granted(&id, lane, tokens, prompt, None);
                    for b in &behind[..granted] {
                        self.hold_granted(&b.id, lane, b.tokens, b.prompt, None);
                    }
                    self.metrics.leases("acquire", 1 + granted);
                    Take::Granted(id, granted)
                } else {
                    Take::Refused(verdict, asked)
                }
            }
            Err(err) => {
                self.failed("acquire", &err);
                drop(pending);
                if self.degraded() {
                    Take::Down
                } else {
                    Take::Failed
                }
            }
        }
    }

    /// Moves lease `id` from `from` to `to`, growing it to `tokens` (mid-stream promotion);
    /// [`Move::Full`] when `to` or the global budget has no room (or Redis cannot be reached),
    /// [`Move::Asked`] when pre-emptible work holding it is leaving for it (asked with `ask`).
    pub async fn promote(
        &self,
        id: &str,
        from: Lane,
        from_tokens: u32,
        (to, tokens): (Lane, u32),
        ask: bool,
    ) -> Move {
        let Some(mut conn) = self.connection() else {
            return Move::Full;
        };
        let started = Instant::now();
        let reply = self
            .scripts
            .move_and_grow(&mut conn, &self.keys, id, to, tokens.max(from_tokens), ask)
            .await;
        self.metrics
            .observe("move", started.elapsed().as_secs_f64());
        match reply {
            Ok(MoveReply {
                verdict,
                reaped,
                asked,
            }) => {
                self.metrics.reaped(reaped);
                if verdict != Verdict::Granted {
                    return if asked { Move::Asked } else { Move::Full };
                }
                if let Some(h) = self.held().get_mut(id) {
                    h.lane = to;
                    h.tokens = tokens.max(from_tokens);
                }
                Move::Done
            }
            Err(err) => {
                self.failed("move", &err);
                let _ = from;
                Move::Full
            }
        }
    }

    /// Gives lease `id` back (a guard's drop): forget it here, release it in the background.
    pub fn release(&self, id: String, lane: Lane) {
        self.held().remove(&id);
        if self.marks_every_lane {
            self.preemptibles().remove(&id);
        }
        let shadow = self.shadows().remove(&id);
        drop(shadow);
        self.send(Lease {
            id,
            lane,
            give: Give::Lease,
            first_token: None,
        });
    }

    /// Gives lease `id`'s prefill reservation back (its first token came), in the background
    /// and in order with its release.
    pub fn prefill_done(&self, id: &str) {
        self.prefill_give_back(id, Some(Instant::now()));
    }

    /// Gives lease `id`'s prefill room back; `first_token`: when its first token came (`None`:
    /// its prefill ended without one, and no prefill rate is learnt from it).
    pub fn prefill_give_back(&self, id: &str, first_token: Option<Instant>) {
        let lane = match self.held().get_mut(id) {
            Some(held) if held.prefill > 0 => {
                held.prefill = 0;
                held.lane
            }
            _ => return,
        };
        self.send(Lease {
            id: id.to_owned(),
            lane,
            give: Give::Prefill,
            first_token,
        });
    }

    fn send(&self, lease: Lease) {
        if !self.abandoned.load(Ordering::Acquire) {
            // Fails only once the release task has stopped; the lease then expires by TTL.
            let _ = self.releases.send(lease);
        }
    }
}

/// The leases an acquire call may take, given back if it is dropped before its reply is read.
pub(super) struct Pending<'s> {
    shared: &'s Shared,
    lane: Lane,
    ids: Vec<String>,
}

impl<'s> Pending<'s> {
    /// Lease `id`, which a call about to run may take in `lane`.
    pub(super) fn new(shared: &'s Shared, lane: Lane, id: &str) -> Self {
        Self {
            shared,
            lane,
            ids: vec![id.to_owned()],
        }
    }

    /// The reply was read: what it says is booked by the caller, nothing to give back.
    pub(super) fn disarm(&mut self) {
        self.ids.clear();
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            self.shared.release(id, self.lane);
        }
    }
}

/// A lease a line's head took for a waiter behind it ([`LaneQueue`]'s `H`): the waiter claims
/// it; dropped unclaimed (the waiter left the line meanwhile), it is given back.
pub(crate) struct Handed {
    shared: Arc<Shared>,
    lane: Lane,
    id: Option<String>,
}

impl Handed {
    /// Lease `id` in `lane`, already booked as this replica's ([`Shared::hold`]).
    pub fn new(shared: Arc<Shared>, lane: Lane, id: String) -> Self {
        Self {
            shared,
            lane,
            id: Some(id),
        }
    }

    /// The lease's id, now its waiter's to give back.
    pub fn claim(mut self) -> String {
        self.id.take().unwrap_or_default()
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.shared.release(id, self.lane);
        }
    }
}

impl std::fmt::Debug for Handed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handed").field("id", &self.id).finish()
    }
}

/// Whether lease `id` is a fallback admission's (`<replica>:f<n>`).
fn is_fallback(id: &str) -> bool {
    id.rsplit(':').next().is_some_and(|n| n.starts_with('f'))
}

/// A request the fallback admitted: its local seat, and once Redis is back its lease there.
pub(crate) struct FallbackLease {
    shared: Arc<Shared>,
    id: String,
    guard: Mutex<Option<LaneGuard>>,
}

impl FallbackLease {
    /// Registered in Redis and booked as this replica's lease (moves and prefill give-backs
    /// then go to Redis too).
    fn adopted(&self) -> bool {
        self.shared.held().contains_key(&self.id)
    }
}

impl Reservation for FallbackLease {
    fn promote(&self, from: Lane, tokens: u32, to: Lane, grown: u32) -> BoxFuture<'_, Move> {
        Box::pin(async move {
            // Registered in Redis: the fleet's counts decide (the fallback's own are for the
            // next outage). Redis registered it whatever its limits, so it may well be full:
            // a move it refuses is no move, or the request would run in the larger lane while
            // the fleet counts it in the smaller one.
            let adopted = self.adopted();
            if adopted {
                let fleet = self
                    .shared
                    .promote(&self.id, from, tokens, (to, grown), true)
                    .await;
                if fleet != Move::Done {
                    return fleet;
                }
            }
            let taken = self
                .guard
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let Some(mut guard) = taken else {
                return if adopted { Move::Done } else { Move::Full };
            };
            let moved = guard.promote(to, grown).await;
            let (lane, now) = (guard.lane(), guard.tokens());
            *self.guard.lock().unwrap_or_else(PoisonError::into_inner) = Some(guard);
            if moved == Move::Done {
                if let Some((h, _)) = self.shared.fallback_leases().get_mut(&self.id) {
                    h.lane = lane;
                    h.tokens = now;
                }
            }
            if adopted {
                Move::Done
            } else {
                moved
            }
        })
    }

    fn release(self: Box<Self>, lane: Lane, _tokens: u32, _served: Option<u64>) {
        drop(
            self.guard
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let sent = self
            .shared
            .fallback_leases()
            .remove(&self.id)
            .is_some_and(|(_, sent)| sent);
        if sent {
            // Registered, or its registration on the way: release it (after it, in order).
            self.shared.release(self.id.clone(), lane);
        }
    }

    fn prefill_done(&self, _tokens: u32) {
        if let Some(g) = self
            .guard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            g.prefill_done();
        }
        if let Some((h, _)) = self.shared.fallback_leases().get_mut(&self.id) {
            h.prefill = 0;
        }
        if self.adopted() {
            self.shared.prefill_done(&self.id);
        }
    }
}

/// Hands a Redis lease back when its [`crate::admission::LaneGuard`] drops.
pub(crate) struct LeaseRelease {
    pub shared: std::sync::Arc<Shared>,
    pub id: String,
    /// Its tenant's service charge (`auth.fleet_fairness`): the tenant, its share and the
    /// tokens charged at admission, settled to what was served at release.
    pub service: Option<(std::sync::Arc<str>, f64, u32)>,
}

impl Reservation for LeaseRelease {
    fn promote(&self, from: Lane, tokens: u32, to: Lane, grown: u32) -> BoxFuture<'_, Move> {
        Box::pin(
            self.shared
                .promote(&self.id, from, tokens, (to, grown), true),
        )
    }

    fn release(self: Box<Self>, lane: Lane, _tokens: u32, served: Option<u64>) {
        let LeaseRelease {
            shared,
            id,
            service,
        } = *self;
        if let Some((tenant, share, charged)) = service {
            // What the engine counted (nothing when it never got the request), less the charge.
            #[allow(clippy::cast_precision_loss)]
            let delta = (served.unwrap_or(0) as f64 - f64::from(charged)) / share;
            shared
                .service
                .charge(shared.connection(), &shared.background, &tenant, delta);
        }
        shared.release(id, lane);
    }

    fn prefill_done(&self, _tokens: u32) {
        self.shared.prefill_done(&self.id);
    }

    fn prefill_abandoned(&self, _tokens: u32) {
        // Ended before its first token: its room goes back with no first token. Timed to this
        // moment, a borrower's cut prefill would read as a fast one (the rate
        // `jobs.preempt_prefill_grace_tokens` is judged by).
        self.shared.prefill_give_back(&self.id, None);
    }
}
