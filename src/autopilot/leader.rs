//! One autopilot for a fleet that shares the Redis quota: the replica holding the lease
//! `<prefix>:{quota}:autopilot` (a key holding its replica id, with a TTL of three looks, at
//! least 2 s) paces, and publishes its values as the shared limits record that every replica's
//! scripts enforce. The others follow that record. A leader that stops (crash, shutdown, or the
//! autopilot turned off) stops renewing; once the lease expires the next replica to look takes
//! it, starts from the configured values and publishes them first: losing the leader falls back
//! to the static values, then paces again from there.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::admission::redis::RedisAdmission;

/// Takes the lease when nobody holds it, renews it when this replica does: 1 while it leads.
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_LUA));
const CLAIM_LUA: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
";

/// Gives the lease up if this replica holds it.
static RESIGN: LazyLock<Script> = LazyLock::new(|| Script::new(RESIGN_LUA));
const RESIGN_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Whether nobody holds the lease.
static FREE: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('EXISTS', KEYS[1])"));

/// Shortest lease.
const MIN_LEASE: Duration = Duration::from_secs(2);

/// This replica's claim on the autopilot's lease.
#[derive(Debug, Default)]
pub struct Lease {
    held: bool,
}

impl Lease {
    /// Claims or renews the lease for three looks `interval` apart (at least 2 s):
    /// `Some(true)` while this replica leads, `Some(false)` while another does. `None` when
    /// Redis did not answer (unreachable, or an error): nothing is known, and a leader keeps
    /// its pace for its next look instead of starting again from the configured values (its
    /// published values stay until its lease expires; another replica then takes over).
    pub async fn claim(&mut self, redis: &RedisAdmission, interval: Duration) -> Option<bool> {
        let ttl = (interval * 3).max(MIN_LEASE);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut conn = redis.connection()?;
        let leads: Result<i64, _> = CLAIM
            .key(&redis.keys().autopilot)
            .arg(redis.replica())
            .arg(ttl_ms)
            .invoke_async(&mut conn)
            .await;
        let leads = leads.ok()? == 1;
        self.changed(leads, redis);
        Some(leads)
    }

    /// Gives the lease up if this replica holds it (the autopilot turned off, or shutdown).
    pub async fn resign(&mut self, redis: &RedisAdmission) {
        if !self.held {
            return;
        }
        self.changed(false, redis);
        if let Some(mut conn) = redis.connection() {
            let _: Result<i64, _> = RESIGN
                .key(&redis.keys().autopilot)
                .arg(redis.replica())
                .invoke_async(&mut conn)
                .await;
        }
    }

    /// Whether no replica leads now (the lease expired or was given up); false when Redis did
    /// not answer.
    pub async fn free(redis: &RedisAdmission) -> bool {
        let Some(mut conn) = redis.connection() else {
            return false;
        };
        let held: Result<i64, _> = FREE
            .key(&redis.keys().autopilot)
            .invoke_async(&mut conn)
            .await;
        held.is_ok_and(|n| n == 0)
    }

    fn changed(&mut self, leads: bool, redis: &RedisAdmission) {
        if leads != self.held {
            if leads {
                tracing::info!(replica = redis.replica(), "autopilot: this replica leads");
            } else {
                tracing::info!(replica = redis.replica(), "autopilot: this replica follows");
            }
            self.held = leads;
        }
    }
}
