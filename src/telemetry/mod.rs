//! Telemetry: what is measured about each request and where it goes.
//!
//! - [`record`]: [`RequestRecord`], one per request, written once when it ends (or dropped:
//!   the client went away) into the metrics, the span and the request log.
//! - [`latency`]: the latency split (queue wait, TTFT, prefill, decode) computed from timestamps.
//! - [`metrics`]: the Prometheus families ([`Metrics`], no globals).
//! - [`span`]: the `llm.generate` span and its attribute names.
//! - [`request_log`]: one JSON line per finished request.
//! - [`job_metrics`]: background jobs (`tutor_gateway_jobs{status}`, wait, run, webhooks).
//! - [`prefix_metrics`], [`drift`]: per-fingerprint prefix-cache metrics and drift (M18, M19).
//! - [`estimate_metrics`]: the input estimate against the engine's count (M12).
//! - [`focus_metrics`]: focusing course code on its stack trace (M11).
//! - [`replica_metrics`]: each vLLM replica's traffic, health and prefix hits.
//! - [`ttft_window`], [`step_window`]: the lanes' recent first tokens and the engine's recent
//!   steps as streams saw them (the autopilot's inputs).
//! - [`otel`]: logging and OpenTelemetry set-up, W3C trace-context propagation.
//! - `text`: [`printable`], client- or engine-supplied text made safe to log (a leaf).
//!
//! Telemetry takes plain values ([`UpstreamView`], [`AdmissionSnapshot`]) and imports neither
//! admission nor upstream (checked by `tests/layering.rs`).

pub mod admission_rate;
pub mod autopilot_metrics;
pub mod cached_prefix;
pub mod config_metrics;
pub mod drift;
pub mod estimate_metrics;
pub mod focus_metrics;
pub mod job_metrics;
pub mod latency;
mod metrics;
pub mod otel;
pub mod panic;
pub mod piece_metrics;
pub mod prefix_metrics;
pub mod promotion_metrics;
pub mod quota_metrics;
pub mod record;
mod registered;
pub mod relay_metrics;
pub mod replica_metrics;
pub mod request_log;
mod snapshot;
pub mod span;
pub mod step_window;
mod text;
pub mod throttle;
pub mod ttft_window;

pub use admission_rate::Line;
pub use config_metrics::ConfigMetrics;
pub use job_metrics::JobMetrics;
pub use latency::{EngineTimings, LatencySplit, Mark, PromptUsage, StageSplit, UpstreamView};
pub use metrics::{Metrics, Outcome, Route, Stage};
pub use prefix_metrics::PrefixMetrics;
pub use promotion_metrics::PromotionMetrics;
pub use quota_metrics::QuotaMetrics;
pub use record::{RequestRecord, INVALID_API_KEY};
pub use relay_metrics::RelayMetrics;
pub use replica_metrics::ReplicaMetrics;
pub use request_log::RequestLog;
pub use snapshot::{AdmissionSnapshot, LaneSnapshot};
pub use text::printable;
