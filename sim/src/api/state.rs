//! The handlers' shared state: a leaf every route file uses.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};

use crate::engine::Engine;
use crate::text::FaultRates;
use crate::tokenizer::PromptTokenizer;

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The engine.
    pub engine: Engine,
    /// Prompt tokenizer.
    pub tokenizer: Arc<PromptTokenizer>,
    /// Served model name.
    pub model: String,
    /// Longest prompt + output.
    pub max_model_len: u32,
    /// Mean seeded output length.
    pub mean_output_tokens: u32,
    /// `--reasoning-tokens`: the first output tokens of a chat answer that are reasoning.
    pub reasoning_tokens: u32,
    /// A continued answer of a reasoning model comes out labelled as reasoning
    /// (`--reasoning-tokens` without `--template-closes-reasoning`).
    pub continued_as_reasoning: bool,
    /// Server seed.
    pub seed: u64,
    /// Fault injection.
    pub faults: FaultRates,
    /// `--enable-prompt-tokens-details`.
    pub prompt_tokens_details: bool,
    /// `--exclude-tools-when-tool-choice-none`.
    pub exclude_tools_when_none: bool,
    /// `--image-token-pixels` and `--image-max-tokens`: `None` for a text model.
    pub vision: Option<crate::vision::Vision>,
    /// `--call-tools`: `tool_choice` `"auto"` with tools is answered with a call of the first.
    pub call_tools: bool,
    /// `--enable-per-request-metrics`.
    pub per_request_metrics: bool,
    /// `--enable-request-id-headers`.
    pub request_id_headers: bool,
    /// `--api-key`: required as a bearer token on `/v1/*` and `/inference/*`.
    pub api_key: Option<Arc<str>>,
    /// `--redirect-to`: generation requests are answered 307 to this base URL.
    pub redirect_to: Option<Arc<str>>,
    /// `--enable-scale-out`: `POST /inference/v1/abort_requests` is served.
    pub scale_out: bool,
    /// Every call to an abort path (`GET /debug/aborts`), oldest first, the last 1,000: path,
    /// status answered, the ids named, how many requests they aborted.
    pub aborts: Arc<std::sync::Mutex<std::collections::VecDeque<serde_json::Value>>>,
    /// Unix seconds at start, for `/v1/models`.
    pub started: u64,
    /// The last `traceparent` headers received (`GET /debug/traceparents`), newest last.
    pub traceparents: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    /// `--scheduling-policy priority`: a non-zero `priority` is accepted (vLLM refuses one
    /// otherwise).
    pub priority_policy: bool,
    /// The last requests accepted (`GET /debug/requests`), newest last: prompt tokens,
    /// `max_tokens` as sent (null when none) and `priority`. Never the prompt itself.
    pub recent: Arc<std::sync::Mutex<std::collections::VecDeque<serde_json::Value>>>,
}

impl AppState {
    /// The prompt the simulator's template renders for a chat request: media parts as the
    /// model takes them (`--image-token-pixels`: a vision model's tokens per picture).
    pub fn render(
        &self,
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Value>,
        messages: &[crate::tokenizer::ChatMessage],
        end: crate::tokenizer::PromptEnd,
    ) -> String {
        let pictures = self
            .vision
            .map(|v| move |part: &crate::tokenizer::ContentPart| v.render(part));
        let pictures: tutor_wire::chat::Pictures<'_> = pictures
            .as_ref()
            .map(|f| f as &dyn Fn(&crate::tokenizer::ContentPart) -> Option<String>);
        tutor_wire::chat::render_request_with(tools, kwargs, messages, end, pictures)
    }

    /// Remembers a call to an abort path (the last 1,000).
    pub(super) fn saw_abort(&self, path: &str, status: StatusCode, ids: &[String], aborted: usize) {
        let mut q = self.aborts.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == 1000 {
            q.pop_front();
        }
        q.push_back(serde_json::json!({
            "path": path,
            "status": status.as_u16(),
            "request_ids": ids,
            "aborted": aborted,
        }));
    }

    /// Remembers an accepted request's limits (the last 1,000).
    pub fn saw_request(&self, summary: serde_json::Value) {
        let mut q = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == 1000 {
            q.pop_front();
        }
        q.push_back(summary);
    }

    /// Remembers a request's `traceparent` (the last 1,000), as vLLM would parent its span on it.
    pub fn saw_traceparent(&self, headers: &HeaderMap) {
        if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
            let mut q = self.traceparents.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() == 1000 {
                q.pop_front();
            }
            q.push_back(tp.to_owned());
        }
    }
}
