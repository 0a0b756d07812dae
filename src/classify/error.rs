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

impl ClassifyError {
    /// A counting task that did not finish: cancelled (the runtime is shutting down) or
    /// panicked. The panic's message is neither logged nor told, since it may quote the text
    /// counted (a string slice out of bounds names the string).
    pub fn join(e: tokio::task::JoinError) -> Self {
        if e.is_cancelled() {
            ClassifyError::Internal("the gateway is shutting down".into())
        } else {
            tracing::error!(
                "a token count panicked (its message is not logged: it may quote the prompt)"
            );
            ClassifyError::Internal("the count panicked inside the gateway".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count that panicked quoting the text it counted tells neither the client nor the log
    /// that text.
    #[tokio::test]
    async fn a_panicking_count_does_not_repeat_its_panic_message() {
        let prompt = "my secret homework";
        let failed = tokio::task::spawn_blocking(move || {
            let _ = &prompt[..prompt.len() + 1];
        })
        .await
        .unwrap_err();
        assert!(failed.to_string().contains("secret"), "{failed}");
        let error = ClassifyError::join(failed).to_string();
        assert!(!error.contains("secret"), "{error}");
        assert!(error.contains("panicked"), "{error}");
    }
}
