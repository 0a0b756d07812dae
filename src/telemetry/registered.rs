//! Registering a metric family once: build it, register it in the registry, hand it back. A
//! leaf: it imports nothing from the crate.

use prometheus::core::Collector;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// `metric` (as its constructor returned it) registered in `registry`; panics on an invalid
/// definition or a second registration of the same name (both are bugs, found by any test).
pub fn registered<T: Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<T>,
) -> T {
    let metric = metric.expect("valid metric definition");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

/// An integer counter family with `labels`, registered in `registry`.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

/// An integer gauge family with `labels`, registered in `registry`.
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}
