//! What an [`UpstreamStream`] knows, handed to telemetry as plain values
//! ([`UpstreamView`]): telemetry never reads the stream or vLLM's wire types itself.

use super::stream::UpstreamStream;
use crate::telemetry::latency::{EngineTimings, PromptUsage, UpstreamView};

impl UpstreamStream {
    /// What this stream knows now: output count, usage, engine timings, first token and end.
    pub fn view(&self) -> UpstreamView {
        let t = self.timings();
        let out = self.output_tokens();
        UpstreamView {
            output_tokens: out.count,
            exact_output: out.exact,
            usage: self.usage().map(|u| PromptUsage {
                prompt_tokens: u.prompt_tokens,
                cached_tokens: u.cached_tokens,
                reported: self.final_usage(),
            }),
            engine: self.engine_metrics().map(|e| EngineTimings {
                time_to_first_token_ms: e.time_to_first_token_ms,
                queue_time_ms: e.queue_time_ms,
            }),
            first_content_at: t.first_content_at,
            first_answer_at: t.first_answer_at,
            ended_at: t.ended_at,
            finish_reason: self.finish_reason().map(str::to_owned),
        }
    }
}
