//! `POST /tokenize`: vLLM's tokenizer, for clients written for vLLM (benchmark clients count
//! tokens with it). It renders the chat template and may fetch media like a generation request
//! does, so it goes through the same steps, smaller:
//!
//! 1. **parse** ([`parse::tokenize`]): the body checked as `/v1` checks it (`chat_template`
//!    refused, messages and media URLs checked, fields read as vLLM reads them);
//! 2. **admit**: a seat in the small lane with one token reserved (no prefill: the engine
//!    computes nothing), waited for in the small lane's queue like any small request (its
//!    queue timeout and size apply), so tokenizing is inside admission and bounded by the
//!    small lane's seats;
//! 3. **send**: the checked body to vLLM's `/tokenize`, the seat held until vLLM answers.
//!
//! The gateway asks `/tokenize` itself too ([`engine_count`]): with `classify.exact_count =
//! "near_limits"`, a request whose estimate comes near a lane boundary or `max_model_len`
//! takes the engine's exact count (`crate::classify`). That call is part of classifying the
//! request, made at most once per request, before admission, within
//! `classify.exact_count_timeout_ms`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use serde_json::{Map, Value};

use super::ctx::RequestCtx;
use super::parse;
use super::tenant::Tenant;
use crate::admission::Ask;
use crate::error::GatewayError;
use crate::lane::Lane;
use crate::telemetry::estimate_metrics::EstimateMetrics;
use crate::upstream::{Endpoint, RawResponse, UpstreamClient};

/// Tokens a `/tokenize` call reserves in the small lane: a seat's worth of bookkeeping, since
/// no tokens are generated.
const RESERVED_TOKENS: u32 = 1;

/// Checks `body`, waits for a small-lane seat for `tenant`, and answers vLLM's tokenizer
/// response (relayed as it is), or the error to send; all under the request's `ctx`.
pub async fn tokenize(
    ctx: RequestCtx,
    body: Result<Bytes, BytesRejection>,
    tenant: Option<Tenant>,
) -> Result<RawResponse, GatewayError> {
    let config = ctx.config();
    let bytes = parse::body_bytes(body, config.server.max_body_bytes)?;
    // Held from now (its text and parsed form) until its seat: the parse waits too.
    let held = ctx.queued_bytes().hold(
        tenant.as_ref().map(|t| t.0.as_str()),
        parse::held_bytes(&bytes, config)?,
    )?;
    let checked = ctx
        .off_workers(bytes.clone(), |ctx, b| {
            parse::tokenize(b, parse::FieldRules::of(ctx.config()))
        })
        .await?;
    let forwarded = serde_json::to_vec(&checked).map_err(|e| {
        GatewayError::Classify(crate::classify::ClassifyError::Internal(format!(
            "cannot encode the body: {e}"
        )))
    })?;
    drop(bytes);
    let guard = ctx
        .admission()
        .acquire(
            Ask::new(Lane::Small, RESERVED_TOKENS)
                .for_tenant(tenant.as_ref().map(|t| t.0.as_str())),
        )
        .await?;
    drop(held);
    let answer = ctx.upstream().tokenize(forwarded.into()).await;
    drop(guard);
    Ok(answer?)
}

/// The `/tokenize` body for what `body` renders on `endpoint`: the model, and the messages with
/// what the template renders besides them (`tools`, `chat_template_kwargs`,
/// `add_generation_prompt`, `continue_final_message`, as vLLM's `TokenizeChatRequest` takes
/// them), or the prompt; with `add_special_tokens` (a BOS more or less shifts every id; both
/// of vLLM's tokenize requests take it, with the defaults of the requests they stand for).
/// `None` for a prompt that is not text.
pub fn tokenize_body(endpoint: Endpoint, body: &Map<String, Value>) -> Option<Bytes> {
    let mut out = Map::new();
    let keys: &[&str] = match endpoint {
        Endpoint::ChatCompletions => &[
            "model",
            "messages",
            "tools",
            "chat_template_kwargs",
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
        ],
        Endpoint::Completions => {
            body.get("prompt").filter(|p| p.is_string())?;
            &["model", "prompt", "add_special_tokens"]
        }
    };
    for key in keys {
        if let Some(v) = body.get(*key).filter(|v| !v.is_null()) {
            out.insert((*key).to_owned(), v.clone());
        }
    }
    serde_json::to_vec(&out).ok().map(Bytes::from)
}

/// The engine's prompt count for `body` (a [`tokenize_body`]), within `timeout`; `None` (and
/// the estimate stands) on an error, a timeout or an answer without `count`. Counted in
/// `tutor_gateway_exact_counts_total{outcome}`.
pub async fn engine_count(
    upstream: UpstreamClient,
    body: Bytes,
    timeout: Duration,
    metrics: EstimateMetrics,
) -> Option<u32> {
    let (outcome, count) = upstream.prompt_count(body, timeout).await;
    metrics.exact_count(outcome);
    count
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn sent(endpoint: Endpoint, body: Value) -> Value {
        let bytes = tokenize_body(endpoint, body.as_object().unwrap()).unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// A BOS more (`add_special_tokens`) shifts every id: the ids asked for are the prompt's
    /// own only with it (prefill pieces would otherwise never be found cached).
    #[test]
    fn the_tokenize_body_carries_what_changes_the_ids() {
        let chat = sent(
            Endpoint::ChatCompletions,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "add_special_tokens": true, "max_tokens": 5, "stream": true}),
        );
        assert_eq!(
            chat,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "add_special_tokens": true})
        );
        let completion = sent(
            Endpoint::Completions,
            json!({"model": "m", "prompt": "hi", "add_special_tokens": false}),
        );
        assert_eq!(
            completion,
            json!({"model": "m", "prompt": "hi", "add_special_tokens": false})
        );
    }
}
