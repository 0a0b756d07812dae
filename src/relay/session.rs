//! Continuations (M14): output tokens per session within a window, so a chain of "continue"
//! requests is classified by what it has produced in total. Kept in this process; with the
//! Redis quota each replica keeps its own ledger (a session's requests usually reach one
//! replica; see docs/operations.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const PURGE_ABOVE: usize = 10_000;

/// Output tokens per session id, forgotten `window` after a session's last request.
#[derive(Debug, Clone)]
pub struct SessionLedger {
    window: Duration,
    sessions: Arc<Mutex<HashMap<String, (u64, Instant)>>>,
}

impl SessionLedger {
    /// An empty ledger with this window.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            sessions: Arc::default(),
        }
    }

    /// Output tokens the session produced within the window.
    pub fn output(&self, session: &str) -> u64 {
        let map = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(session)
            .filter(|(_, expires)| *expires > Instant::now())
            .map_or(0, |(tokens, _)| *tokens)
    }

    /// Adds a finished request's output tokens to its session.
    pub fn add(&self, session: &str, tokens: u32) {
        let now = Instant::now();
        let mut map = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
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

    #[test]
    fn output_accumulates_per_session_and_expires() {
        let ledger = SessionLedger::new(Duration::from_millis(50));
        ledger.add("a", 100);
        ledger.add("a", 120);
        ledger.add("b", 7);
        assert_eq!(ledger.output("a"), 220);
        assert_eq!(ledger.output("b"), 7);
        assert_eq!(ledger.output("c"), 0);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(ledger.output("a"), 0);
        ledger.add("a", 5);
        assert_eq!(ledger.output("a"), 5, "a new window starts from zero");
    }
}
