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

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;

use super::ctx::RequestCtx;
use super::parse;
use super::tenant::Tenant;
use crate::admission::Ask;
use crate::error::GatewayError;
use crate::lane::Lane;
use crate::upstream::RawResponse;

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
    let checked = parse::tokenize(&bytes, parse::FieldRules::of(config))?;
    let forwarded = serde_json::to_vec(&checked)
        .map_err(|e| GatewayError::bad_request(format!("cannot encode the body: {e}"), None))?;
    // While it waits for its seat its body is held, as any queued request's.
    let held = ctx.queued_bytes().hold(bytes.len())?;
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
