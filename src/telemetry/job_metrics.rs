//! Background jobs' families, registered once by [`super::Metrics::new`]:
//!
//! - `tutor_gateway_jobs{status}`: jobs kept now, by status (`queued`, `running`, `done`,
//!   `failed`, `cancelled`, `expired`);
//! - `tutor_gateway_job_wait_seconds`: submission to start (time queued for idle capacity);
//! - `tutor_gateway_job_run_seconds`: start to end (done, failed or cancelled while running);
//! - `tutor_gateway_webhook_deliveries_total{outcome}`: webhook attempts, `delivered` (2xx),
//!   `retried` (failed, another attempt follows) or `failed` (the last attempt failed).

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Every job status, as its label value.
pub const JOB_STATUSES: [&str; 6] = [
    "queued",
    "running",
    "done",
    "failed",
    "cancelled",
    "expired",
];

/// Buckets from 100 ms to an hour (seconds): jobs wait for idle capacity and run long.
const BUCKETS: [f64; 12] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0,
];

/// The job families.
#[derive(Debug, Clone)]
pub struct JobMetrics {
    jobs: IntGaugeVec,
    wait: Histogram,
    run: Histogram,
    webhooks: IntCounterVec,
}

impl JobMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let jobs = IntGaugeVec::new(
            Opts::new(
                "tutor_gateway_jobs",
                "Background jobs kept by this replica, by status.",
            ),
            &["status"],
        )
        .expect("valid gauge");
        for status in JOB_STATUSES {
            jobs.with_label_values(&[status]).set(0);
        }
        let histogram = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()))
                .expect("valid histogram")
        };
        let wait = histogram(
            "tutor_gateway_job_wait_seconds",
            "Time from a job's submission to its start (queued for idle large-lane capacity).",
        );
        let run = histogram(
            "tutor_gateway_job_run_seconds",
            "Time from a job's start to its end (done, failed, or cancelled while running).",
        );
        let webhooks = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_webhook_deliveries_total",
                "Job webhook attempts: delivered (2xx), retried (failed, another follows), \
                 failed (the last attempt failed).",
            ),
            &["outcome"],
        )
        .expect("valid counter");
        for outcome in ["delivered", "retried", "failed"] {
            webhooks.with_label_values(&[outcome]);
        }
        for c in [
            Box::new(jobs.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(wait.clone()),
            Box::new(run.clone()),
            Box::new(webhooks.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        Self {
            jobs,
            wait,
            run,
            webhooks,
        }
    }

    /// A job moved from status `from` (`None`: it is new) to `to` (`None`: it is forgotten).
    pub fn moved(&self, from: Option<&str>, to: Option<&str>) {
        if let Some(from) = from {
            self.jobs.with_label_values(&[from]).dec();
        }
        if let Some(to) = to {
            self.jobs.with_label_values(&[to]).inc();
        }
    }

    /// Sets the jobs with `status` to `n` (the shared store's fleet-wide counts).
    pub fn set(&self, status: &str, n: i64) {
        self.jobs.with_label_values(&[status]).set(n);
    }

    /// Jobs kept now with `status`.
    pub fn count(&self, status: &str) -> i64 {
        self.jobs.with_label_values(&[status]).get()
    }

    /// A job started after waiting `d`.
    pub fn waited(&self, d: Duration) {
        self.wait.observe(d.as_secs_f64());
    }

    /// A job ran for `d`.
    pub fn ran(&self, d: Duration) {
        self.run.observe(d.as_secs_f64());
    }

    /// One webhook attempt ended with `outcome` (`delivered`, `retried` or `failed`).
    pub fn webhook(&self, outcome: &'static str) {
        self.webhooks.with_label_values(&[outcome]).inc();
    }
}
