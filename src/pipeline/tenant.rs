//! [`Tenant`]: whose request it is, and [`TenantSlots`]: how many of something (requests in
//! flight, job event streams) each tenant holds at once.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

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
