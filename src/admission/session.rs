//! Continuations (M14): output tokens per session within a window, so a chain of "continue"
//! requests is classified by what it has produced in total. The count lives where the quota
//! lives: in this process with the local quota; in Redis with the Redis quota
//! (`<prefix>:{quota}:session:<sha256(session id), 16 hex>`, INCRBY + PEXPIRE), shared by all
//! replicas. While Redis is unreachable the replica's own count is used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use sha2::{Digest, Sha256};

use super::redis::RedisAdmission;

const PURGE_ABOVE: usize = 10_000;

/// Output tokens per session id, forgotten `window` after a session's last request.
#[derive(Debug, Clone)]
pub struct SessionLedger {
    window: Duration,
    local: Arc<Mutex<HashMap<String, (u64, Instant)>>>,
    redis: Option<RedisAdmission>,
}

impl SessionLedger {
    /// An in-process ledger with this window.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            local: Arc::default(),
            redis: None,
        }
    }

    /// A ledger kept in the Redis quota's server, shared by every replica.
    pub fn shared(window: Duration, redis: RedisAdmission) -> Self {
        Self {
            redis: Some(redis),
            ..Self::new(window)
        }
    }

    fn key(redis: &RedisAdmission, session: &str) -> String {
        let digest = Sha256::digest(session.as_bytes());
        let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("{}:{hash}", redis.keys().session)
    }

    /// Output tokens the session produced within the window.
    pub async fn output(&self, session: &str) -> u64 {
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
        self.local_output(session)
    }

    fn local_output(&self, session: &str) -> u64 {
        let map = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(session)
            .filter(|(_, expires)| *expires > Instant::now())
            .map_or(0, |(tokens, _)| *tokens)
    }

    /// Adds a finished request's output tokens to its session (in Redis in the background).
    pub fn add(&self, session: &str, tokens: u32) {
        self.local_add(session, tokens);
        let Some(redis) = &self.redis else { return };
        let Some(mut conn) = redis.connection() else {
            return;
        };
        let key = Self::key(redis, session);
        let ttl_ms = self.window.as_millis() as u64;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _: redis::RedisResult<()> = redis::pipe()
                    .atomic()
                    .cmd("INCRBY")
                    .arg(&key)
                    .arg(tokens)
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(&key)
                    .arg(ttl_ms)
                    .ignore()
                    .query_async(&mut conn)
                    .await;
            });
        }
    }

    fn local_add(&self, session: &str, tokens: u32) {
        let now = Instant::now();
        let mut map = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() > PURGE_ABOVE {
            map.retain(|_, (_, expires)| *expires > now);
        }
        let entry = map.entry(session.to_owned()).or_insert((0, now));
        if entry.1 <= now {
            entry.0 = 0;
        }
        entry.0 += u64::from(tokens);
        entry.1 = now + self.window;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn output_accumulates_per_session_and_expires() {
        let ledger = SessionLedger::new(Duration::from_millis(50));
        ledger.add("a", 100);
        ledger.add("a", 120);
        ledger.add("b", 7);
        assert_eq!(ledger.output("a").await, 220);
        assert_eq!(ledger.output("b").await, 7);
        assert_eq!(ledger.output("c").await, 0);
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(ledger.output("a").await, 0);
        ledger.add("a", 5);
        assert_eq!(ledger.output("a").await, 5, "a new window starts from zero");
    }
}
