//! Classification (M12): estimate a request's work and pick its lane.
//!
//! Estimated work = input tokens (the prompt, or the chat messages plus
//! `classify.per_message_overhead` per message) + the requested max output tokens (or
//! `classify.default_output_tokens`). Work `<= small_max_work` (1200) is [`Lane::Small`],
//! `<= medium_max_work` (5000) [`Lane::Medium`], anything more [`Lane::Large`].
//!
//! Tokens are counted with the `tokenizer.json` vLLM serves with, or the simulator's heuristic
//! when configured explicitly ([`TokenCounter`]). Counting runs on a blocking thread
//! (`spawn_blocking`) and is skipped altogether when byte length already settles the lane; the
//! bounds and the estimate used then are documented in [`bounds`]. A request that cannot fit
//! `upstream.max_model_len` is rejected with [`ClassifyError::ExceedsModelLen`] (HTTP 400).
//!
//! Files: `lane.rs` (the enum), `input.rs` (what is counted), `counter.rs` (tokenizer or
//! heuristic), `bounds.rs` (byte-length bounds), `classifier.rs` (the decision).

pub mod bounds;
mod classifier;
mod counter;
mod error;
mod input;
mod lane;

#[cfg(test)]
mod tests;

pub use classifier::{Classification, Classifier};
pub use counter::TokenCounter;
pub use error::ClassifyError;
pub use input::{ChatMessage, ContentPart, MessageContent, PromptInput};
pub use lane::Lane;
