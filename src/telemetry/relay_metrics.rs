//! `tutor_gateway_relay_seconds`: the gateway's own time per relayed piece of a stream, from
//! reading it from vLLM to handing it to the client's connection, registered once by
//! [`super::Metrics::new`]. It reads the inter-token overhead directly, without client noise.

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, Registry};

/// Buckets from 10 µs to 10 ms (seconds).
const BUCKETS: [f64; 12] = [
    0.000_01, 0.000_02, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1,
];

/// The relay latency family.
#[derive(Debug, Clone)]
pub struct RelayMetrics {
    relay: Histogram,
}

impl RelayMetrics {
    /// Registers the family in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let relay = Histogram::with_opts(
            HistogramOpts::new(
                "tutor_gateway_relay_seconds",
                "Time from reading a piece of a stream from vLLM to handing it to the client's \
                 connection (one observation per write; several chunks that arrived together \
                 make one write).",
            )
            .buckets(BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        registry
            .register(Box::new(relay.clone()))
            .expect("registered once");
        Self { relay }
    }

    /// Records one relayed write that waited `d` inside the gateway.
    pub fn observe(&self, d: Duration) {
        self.relay.observe(d.as_secs_f64());
    }
}
