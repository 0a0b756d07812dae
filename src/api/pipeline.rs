//! One request through the pipeline: classify -> admit -> send upstream -> a [`Relay`].
//! Handlers parse and validate; everything after that happens here, the same for every route.

use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::time::Instant;

use super::{AppState, GatewayError};
use crate::classify::{Lane, PromptInput};
use crate::relay::{Clock, Format, Relay};
use crate::telemetry::Route;
use crate::upstream::{Endpoint, UpstreamRequest};

/// A validated request, ready for the pipeline.
#[derive(Debug)]
pub struct Job {
    /// Which API it came through.
    pub route: Route,
    /// Which vLLM endpoint serves it.
    pub endpoint: Endpoint,
    /// What gets counted for classification.
    pub input: PromptInput,
    /// The output limit the client declared, if any.
    pub max_tokens: Option<u32>,
    /// The JSON body to send upstream.
    pub body: Map<String, Value>,
    /// The client's W3C `traceparent`, propagated to vLLM.
    pub traceparent: Option<String>,
    /// When the gateway received it.
    pub arrival: Instant,
    /// The gateway's request id (also vLLM's, and the client's `x-request-id`).
    pub request_id: String,
}

/// A new gateway request id: 32 hex characters, safe as a header value and in URLs.
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Runs `job` until the upstream stream starts. Failures are counted in
/// `tutor_gateway_requests_total` here; the relay counts everything after.
pub async fn start(state: &AppState, job: Job, format: Format) -> Result<Relay, GatewayError> {
    let route = job.route;
    let request_id = job.request_id.clone();
    let mut lane = None;
    let result = run(state, job, format, &mut lane).await;
    if let Err(e) = &result {
        tracing::info!(%request_id, route = route.as_str(), lane = lane.map_or("none", Lane::as_str), code = e.code(), error = %e, "request rejected");
        state.metrics().request_done(lane, route, e.outcome());
    }
    result
}

async fn run(
    state: &AppState,
    mut job: Job,
    format: Format,
    lane: &mut Option<Lane>,
) -> Result<Relay, GatewayError> {
    let class = state
        .classifier()
        .classify(Arc::new(job.input), job.max_tokens)
        .await?;
    *lane = Some(class.lane);
    if job.max_tokens.is_none() {
        // The reservation counts `output_budget` tokens of output: make vLLM keep to it.
        job.body
            .insert("max_tokens".into(), Value::from(class.output_budget));
    }
    let guard = state.admission().acquire(class.lane, class.work).await?;
    let clock = Clock {
        arrival: job.arrival,
        admitted: Instant::now(),
        queue_wait: guard.queue_wait(),
    };
    let upstream = state
        .upstream()
        .stream(UpstreamRequest {
            endpoint: job.endpoint,
            request_id: job.request_id.clone(),
            traceparent: job.traceparent,
            body: job.body,
        })
        .await?;
    tracing::debug!(request_id = %job.request_id, lane = %class.lane, work = class.work, exact = class.exact, "admitted");
    Ok(Relay::new(
        upstream,
        guard,
        class,
        job.route,
        format,
        state.metrics().clone(),
        clock,
    ))
}
