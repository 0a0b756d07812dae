//! How many `GET /jobs/{id}/events` streams each tenant holds open on this replica, bounded by
//! `jobs.max_event_streams_per_tenant`: a stream lasts as long as its job (hours for a queued
//! review), so without a bound one client's streams could fill `server.max_requests_in_flight`
//! and lock every other client out. A slot is taken before the stream starts and given back
//! when the stream is dropped, however it ends.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::GatewayError;
use crate::pipeline::Tenant;

/// Open event streams per tenant (`""`: requests without a tenant, `[auth]` off).
#[derive(Debug, Default)]
pub struct StreamSlots {
    open: Mutex<HashMap<String, usize>>,
}

/// One open stream's slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    tenant: String,
}

impl StreamSlots {
    /// A slot for `tenant`'s new stream, or 429 `too_many_streams` when it holds `max`.
    pub fn take(
        self: &Arc<Self>,
        tenant: Option<&Tenant>,
        max: usize,
    ) -> Result<StreamSlot, GatewayError> {
        let tenant = tenant.map(|t| t.0.clone()).unwrap_or_default();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let held = open.entry(tenant.clone()).or_default();
        if *held >= max {
            return Err(GatewayError::TooManyStreams);
        }
        *held = held.saturating_add(1);
        Ok(StreamSlot {
            slots: self.clone(),
            tenant,
        })
    }

    /// Streams `tenant` holds open now (`None`: requests without a tenant).
    pub fn held(&self, tenant: Option<&str>) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(tenant.unwrap_or_default()).copied().unwrap_or(0)
    }
}

impl Drop for StreamSlot {
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

    use super::StreamSlots;
    use crate::pipeline::Tenant;

    #[test]
    fn a_tenant_holds_at_most_max_and_a_dropped_stream_gives_its_slot_back() {
        let slots = Arc::new(StreamSlots::default());
        let a = Tenant("a".into());
        let first = slots.take(Some(&a), 2).unwrap();
        let _second = slots.take(Some(&a), 2).unwrap();
        assert!(slots.take(Some(&a), 2).is_err());
        // Another tenant is not affected.
        let _other = slots.take(Some(&Tenant("b".into())), 2).unwrap();
        drop(first);
        assert_eq!(slots.held(Some("a")), 1);
        let _third = slots.take(Some(&a), 2).unwrap();
    }
}
