//! Token counting: a real `tokenizer.json` or the simulator's documented heuristic.
//!
//! Counting is CPU work (a 32 KB prompt takes milliseconds with a large BPE vocabulary), so the
//! classifier only calls [`TokenCounter::count_text`] from `spawn_blocking`, never on an async
//! worker thread.

use std::path::Path;
use std::sync::Arc;

use super::error::ClassifyError;
use super::input::PromptInput;
use crate::config::TokenizerSource;

/// Counts tokens of text pieces (no special tokens; the template overhead is added separately).
#[derive(Clone)]
pub enum TokenCounter {
    /// A HuggingFace tokenizer loaded from `tokenizer.json`.
    HuggingFace(Arc<tokenizers::Tokenizer>),
    /// `tutor_wire::tokens::heuristic_ids`: the same counts the simulator uses.
    Heuristic,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenCounter::HuggingFace(_) => f.write_str("TokenCounter::HuggingFace"),
            TokenCounter::Heuristic => f.write_str("TokenCounter::Heuristic"),
        }
    }
}

impl TokenCounter {
    /// Loads the configured source. Reads and parses the file: call it at startup, not per request.
    pub fn load(source: &TokenizerSource) -> Result<Self, ClassifyError> {
        match source {
            TokenizerSource::Heuristic => Ok(TokenCounter::Heuristic),
            TokenizerSource::File(path) => Self::from_file(path),
        }
    }

    /// Loads a HuggingFace `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, ClassifyError> {
        tokenizers::Tokenizer::from_file(path)
            .map(|t| TokenCounter::HuggingFace(Arc::new(t)))
            .map_err(|e| ClassifyError::TokenizerLoad {
                path: path.to_owned(),
                reason: e.to_string(),
            })
    }

    /// Tokens in `text`, without special tokens. Blocking CPU work.
    ///
    /// If the real tokenizer fails on some input, falls back to one token per byte: an upper
    /// bound (see `bounds.rs`), so the reservation errs on the safe side.
    pub fn count_text(&self, text: &str) -> u32 {
        let n = match self {
            TokenCounter::HuggingFace(tok) => match tok.encode_fast(text, false) {
                Ok(encoding) => encoding.len(),
                Err(err) => {
                    tracing::warn!(error = %err, "tokenizer failed; counting one token per byte");
                    text.len()
                }
            },
            TokenCounter::Heuristic => tutor_wire::tokens::heuristic_ids(text, false).len(),
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Tokens in all text pieces of `input` (template overhead not included). Blocking CPU work.
    pub fn count_input(&self, input: &PromptInput) -> u32 {
        let mut total = 0u32;
        input.for_each_text(|t| total = total.saturating_add(self.count_text(t)));
        total
    }
}
