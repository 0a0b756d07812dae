//! Telemetry: the gateway's Prometheus series (one [`Metrics`] struct, no globals).
//!
//! The observability issue adds OpenTelemetry spans and the latency histograms here.

mod metrics;

pub use metrics::{Metrics, Outcome, Route};
