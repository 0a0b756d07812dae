//! [`Tenant`]: whose request it is, and [`TenantSlots`]: how many of something (requests in
//! flight, job event streams) each tenant holds at once. Also the API key a request came with
//! ([`caller_key`]) and [`KeysInForce`], for work that outlives its request (a job) and must
//! end when that key is revoked.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

tokio::task_local! {
    /// The API key the request being handled came with (`[auth]`).
    static CALLER_KEY: CallerKey;
}

/// The API key a request came with: its id, its tenant, and the keys in force to ask whether
/// it still is.
#[derive(Clone)]
pub struct CallerKey {
    id: String,
    tenant: String,
    keys: Arc<dyn KeysInForce>,
}

impl CallerKey {
    /// The key with id `id`, of `tenant`, among `keys`.
    pub fn new(id: String, tenant: String, keys: Arc<dyn KeysInForce>) -> Self {
        Self { id, tenant, keys }
    }

    /// Whether it is still in force for its tenant.
    pub fn in_force(&self) -> bool {
        self.keys.in_force(&self.id, &self.tenant)
    }
}

/// Runs `f` (a request's handling) as the request of `key`.
pub async fn with_caller_key<F: std::future::Future>(key: CallerKey, f: F) -> F::Output {
    CALLER_KEY.scope(key, f).await
}

/// The id of the API key the request being handled came with, inside [`with_caller_key`]
/// (`None` without `[auth]`).
pub fn caller_key() -> Option<String> {
    CALLER_KEY.try_with(|k| k.id.clone()).ok()
}

/// Why a request whose API key was revoked while it was in flight ends.
pub const KEY_REVOKED: &str = "the API key was revoked while this request was in flight";

/// Whether the API key the request being handled came with is still in force for its tenant
/// (true without `[auth]`): a request whose key was revoked while it waited for its seat is not
/// sent to the engine.
pub fn caller_key_in_force() -> bool {
    CALLER_KEY.try_with(CallerKey::in_force).unwrap_or(true)
}

/// The API key the request being handled came with, inside [`with_caller_key`] (`None`
/// without `[auth]`).
pub fn caller() -> Option<CallerKey> {
    CALLER_KEY.try_with(Clone::clone).ok()
}

/// The keys in force (`[auth]`), as work that outlives its request sees them.
pub trait KeysInForce: Send + Sync + std::fmt::Debug {
    /// Whether the key with id `key_id` is in force now, for `tenant`.
    fn in_force(&self, key_id: &str, tenant: &str) -> bool;
    /// Whether the key with id `key_id` is in force, for `tenant`, and has been since
    /// `since_ms` (ms since the epoch: a job's submission): a key removed and put back since
    /// is not (what it submitted before died with it).
    fn in_force_since(&self, key_id: &str, tenant: &str, since_ms: u64) -> bool;
    /// Resolves once it is not (never, while it is).
    fn revoked(&self, key_id: &str, tenant: &str) -> futures::future::BoxFuture<'static, ()>;
}

/// The tenant a request's API key belongs to (`[auth]`); set by the auth layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// What each tenant holds at once (`""`: requests without a tenant, `[auth]` off).
#[derive(Debug, Default)]
pub struct TenantSlots {
    open: Mutex<HashMap<String, usize>>,
}

/// One held slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct TenantSlot {
    slots: Arc<TenantSlots>,
    tenant: String,
}

impl TenantSlots {
    /// A slot for `tenant`, or `None` when it holds `max` already.
    pub fn take(self: &Arc<Self>, tenant: Option<&Tenant>, max: usize) -> Option<TenantSlot> {
        let tenant = tenant.map(|t| t.0.clone()).unwrap_or_default();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let held = open.entry(tenant.clone()).or_default();
        if *held >= max {
            if *held == 0 {
                open.remove(&tenant);
            }
            return None;
        }
        *held = held.saturating_add(1);
        Some(TenantSlot {
            slots: self.clone(),
            tenant,
        })
    }

    /// Slots `tenant` holds now (`None`: requests without a tenant).
    pub fn held(&self, tenant: Option<&str>) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(tenant.unwrap_or_default()).copied().unwrap_or(0)
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = open.get_mut(&self.tenant) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Tenant, TenantSlots};

    #[test]
    fn a_tenant_holds_at_most_max_and_a_dropped_slot_comes_back() {
        let slots = Arc::new(TenantSlots::default());
        let a = Tenant("a".into());
        let first = slots.take(Some(&a), 2).unwrap();
        let _second = slots.take(Some(&a), 2).unwrap();
        assert!(slots.take(Some(&a), 2).is_none());
        // Another tenant is not affected.
        let _other = slots.take(Some(&Tenant("b".into())), 2).unwrap();
        drop(first);
        assert_eq!(slots.held(Some("a")), 1);
        let _third = slots.take(Some(&a), 2).unwrap();
        assert!(slots.take(Some(&Tenant("c".into())), 0).is_none());
        assert_eq!(slots.held(Some("c")), 0);
    }
}
