//! The relay's families, registered once by [`super::Metrics::new`]:
//!
//! - `tutor_gateway_relay_seconds`: the gateway's own time per relayed piece of a stream, from
//!   reading it from vLLM to putting it in the client's buffer (the response body takes it
//!   from there as the client reads). It reads the inter-token overhead directly, without
//!   client noise.
//! - `tutor_gateway_client_too_slow_total{reason}`: streams whose client was cut because it
//!   did not take their bytes in time (`server.client_buffer_bytes`,
//!   `server.client_write_timeout_ms`).

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

/// Buckets from 10 µs to 100 ms (seconds).
const BUCKETS: [f64; 12] = [
    0.000_01, 0.000_02, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1,
];

/// Why a stream's client was cut as too slow (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooSlow {
    /// More than `server.client_buffer_bytes` waited for it.
    BufferFull,
    /// It took nothing for `server.client_write_timeout_ms` while bytes waited.
    WriteTimeout,
}

impl TooSlow {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            TooSlow::BufferFull => "buffer_full",
            TooSlow::WriteTimeout => "write_timeout",
        }
    }
}

/// The relay's families.
#[derive(Debug, Clone)]
pub struct RelayMetrics {
    relay: Histogram,
    too_slow: IntCounterVec,
}

impl RelayMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let relay = Histogram::with_opts(
            HistogramOpts::new(
                "tutor_gateway_relay_seconds",
                "Time from reading a piece of a stream from vLLM to putting it in the client's \
                 buffer (one observation per write; several chunks that arrived together make \
                 one write).",
            )
            .buckets(BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        let too_slow = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_client_too_slow_total",
                "Streams whose client was cut (code client_too_slow, engine work aborted) by \
                 reason: buffer_full (server.client_buffer_bytes behind) or write_timeout \
                 (nothing taken for server.client_write_timeout_ms).",
            ),
            &["reason"],
        )
        .expect("valid counter");
        for family in [
            Box::new(relay.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(too_slow.clone()),
        ] {
            registry.register(family).expect("registered once");
        }
        for reason in [TooSlow::BufferFull, TooSlow::WriteTimeout] {
            too_slow.with_label_values(&[reason.as_str()]);
        }
        Self { relay, too_slow }
    }

    /// Records one relayed write that waited `d` inside the gateway.
    pub fn observe(&self, d: Duration) {
        self.relay.observe(d.as_secs_f64());
    }

    /// Records a stream's client cut for `reason`.
    pub fn too_slow(&self, reason: TooSlow) {
        self.too_slow.with_label_values(&[reason.as_str()]).inc();
    }
}
