//! Prefilling a long prompt in pieces (`admission.prefill_piece_tokens`, or the size the
//! autopilot picked: `crate::autopilot::piecing`), between admission and the send. Without
//! `--long-prefill-token-threshold` vLLM computes a waiting prompt in as few steps as its token
//! budget allows (`max_num_batched_tokens` a step), so one review's 12k-token
//! prompt fills whole steps, and a question arriving meanwhile waits them out: no admission rule
//! can shorten a step. The gateway can: it renders a prompt longer than two pieces (estimated;
//! a question or a medium prompt included, so no prompt goes whole into a step once it is above
//! twice the piece) to token ids once (vLLM's `POST /tokenize`, which applies the chat template
//! exactly as the chat route does) and sends
//! its prefixes one after the other as `/v1/completions` requests of `max_tokens: 1`, the k-th
//! ending at k × `prefill_piece_tokens` tokens (a multiple of the KV block size, so every piece
//! is whole blocks). Each finds the earlier pieces in vLLM's prefix cache and computes only its
//! own; then the request itself computes only what follows the last piece. Every step then holds
//! at most one piece of the prompt, and the questions in between.
//!
//! All go to one replica (the first piece's; the request itself is pinned there). The pieces
//! carry what keys the prefix cache besides the tokens (`model`, which may name a LoRA adapter,
//! and `cache_salt`) and the engine `priority`. Prompts with media are not pieced (their
//! placeholders and cache keys are the engine's own), nor prompts that are not text.
//!
//! It never fails a request: a `/tokenize` or piece failure leaves the request to go as it is
//! (with its earlier pieces still cached). Cancel-safe: dropping the future drops the piece in
//! flight, which aborts it in the engine. What it costs is counted: pieces sent, the time they
//! took, and the tokens computed again because a piece was evicted before its successor came
//! (`tutor_gateway_prefill_piec*`).

use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::ctx::RequestCtx;
use super::tokenize::tokenize_body;
use crate::classify::text_field;
use crate::telemetry::piece_metrics::PieceOutcome;
use crate::upstream::{Endpoint, UpstreamRequest};

/// How long the engine's `/tokenize` may take for a prompt to piece.
const COUNT_TIMEOUT: Duration = Duration::from_secs(2);

/// Fields of the request its pieces carry as they are: the model (or LoRA adapter), the prefix
/// cache's salt, and the engine priority.
const CARRIED: [&str; 3] = ["model", "cache_salt", "priority"];

/// A request whose prompt was prefilled in pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pieced {
    /// The replica its pieces went to: where the request itself goes.
    pub replica: Option<String>,
    /// Prompt tokens its pieces left cached (the last piece's end).
    pub prefix: u32,
    /// Whether the engine reported cached tokens on a piece (then an absent count is 0).
    pub reports_cached: bool,
}

/// Prefills `request`'s prompt in pieces of `piece` tokens (`admission.prefill_piece_tokens`,
/// the autopilot's size, or for a job `jobs.prefill_piece_tokens`) when it is long enough for
/// two (estimated, `prompt` tokens, above twice the piece). `None`: not pieced (`piece` 0,
/// short, media, or the count failed); the request goes as usual. `sent` is set once the
/// engine took the first piece (it may prefill from then on).
pub async fn prefill(
    ctx: &RequestCtx,
    request: &UpstreamRequest,
    piece: u32,
    prompt: u32,
    sent: &std::sync::atomic::AtomicBool,
) -> Option<Pieced> {
    if piece == 0 || prompt <= piece.saturating_mul(2) {
        return None;
    }
    let metrics = ctx.metrics().pieces();
    let Some(tokenize) =
        tokenize_body(request.endpoint, &request.body).filter(|_| !has_media(&request.body))
    else {
        metrics.request(PieceOutcome::NotText);
        return None;
    };
    if !ids_match(&request.body) {
        metrics.request(PieceOutcome::Unmatched);
        return None;
    }
    // More ids than the model holds is no count of this prompt (pieces of it would grow
    // without bound, each resending the ones before).
    let most = ctx.config().upstream.max_model_len.get() as usize;
    let Some(ids) = token_ids(ctx, tokenize)
        .await
        .filter(|ids| ids.len() <= most)
    else {
        metrics.request(PieceOutcome::CountFailed);
        return None;
    };
    let ends: Vec<usize> = (1..)
        .map(|k| k * piece as usize)
        .take_while(|end| *end < ids.len())
        .collect();
    if ends.is_empty() {
        return None;
    }
    let started = Instant::now();
    let mut pieced = Pieced {
        replica: None,
        prefix: 0,
        reports_cached: false,
    };
    let mut recomputed = 0u32;
    for (k, &end) in ends.iter().enumerate() {
        let mut body: Map<String, Value> = CARRIED
            .iter()
            .filter_map(|f| request.body.get(*f).map(|v| ((*f).to_owned(), v.clone())))
            .collect();
        body.insert("prompt".into(), Value::from(&ids[..end]));
        body.insert("max_tokens".into(), Value::from(1));
        let piece_request = UpstreamRequest {
            endpoint: Endpoint::Completions,
            request_id: format!("{}-piece{}", request.request_id, k + 1),
            traceparent: request.traceparent.clone(),
            body,
            affinity: request.affinity.clone(),
            pin: pieced.replica.clone(),
            continues_answer: false,
        };
        metrics.piece();
        let Ok(mut stream) = ctx.upstream().stream(piece_request).await else {
            metrics.request(PieceOutcome::PieceFailed);
            return (k > 0).then_some(pieced);
        };
        sent.store(true, std::sync::atomic::Ordering::Release);
        let mut failed = false;
        while let Some(event) = stream.next_event().await {
            failed |= event.is_err();
        }
        if failed || stream.missing_done() {
            metrics.request(PieceOutcome::PieceFailed);
            return (k > 0).then_some(pieced);
        }
        if pieced.replica.is_none() {
            pieced.replica = stream.replica().map(str::to_owned);
        }
        let cached = stream.usage().and_then(|u| u.cached_tokens);
        pieced.reports_cached |= cached.is_some();
        if pieced.reports_cached {
            recomputed =
                recomputed.saturating_add(pieced.prefix.saturating_sub(cached.unwrap_or(0)));
        }
        pieced.prefix = u32::try_from(end).unwrap_or(u32::MAX);
    }
    metrics.recomputed(recomputed);
    metrics.took(started.elapsed().as_secs_f64());
    metrics.request(PieceOutcome::Pieced);
    Some(pieced)
}

/// Whether `/tokenize` gives `body`'s own prompt ids: not with a field it cannot take that
/// changes them (`truncate_prompt_tokens` cuts the prompt from its start; `reasoning_effort`
/// is rendered by harmony templates; `tool_choice: "none"` leaves the tools out of the template
/// under vLLM's `--exclude-tools-when-tool-choice-none`).
pub(super) fn ids_match(body: &serde_json::Map<String, serde_json::Value>) -> bool {
    let set = |key: &str| body.get(key).is_some_and(|v| !v.is_null());
    !set("truncate_prompt_tokens")
        && !set("reasoning_effort")
        && body.get("tool_choice").and_then(serde_json::Value::as_str) != Some("none")
}

/// The engine's token ids for `body` (a [`tokenize_body`]), within [`COUNT_TIMEOUT`].
async fn token_ids(ctx: &RequestCtx, body: bytes::Bytes) -> Option<Vec<u32>> {
    let answer = tokio::time::timeout(COUNT_TIMEOUT, ctx.upstream().tokenize(body))
        .await
        .ok()?
        .ok()?;
    let v: Value = serde_json::from_slice(&answer.body).ok()?;
    v["tokens"]
        .as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// Whether a chat body carries content parts other than text (images, audio, video, files).
pub(super) fn has_media(body: &Map<String, Value>) -> bool {
    body.get("messages")
        .and_then(Value::as_array)
        .is_some_and(|messages| {
            messages.iter().any(|m| {
                m["content"].as_array().is_some_and(|parts| {
                    parts
                        .iter()
                        .any(|p| p["type"].as_str().is_some_and(|t| text_field(t).is_none()))
                })
            })
        })
}
