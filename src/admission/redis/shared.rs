//! State shared by [`super::RedisAdmission`] handles, their guards and background tasks: the
//! connection, the leases this replica holds, the wait lines and the degraded flag.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redis::aio::ConnectionManager;
use redis::RedisError;
use tokio::sync::{mpsc, watch};

use super::keys::Keys;
use super::queue::LaneQueue;
use super::scripts::{AcquireLimits, Ask, LaneQuota, Scripts, TakeReply, Verdict};
use crate::admission::budget::PrefillLimit;
use crate::admission::guard::Reservation;
use crate::lane::Lane;
use crate::telemetry::QuotaMetrics;

/// How long a refused large-lane acquire marks this replica as having a large request waiting,
/// ms: longer than a line head's longest backoff (250 ms) between two tries, so the mark holds
/// while anyone waits, and short enough that a crashed replica's mark holds jobs back briefly.
const WAIT_MARK_MS: u64 = 1_000;

/// A lease this replica holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub lane: Lane,
    pub tokens: u32,
    /// Prefill reservation still held (0 after the first token).
    pub prefill: u32,
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
}

/// What one acquire call got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Take {
    /// A lease with this id.
    Granted(String),
    /// No room; why.
    Refused(Verdict),
    /// Redis could not be reached (now degraded).
    Down,
}

/// Everything the scripts need to know about the limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuotaLimits {
    pub lanes: [LaneQuota; 3],
    pub global_tokens: u64,
    pub prefill: PrefillLimit,
}

pub(crate) struct Shared {
    pub client: redis::Client,
    /// `None` until the first connection; the manager reconnects by itself afterwards.
    pub conn: watch::Sender<Option<ConnectionManager>>,
    pub scripts: Scripts,
    pub keys: Keys,
    pub limits: QuotaLimits,
    pub ttl_ms: u64,
    pub heartbeat: Duration,
    pub replica: String,
    next_id: AtomicU64,
    held: Mutex<HashMap<String, Held>>,
    /// Per lane: the line of requests that never wait for prefill room.
    pub queues: [LaneQueue; 3],
    /// Per lane: long prompts under a prefill budget (FIFO among themselves; a short prompt is
    /// never held back by one).
    pub long_lines: [LaneQueue; 3],
    degraded: AtomicBool,
    /// Set by [`super::RedisAdmission::abandon`]: behave like a killed process.
    pub abandoned: AtomicBool,
    pub releases: mpsc::UnboundedSender<Lease>,
    pub metrics: QuotaMetrics,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: redis::Client,
        keys: Keys,
        limits: QuotaLimits,
        ttl: Duration,
        heartbeat: Duration,
        releases: mpsc::UnboundedSender<Lease>,
        metrics: QuotaMetrics,
    ) -> Self {
        let replica = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        Self {
            client,
            conn: watch::Sender::new(None),
            scripts: Scripts::default(),
            keys,
            limits,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            heartbeat,
            replica,
            next_id: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            queues: Default::default(),
            long_lines: Default::default(),
            degraded: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            releases,
            metrics,
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

    /// Enters or leaves the fallback; logs and sets the gauge on a change.
    pub fn set_degraded(&self, degraded: bool) {
        if self.degraded.swap(degraded, Ordering::AcqRel) != degraded {
            self.metrics.set_degraded(degraded);
            if degraded {
                tracing::error!("shared quota unreachable: running on the fallback");
            } else {
                tracing::info!("shared quota reachable again: back on Redis");
            }
        }
    }

    /// Counts a failed call and marks the quota degraded.
    pub fn failed(&self, op: &str, err: &RedisError) {
        let kind = if err.is_timeout() {
            "timeout"
        } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
            "connection"
        } else {
            "other"
        };
        self.metrics.error(kind);
        // The error text names the server but never the password.
        tracing::warn!(op, kind, error = %err, "quota call failed");
        self.set_degraded(true);
    }

    /// Whether a prompt of `prompt` tokens waits for prefill room (a long prompt under a
    /// budget); such requests wait in [`Shared::long_lines`].
    pub fn waits_for_prefill(&self, prompt: u32) -> bool {
        self.limits.prefill.waits(prompt)
    }

    /// The line a request of `lane` with a prompt of `prompt` tokens waits in.
    pub fn line(&self, lane: Lane, prompt: u32) -> &LaneQueue {
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
        let held = Held {
            lane,
            tokens,
            prefill: prompt,
        };
        self.held().insert(id.to_owned(), held);
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
    /// reservation of `prompt` tokens; `in_line`: the caller holds a place in one of the lane's
    /// lines (a large request refused, or granted with others behind it, keeps this replica's
    /// "large request waiting" mark, which holds background jobs back).
    pub async fn try_take(&self, lane: Lane, tokens: u32, prompt: u32, in_line: bool) -> Take {
        let Some(mut conn) = self.connection() else {
            self.set_degraded(true);
            return Take::Down;
        };
        let id = self.next_lease_id();
        let ask = Ask {
            id: &id,
            lane,
            tokens,
            prompt,
            ttl_ms: self.ttl_ms,
            wait_mark_ms: if lane == Lane::Large { WAIT_MARK_MS } else { 0 },
            replica: &self.replica,
            others_waiting: self.waiting_in(lane) > u32::from(in_line),
        };
        let limits = AcquireLimits {
            lane: self.limits.lanes[lane.index()],
            global_tokens: self.limits.global_tokens,
            prefill: self.limits.prefill,
        };
        let started = Instant::now();
        let reply = self
            .scripts
            .acquire(&mut conn, &self.keys, &ask, &limits)
            .await;
        self.metrics
            .observe("acquire", started.elapsed().as_secs_f64());
        match reply {
            Ok(TakeReply { verdict, reaped }) => {
                self.metrics.reaped(reaped);
                if verdict == Verdict::Granted {
                    self.hold(&id, lane, tokens, prompt);
                    Take::Granted(id)
                } else {
                    Take::Refused(verdict)
                }
            }
            Err(err) => {
                self.failed("acquire", &err);
                Take::Down
            }
        }
    }

    /// Moves lease `id` from `from` to `to`, growing it to `tokens` (mid-stream promotion);
    /// `false` when `to` or the global budget has no room, or Redis cannot be reached.
    pub async fn promote(
        &self,
        id: &str,
        from: Lane,
        from_tokens: u32,
        to: Lane,
        tokens: u32,
    ) -> bool {
        let Some(mut conn) = self.connection() else {
            return false;
        };
        let started = Instant::now();
        let reply = self
            .scripts
            .move_and_grow(
                &mut conn,
                &self.keys,
                id,
                to,
                self.limits.lanes[to.index()],
                tokens.max(from_tokens),
                self.limits.global_tokens,
            )
            .await;
        self.metrics
            .observe("move", started.elapsed().as_secs_f64());
        match reply {
            Ok(TakeReply { verdict, reaped }) => {
                self.metrics.reaped(reaped);
                let moved = verdict == Verdict::Granted;
                if moved {
                    if let Some(h) = self.held().get_mut(id) {
                        h.lane = to;
                        h.tokens = tokens.max(from_tokens);
                    }
                }
                moved
            }
            Err(err) => {
                self.failed("move", &err);
                let _ = from;
                false
            }
        }
    }

    /// Gives lease `id` back (a guard's drop): forget it here, release it in the background.
    pub fn release(&self, id: String, lane: Lane) {
        self.held().remove(&id);
        self.send(Lease {
            id,
            lane,
            give: Give::Lease,
        });
    }

    /// Gives lease `id`'s prefill reservation back (its first token came), in the background
    /// and in order with its release.
    pub fn prefill_done(&self, id: &str) {
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
        });
    }

    fn send(&self, lease: Lease) {
        if !self.abandoned.load(Ordering::Acquire) {
            // Fails only once the release task has stopped; the lease then expires by TTL.
            let _ = self.releases.send(lease);
        }
    }
}

/// Hands a Redis lease back when its [`crate::admission::LaneGuard`] drops.
pub(crate) struct LeaseRelease {
    pub shared: std::sync::Arc<Shared>,
    pub id: String,
}

impl Reservation for LeaseRelease {
    fn promote(&self, from: Lane, tokens: u32, to: Lane, grown: u32) -> BoxFuture<'_, bool> {
        Box::pin(self.shared.promote(&self.id, from, tokens, to, grown))
    }

    fn release(self: Box<Self>, lane: Lane, _tokens: u32) {
        let LeaseRelease { shared, id } = *self;
        shared.release(id, lane);
    }

    fn prefill_done(&self, _tokens: u32) {
        self.shared.prefill_done(&self.id);
    }
}
