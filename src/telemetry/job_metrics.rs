//! Background jobs' families, registered once by [`super::Metrics::new`]:
//!
//! - `tutor_gateway_jobs{status}`: jobs kept now, by status (`queued`, `running`, `done`,
//!   `failed`, `cancelled`, `expired`);
//! - `tutor_gateway_job_wait_seconds`: submission to start (time queued for idle capacity);
//! - `tutor_gateway_job_run_seconds`: start to end (done, failed or cancelled while running);
//! - `tutor_gateway_webhook_deliveries_total{outcome}`: webhook attempts, `delivered` (2xx),
//!   `retried` (failed, another attempt follows) or `failed` (the last attempt failed);
//! - `tutor_gateway_job_preemptions_total{lane,reason}`: jobs asked to give their seat back
//!   (`jobs.preempt`), by the lane of the request that needed it and what it lacked (`seat`,
//!   `tokens`, `prefill`);
//! - `tutor_gateway_job_recomputed_tokens_total{stage}`: prompt tokens of resumed jobs that the
//!   engine did not find in its prefix cache, by where the pre-emption cut the run (`decode`:
//!   prefill paid again; `prefill`: an upper bound, as the cut prefill's rest was never done);
//! - `tutor_gateway_job_unreported_prompt_tokens_total`: prompt tokens of resumed runs whose
//!   cache hit the engine never reported (cut again before their final usage chunk, the only
//!   one with `cached_tokens`): what they recomputed is unknown, at most this;
//! - `tutor_gateway_preemption_admit_seconds{lane}`: for a request a job was pre-empted for, its
//!   queue wait (joining its lane's queue to its admission);
//! - `tutor_gateway_jobs_engine_down`: 1 while this replica starts no job because the engine
//!   is not ready (queued jobs wait for it);
//! - `tutor_gateway_job_engine_cuts_total`: job runs cut by the engine that the job went on
//!   from (`jobs.engine_retries`).

use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::lane::Lane;

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
    preemptions: IntCounterVec,
    recomputed: IntCounterVec,
    unreported: IntCounter,
    made_room: HistogramVec,
    after_ask: HistogramVec,
    engine_down: prometheus::IntGauge,
    engine_cuts: prometheus::IntCounter,
}

/// Buckets from 1 ms to 5 s: an abort and a seat coming back take one engine step or so.
const ADMIT_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

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
            "Time from a job's submission to its start (queued for idle capacity: any lane's idle seat with jobs.preempt, the large lane's otherwise).",
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
        let preemptions = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_job_preemptions_total",
                "Jobs asked to give a seat back to an interactive request (jobs.preempt), by the \
                 request's lane and what it lacked (seat, tokens, prefill), or pressure: at its own \
                 limits, it waits for the engine's time.",
            ),
            &["lane", "reason"],
        )
        .expect("valid counter");
        let recomputed = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_job_recomputed_tokens_total",
                "Prompt tokens of resumed jobs not served from the engine's prefix cache, by the \
                 stage the pre-emption cut (decode: computed again; prefill: an upper bound, the \
                 cut prefill's rest was never computed).",
            ),
            &["stage"],
        )
        .expect("valid counter");
        for stage in ["prefill", "decode"] {
            recomputed.with_label_values(&[stage]);
        }
        let unreported = IntCounter::new(
            "tutor_gateway_job_unreported_prompt_tokens_total",
            "Prompt tokens of resumed jobs whose cache hit the engine never reported (the run was \
             cut again before its final usage, the only chunk with cached_tokens): what they \
             recomputed is unknown, at most this.",
        )
        .expect("valid counter");
        let made_room = HistogramVec::new(
            HistogramOpts::new(
                "tutor_gateway_preemption_admit_seconds",
                "Queue wait (joining the queue to admission) of requests a job was pre-empted for, by lane.",
            )
            .buckets(ADMIT_BUCKETS.to_vec()),
            &["lane"],
        )
        .expect("valid histogram");
        let after_ask = HistogramVec::new(
            HistogramOpts::new(
                "tutor_gateway_preemption_ask_admit_seconds",
                "First ask for a job to leave to admission, of requests a job was pre-empted for, \
                 by lane (the arrival-to-admission time less the wait before any job could be \
                 asked).",
            )
            .buckets(ADMIT_BUCKETS.to_vec()),
            &["lane"],
        )
        .expect("valid histogram");
        for lane in Lane::ALL {
            made_room.with_label_values(&[lane.as_str()]);
            after_ask.with_label_values(&[lane.as_str()]);
            for reason in ["seat", "tokens", "prefill", "pressure"] {
                preemptions.with_label_values(&[lane.as_str(), reason]);
            }
        }
        let engine_down = prometheus::IntGauge::new(
            "tutor_gateway_jobs_engine_down",
            "1 while this replica starts no job because the engine is not ready (queued jobs \
             wait for it instead of failing one after another).",
        )
        .expect("valid gauge");
        let engine_cuts = prometheus::IntCounter::new(
            "tutor_gateway_job_engine_cuts_total",
            "Job runs cut by the engine (unreachable, 5xx, a cut stream, a timeout) that the \
             job went on from once the engine was ready (jobs.engine_retries).",
        )
        .expect("valid counter");
        for c in [
            Box::new(engine_down.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(engine_cuts.clone()),
            Box::new(jobs.clone()),
            Box::new(wait.clone()),
            Box::new(run.clone()),
            Box::new(webhooks.clone()),
            Box::new(preemptions.clone()),
            Box::new(recomputed.clone()),
            Box::new(unreported.clone()),
            Box::new(made_room.clone()),
            Box::new(after_ask.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        Self {
            jobs,
            wait,
            run,
            webhooks,
            preemptions,
            recomputed,
            unreported,
            made_room,
            after_ask,
            engine_down,
            engine_cuts,
        }
    }

    /// A job's run was cut by the engine and the job goes on.
    pub fn engine_cut(&self) {
        self.engine_cuts.inc();
    }

    /// Whether this replica holds queued jobs back for the engine.
    pub fn engine_down(&self, down: bool) {
        self.engine_down.set(i64::from(down));
    }

    /// A job was asked to give its seat back to a `lane` request that lacked `reason`.
    pub fn preempted(&self, lane: Lane, reason: &str) {
        self.preemptions
            .with_label_values(&[lane.as_str(), reason])
            .inc();
    }

    /// A job resumed after a pre-emption at `stage` (`prefill` or `decode`) had `n` prompt
    /// tokens the prefix cache did not serve.
    pub fn recomputed(&self, stage: &str, n: u32) {
        self.recomputed
            .with_label_values(&[stage])
            .inc_by(u64::from(n));
    }

    /// A resumed run ended with `n` prompt tokens whose cache hit the engine never reported.
    pub fn unreported(&self, n: u32) {
        self.unreported.inc_by(u64::from(n));
    }

    /// A `lane` request that a job was pre-empted for was admitted `waited` after its arrival,
    /// `after_ask` after it first asked a job to leave.
    pub fn made_room(&self, lane: Lane, waited: Duration, after_ask: Duration) {
        self.made_room
            .with_label_values(&[lane.as_str()])
            .observe(waited.as_secs_f64());
        self.after_ask
            .with_label_values(&[lane.as_str()])
            .observe(after_ask.as_secs_f64());
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
