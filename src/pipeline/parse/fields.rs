//! Which `/v1` body fields reach vLLM (docs/operations.md, "Fields forwarded to vLLM").
//!
//! - **Read as vLLM reads them** ([`read_as_vllm`]): the numbers and booleans the gateway judges
//!   are first coerced as vLLM's pydantic models coerce them (`"20"` and `20.0` are 20, `"yes"`
//!   is true, [`super::lax`]) and forwarded as that value; one vLLM could not read is a 400
//!   naming the field.
//! - **Forwarded**: the OpenAI fields of each endpoint and vLLM's own sampling, structured
//!   output and tokenizer fields ([`SHARED`], [`CHAT`], [`COMPLETIONS`]), within the bounds of
//!   `[fields]` (stop strings, token lists, guides: [`super::bounds`]; media URLs:
//!   [`super::media`]).
//! - **Refused** with a 400 naming the field ([`refusal`]): what multiplies the engine's work
//!   per request (`best_of`, beam search, `prompt_logprobs` and `echo` with log-probabilities,
//!   which vLLM turns into `prompt_logprobs`, `logprobs` above `server.max_logprobs` or
//!   negative, `logprob_token_ids` listing more ids than that), hides output from the count
//!   (`include_reasoning: false`), costs the scheduler per token (`repetition_detection`), adds
//!   uncounted prompt (`suffix`), or
//!   changes the prompt after the gateway counted it (`chat_template`, `documents`,
//!   `prompt_embeds`, `mm_processor_kwargs`, `media_io_kwargs`), keeps engine memory past the
//!   reservation (`kv_transfer_params`, `ec_transfer_params`), streams tokens in batches the
//!   mid-stream count cannot see into (`stream_interval` other than 1), and `min_tokens` above
//!   the declared output limit (the reservation could not hold).
//! - **The gateway's own**: `priority` is removed; the gateway sets it from the lane when
//!   `admission.engine_priority` is on, so no client jumps vLLM's queue.
//! - **Anything else**: forwarded or refused by `server.unknown_fields`.

use serde_json::{Map, Value};

pub use super::lax::read_as_vllm;
use super::{bounds, media};
use crate::config::{Config, FieldsConfig, UnknownFields};
use crate::error::GatewayError;

/// Fields of both endpoints.
pub const SHARED: &[&str] = &[
    "model",
    "logprob_token_ids",
    "max_tokens",
    "stream",
    "stream_options",
    "n",
    "temperature",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "stop",
    "seed",
    "logit_bias",
    "logprobs",
    "user",
    "response_format",
    "echo",
    "metadata",
    "store",
    "service_tier",
    // vLLM's sampling parameters.
    "top_k",
    "min_p",
    "repetition_penalty",
    "length_penalty",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "bad_words",
    "allowed_token_ids",
    "return_tokens_as_token_ids",
    "return_token_ids",
    // Structured output.
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "structured_outputs",
    // Tokenizer and request handling.
    "add_special_tokens",
    "request_id",
    "cache_salt",
    // vLLM 0.34's that only lessen the work or tag it: a cap on reasoning tokens (still
    // counted as output), which end of a truncated prompt is kept, its KV-cache events' tag.
    "thinking_token_budget",
    "truncation_side",
    "session_id",
];

/// Fields of `/v1/chat/completions` only.
pub const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "include_reasoning",
];

/// Fields of `/v1/completions` only.
pub const COMPLETIONS: &[&str] = &["prompt", "suffix"];

/// Removed from every body: the gateway's to set.
pub const GATEWAY_OWNED: &[&str] = &["priority"];

/// How the gateway treats a `/v1` body's fields.
#[derive(Debug, Clone, Copy)]
pub struct FieldRules<'a> {
    /// Fields on no list.
    pub unknown: UnknownFields,
    /// Most log-probabilities per token a client may ask for.
    pub max_logprobs: u32,
    /// Message roles accepted besides vLLM's (`classify.extra_roles`).
    pub extra_roles: &'a [String],
    /// Stop strings, token lists, guides and media hosts (`[fields]`).
    pub bounds: &'a FieldsConfig,
    /// The model's context (`upstream.max_model_len`): bounds what the JSON blocks the
    /// template renders (`tools`, `chat_template_kwargs`) are rendered to for counting.
    pub max_model_len: u32,
}

impl<'a> FieldRules<'a> {
    /// The rules `config` sets (`server.unknown_fields`, `server.max_logprobs`,
    /// `classify.extra_roles`, `[fields]`, `upstream.max_model_len`).
    pub fn of(config: &'a Config) -> Self {
        Self {
            unknown: config.server.unknown_fields,
            max_logprobs: config.server.max_logprobs,
            extra_roles: &config.classify.extra_roles,
            bounds: &config.fields,
            max_model_len: config.upstream.max_model_len.get(),
        }
    }
}

/// Checks `body`'s fields for the chat (`chat`) or completions endpoint, removes the gateway's
/// own, and answers the first refusal.
pub fn check(
    body: &mut Map<String, Value>,
    chat: bool,
    declared_max: Option<u32>,
    rules: FieldRules<'_>,
) -> Result<(), GatewayError> {
    for name in GATEWAY_OWNED {
        body.remove(*name);
    }
    for (name, value) in body.iter() {
        if let Some((field, why)) = refusal(name, value, chat, declared_max, rules) {
            return Err(GatewayError::bad_request(why, Some(field)));
        }
        // A field the gateway judges (refusable, or a bounded guide) is known whatever its
        // value: `best_of: 1` or `use_beam_search: false` is no unknown field. One of a single
        // endpoint's (`suffix`, `top_logprobs`) is known on that endpoint only.
        let name = name.as_str();
        let own = if chat { CHAT } else { COMPLETIONS };
        let one_endpoints = CHAT.contains(&name) || COMPLETIONS.contains(&name);
        let known = SHARED.contains(&name)
            || own.contains(&name)
            || (REFUSABLE.contains(&name) && !one_endpoints)
            || bounds::GUIDES.contains(&name);
        if !known && rules.unknown == UnknownFields::Reject {
            let endpoint = if chat {
                "chat/completions"
            } else {
                "completions"
            };
            return Err(GatewayError::bad_request(
                format!(
                    "unknown field `{}` for /v1/{endpoint} (this gateway forwards only the documented fields)",
                    printable(name)
                ),
                None,
            ));
        }
    }
    if let Some(why) = echo_refusal(body, chat) {
        return Err(GatewayError::bad_request(why, Some("echo")));
    }
    // A whole answer is assembled from the stream's text, tool calls, log-probabilities and
    // usage; the token ids vLLM streams on each chunk are not kept, so a whole answer would
    // silently lack them.
    let ids_asked = body
        .get("return_token_ids")
        .is_some_and(|v| !v.is_null() && v.as_bool() != Some(false));
    if ids_asked && body.get("stream").and_then(Value::as_bool) != Some(true) {
        return Err(GatewayError::bad_request(
            "return_token_ids is supported on streaming requests only (\"stream\": true)",
            Some("return_token_ids"),
        ));
    }
    bounds::check(body, rules.bounds)?;
    if chat {
        media::check(body.get("messages"), &rules.bounds.media_hosts)?;
    }
    Ok(())
}

/// Why `echo` is refused, if it is: with it vLLM computes log-probabilities for every prompt
/// token (it sets `prompt_logprobs` to completions' `logprobs`, or to chat's `top_logprobs`,
/// which is 0 when left out or null, so on chat any `echo`). Read after [`read_as_vllm`].
fn echo_refusal(body: &Map<String, Value>, chat: bool) -> Option<String> {
    if body.get("echo").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    let source = if chat { "top_logprobs" } else { "logprobs" };
    let prompt_logprobs = match body.get(source) {
        // vLLM 0.34 reads chat's `top_logprobs: null` as 0 (its `TopLogprobsParam`), as it
        // reads it left out: on chat every `echo` asks for prompt log-probabilities.
        _ if chat => true,
        Some(Value::Null) | None => false,
        Some(_) => true,
    };
    prompt_logprobs.then(|| {
        format!(
            "echo is not supported with {source}: vLLM then computes prompt_logprobs, a \
             distribution for every prompt token"
        )
    })
}

/// The field and why `name: value` is refused, if it is.
fn refusal(
    name: &str,
    value: &Value,
    chat: bool,
    declared_max: Option<u32>,
    rules: FieldRules<'_>,
) -> Option<(&'static str, String)> {
    let field = REFUSABLE.iter().find(|f| **f == name)?;
    why_refused(field, value, chat, declared_max, rules).map(|why| (*field, why))
}

/// The fields [`why_refused`] may refuse.
const REFUSABLE: &[&str] = &[
    "best_of",
    "use_beam_search",
    "prompt_logprobs",
    "chat_template",
    "documents",
    "prompt_embeds",
    "top_logprobs",
    "logprobs",
    "min_tokens",
    "include_reasoning",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "stream_interval",
    "cache_salt",
    "logprob_token_ids",
    "suffix",
    "repetition_detection",
    "max_repetition_pattern_size",
    "min_repetition_pattern_size",
    "repetition_min_count",
];

fn why_refused(
    name: &str,
    value: &Value,
    chat: bool,
    declared_max: Option<u32>,
    rules: FieldRules<'_>,
) -> Option<String> {
    let set = !value.is_null();
    match name {
        "best_of" if set && value.as_u64() != Some(1) => {
            Some("best_of is not supported by this gateway: send 1 or leave it out (each extra candidate is engine work it cannot reserve)".into())
        }
        "use_beam_search" if value.as_bool() == Some(true) => {
            Some("use_beam_search is not supported by this gateway: leave it out (each beam is engine work it cannot reserve)".into())
        }
        "prompt_logprobs" if set => Some(
            "prompt_logprobs is not supported: it makes the engine compute a distribution for every prompt token".into(),
        ),
        "chat_template" if set => Some(
            "chat_template is not accepted: the gateway counts the prompt the model's own template renders".into(),
        ),
        "documents" if set => Some(
            "documents is not accepted: put the material in the messages, where it is counted".into(),
        ),
        "prompt_embeds" if set => {
            Some("prompt_embeds is not supported: only text prompts can be counted".into())
        }
        "mm_processor_kwargs" | "media_io_kwargs" if set => Some(format!(
            "{name} is not accepted: it changes how many tokens an image, audio or video part \
             becomes after the gateway counted it (classify.*_part_tokens)"
        )),
        "kv_transfer_params" if set => Some(
            "kv_transfer_params is not accepted: it would keep the request's KV cache in the \
             engine after the gateway gave its reservation back"
                .into(),
        ),
        "ec_transfer_params" if set => Some(
            "ec_transfer_params is not accepted: it would keep the request's encoder cache in \
             the engine after the gateway gave its reservation back"
                .into(),
        ),
        // vLLM hands these to the engine as the request's extra arguments, where its KV
        // connector reads `kv_transfer_params` (refused above as a field of its own) and custom
        // logits processors read theirs: outside anything the gateway counts or bounds.
        "vllm_xargs" if set => Some(
            "vllm_xargs is not accepted: vLLM hands it to the engine as extra arguments (KV \
             transfer, logits processors) the gateway cannot bound"
                .into(),
        ),
        // vLLM sends one chunk every N tokens: the usage the gateway counts output by would
        // arrive N tokens late, the lane's limits passed unseen in between.
        "stream_interval" if set && value.as_u64() != Some(1) => Some(
            "stream_interval is not supported: the gateway counts the output as each token \
             streams, and with it vLLM holds tokens back between chunks"
                .into(),
        ),
        "include_reasoning" if chat && value.as_bool() == Some(false) => Some(
            "include_reasoning: false is not supported: vLLM then streams nothing while the \
             model reasons, and the gateway counts a request's output as it streams; leave it \
             out and skip the reasoning deltas (`delta.reasoning`)"
                .into(),
        ),
        // vLLM's own rule (its `check_cache_salt_support`); the gateway also reads the salt to
        // derive its tenant's (`prompt/salt.rs`), so it must be text.
        "cache_salt" if set && value.as_str().is_none_or(|s| s.is_empty() || s.len() > 256) => {
            Some("cache_salt must be a non-empty string of at most 256 bytes".into())
        }
        // One log-probability per listed id on every token, beside `logprobs`' own cap.
        "logprob_token_ids" if set => match value.as_array() {
            Some(ids) if ids.len() <= rules.max_logprobs as usize => None,
            _ => Some(format!(
                "logprob_token_ids must be a list of at most {} token ids on this gateway \
                 (server.max_logprobs)",
                rules.max_logprobs
            )),
        },
        // A model that fills in the middle renders the suffix into the prompt, which the
        // gateway counts from `prompt` alone; others refuse it anyway.
        "suffix" if !chat && value.as_str().is_none_or(|s| !s.is_empty()) && set => Some(
            "suffix is not supported: it would be prompt text the gateway does not count".into(),
        ),
        // vLLM checks these after every generated token on its scheduler thread, at a cost
        // that grows with the output and the pattern sizes, which nothing bounds.
        "repetition_detection"
        | "max_repetition_pattern_size"
        | "min_repetition_pattern_size"
        | "repetition_min_count"
            if set =>
        {
            Some(format!(
                "{name} is not supported: vLLM checks it after every token on the scheduler \
                 thread every request waits on, at a cost no lane reserves"
            ))
        }
        "top_logprobs" if chat => over_cap(name, value, rules.max_logprobs),
        "logprobs" if !chat => over_cap(name, value, rules.max_logprobs),
        "min_tokens" if set => {
            let min = value.as_i64()?;
            if min < 0 {
                return Some("min_tokens must be at least 0".into());
            }
            match declared_max {
                Some(max) if min <= i64::from(max) => None,
                Some(max) => Some(format!(
                    "min_tokens ({min}) must not exceed the output limit ({max})"
                )),
                None if min <= 1 => None,
                None => Some("min_tokens needs max_tokens (or max_completion_tokens): the reservation must cover the output".into()),
            }
        }
        _ => None,
    }
}

/// A count of log-probabilities over the gateway's cap, or negative (vLLM reads -1 as the
/// whole vocabulary).
fn over_cap(name: &str, value: &Value, cap: u32) -> Option<String> {
    let n = value
        .as_i64()
        .or_else(|| value.as_u64().map(|_| i64::MAX))?;
    (!(0..=i64::from(cap)).contains(&n))
        .then(|| format!("{name} must be between 0 and {cap} on this gateway"))
}

/// A field name as it may appear in an error message: at most 64 visible characters.
fn printable(name: &str) -> String {
    let mut out = crate::telemetry::printable(name, 64);
    if name.chars().count() > 64 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    static BOUNDS: std::sync::LazyLock<FieldsConfig> =
        std::sync::LazyLock::new(FieldsConfig::default);

    fn rules(unknown: UnknownFields) -> FieldRules<'static> {
        FieldRules {
            unknown,
            max_logprobs: 5,
            extra_roles: &[],
            bounds: &BOUNDS,
            max_model_len: 16_384,
        }
    }

    /// The output limit a body declares, as the request path reads it.
    fn max_of(map: &serde_json::Map<String, Value>) -> Option<u32> {
        map.get("max_completion_tokens")
            .or(map.get("max_tokens"))
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    }

    fn checked(mut body: Value, chat: bool, unknown: UnknownFields) -> Result<Value, String> {
        read_as_vllm(&mut body, chat).map_err(|e| e.to_string())?;
        let mut map = body.as_object().unwrap().clone();
        let max = max_of(&map);
        check(&mut map, chat, max, rules(unknown))
            .map(|()| Value::Object(map))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_clients_priority_never_reaches_the_engine() {
        let out = checked(
            json!({"messages": [], "priority": -100}),
            true,
            UnknownFields::Forward,
        )
        .unwrap();
        assert_eq!(out, json!({"messages": []}));
    }

    #[test]
    fn work_multipliers_are_refused_with_their_field() {
        for (body, chat, field) in [
            (json!({"best_of": 4}), false, "best_of"),
            (json!({"use_beam_search": true}), true, "use_beam_search"),
            (json!({"prompt_logprobs": 1}), true, "prompt_logprobs"),
            (
                json!({"top_logprobs": 6, "logprobs": true}),
                true,
                "top_logprobs",
            ),
            (json!({"logprobs": 20}), false, "logprobs"),
            (
                json!({"chat_template": "{{ messages }}"}),
                true,
                "chat_template",
            ),
            (json!({"documents": [{"text": "x"}]}), true, "documents"),
            (
                json!({"min_tokens": 50, "max_tokens": 10}),
                true,
                "min_tokens",
            ),
            (json!({"min_tokens": 50}), true, "min_tokens"),
            // -1 is the whole vocabulary to vLLM.
            (
                json!({"top_logprobs": -1, "logprobs": true}),
                true,
                "top_logprobs",
            ),
            (json!({"logprobs": -1}), false, "logprobs"),
            // Reasoning vLLM would not stream is output the gateway could not count.
            (
                json!({"include_reasoning": false}),
                true,
                "include_reasoning",
            ),
            // Media made bigger than counted; KV kept past the reservation.
            (
                json!({"mm_processor_kwargs": {"min_pixels": 12845056}}),
                true,
                "mm_processor_kwargs",
            ),
            (
                json!({"media_io_kwargs": {"video": {"num_frames": 4096}}}),
                true,
                "media_io_kwargs",
            ),
            (
                json!({"kv_transfer_params": {"do_remote_decode": true}}),
                false,
                "kv_transfer_params",
            ),
            (
                json!({"ec_transfer_params": {"do_remote_encode": true}}),
                true,
                "ec_transfer_params",
            ),
            // The same through vLLM's extra arguments.
            (
                json!({"vllm_xargs": {"kv_transfer_params": "x"}}),
                true,
                "vllm_xargs",
            ),
            (json!({"vllm_xargs": {"a": 1}}), false, "vllm_xargs"),
            // Tokens held back between chunks are output counted late.
            (json!({"stream_interval": 1500}), true, "stream_interval"),
            (json!({"stream_interval": 8}), false, "stream_interval"),
        ] {
            let err = checked(body.clone(), chat, UnknownFields::Forward).unwrap_err();
            assert!(err.contains(field), "{body}: {err}");
        }
        for (body, chat) in [
            (
                json!({"best_of": 1, "use_beam_search": false, "prompt_logprobs": null}),
                false,
            ),
            (json!({"top_logprobs": 5, "logprobs": true}), true),
            (json!({"logprobs": 5}), false),
            (json!({"min_tokens": 10, "max_completion_tokens": 10}), true),
            (json!({"top_logprobs": 0, "logprobs": true}), true),
            (json!({"include_reasoning": true}), true),
            (json!({"stream_interval": 1}), true),
        ] {
            assert!(
                checked(body.clone(), chat, UnknownFields::Forward).is_ok(),
                "{body}"
            );
        }
    }

    #[test]
    fn unknown_fields_follow_the_configured_behaviour() {
        let body = json!({"messages": [], "temperature": 0.2, "x_custom": 1});
        assert_eq!(
            checked(body.clone(), true, UnknownFields::Forward).unwrap(),
            body
        );
        let err = checked(body, true, UnknownFields::Reject).unwrap_err();
        assert!(err.contains("x_custom"), "{err}");
        // A field of the other endpoint is unknown here.
        assert!(checked(json!({"suffix": ""}), true, UnknownFields::Reject).is_err());
        assert!(checked(json!({"suffix": ""}), false, UnknownFields::Reject).is_ok());
        // Harmless values of judged fields, and bounded guides, are known fields.
        for body in [
            json!({"best_of": 1, "use_beam_search": false, "stream_interval": 1}),
            json!({"prompt_logprobs": null, "structural_tag": "{}", "thinking_token_budget": 64}),
        ] {
            assert!(
                checked(body.clone(), true, UnknownFields::Reject).is_ok(),
                "{body}"
            );
        }
        let long = "k".repeat(10_000);
        let err = checked(json!({ long: 1 }), true, UnknownFields::Reject).unwrap_err();
        assert!(err.len() < 300, "the name is shortened: {err}");
    }

    /// The param the 400 for `body` names, or `None` when it is accepted.
    fn refused_param(body: Value, chat: bool) -> Option<String> {
        let mut body = body;
        let rules = rules(UnknownFields::Forward);
        let err = match read_as_vllm(&mut body, chat) {
            Err(e) => e,
            Ok(()) => {
                let mut map = body.as_object().unwrap().clone();
                let max = max_of(&map);
                check(&mut map, chat, max, rules).err()?
            }
        };
        match err {
            GatewayError::BadRequest { param, .. } => param.map(|p| p.into_owned()),
            other => panic!("not a 400: {other}"),
        }
    }

    #[test]
    fn numbers_and_booleans_are_judged_as_vllm_reads_them() {
        for (body, chat, field) in [
            (
                json!({"top_logprobs": 20.0, "logprobs": true}),
                true,
                "top_logprobs",
            ),
            (
                json!({"top_logprobs": "20", "logprobs": "true"}),
                true,
                "top_logprobs",
            ),
            (json!({"logprobs": "20"}), false, "logprobs"),
            (json!({"logprobs": 20.0}), false, "logprobs"),
            (json!({"use_beam_search": "true"}), true, "use_beam_search"),
            (json!({"use_beam_search": "yes"}), false, "use_beam_search"),
            (json!({"use_beam_search": 1}), true, "use_beam_search"),
            (json!({"best_of": "4"}), false, "best_of"),
            (
                json!({"min_tokens": "500", "max_tokens": 10}),
                true,
                "min_tokens",
            ),
            (
                json!({"min_tokens": 500.0, "max_tokens": 10}),
                false,
                "min_tokens",
            ),
            (
                json!({"min_tokens": -1, "max_tokens": 10}),
                false,
                "min_tokens",
            ),
            // What vLLM could not read either: named, never passed on unjudged.
            (json!({"logprobs": "abc"}), false, "logprobs"),
            (
                json!({"top_logprobs": 2.5, "logprobs": true}),
                true,
                "top_logprobs",
            ),
            (json!({"use_beam_search": "maybe"}), true, "use_beam_search"),
            (json!({"max_tokens": "many"}), true, "max_tokens"),
            (json!({"echo": [true]}), false, "echo"),
            (
                json!({"stream_options": {"include_usage": "perhaps"}}),
                true,
                "stream_options",
            ),
        ] {
            assert_eq!(
                refused_param(body.clone(), chat).as_deref(),
                Some(field),
                "{body}"
            );
        }
        // Within bounds once read: forwarded as the value vLLM reads.
        let out = checked(
            json!({"top_logprobs": "3", "logprobs": "yes", "min_tokens": 5.0, "max_tokens": "10"}),
            true,
            UnknownFields::Forward,
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"top_logprobs": 3, "logprobs": true, "min_tokens": 5, "max_tokens": 10})
        );
    }

    /// A whole answer is assembled from the stream without the token ids: asking for them
    /// without streaming is refused, not answered without them.
    #[test]
    fn token_ids_are_for_streaming_requests_only() {
        assert_eq!(
            refused_param(json!({"return_token_ids": true}), true).as_deref(),
            Some("return_token_ids")
        );
        for body in [
            json!({"return_token_ids": true, "stream": true}),
            json!({"return_token_ids": false}),
        ] {
            assert_eq!(refused_param(body.clone(), false), None, "{body}");
        }
    }

    /// Fields of vLLM 0.34 that cost the engine what no lane reserves: per-token log-probabilities
    /// for listed ids past `server.max_logprobs` (5 here), a completion's suffix (prompt text a
    /// fill-in-the-middle model renders, uncounted), and repetition detection (checked after
    /// every token on vLLM's scheduler thread, unbounded).
    #[test]
    fn fields_that_cost_the_engine_unreserved_work_are_refused() {
        for (body, chat, param) in [
            (
                json!({"logprob_token_ids": [1, 2, 3, 4, 5, 6]}),
                true,
                "logprob_token_ids",
            ),
            (
                json!({"logprob_token_ids": "1,2"}),
                false,
                "logprob_token_ids",
            ),
            (json!({"suffix": "def main():"}), false, "suffix"),
            (json!({"suffix": 3}), false, "suffix"),
            (
                json!({"repetition_detection": {"max_pattern_size": 100000}}),
                true,
                "repetition_detection",
            ),
            (
                json!({"repetition_min_count": 2}),
                false,
                "repetition_min_count",
            ),
        ] {
            assert_eq!(
                refused_param(body.clone(), chat).as_deref(),
                Some(param),
                "{body}"
            );
        }
        for (body, chat) in [
            (json!({"logprob_token_ids": [1, 2, 3, 4, 5]}), true),
            (json!({"logprob_token_ids": null}), false),
            (json!({"suffix": ""}), false),
            (json!({"suffix": null}), false),
            (json!({"repetition_detection": null}), true),
        ] {
            assert_eq!(refused_param(body.clone(), chat), None, "{body}");
        }
    }

    #[test]
    fn echo_with_log_probabilities_is_refused_like_prompt_logprobs() {
        for (body, chat) in [
            (json!({"echo": true, "logprobs": 5}), false),
            (json!({"echo": "true", "logprobs": "0"}), false),
            (
                json!({"echo": 1, "logprobs": true, "top_logprobs": 5}),
                true,
            ),
            // Chat's top_logprobs defaults to 0: echo alone asks for prompt logprobs, and so
            // does echo with `top_logprobs: null` (vLLM 0.34 reads null as 0).
            (json!({"echo": true}), true),
            (json!({"echo": true, "top_logprobs": null}), true),
        ] {
            assert_eq!(
                refused_param(body.clone(), chat).as_deref(),
                Some("echo"),
                "{body}"
            );
        }
        for (body, chat) in [
            (json!({"echo": true}), false),
            (json!({"echo": true, "logprobs": null}), false),
            (json!({"echo": "false", "logprobs": 5}), false),
            (
                json!({"echo": false, "logprobs": true, "top_logprobs": 5}),
                true,
            ),
        ] {
            assert_eq!(refused_param(body.clone(), chat), None, "{body}");
        }
    }
}
