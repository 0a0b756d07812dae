//! The `llm.generate` span: its attribute names in one place, and the span constructor that
//! declares them (tracing needs every field declared up front; they are filled in as the
//! request goes). With OpenTelemetry on, each field becomes a span attribute.

/// Gateway queue wait, ms.
pub const QUEUE_WAIT_MS: &str = "llm.queue_wait_ms";
/// Of the queue wait, the time a long prompt waited for room in the prefill budget, ms.
pub const PREFILL_WAIT_MS: &str = "llm.prefill_wait_ms";
/// Admission to first token, ms.
pub const TTFT_MS: &str = "llm.ttft_ms";
/// Arrival to first token (what the student felt), ms.
pub const TIME_TO_FIRST_TOKEN_MS: &str = "llm.time_to_first_token_ms";
/// Arrival to the first answer token (content or tool calls, after any reasoning), ms.
pub const TIME_TO_FIRST_ANSWER_MS: &str = "llm.time_to_first_answer_ms";
/// Prefill, ms (see `LatencySplit::prefill_ms`).
pub const PREFILL_MS: &str = "llm.prefill_ms";
/// vLLM's own queue, ms (only when vLLM reports per-request metrics).
pub const ENGINE_QUEUE_MS: &str = "llm.engine_queue_ms";
/// Output tokens.
pub const OUTPUT_TOKENS: &str = "llm.output_tokens";
/// Decode tokens per second.
pub const DECODE_TPS: &str = "llm.decode_tps";
/// Lane (the final one, after any mid-stream promotion).
pub const LANE: &str = "llm.lane";
/// The lane a promoted request started in.
pub const PROMOTED_FROM: &str = "llm.promoted_from";
/// Estimated input tokens (classification).
pub const INPUT_TOKENS_ESTIMATED: &str = "llm.input_tokens.estimated";
/// Input tokens vLLM reported.
pub const INPUT_TOKENS: &str = "llm.input_tokens";
/// Prompt tokens served from vLLM's prefix cache.
pub const CACHED_TOKENS: &str = "llm.cached_tokens";
/// Prompt fingerprint (M18).
pub const PROMPT_FINGERPRINT: &str = "llm.prompt_fingerprint";
/// What focusing did to a course request's code (`tutor_gateway_focus_outcome_total`'s
/// outcome).
pub const FOCUS_OUTCOME: &str = "llm.focus.outcome";
/// Tokens of the code focusing left out.
pub const FOCUS_TOKENS_SAVED: &str = "llm.focus.tokens_saved";
/// Output tokens relayed before the client went away.
pub const CANCELLED_AFTER_TOKENS: &str = "llm.cancelled_after_tokens";
/// How the request ended (`tutor_gateway_requests_total`'s outcome).
pub const OUTCOME: &str = "llm.outcome";
/// The gateway's request id.
pub const REQUEST_ID: &str = "llm.request_id";
/// API route.
pub const ROUTE: &str = "llm.route";
/// OpenTelemetry GenAI: the provider.
pub const GEN_AI_SYSTEM: &str = "gen_ai.system";
/// OpenTelemetry GenAI: the operation (`chat`, `text_completion`).
pub const GEN_AI_OPERATION: &str = "gen_ai.operation.name";
/// OpenTelemetry GenAI: the model asked for.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// OpenTelemetry GenAI: the output limit asked for.
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
/// OpenTelemetry GenAI: input tokens used.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// OpenTelemetry GenAI: output tokens used.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// OpenTelemetry GenAI: finish reasons.
pub const GEN_AI_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// OpenTelemetry GenAI: the response id.
pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
/// OpenTelemetry: error type on failed requests.
pub const ERROR_TYPE: &str = "error.type";
/// OpenTelemetry span status: recording a description sets the status to Error (the engine's
/// or the gateway's fault, [`super::Outcome::is_fault`]; a client's bad input or a refusal for
/// capacity leaves it unset, as HTTP servers' 4xx do).
pub const STATUS_DESCRIPTION: &str = "otel.status_description";

/// A new `llm.generate` span with every attribute declared (names as the constants above).
pub fn llm_generate() -> tracing::Span {
    tracing::info_span!(
        "llm.generate",
        otel.kind = "server",
        llm.queue_wait_ms = tracing::field::Empty,
        llm.prefill_wait_ms = tracing::field::Empty,
        llm.ttft_ms = tracing::field::Empty,
        llm.time_to_first_token_ms = tracing::field::Empty,
        llm.time_to_first_answer_ms = tracing::field::Empty,
        llm.prefill_ms = tracing::field::Empty,
        llm.engine_queue_ms = tracing::field::Empty,
        llm.output_tokens = tracing::field::Empty,
        llm.decode_tps = tracing::field::Empty,
        llm.lane = tracing::field::Empty,
        llm.promoted_from = tracing::field::Empty,
        llm.input_tokens.estimated = tracing::field::Empty,
        llm.input_tokens = tracing::field::Empty,
        llm.cached_tokens = tracing::field::Empty,
        llm.prompt_fingerprint = tracing::field::Empty,
        llm.focus.outcome = tracing::field::Empty,
        llm.focus.tokens_saved = tracing::field::Empty,
        llm.cancelled_after_tokens = tracing::field::Empty,
        llm.outcome = tracing::field::Empty,
        llm.request_id = tracing::field::Empty,
        llm.route = tracing::field::Empty,
        gen_ai.system = "vllm",
        gen_ai.operation.name = tracing::field::Empty,
        gen_ai.request.model = tracing::field::Empty,
        gen_ai.request.max_tokens = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        gen_ai.response.id = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}
