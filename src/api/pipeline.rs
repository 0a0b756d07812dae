//! One request through the pipeline: classify -> admit -> send upstream -> a [`Relay`].
//! Handlers parse and validate; everything after that happens here, the same for every route.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{AppState, GatewayError};
use crate::classify::PromptInput;
use crate::prompt::fingerprint_of_chat;
use crate::relay::{Format, Relay, RelayContext};
use crate::telemetry::RequestRecord;
use crate::upstream::{Endpoint, UpstreamRequest};

/// A validated request, ready for the pipeline.
#[derive(Debug)]
pub struct Job {
    /// Which vLLM endpoint serves it.
    pub endpoint: Endpoint,
    /// What gets counted for classification.
    pub input: PromptInput,
    /// The output limit the client declared, if any.
    pub max_tokens: Option<u32>,
    /// The JSON body to send upstream.
    pub body: Map<String, Value>,
    /// The request's measurements (id, route, arrival), written when it ends.
    pub record: RequestRecord,
    /// The session this request continues (`/answer` `session_id`, `/v1` `x-session-id`).
    pub session: Option<String>,
}

/// Asks vLLM for running usage on every chunk (`continuous_usage_stats`), so the relay counts
/// output tokens exactly mid-stream, even when vLLM packs several tokens into one chunk. The
/// relay strips it again for clients that did not ask for it.
fn count_tokens_exactly(body: &mut Map<String, Value>) {
    let opts = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !opts.is_object() {
        *opts = Value::Object(Map::new());
    }
    if let Some(o) = opts.as_object_mut() {
        o.insert("continuous_usage_stats".into(), Value::Bool(true));
    }
}

/// A new gateway request id: 32 hex characters, safe as a header value and in URLs.
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Runs `job` until the upstream stream starts. A failure is written to the request's record
/// here; the relay writes it after that. A client that goes away meanwhile drops the record,
/// which counts it as cancelled where it was.
pub async fn start(state: &AppState, job: Job, format: Format) -> Result<Relay, GatewayError> {
    let Job {
        endpoint,
        input,
        max_tokens,
        mut body,
        mut record,
        session,
    } = job;
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&state.config().upstream.model)
        .to_owned();
    record.requested(&model, max_tokens);
    if let PromptInput::Chat(messages) = &input {
        record.fingerprint(fingerprint_of_chat(messages, body.get("tools")));
    }
    let result = async {
        let mut class = state
            .classifier()
            .classify(Arc::new(input), max_tokens)
            .await?;
        if let Some(session) = &session {
            // A "continue" chain is one piece of work: its output so far picks the lane.
            let before = state.sessions().output(session).await;
            let lane = state.promotion().lane_for_session(class.lane, before);
            if lane != class.lane {
                state.metrics().promotion().reclassified(class.lane, lane);
                class.lane = lane;
            }
        }
        record.classified(class);
        count_tokens_exactly(&mut body);
        if state.config().admission.engine_priority {
            // Short work first in the engine too (vLLM `--scheduling-policy priority`).
            body.insert("priority".into(), Value::from(class.lane.index()));
        }
        // No max_tokens is added when the client sent none: the relay counts the output and
        // moves the request to a bigger lane (or cuts it) when it outgrows its lane.
        let guard = state.admission().acquire(class.lane, class.work).await?;
        record.admitted(guard.queue_wait());
        let request = UpstreamRequest {
            endpoint,
            request_id: record.request_id().to_owned(),
            traceparent: record.upstream_traceparent(),
            body,
        };
        let upstream = state.upstream().stream(request).await?;
        Ok::<_, GatewayError>((class, guard, upstream))
    }
    .await;
    match result {
        Ok((class, guard, upstream)) => {
            tracing::debug!(request_id = %record.request_id(), lane = %class.lane, work = class.work, exact = class.exact, "admitted");
            let ctx = RelayContext {
                promotion: *state.promotion(),
                metrics: state.metrics().clone(),
                session: session.map(|s| (state.sessions().clone(), s)),
            };
            Ok(Relay::new(upstream, guard, class, format, record, ctx))
        }
        Err(e) => {
            tracing::info!(request_id = %record.request_id(), code = e.code(), error = %e, "request rejected");
            record.finish(e.outcome(), Some(e.code()), None);
            Err(e)
        }
    }
}
