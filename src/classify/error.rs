//! Classification errors.

use std::path::PathBuf;

/// Why a request could not be classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    /// The request cannot fit the model: its prompt leaves no room for output within
    /// `upstream.max_model_len`, or its output limit alone is above it (a limit that does not
    /// fit beside the prompt is lowered to the room left, as vLLM lowers it). The HTTP layer
    /// answers 400. When decided from byte length alone, `input_tokens` is a lower bound (the
    /// request is certainly too long).
    #[error(
        "request needs {input_tokens} input + {output_tokens} output tokens, more than the \
         model's maximum length of {max_model_len}"
    )]
    ExceedsModelLen {
        /// Estimated input tokens (template overhead included).
        input_tokens: u32,
        /// Output tokens requested (or the default budget).
        output_tokens: u32,
        /// `upstream.max_model_len`.
        max_model_len: u32,
    },
    /// `tokenizer.json` could not be loaded (at startup).
    #[error("cannot load tokenizer {}: {reason}", path.display())]
    TokenizerLoad {
        /// The configured path.
        path: PathBuf,
        /// The tokenizers crate's message.
        reason: String,
    },
    /// The blocking tokenization task panicked or was cancelled at shutdown.
    #[error("token counting failed: {0}")]
    Internal(String),
}
