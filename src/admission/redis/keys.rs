//! Redis key names. All share the hash tag `{quota}`, so every script's keys live in one
//! Cluster slot: `<prefix>:{quota}:expiry`, `:leases`, `:usage`, `:waiting:large`, `:limits`, `:autopilot`, `:epoch`, `:beat` (written by every heartbeat), the pub/sub
//! channel `<prefix>:{quota}:released`, and the background jobs' keys (`:jobs:*`, `:job:<id>`,
//! see `crate::jobs`), which some scripts change together with the quota's.

use redis::{Script, ScriptInvocation};

/// The quota's keys under one prefix (default `tg:v2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// ZSET lease id -> expiry, Redis server time in ms.
    pub expiry: String,
    /// HASH lease id -> `"<lane> <tokens>"`.
    pub leases: String,
    /// HASH `<lane>:n`, `<lane>:tokens`, `global:tokens`.
    pub usage: String,
    /// Pub/sub channel: a lane name is published each time a lease of it is released.
    pub released: String,
    /// ZSET replica -> until when (Redis server ms) it has an interactive large request
    /// waiting: background work starts only while it is empty.
    pub waiting_large: String,
    /// HASH the limits record every replica's scripts enforce (versioned).
    pub limits: String,
    /// The prefix every key shares (`<prefix>:{quota}`), for the keys of other modules.
    pub base: String,
    /// STRING the replica id of the autopilot's leader, with a TTL (`crate::autopilot`).
    pub autopilot: String,
    /// Pub/sub channel (`jobs.preempt`): `<lease id> <lane> <reason>` when an acquire asks a
    /// pre-emptible lease to leave (`quota_common_v2.lua`, `ask_borrowers`).
    pub leave: String,
    /// STRING a random id set once (`quota_epoch_v2.lua`): a new one means Redis lost its data.
    pub epoch: String,
    /// Prefix of the per-session output counters (`<prefix>:{quota}:session:<hash>`, STRING
    /// with a TTL of the continuation window); the hash is of the session id, never the id.
    pub session: String,
}

impl Keys {
    /// The keys under `prefix` (no braces: config validation ensures it).
    pub fn new(prefix: &str) -> Self {
        let key = |name: &str| format!("{prefix}:{{quota}}:{name}");
        Self {
            expiry: key("expiry"),
            leases: key("leases"),
            usage: key("usage"),
            released: key("released"),
            leave: key("leave"),
            waiting_large: key("waiting:large"),
            limits: key("limits"),
            autopilot: key("autopilot"),
            base: format!("{prefix}:{{quota}}"),
            session: key("session"),
            epoch: key("epoch"),
        }
    }

    /// An invocation of `script` with the keys every quota script takes, in order.
    pub(crate) fn with_keys<'a>(&self, script: &'a Script) -> ScriptInvocation<'a> {
        let mut call = script.prepare_invoke();
        call.key(&self.expiry)
            .key(&self.leases)
            .key(&self.usage)
            .key(&self.released)
            .key(&self.waiting_large)
            .key(&self.limits);
        call
    }
}
