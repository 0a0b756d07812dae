//! Continuations (M14): output tokens per session within a window, so a chain of "continue"
//! requests is classified by what it has produced in total.
//!
//! - A session id is checked ([`SessionId::parse`]: at most [`SESSION_ID_MAX_BYTES`] bytes of
//!   `A-Z a-z 0-9 - _ . : + / =`) and hashed at once; the raw id is never stored or logged. With
//!   `[auth]` on it is the tenant's ([`SessionId::within`]): two tenants sending one id have two
//!   sessions.
//! - Each request reserves its declared output at admission ([`SessionLedger::reserve`], which
//!   answers what the session had before it, atomically), so parallel continues see each other;
//!   its [`SessionHold`] settles the reservation to what was really produced when it ends, on
//!   every path (a request that never reached vLLM settles at zero).
//! - The count lives where the quota lives: in this process with the local quota; in Redis
//!   with the Redis quota (`<prefix>:{quota}:session:<16 hex of the hash>`, INCRBY + PEXPIRE),
//!   shared by all replicas. While Redis is unreachable the replica's own count is used.
//! - The replica's own map holds at most `promotion.max_sessions` ids: beyond it the session
//!   used longest ago is forgotten (`tutor_gateway_sessions_evicted_total`), and expired ones go
//!   first. Every operation is amortised O(1).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::Script;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::redis::RedisAdmission;
use crate::telemetry::PromotionMetrics;

/// Longest session id accepted, in bytes.
pub const SESSION_ID_MAX_BYTES: usize = 128;

/// A checked session id, kept only as a hash of what the client sent.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId([u8; 16]);

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionId({})", self.hex())
    }
}

impl SessionId {
    /// The id `raw` stands for: `Ok(None)` when empty, an error message when too long or
    /// outside the allowed characters.
    pub fn parse(raw: &str) -> Result<Option<Self>, String> {
        if raw.is_empty() {
            return Ok(None);
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-_.:+/=".contains(&b);
        if raw.len() > SESSION_ID_MAX_BYTES || !raw.bytes().all(allowed) {
            return Err(format!(
                "must be at most {SESSION_ID_MAX_BYTES} characters from A-Z a-z 0-9 - _ . : + / ="
            ));
        }
        let digest = Sha256::digest(raw.as_bytes());
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&digest[..16]);
        Ok(Some(Self(hash)))
    }

    /// The same id within `tenant`'s requests: two tenants that send one id have two sessions
    /// (one tenant's output never moves another's request to a larger lane). No tenant (auth
    /// off): the id as it is.
    pub fn within(self, tenant: Option<&str>) -> Self {
        let Some(tenant) = tenant else {
            return self;
        };
        let mut h = Sha256::new();
        h.update(b"tenant\0");
        h.update(tenant.as_bytes());
        h.update(b"\0");
        h.update(self.0);
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&h.finalize()[..16]);
        Self(hash)
    }

    /// The first 8 bytes of the hash in hex (the Redis key's suffix).
    fn hex(&self) -> String {
        crate::sign::hex(&self.0[..8])
    }
}

/// Output tokens per session, forgotten `window` after a session's last request.
#[derive(Debug, Clone)]
pub struct SessionLedger {
    window: Duration,
    local: Arc<Mutex<LocalSessions>>,
    redis: Option<RedisAdmission>,
    metrics: PromotionMetrics,
    settle_script: Script,
}

impl SessionLedger {
    /// An in-process ledger with this window, holding at most `capacity` sessions.
    pub fn new(window: Duration, capacity: usize, metrics: PromotionMetrics) -> Self {
        Self {
            window,
            local: Arc::new(Mutex::new(LocalSessions::new(capacity.max(1)))),
            redis: None,
            metrics,
            settle_script: Script::new(SETTLE_LUA),
        }
    }

    /// A ledger kept in the Redis quota's server, shared by every replica.
    pub fn shared(
        window: Duration,
        capacity: usize,
        metrics: PromotionMetrics,
        redis: RedisAdmission,
    ) -> Self {
        Self {
            redis: Some(redis),
            ..Self::new(window, capacity, metrics)
        }
    }

    fn key(redis: &RedisAdmission, session: SessionId) -> String {
        format!("{}:{}", redis.keys().session, session.hex())
    }

    /// Reserves `declared` output tokens for a request of `session` and answers the session's
    /// output before it (finished requests' output plus the reservations of those still
    /// running). The hold gives back what the request does not produce when it ends.
    ///
    /// Cancel-safe: the hold exists before the call to Redis goes out, so a request dropped
    /// while it is out (its client went away) gives its local reservation back. What Redis
    /// may have counted then stays counted for the window (more output than the session
    /// produced moves its continuations to larger lanes sooner, never later).
    pub async fn reserve(&self, session: SessionId, declared: u32) -> (u64, SessionHold) {
        let mut before = self.local_change(session, i64::from(declared));
        let mut hold = SessionHold {
            ledger: self.clone(),
            session,
            reserved: declared,
            in_redis: false,
            settled: false,
        };
        if let Some(redis) = &self.redis {
            if let Some(mut conn) = redis.connection() {
                let got: redis::RedisResult<(u64,)> = redis::pipe()
                    .atomic()
                    .cmd("INCRBY")
                    .arg(Self::key(redis, session))
                    .arg(declared)
                    .cmd("PEXPIRE")
                    .arg(Self::key(redis, session))
                    .arg(self.window.as_millis() as u64)
                    .ignore()
                    .query_async(&mut conn)
                    .await;
                if let Ok((after,)) = got {
                    before = after.saturating_sub(u64::from(declared));
                    hold.in_redis = true;
                }
            }
        }
        (before, hold)
    }

    /// Output tokens the session produced (or has reserved) within the window.
    pub async fn output(&self, session: SessionId) -> u64 {
        if let Some(redis) = &self.redis {
            if let Some(mut conn) = redis.connection() {
                let got: redis::RedisResult<Option<u64>> = redis::cmd("GET")
                    .arg(Self::key(redis, session))
                    .query_async(&mut conn)
                    .await;
                if let Ok(v) = got {
                    return v.unwrap_or(0);
                }
            }
        }
        self.lock().tokens(session, Instant::now())
    }

    /// Sessions this replica tracks now.
    pub fn tracked(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LocalSessions> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `delta` to the session's local count (clamped at zero) and answers the count
    /// before; updates the metrics.
    fn local_change(&self, session: SessionId, delta: i64) -> u64 {
        let mut local = self.lock();
        let (before, evicted) = local.change(session, delta, Instant::now(), self.window);
        self.metrics.sessions_tracked(local.map.len());
        drop(local);
        if evicted > 0 {
            self.metrics.sessions_evicted(evicted);
        }
        before
    }

    /// Settles a reservation: adds `local` to the session's own count and `shared` to Redis's
    /// (produced less reserved where the reservation was taken; all of the output where
    /// Redis did not get it).
    fn settle(&self, session: SessionId, local: i64, shared: i64) {
        if local != 0 {
            self.local_change(session, local);
        }
        let delta = shared;
        if delta == 0 {
            return;
        }
        let Some(redis) = &self.redis else { return };
        let Some(mut conn) = redis.connection() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let key = Self::key(redis, session);
        let ttl_ms = self.window.as_millis() as u64;
        let script = self.settle_script.clone();
        // A shutdown waits for it (bounded), as for the leases.
        redis.spawn_background(async move {
            let _: redis::RedisResult<()> = script
                .key(key)
                .arg(delta)
                .arg(ttl_ms)
                .invoke_async(&mut conn)
                .await;
        });
    }
}

/// Adds ARGV[1] (may be negative) to the session's count, never below zero, and renews its TTL.
const SETTLE_LUA: &str = r"
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if v < 0 then redis.call('SET', KEYS[1], 0) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
";

/// A request's reservation of output in its session, settled once: by
/// [`SessionHold::settle`] with what it produced, or at drop with nothing produced.
#[derive(Debug)]
pub struct SessionHold {
    ledger: SessionLedger,
    session: SessionId,
    reserved: u32,
    /// Whether Redis counted the reservation (it was reachable at admission).
    in_redis: bool,
    settled: bool,
}

impl SessionHold {
    /// The request ended having produced `produced` output tokens.
    pub fn settle(mut self, produced: u32) {
        self.settle_with(produced);
    }

    fn settle_with(&mut self, produced: u32) {
        if !self.settled {
            self.settled = true;
            let delta = i64::from(produced) - i64::from(self.reserved);
            let shared = if self.in_redis {
                delta
            } else {
                i64::from(produced)
            };
            self.ledger.settle(self.session, delta, shared);
        }
    }
}

impl Drop for SessionHold {
    fn drop(&mut self) {
        self.settle_with(0);
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    tokens: u64,
    expires: Instant,
    /// The touch that put this entry last in `order`.
    stamp: u64,
}

/// The replica's own sessions: a map, and the order in which they were last touched (which is
/// also the order in which they expire), with stale positions skipped as they come up.
#[derive(Debug)]
struct LocalSessions {
    capacity: usize,
    map: HashMap<SessionId, Entry>,
    order: VecDeque<(SessionId, u64)>,
    next_stamp: u64,
}

impl LocalSessions {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            map: HashMap::new(),
            order: VecDeque::new(),
            next_stamp: 0,
        }
    }

    fn tokens(&self, session: SessionId, now: Instant) -> u64 {
        self.map
            .get(&session)
            .filter(|e| e.expires > now)
            .map_or(0, |e| e.tokens)
    }

    /// Adds `delta` (clamped at zero), renews the window; answers the count before and how
    /// many live sessions had to be evicted to make room.
    fn change(
        &mut self,
        session: SessionId,
        delta: i64,
        now: Instant,
        window: Duration,
    ) -> (u64, u64) {
        self.forget_expired(now);
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let entry = self.map.entry(session).or_insert(Entry {
            tokens: 0,
            expires: now,
            stamp,
        });
        if entry.expires <= now {
            entry.tokens = 0;
        }
        let before = entry.tokens;
        entry.tokens = before.saturating_add_signed(delta);
        entry.expires = now + window;
        entry.stamp = stamp;
        self.order.push_back((session, stamp));
        let mut evicted = 0;
        while self.map.len() > self.capacity {
            if let Some((id, _)) = self.pop_current() {
                self.map.remove(&id);
                evicted += 1;
            }
        }
        if self.order.len() > 2 * self.capacity + 16 {
            self.compact();
        }
        (before, evicted)
    }

    /// Drops sessions whose window has passed (they sit at the front).
    fn forget_expired(&mut self, now: Instant) {
        while let Some(&(id, stamp)) = self.order.front() {
            match self.map.get(&id) {
                Some(e) if e.stamp == stamp && e.expires > now => break,
                Some(e) if e.stamp == stamp => {
                    self.map.remove(&id);
                }
                _ => {}
            }
            self.order.pop_front();
        }
    }

    /// Pops the least recently touched live session's position.
    fn pop_current(&mut self) -> Option<(SessionId, u64)> {
        while let Some((id, stamp)) = self.order.pop_front() {
            if self.map.get(&id).is_some_and(|e| e.stamp == stamp) {
                return Some((id, stamp));
            }
        }
        None
    }

    /// Rebuilds `order` from the map when stale positions pile up behind a live one.
    fn compact(&mut self) {
        let mut live: Vec<(SessionId, u64)> =
            self.map.iter().map(|(id, e)| (*id, e.stamp)).collect();
        live.sort_unstable_by_key(|&(_, stamp)| stamp);
        self.order = live.into();
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
