//! `POST /v1/chat/completions` and `POST /v1/completions`: validate, submit to the engine,
//! answer streaming (SSE) or whole.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::chunks::{ResponseId, Usage};
use super::error::ApiError;
use super::request::{engine_request_id, parse_json, Api, ChatBody, CompletionBody, Generation};
use super::state::AppState;
use super::stream::{next_batch, sse_body, AbortGuard, StreamSpec};
use crate::engine::NewRequest;
use crate::text::{output_length, words, SplitMix};
use crate::tokenizer::fnv1a;

/// `--redirect-to`: a 307 to the same path there.
fn redirected(state: &AppState, path: &str) -> Option<Response> {
    let to = state.redirect_to.as_deref()?;
    let location = format!("{}{path}", to.trim_end_matches('/'));
    let mut resp = axum::http::StatusCode::TEMPORARY_REDIRECT.into_response();
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_str(&location).ok()?);
    Some(resp)
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    state.saw_traceparent(&headers);
    if let Some(resp) = redirected(&state, "/v1/chat/completions") {
        return resp;
    }
    let result = async {
        let body: ChatBody = parse_json(&body)?;
        let gen = Generation::chat(&state, &headers, body).await?;
        Ok::<_, ApiError>(gen)
    }
    .await;
    match result {
        Ok(gen) => generate(state, gen).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state.saw_traceparent(&headers);
    if let Some(resp) = redirected(&state, "/v1/completions") {
        return resp;
    }
    let result = async {
        let body: CompletionBody = parse_json(&body)?;
        Generation::completion(&state, &headers, body).await
    }
    .await;
    match result {
        Ok(gen) => generate(state, gen).await,
        Err(e) => e.into_response(),
    }
}

/// Runs a validated request through the engine.
async fn generate(state: AppState, gen: Generation) -> Response {
    // Seeded per request: server seed, request seed and prompt, so a replay is identical (a
    // continuation: its original's prompt, so it replays the original's draws).
    let prompt_hash = fnv1a(
        &gen.origin
            .as_deref()
            .unwrap_or(&gen.prompt)
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let mut rng = SplitMix::new(state.seed ^ gen.seed.unwrap_or(0).rotate_left(17) ^ prompt_hash);
    let faults = state.faults.draw(&mut rng);
    let rid = ResponseId::new(gen.api, &gen.request_id, &state.model);
    let echo = state
        .request_id_headers
        .then(|| HeaderValue::from_str(&gen.request_id).ok())
        .flatten();
    if faults.fail {
        let mut resp = ApiError::internal("injected engine failure").into_response();
        if let Some(v) = echo {
            resp.headers_mut().insert("x-request-id", v);
        }
        return resp;
    }
    if let Some(e) = gen.late_error {
        // vLLM's engine refuses it as it takes it: a streaming answer has begun by then (200,
        // the error as its first event, then `[DONE]`); a whole one is a plain 400.
        let mut resp = if gen.stream {
            let sse = format!("data: {}\n\ndata: [DONE]\n\n", e.to_json());
            ([(header::CONTENT_TYPE, "text/event-stream")], sse).into_response()
        } else {
            e.into_response()
        };
        if let Some(v) = echo {
            resp.headers_mut().insert("x-request-id", v);
        }
        return resp;
    }
    // A continuation's length is what is left of its original's: drawn as the original's,
    // whose limit was this one's and the tokens already given.
    let first = gen.first_word;
    let (whole, finish) = output_length(
        &mut rng,
        gen.max_tokens.saturating_add(first),
        gen.ignore_eos,
        state.mean_output_tokens,
    );
    let target = whole.saturating_sub(first).max(1);
    let prompt_tokens = gen.prompt.len() as u32;
    let (seq_no, mut rx) = state.engine.submit(NewRequest {
        request_id: engine_request_id(gen.api, &gen.request_id),
        prompt: gen.prompt,
        target_output: target,
        finish_at_target: finish,
        priority: gen.priority,
        cache_salt: gen.cache_salt.clone(),
        // Output hashed into the prefix cache as words; not reasoning, which it has no ids for.
        output_from: match gen.api {
            Api::Chat if gen.first_word == 0 && state.reasoning_tokens > 0 => None,
            _ => Some(gen.first_word),
        },
    });
    let mut guard = AbortGuard::new(state.engine.clone(), seq_no);
    // A reasoning model's continued answer, taken for reasoning by vLLM's parser.
    let answer_as_reasoning = first > 0 && gen.api == Api::Chat && state.continued_as_reasoning;

    let mut resp = if gen.stream {
        let spec = StreamSpec {
            rid,
            prompt_tokens,
            include_usage: gen.include_usage,
            continuous_usage: gen.continuous_usage,
            prompt_details: state.prompt_tokens_details,
            per_request_metrics: state.per_request_metrics,
            faults,
            // A continued message is past its reasoning.
            reasoning_tokens: match gen.api {
                Api::Chat if gen.first_word == 0 => state.reasoning_tokens,
                _ => 0,
            },
            first_word: gen.first_word,
            answer_as_reasoning,
            tool_call: gen.tool_call.clone().filter(|_| gen.api == Api::Chat),
            auto_call: gen.auto_call,
            logprobs: gen.logprobs,
            silent: gen.silent,
        };
        let mut resp = Response::new(Body::from_stream(sse_body(spec, rx, guard)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        resp
    } else {
        // Whole answer: wait for the end; a client that leaves drops this future and the guard.
        let mut tokens = 0u32;
        let finished = loop {
            match next_batch(&mut rx).await {
                None => break None,
                Some((n, None)) => tokens += n,
                Some((_, Some(f))) => break Some(f),
            }
            if faults.error_after.is_some_and(|e| tokens >= e) {
                guard.abort();
                return ApiError::internal("injected engine error").into_response();
            }
            if faults.stall_after.is_some_and(|s| tokens >= s) {
                guard.abort();
                futures::future::pending::<()>().await;
            }
        };
        let Some(fin) = finished else {
            return ApiError::internal("request ended unexpectedly").into_response();
        };
        guard.disarm();
        let metrics = state
            .per_request_metrics
            .then(|| fin.timings.per_request_metrics(fin.output_tokens));
        let thinking = match gen.api {
            Api::Chat if gen.first_word == 0 => state.reasoning_tokens.min(fin.output_tokens),
            _ => 0,
        };
        let answer = if gen.silent {
            String::new()
        } else {
            words(
                first.saturating_add(thinking),
                first.saturating_add(fin.output_tokens),
            )
        };
        let (reasoning, answer) = if answer_as_reasoning {
            (Some(answer), String::new())
        } else {
            let thought = if gen.silent {
                String::new()
            } else {
                words(0, thinking)
            };
            ((thinking > 0).then_some(thought), answer)
        };
        // A named tool call: the words are its arguments.
        let answer = match &gen.tool_call {
            Some(_) => format!(
                "{}{answer}{}",
                ResponseId::ARGUMENTS_OPEN,
                ResponseId::ARGUMENTS_CLOSE
            ),
            None => answer,
        };
        let body = rid.full_response(
            reasoning.as_deref(),
            &answer,
            gen.tool_call.as_deref(),
            if gen.auto_call {
                "tool_calls"
            } else {
                fin.reason.as_str()
            },
            Usage::final_of(&fin, state.prompt_tokens_details),
            metrics,
        );
        let mut body = body;
        if let Some(top) = gen.logprobs {
            // The answer's positions: after the reasoning, from where a continued one goes on.
            let (from, to) = (
                first.saturating_add(thinking),
                first.saturating_add(fin.output_tokens),
            );
            body["choices"][0]["logprobs"] = super::chunks::logprobs(gen.api, from, to, top, 0);
        }
        axum::Json(body).into_response()
    };
    if let Some(v) = echo {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}
