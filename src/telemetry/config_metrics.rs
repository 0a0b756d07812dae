//! Configuration reloads' families, registered once by [`super::Metrics::new`]:
//!
//! - `tutor_gateway_config_reloads_total{outcome}`: reloads, `applied`, `invalid` (the file has
//!   problems, or there is none) or `failed` (something it names could not be built);
//! - `tutor_gateway_config_info{sha256}`: 1 for the configuration in force, named by a short
//!   SHA-256 of it (one series: replicas that agree show the same value).

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// Every reload outcome, as its label value.
pub const RELOAD_OUTCOMES: [&str; 3] = ["applied", "invalid", "failed"];

/// The configuration families.
#[derive(Debug, Clone)]
pub struct ConfigMetrics {
    reloads: IntCounterVec,
    info: IntGaugeVec,
}

impl ConfigMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let reloads = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_config_reloads_total",
                "Configuration reloads (SIGHUP, POST /admin/reload), by outcome.",
            ),
            &["outcome"],
        )
        .expect("valid counter");
        for outcome in RELOAD_OUTCOMES {
            reloads.with_label_values(&[outcome]);
        }
        let info = IntGaugeVec::new(
            Opts::new(
                "tutor_gateway_config_info",
                "1 for the configuration in force, by a short SHA-256 of it.",
            ),
            &["sha256"],
        )
        .expect("valid gauge");
        registry
            .register(Box::new(reloads.clone()))
            .expect("registered once");
        registry
            .register(Box::new(info.clone()))
            .expect("registered once");
        Self { reloads, info }
    }

    /// The configuration named `sha256` is in force.
    pub fn in_force(&self, sha256: &str) {
        self.info.reset();
        self.info.with_label_values(&[sha256]).set(1);
    }

    /// A reload ended with `outcome`; when applied, `sha256` is now in force.
    pub fn reloaded(&self, outcome: &str, sha256: &str) {
        self.reloads.with_label_values(&[outcome]).inc();
        if outcome == "applied" {
            self.in_force(sha256);
        }
    }
}
