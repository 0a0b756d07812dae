//! Classification (M12): estimate a request's work and pick its lane.
//!
//! Estimated work = input tokens (the prompt, or the chat messages plus
//! `classify.per_message_overhead` per message) + the requested max output tokens (or
//! `classify.default_output_tokens`). Work `<= small_max_work` (1200) is small, `<=
//! medium_max_work` (5000) medium, anything more large; that rule, the continuation choice and
//! the mid-stream promotion rules all live in [`decision`].
//!
//! Tokens are counted with the `tokenizer.json` vLLM serves with, or the simulator's heuristic
//! when configured explicitly ([`TokenCounter`]), and the count is corrected per kind of
//! content by what the engine's own counts taught ([`calibration`]). Counting runs on the
//! calling thread for a short prompt with a fast count, on a blocking thread (`spawn_blocking`)
//! otherwise, and is skipped when byte length already settles the small lane or rejects the
//! request; the bounds are documented in [`bounds`]. A request that cannot fit
//! `upstream.max_model_len` (its prompt leaves no room, or its output limit alone is above it)
//! is rejected with [`ClassifyError::ExceedsModelLen`] (HTTP 400); an output limit that only
//! does not fit beside the prompt is lowered to the room left, as vLLM lowers it.
//!
//! Files: `input.rs` (what is counted), `counter.rs` (tokenizer or heuristic), `bounds.rs`
//! (byte-length bounds), `pair_bound.rs` (the tighter bound a byte-level BPE's merges give),
//! `pieces.rs` (exact counts without the pre-tokenizer's regular expression, for ASCII text),
//! `calibration.rs` (the learned correction), `classifier.rs` (the estimate), `decision.rs` (every lane rule). The
//! [`Lane`](crate::lane::Lane) enum itself is the leaf module `crate::lane`.

pub mod bounds;
pub mod calibration;
mod classifier;
mod counter;
pub mod decision;
mod error;
mod input;
mod pair_bound;
mod pieces;

#[cfg(test)]
mod byte_level_tests;
#[cfg(test)]
mod tests;

pub use calibration::{Calibration, ContentKind, KindCounts};
pub use classifier::{Classification, Classifier, EngineCount};
pub use counter::TokenCounter;
pub use decision::LaneRules;
pub use error::ClassifyError;
pub use input::{
    text_field, ChatMessage, ContentPart, MediaKind, MessageContent, PieceKind, PromptInput,
    TemplateCosts, TEXT_PART_TYPES,
};
