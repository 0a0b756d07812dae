//! The entries of a request's journey: [`answer`] (`/answer`) and [`openai`] (`/v1`). Each
//! takes the request's [`RequestCtx`] (the snapshot its route handler took at its arrival) and
//! passes it down the typed chain, each step consuming the value the one before made:
//!
//! parse (`AnswerRequest`, `OpenAiRequest`) -> [`prompt`] ([`Prepared`]) -> [`classify()`]
//! ([`Ready`]) -> [`admit()`] ([`Admitted`]) -> [`send()`] ([`crate::relay::Relay`], streaming).

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::Query;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::admit::{admit, Admit, Admitted, Divert};
use super::classify::{classify, Ready};
use super::ctx::RequestCtx;
use super::parse::{self, AnswerQuery, AnswerRequest, OpenAiRequest};
use super::prompt::{self, Prepared};
use super::respond::{answer_refused, link_trace, refused, rejected, sse_response, with_id};
use super::send::send;
use super::state::BytesHold;
use super::tenant::{Tenant, TenantSlot};
use crate::error::GatewayError;
use crate::relay::{ClientLimits, Format, Relay};
use crate::telemetry::{RequestRecord, Route};

/// How an `/answer` request arrived.
#[derive(Debug)]
pub enum AnswerInput {
    /// `GET /answer?prompt=…` (browser `EventSource`).
    Query(Result<Query<AnswerQuery>, QueryRejection>),
    /// `POST /answer` with JSON.
    Body(Result<Bytes, BytesRejection>),
}

/// `/answer`: the whole journey under `ctx`, ending in the typed SSE stream (or an HTTP error
/// before it). With `divert`, a large request that waits too long becomes a job (a `job`
/// event).
///
/// A request carrying `Last-Event-ID` is an `EventSource` reconnecting after its stream ended:
/// `/answer` streams are never resumed or started again, so it gets 204, which tells the
/// browser to stop reconnecting.
pub async fn answer(
    ctx: RequestCtx,
    headers: HeaderMap,
    input: AnswerInput,
    divert: Option<&dyn Divert>,
    tenant: Option<Tenant>,
) -> Response {
    if headers.contains_key("last-event-id") {
        return StatusCode::NO_CONTENT.into_response();
    }
    let slot = match ctx.tenant_request(tenant.as_ref()) {
        Ok(slot) => slot,
        Err(e) => return rejected(ctx.record(Route::Answer), e),
    };
    holding(
        answer_journey(ctx, headers, input, divert, tenant).await,
        slot,
    )
}

/// [`answer`] once its tenant's slot is held.
async fn answer_journey(
    ctx: RequestCtx,
    headers: HeaderMap,
    input: AnswerInput,
    divert: Option<&dyn Divert>,
    tenant: Option<Tenant>,
) -> Response {
    let mut record = ctx.record(Route::Answer);
    link_trace(&mut record, &headers);
    let request_id = record.request_id().to_owned();
    let mut size = 0;
    let mut queued = None;
    let req = match input {
        AnswerInput::Query(q) => q.map_err(GatewayError::from).and_then(|Query(q)| {
            size = q.prompt.len();
            AnswerRequest::from_query(q)
        }),
        AnswerInput::Body(body) => match read_and_hold(&ctx, body, tenant.as_ref()) {
            Ok((b, held)) => {
                size = held.bytes();
                queued = Some(held);
                ctx.off_workers(b, |_, b| AnswerRequest::from_body(b)).await
            }
            Err(e) => Err(e),
        },
    };
    let req = match req {
        Ok(r) => r,
        Err(e) => return rejected(record, e),
    };
    let deadline = match prompt::deadline_from(&headers) {
        Ok(d) => d,
        Err(e) => return rejected(record, e),
    };
    let preemptible = match prompt::preemptible_from(&headers) {
        Ok(marked) => ctx.config().jobs.preempt_answers.applies(marked),
        Err(e) => return rejected(record, e),
    };
    let prepared = match prompt::answer_request(&ctx, req, tenant.as_ref()).await {
        Ok(p) => Prepared {
            // The client's bytes and what its course added (`answer_request`).
            size: size.saturating_add(p.size),
            queued,
            tenant,
            deadline,
            preemptible,
            ..p
        },
        Err(e) => return rejected(record, e),
    };
    let started = match start(&ctx, prepared, record, Format::Answer, divert).await {
        Ok(s) => s,
        Err(e) => return with_id(answer_refused(e, &headers), &request_id),
    };
    match started {
        Started::Relay(relay) => with_id(sse_response(streamed(&ctx, relay)), &request_id),
        Started::Job(job) => {
            let id = job["id"].as_str().unwrap_or_default();
            let event = format!("id: job:{id}\nevent: job\ndata: {job}\n\n");
            with_id(sse_response(Body::from(event)), &request_id)
        }
    }
}

/// `/v1/chat/completions` and `/v1/completions`: the whole journey under `ctx`. Streaming
/// answers relay vLLM's chunks as they are; non-streaming answers are assembled from the stream
/// in vLLM's response shape.
pub async fn openai(
    ctx: RequestCtx,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    route: Route,
    tenant: Option<Tenant>,
) -> Response {
    let slot = match ctx.tenant_request(tenant.as_ref()) {
        Ok(slot) => slot,
        Err(e) => return rejected(ctx.record(route), e),
    };
    holding(
        openai_journey(ctx, headers, body, route, tenant).await,
        slot,
    )
}

/// `resp`, with `slot` (a tenant's request in flight) held until its body's last byte is taken
/// (streamed or whole), or the client goes away.
fn holding(resp: Response, slot: Option<TenantSlot>) -> Response {
    let Some(slot) = slot else { return resp };
    crate::relay::held::until_sent(resp, slot)
}

/// [`openai`] once its tenant's slot is held.
async fn openai_journey(
    ctx: RequestCtx,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    route: Route,
    tenant: Option<Tenant>,
) -> Response {
    let mut record = ctx.record(route);
    link_trace(&mut record, &headers);
    let request_id = record.request_id().to_owned();
    let mut size = 0;
    let mut queued = None;
    let parsed = match read_and_hold(&ctx, body, tenant.as_ref()) {
        Ok((b, held)) => {
            size = held.bytes();
            queued = Some(held);
            ctx.off_workers(b, move |ctx, b| {
                let rules = parse::FieldRules::of(ctx.config());
                match route {
                    Route::Completions => parse::completion(b, rules),
                    Route::ChatCompletions | Route::Answer | Route::Job => parse::chat(b, rules),
                }
            })
            .await
        }
        Err(e) => Err(e),
    };
    let req: OpenAiRequest = match parsed {
        Ok(r) => r,
        Err(e) => return rejected(record, e),
    };
    let format = Format::OpenAi {
        include_usage: req.include_usage,
        continuous_usage: req.continuous_usage,
    };
    let stream = req.stream;
    let forced_tool_call = req
        .body
        .get("tool_choice")
        .is_some_and(|c| c.is_object() || c.as_str() == Some("required"));
    let prepared = match prompt::openai_request(&ctx, route, &headers, req).and_then(|p| {
        Ok(Prepared {
            size,
            queued,
            tenant,
            deadline: prompt::deadline_from(&headers)?,
            ..p
        })
    }) {
        Ok(p) => p,
        Err(e) => return rejected(record, e),
    };
    let relay = match start(&ctx, prepared, record, format, None).await {
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
        sse_response(streamed(&ctx, relay))
    } else {
        match relay.collect().await {
            Ok(mut all) => {
                all.forced_tool_call = forced_tool_call;
                axum::Json(all.into_json(route)).into_response()
            }
            Err(e) => e.into_response(),
        }
    };
    with_id(resp, &request_id)
}

/// The body, read, and held in `server.max_queued_bytes` from now until its request is admitted
/// (its bytes and its parsed form's, [`parse::held_bytes`]): a body waiting for the blocking
/// pool to parse or count it is bounded like one waiting for a seat, not only while it arrives.
fn read_and_hold(
    ctx: &RequestCtx,
    body: Result<Bytes, BytesRejection>,
    tenant: Option<&Tenant>,
) -> Result<(Bytes, BytesHold), GatewayError> {
    let config = ctx.config();
    let b = parse::body_bytes(body, config.server.max_body_bytes)?;
    let bytes = parse::held_bytes(&b, config)?;
    let held = ctx
        .queued_bytes()
        .hold(tenant.map(|t| t.0.as_str()), bytes)?;
    Ok((b, held))
}

/// What [`start`] made of a request: its stream, or the job it became.
// Made and taken apart once per request.
#[allow(clippy::large_enum_variant)]
enum Started {
    Relay(Relay),
    Job(Value),
}

/// Classifies, admits and sends `prepared` under `ctx`, until the upstream stream starts. A
/// failure is written to the request's `record` (id, route, arrival; written when it ends) on
/// the way; the relay writes it after that.
async fn start(
    ctx: &RequestCtx,
    prepared: Prepared,
    mut record: RequestRecord,
    format: Format,
    divert: Option<&dyn Divert>,
) -> Result<Started, GatewayError> {
    let ready: Ready = match classify(ctx, prepared, &mut record).await {
        Ok(r) => r,
        Err(e) => return Err(refused(record, e)),
    };
    let admitted: Admitted = match admit(ctx, ready, record, divert).await? {
        Admit::Admitted(a) => a,
        Admit::Diverted(job) => return Ok(Started::Job(job)),
    };
    // A key revoked while its request waited: the seat its revoked stream gave back can come
    // to this request before the auth layer hears of the revocation. Refused here, its seat
    // back, before the engine sees it; recorded as ended by the revocation, as when the auth
    // layer answers first.
    if !super::tenant::caller_key_in_force() {
        let Admitted {
            guard, mut record, ..
        } = admitted;
        drop(guard);
        record.finish(
            crate::telemetry::Outcome::Cancelled,
            Some(crate::telemetry::INVALID_API_KEY),
            None,
        );
        return Err(GatewayError::Unauthorized(super::tenant::KEY_REVOKED));
    }
    send(ctx, admitted, format).await.map(Started::Relay)
}

/// The relay as an SSE body, with the client limits of the request's configuration.
fn streamed(ctx: &RequestCtx, relay: Relay) -> Body {
    Body::from_stream(relay.into_sse(
        ctx.upstream().tasks(),
        ClientLimits::from_config(&ctx.config().server),
        ctx.connection(),
    ))
}
