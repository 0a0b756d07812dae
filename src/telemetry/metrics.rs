//! Prometheus series of the gateway. Names are a public contract (dashboards, alerts); every
//! series is listed in `docs/operations.md`.
//!
//! - `tutor_gateway_lane_in_flight{lane}`, `tutor_gateway_lane_reserved_tokens{lane}`,
//!   `tutor_gateway_lane_queue_depth{lane}`: gauges read from admission at scrape time.
//! - `tutor_gateway_requests_total{lane,route,outcome}`: every request once, when it ends.
//!   `lane="none"` for requests rejected before classification (bad input).
//! - `tutor_gateway_cancelled_after_tokens{lane}`: output tokens relayed before the client went
//!   away (M21).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::admission::AdmissionSnapshot;
use crate::classify::Lane;

/// Which API a request came through (the `route` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/answer` (SSE for the tutoring frontend).
    Answer,
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/completions`.
    Completions,
}

impl Route {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Route::Answer => "answer",
            Route::ChatCompletions => "chat_completions",
            Route::Completions => "completions",
        }
    }
}

/// How a request ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Streamed to the end.
    Ok,
    /// The client went away first.
    Cancelled,
    /// Rejected: malformed or invalid input.
    BadRequest,
    /// Rejected: longer than the model's maximum length.
    TooLong,
    /// Rejected: the lane's queue was full (429).
    QueueFull,
    /// Waited the lane's queue timeout without a slot (503).
    QueueTimeout,
    /// The engine could not be reached (503).
    UpstreamUnavailable,
    /// The engine stalled: first-token, idle or total timeout (504).
    UpstreamTimeout,
    /// The engine answered an error, or spoke garbage (502, or vLLM's own 4xx).
    UpstreamError,
    /// A bug in the gateway (500).
    Internal,
}

impl Outcome {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Cancelled => "cancelled",
            Outcome::BadRequest => "bad_request",
            Outcome::TooLong => "too_long",
            Outcome::QueueFull => "queue_full",
            Outcome::QueueTimeout => "queue_timeout",
            Outcome::UpstreamUnavailable => "upstream_unavailable",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Internal => "internal",
        }
    }
}

/// The gateway's metric families, registered once.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    lane_in_flight: IntGaugeVec,
    lane_reserved_tokens: IntGaugeVec,
    lane_queue_depth: IntGaugeVec,
    requests: IntCounterVec,
    cancelled_after_tokens: HistogramVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family in a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["lane"]).expect("valid gauge");
            registry
                .register(Box::new(g.clone()))
                .expect("registered once");
            g
        };
        let lane_in_flight = gauge(
            "tutor_gateway_lane_in_flight",
            "Requests admitted and not yet finished, per lane.",
        );
        let lane_reserved_tokens = gauge(
            "tutor_gateway_lane_reserved_tokens",
            "Tokens reserved by admitted requests (input estimate + output budget), per lane.",
        );
        let lane_queue_depth = gauge(
            "tutor_gateway_lane_queue_depth",
            "Requests waiting for admission, per lane.",
        );
        let requests = IntCounterVec::new(
            Opts::new(
                "tutor_gateway_requests_total",
                "Requests by lane, route and how they ended.",
            ),
            &["lane", "route", "outcome"],
        )
        .expect("valid counter");
        registry
            .register(Box::new(requests.clone()))
            .expect("registered once");
        let cancelled_after_tokens = HistogramVec::new(
            HistogramOpts::new(
                "tutor_gateway_cancelled_after_tokens",
                "Output tokens relayed before the client disconnected.",
            )
            .buckets(vec![
                0.0, 1.0, 8.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
            ]),
            &["lane"],
        )
        .expect("valid histogram");
        registry
            .register(Box::new(cancelled_after_tokens.clone()))
            .expect("registered once");
        Self {
            registry,
            lane_in_flight,
            lane_reserved_tokens,
            lane_queue_depth,
            requests,
            cancelled_after_tokens,
        }
    }

    /// Counts one finished request.
    pub fn request_done(&self, lane: Option<Lane>, route: Route, outcome: Outcome) {
        let lane = lane.map_or("none", Lane::as_str);
        self.requests
            .with_label_values(&[lane, route.as_str(), outcome.as_str()])
            .inc();
    }

    /// Records a client disconnect after `tokens` output tokens.
    pub fn cancelled_after(&self, lane: Lane, tokens: u32) {
        self.cancelled_after_tokens
            .with_label_values(&[lane.as_str()])
            .observe(f64::from(tokens));
    }

    /// Requests counted with these labels so far (for tests and the soak check).
    pub fn requests_count(&self, lane: Option<Lane>, route: Route, outcome: Outcome) -> u64 {
        let lane = lane.map_or("none", Lane::as_str);
        self.requests
            .with_label_values(&[lane, route.as_str(), outcome.as_str()])
            .get()
    }

    /// The text exposition, with lane gauges taken from `admission` now.
    pub fn render(&self, admission: &AdmissionSnapshot) -> String {
        for lane in Lane::ALL {
            let s = admission.lane(lane);
            let l = [lane.as_str()];
            self.lane_in_flight
                .with_label_values(&l)
                .set(i64::from(s.in_flight));
            self.lane_reserved_tokens
                .with_label_values(&l)
                .set(s.reserved_tokens as i64);
            self.lane_queue_depth
                .with_label_values(&l)
                .set(i64::from(s.queue_depth));
        }
        let mut out = Vec::with_capacity(8 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}
