//! One request's journey, in order. Every route runs the same steps:
//!
//! 1. **parse** ([`parse`]): body or query checked, each problem named by its field;
//! 2. **prompt** ([`prompt`]): the body vLLM will see (course prefix first, canonical tools);
//! 3. **classify** ([`crate::classify`]): estimated work -> first lane, then the continuation
//!    choice for a session ([`crate::classify::LaneRules`]);
//! 4. **admit** ([`crate::admission`]): a seat and a token reservation, held by a
//!    [`crate::admission::LaneGuard`];
//! 5. **send** ([`crate::upstream`]): the streaming request to vLLM;
//! 6. **relay** ([`crate::relay`]): the stream back to the client, counted and bounded, which
//!    owns the guard until the end.
//!
//! The handlers in [`crate::api`] only extract what axum gives them and call [`answer`] or
//! [`openai`]. A failure before the stream begins becomes its HTTP status here
//! ([`respond::rejected`]); after that the relay renders it in the stream.

pub mod parse;
pub mod prompt;
pub mod reload;
pub mod respond;
mod state;
pub mod tokenize;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::Query;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

pub use state::{new_request_id, AppState, Overrides};

use crate::admission::session::{SessionHold, SessionId};
use crate::admission::LaneGuard;
use crate::classify::Classification;
use crate::classify::PromptInput;
use crate::error::GatewayError;
use crate::lane::Lane;
use crate::prompt::fingerprint_of_chat;
use crate::prompt::focus::Focus;
use crate::relay::{ClientLimits, Format, Relay, RelayContext};
use crate::telemetry::{Mark, RequestRecord, Route};
use crate::upstream::{Endpoint, UpstreamRequest};
use parse::{AnswerQuery, AnswerRequest, OpenAiRequest};
use respond::{link_trace, rejected, sse_response, with_id};

/// The tenant a request's API key belongs to (`[auth]`); set by the auth layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// A validated request, ready for classification.
#[derive(Debug)]
pub struct Prepared {
    /// Which vLLM endpoint serves it.
    pub endpoint: Endpoint,
    /// What gets counted for classification.
    pub input: PromptInput,
    /// The output limit the client declared, if any.
    pub max_tokens: Option<u32>,
    /// The JSON body to send upstream.
    pub body: Map<String, Value>,
    /// The session this request continues (`/answer` `session_id`, `/v1` `x-session-id`).
    pub session: Option<SessionId>,
    /// Bytes of the request as received (body or query): what it holds while queued.
    pub size: usize,
    /// Background work (a job): runs in the large lane, out of idle capacity.
    pub background: bool,
    /// Whose request it is: its turn in a lane's queue is fair between tenants.
    pub tenant: Option<Tenant>,
    /// What focusing did to a course request's code (M11); `None` without code.
    pub focus: Option<Focus>,
}

/// How an `/answer` request arrived.
#[derive(Debug)]
pub enum AnswerInput {
    /// `GET /answer?prompt=…` (browser `EventSource`).
    Query(Result<Query<AnswerQuery>, QueryRejection>),
    /// `POST /answer` with JSON.
    Body(Result<Bytes, BytesRejection>),
}

/// Where a large `/answer` that waited `jobs.divert_large_after_ms` for its seat goes instead:
/// the job service, which takes the classified request and answers with its id and URLs. On
/// failure (the job store is full) it has written the request's record.
pub trait Divert: Send + Sync {
    /// Whether a job of `bytes` would be taken now (when not, the request keeps its place).
    fn has_room(&self, bytes: usize) -> bool;

    /// Takes `ready` and its `record` as a job: its id and URLs, or the request back (the job
    /// store was full, or could not be reached), which then keeps its place in the queue.
    fn divert(
        &self,
        ready: Ready,
        record: RequestRecord,
    ) -> futures::future::BoxFuture<'_, Result<Value, Box<NotTaken>>>;
}

/// A request a [`Divert`] did not take, given back with the reason.
#[derive(Debug)]
pub struct NotTaken {
    /// The request.
    pub ready: Ready,
    /// Its record.
    pub record: RequestRecord,
    /// Why it was not taken.
    pub error: GatewayError,
}

/// What [`start`] made of a request: its stream, or the job it became.
#[derive(Debug)]
// Made and taken apart once per request, as the `Result<Relay, _>` before it.
#[allow(clippy::large_enum_variant)]
pub enum Started {
    /// Admitted and sent: the stream to relay.
    Relay(Relay),
    /// Waited `jobs.divert_large_after_ms` and became a job: its id and URLs.
    Job(Value),
}

/// `/answer`: the whole journey, ending in the typed SSE stream (or an HTTP error before it).
/// With `divert`, a large request that waits too long becomes a job (a `job` event).
///
/// A request carrying `Last-Event-ID` is an `EventSource` reconnecting after its stream ended:
/// `/answer` streams are never resumed or started again, so it gets 204, which tells the
/// browser to stop reconnecting.
pub async fn answer(
    state: AppState,
    headers: HeaderMap,
    input: AnswerInput,
    divert: Option<&dyn Divert>,
    tenant: Option<Tenant>,
) -> Response {
    if headers.contains_key("last-event-id") {
        return StatusCode::NO_CONTENT.into_response();
    }
    let mut record = state.record(Route::Answer);
    link_trace(&mut record, &headers);
    let request_id = record.request_id().to_owned();
    let mut size = 0;
    let req = match input {
        AnswerInput::Query(q) => q.map_err(GatewayError::from).and_then(|Query(q)| {
            size = q.prompt.len();
            AnswerRequest::from_query(q)
        }),
        AnswerInput::Body(body) => parse::body_bytes(body, state.config().server.max_body_bytes)
            .and_then(|b| {
                size = b.len();
                AnswerRequest::from_body(&b)
            }),
    };
    let req = match req {
        Ok(r) => r,
        Err(e) => return rejected(record, e),
    };
    let prepared = match prompt::answer_request(&state, req).await {
        Ok(p) => Prepared { size, tenant, ..p },
        Err(e) => return rejected(record, e),
    };
    match start(&state, prepared, record, Format::Answer, divert).await {
        Ok(Started::Relay(relay)) => with_id(
            sse_response(Body::from_stream(relay.into_sse(
                state.upstream().tasks(),
                ClientLimits::from_config(&state.config().server),
            ))),
            &request_id,
        ),
        Ok(Started::Job(job)) => {
            let id = job["id"].as_str().unwrap_or_default();
            let event = format!("id: job:{id}\nevent: job\ndata: {job}\n\n");
            with_id(sse_response(Body::from(event)), &request_id)
        }
        Err(e) => with_id(e.into_response(), &request_id),
    }
}

/// `/v1/chat/completions` and `/v1/completions`: the whole journey. Streaming answers relay
/// vLLM's chunks as they are; non-streaming answers are assembled from the stream in vLLM's
/// response shape.
pub async fn openai(
    state: AppState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    route: Route,
    tenant: Option<Tenant>,
) -> Response {
    let mut record = state.record(route);
    link_trace(&mut record, &headers);
    let request_id = record.request_id().to_owned();
    let config = state.config();
    let rules = parse::FieldRules::of(&config);
    let mut size = 0;
    let parsed = parse::body_bytes(body, config.server.max_body_bytes).and_then(|b| {
        size = b.len();
        match route {
            Route::Completions => parse::completion(&b, rules),
            Route::ChatCompletions | Route::Answer | Route::Job => parse::chat(&b, rules),
        }
    });
    let req: OpenAiRequest = match parsed {
        Ok(r) => r,
        Err(e) => return rejected(record, e),
    };
    let format = Format::OpenAi {
        include_usage: req.include_usage,
        continuous_usage: req.continuous_usage,
    };
    let stream = req.stream;
    let prepared = match prompt::openai_request(&state, route, &headers, req) {
        Ok(p) => Prepared { size, tenant, ..p },
        Err(e) => return rejected(record, e),
    };
    let relay = match start(&state, prepared, record, format, None).await {
        Ok(Started::Relay(r)) => r,
        // Not asked for: `/v1` requests are never diverted.
        Ok(Started::Job(job)) => {
            return with_id(
                (StatusCode::ACCEPTED, axum::Json(job)).into_response(),
                &request_id,
            )
        }
        Err(e) => return with_id(e.into_response(), &request_id),
    };
    let resp = if stream {
        sse_response(Body::from_stream(relay.into_sse(
            state.upstream().tasks(),
            ClientLimits::from_config(&state.config().server),
        )))
    } else {
        match relay.collect().await {
            Ok(all) => axum::Json(all.into_json(route)).into_response(),
            Err(e) => e.into_response(),
        }
    };
    with_id(resp, &request_id)
}

/// Classify, admit and send `prepared`, until the upstream stream starts. With `divert`, a
/// large request still waiting for its seat after `jobs.divert_large_after_ms` leaves the queue
/// and becomes a job instead. A failure is written to the request's `record` (id, route,
/// arrival; written when it ends) here; the relay writes it after that. A client that goes away
/// meanwhile drops the record, which counts it as cancelled where it was.
pub async fn start(
    state: &AppState,
    prepared: Prepared,
    mut record: RequestRecord,
    format: Format,
    divert: Option<&dyn Divert>,
) -> Result<Started, GatewayError> {
    let ready = match ready(state, prepared, &mut record).await {
        Ok(r) => r,
        Err(e) => return Err(refused(record, e)),
    };
    // While it waits for a seat its body is held: all queued bodies together are bounded.
    let held = match state.queued_bytes().hold(ready.size) {
        Ok(h) => h,
        Err(e) => return Err(refused(record, e)),
    };
    let tenant = ready.tenant.clone();
    let acquire = state.admission().acquire_for(
        ready.class.lane,
        ready.class.work,
        ready.prefill,
        tenant.as_ref().map(|t| t.0.as_str()),
    );
    tokio::pin!(acquire);
    let deadline = match divert {
        Some(d) if ready.class.lane == Lane::Large => state
            .config()
            .jobs
            .divert_large_after
            .map(|after| (after, d)),
        _ => None,
    };
    let (ready, record, guard) = match deadline {
        // Leaving the queue on the deadline is cancel-safe: the waiter is taken out.
        Some((after, d)) => match tokio::time::timeout(after, &mut acquire).await {
            Ok(guard) => (ready, record, guard),
            Err(_) if d.has_room(ready.size) => {
                tracing::info!(request_id = %record.request_id(), "diverting to a job after waiting");
                // The place in the queue is kept (the acquire is not dropped) until the job
                // store has taken the request.
                match d.divert(ready, record).await {
                    Ok(job) => return Ok(Started::Job(job)),
                    Err(back) => {
                        let NotTaken {
                            ready,
                            record,
                            error,
                        } = *back;
                        tracing::info!(request_id = %record.request_id(), code = error.code(), "not diverted; it keeps its place");
                        (ready, record, acquire.await)
                    }
                }
            }
            // No room for a job: keep the place in the queue.
            Err(_) => (ready, record, acquire.await),
        },
        None => (ready, record, acquire.await),
    };
    drop(held);
    match guard {
        Ok(guard) => send(state, ready, guard, record, format)
            .await
            .map(Started::Relay),
        Err(e) => Err(refused(record, e.into())),
    }
}

/// A request classified and shaped for the engine, not yet admitted: what admission needs
/// (`class.lane`, `class.work`, `prefill`) and what [`send`] sends.
#[derive(Debug)]
pub struct Ready {
    endpoint: Endpoint,
    body: Map<String, Value>,
    /// Lane, work (the token reservation) and estimates.
    pub class: Classification,
    /// The prefill reservation: the input estimate, less what its prefix usually finds cached.
    pub prefill: u32,
    /// Bytes of the request as received.
    pub size: usize,
    /// The session's reservation: settled by the relay, given back on any failure (drop).
    hold: Option<SessionHold>,
    /// Whose request it is.
    tenant: Option<Tenant>,
    /// The replica routing key: the prefix fingerprint of a prompt with a stable prefix.
    affinity: Option<String>,
    /// The `focus` object of the `/answer` `meta` event (M11).
    focus: Option<Value>,
}

impl Ready {
    /// Whose request it is.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// What a job in a shared store keeps of it, so that any replica can send it: the engine's
    /// endpoint and body, the classification, the prefill reservation, the size and the
    /// tenant. Not the session's reservation: it is given back at submission (the stored job
    /// is settled without it wherever it runs).
    pub fn stored(&self) -> Value {
        let c = &self.class;
        serde_json::json!({
            "endpoint": self.endpoint.path(),
            "body": self.body,
            "lane": c.lane.as_str(),
            "input_tokens_estimate": c.input_tokens_estimate,
            "output_budget": c.output_budget,
            "work": c.work,
            "exact": c.exact,
            "prefill": self.prefill,
            "size": self.size,
            "tenant": self.tenant.as_ref().map(|t| &t.0),
            "affinity": self.affinity,
        })
    }

    /// A request [`Ready::stored`] kept; `None` when `v` is not one.
    pub fn from_stored(v: &Value) -> Option<Ready> {
        let endpoint = [Endpoint::ChatCompletions, Endpoint::Completions]
            .into_iter()
            .find(|e| v["endpoint"].as_str() == Some(e.path()))?;
        let lane = Lane::ALL
            .into_iter()
            .find(|l| v["lane"].as_str() == Some(l.as_str()))?;
        let n = |k: &str| v[k].as_u64().and_then(|n| u32::try_from(n).ok());
        Some(Ready {
            endpoint,
            body: v["body"].as_object()?.clone(),
            class: Classification {
                lane,
                input_tokens_estimate: n("input_tokens_estimate")?,
                output_budget: n("output_budget")?,
                work: n("work")?,
                exact: v["exact"].as_bool()?,
            },
            prefill: n("prefill")?,
            size: v["size"].as_u64()? as usize,
            hold: None,
            tenant: v["tenant"].as_str().map(|t| Tenant(t.to_owned())),
            affinity: v["affinity"].as_str().map(str::to_owned),
            focus: None,
        })
    }
}

/// Classifies `prepared` (estimated work, then the continuation choice for a session) and
/// shapes its body for the engine. `background` work (jobs) runs in the large lane whatever its
/// size, and at the engine priority of that lane.
pub async fn ready(
    state: &AppState,
    prepared: Prepared,
    record: &mut RequestRecord,
) -> Result<Ready, GatewayError> {
    let Prepared {
        endpoint,
        input,
        max_tokens,
        mut body,
        session,
        size,
        background,
        tenant,
        focus,
    } = prepared;
    if let Some(t) = &tenant {
        record.tenant(&t.0);
    }
    if let Some(f) = &focus {
        state.metrics().focus().observe(f);
        record.focused(f.outcome.as_str(), f.saved());
    }
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&state.config().upstream.model)
        .to_owned();
    record.requested(&model, max_tokens);
    record.mark(Mark::Parsed);
    let fingerprint = match &input {
        PromptInput::Chat { messages, .. } => {
            Some(fingerprint_of_chat(messages, body.get("tools")))
        }
        _ => None,
    };
    // Only a stable prefix (a system prompt or tools) is worth keeping on one replica.
    let affinity = match &input {
        PromptInput::Chat { messages, .. }
            if messages.first().is_some_and(|m| m.role == "system")
                || body.get("tools").is_some_and(|t| !t.is_null()) =>
        {
            fingerprint.clone()
        }
        _ => None,
    };
    if let Some(fp) = &fingerprint {
        record.fingerprint(fp.clone());
    }
    // Classify: the first lane by estimated work...
    let mut class = state
        .classifier()
        .classify(Arc::new(input), max_tokens)
        .await?;
    // ...then the continuation choice: a "continue" chain is one piece of work. The declared
    // output counts toward the session from now on (parallel continues see it).
    let mut hold: Option<SessionHold> = None;
    if let Some(session) = session {
        let (before, h) = state.sessions().reserve(session, class.output_budget).await;
        hold = Some(h);
        let lane = state.rules().for_continuation(class.lane, before);
        if lane != class.lane {
            state.metrics().promotion().reclassified(class.lane, lane);
            class.lane = lane;
        }
    }
    if background {
        class.lane = Lane::Large;
    }
    record.classified(class);
    record.mark(Mark::Classified);
    let output_cap = match max_tokens {
        Some(_) => None,
        None => {
            state
                .rules()
                .output_cap(class.lane, class.input_tokens_estimate, class.output_budget)
        }
    };
    prompt::for_engine(
        &mut body,
        class.lane,
        state.config().admission.engine_priority,
        output_cap,
    );
    let prefill = prefill_estimate(state, class.input_tokens_estimate, fingerprint.as_deref());
    Ok(Ready {
        endpoint,
        body,
        class,
        prefill,
        size,
        hold,
        tenant,
        affinity,
        focus: focus.map(|f| f.meta()),
    })
}

/// Sends `ready`, admitted under `guard` (a seat and the token reservation, given back when
/// the guard drops, and the prefill reservation, given back at the first token), and hands
/// the stream to a [`Relay`], which owns the guard from here to the end.
pub async fn send(
    state: &AppState,
    ready: Ready,
    guard: LaneGuard,
    mut record: RequestRecord,
    format: Format,
) -> Result<Relay, GatewayError> {
    let Ready {
        endpoint,
        body,
        class,
        hold,
        affinity,
        focus,
        ..
    } = ready;
    record.admitted(guard.queue_wait(), guard.prefill());
    if let Some(waited) = guard.prefill_wait() {
        record.prefill_waited(waited);
    }
    let request = UpstreamRequest {
        endpoint,
        request_id: record.request_id().to_owned(),
        traceparent: record.upstream_traceparent(),
        body,
        affinity,
    };
    let upstream = match state.upstream().stream(request).await {
        Ok(upstream) => upstream,
        Err(e) => return Err(refused(record, e.into())),
    };
    record.mark(Mark::Sent);
    tracing::debug!(request_id = %record.request_id(), lane = %class.lane, work = class.work, exact = class.exact, "admitted");
    let ctx = RelayContext {
        rules: state.rules(),
        metrics: state.metrics().clone(),
        session: hold,
        focus,
    };
    Ok(Relay::new(upstream, guard, class, format, record, ctx))
}

/// Writes a failure before the stream began to `record`, and passes it on.
pub fn refused(mut record: RequestRecord, e: GatewayError) -> GatewayError {
    tracing::info!(request_id = %record.request_id(), code = e.code(), error = %e.log_summary(), "request rejected");
    record.finish(e.outcome(), Some(e.code()), None);
    e
}

/// The prefill reservation of a prompt estimated at `input` tokens: the estimate, less the
/// prompt tokens its prefix `fingerprint` lately found in vLLM's prefix cache when
/// `admission.prefill_discount_cached` is on (a cached course prefix costs next to no prefill).
fn prefill_estimate(state: &AppState, input: u32, fingerprint: Option<&str>) -> u32 {
    match fingerprint {
        Some(fp) if state.config().admission.prefill_discount_cached => {
            input.saturating_sub(state.metrics().prefix().expected_cached(fp))
        }
        _ => input,
    }
}
