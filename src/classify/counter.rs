//! Token counting: a real `tokenizer.json` or the simulator's documented heuristic.
//!
//! Counting is CPU work (a 32 KB prompt takes milliseconds with a large BPE vocabulary), so the
//! classifier only calls [`TokenCounter::count_text`] from `spawn_blocking`, never on an async
//! worker thread.

use std::path::Path;
use std::sync::Arc;

use super::bounds::ByteGrowth;
use super::calibration::{KindCounts, MAX_PRETTY_GROWTH};
use super::error::ClassifyError;
use super::input::PromptInput;
use super::pair_bound::PairBound;
use super::pieces::FastCount;
use crate::config::TokenizerSource;

/// Counts tokens of text pieces (no special tokens; the template overhead is added separately).
#[derive(Clone)]
pub enum TokenCounter {
    /// A HuggingFace tokenizer loaded from `tokenizer.json`, with the tighter byte-length bound
    /// its merges allow when it is a byte-level BPE of a known kind (`pair_bound.rs`).
    HuggingFace {
        /// The tokenizer.
        tokenizer: Arc<tokenizers::Tokenizer>,
        /// `None`: only the generic bound of `bounds.rs` applies.
        bound: Option<Arc<PairBound>>,
        /// The hand-written pre-tokenizer for its pattern (`pieces.rs`); `None`: every count
        /// goes through `encode`.
        fast: Option<Arc<FastCount>>,
        /// What its normalizer does to the bytes one token a byte counts (`bounds.rs`).
        growth: ByteGrowth,
    },
    /// `tutor_wire::tokens::heuristic_ids`: the same counts the simulator uses.
    Heuristic,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenCounter::HuggingFace { bound, fast, .. } => f
                .debug_struct("TokenCounter::HuggingFace")
                .field("bound", bound)
                .field("fast", fast)
                .finish(),
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

    /// Loads a HuggingFace `tokenizer.json`, and the tighter bound its merges allow if any.
    pub fn from_file(path: &Path) -> Result<Self, ClassifyError> {
        let failed = |reason: String| ClassifyError::TokenizerLoad {
            path: path.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        let tokenizer: tokenizers::Tokenizer = text.parse().map_err(|e| failed(format!("{e}")))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?;
        let bound = match PairBound::from_tokenizer_json(&json) {
            Ok(bound) => {
                tracing::info!(
                    ?bound,
                    "tokenizer: using its merges for a tighter byte-length bound"
                );
                Some(Arc::new(bound))
            }
            Err(why) => {
                tracing::info!(%why, "tokenizer: byte-length bound of one token per byte");
                None
            }
        };
        let tokenizer = Arc::new(tokenizer);
        let fast = FastCount::new(Arc::clone(&tokenizer), &json).map(Arc::new);
        tracing::info!(
            fast = fast.is_some(),
            "tokenizer: hand-written pre-tokenizer for ASCII text"
        );
        let growth = ByteGrowth::of_normalizer(&json["normalizer"]);
        tracing::info!(?growth, "tokenizer: what its normalizer does to text bytes");
        Ok(TokenCounter::HuggingFace {
            tokenizer,
            bound,
            fast,
            growth,
        })
    }

    /// What the tokenizer's normalizer does to the bytes one token a byte counts: the
    /// heuristic has none.
    pub fn byte_growth(&self) -> ByteGrowth {
        match self {
            TokenCounter::HuggingFace { growth, .. } => *growth,
            TokenCounter::Heuristic => ByteGrowth::None,
        }
    }

    /// At most this many tokens in all text pieces of `input`, read from the tokenizer's merges
    /// in one pass over the bytes (`pair_bound.rs`); `None` when only the generic bound
    /// (`bounds.rs`) holds for this tokenizer.
    pub fn pair_bound(&self, input: &PromptInput) -> Option<u64> {
        match self {
            TokenCounter::HuggingFace {
                bound: Some(bound), ..
            } => {
                let mut total = 0u64;
                input.for_each_text(|t| total += bound.upper(t));
                Some(total)
            }
            _ => None,
        }
    }

    /// Tokens in `text`, without special tokens. Blocking CPU work.
    ///
    /// If the real tokenizer fails on some input, falls back to one token per byte: an upper
    /// bound (see `bounds.rs`), so the reservation errs on the safe side.
    pub fn count_text(&self, text: &str) -> u32 {
        let n = match self {
            TokenCounter::HuggingFace {
                fast: Some(fast), ..
            } if fast.applies(text) => fast.count(text).unwrap_or_else(|| self.encode(text)),
            TokenCounter::HuggingFace { .. } => self.encode(text),
            TokenCounter::Heuristic => tutor_wire::tokens::heuristic_ids(text, false).len(),
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Tokens in all text pieces of `input` when every piece can be counted the fast way
    /// (`pieces.rs`: tens of microseconds for a short prompt); `None` otherwise.
    pub fn count_quick(&self, input: &PromptInput) -> Option<u32> {
        self.count_quick_kinds(input).map(|c| c.total())
    }

    /// [`TokenCounter::count_kinds`] when every piece can be counted the fast way: the
    /// hand-written pre-tokenizer of `pieces.rs`, or the heuristic (a pass over the bytes);
    /// `None` otherwise.
    pub fn count_quick_kinds(&self, input: &PromptInput) -> Option<KindCounts> {
        let fast = match self {
            TokenCounter::Heuristic => return Some(self.count_kinds(input)),
            TokenCounter::HuggingFace {
                fast: Some(fast), ..
            } => fast,
            TokenCounter::HuggingFace { .. } => return None,
        };
        let mut counts = Some(KindCounts::default());
        let block = input.tools_block();
        let mut pretty = 0;
        input.for_each_kind_text(|kind, rendered, t| {
            counts = counts.take().filter(|_| fast.applies(t)).and_then(|mut c| {
                let n = u32::try_from(fast.count(t)?).ok()?;
                if is_block(block, t) {
                    pretty = n;
                }
                c.add_piece(kind, rendered, n);
                Some(c)
            });
        });
        let mut counts = counts?;
        if let Some(compact) = input.compact_tools() {
            if !fast.applies(&compact) {
                return None;
            }
            counts.tools_inflated = inflated(pretty, u32::try_from(fast.count(&compact)?).ok()?);
        }
        Some(counts)
    }

    /// The full `encode` (no special tokens); if the tokenizer fails, one token per byte of
    /// what its normalizer may make of the text ([`ByteGrowth::most_tokens`]).
    fn encode(&self, text: &str) -> usize {
        let TokenCounter::HuggingFace { tokenizer, .. } = self else {
            return tutor_wire::tokens::heuristic_ids(text, false).len();
        };
        match tokenizer.encode_fast(text, false) {
            Ok(encoding) => encoding.len(),
            Err(err) => {
                tracing::warn!(error = %err, "tokenizer failed; counting one token per byte of the normalized text");
                self.byte_growth().most_tokens(text)
            }
        }
    }

    /// Tokens in `text` by the full `encode`, never the fast way (to check it).
    #[cfg(test)]
    pub fn count_text_encoded(&self, text: &str) -> usize {
        self.encode(text)
    }

    /// Tokens in all text pieces of `input` (template overhead not included). Blocking CPU work.
    pub fn count_input(&self, input: &PromptInput) -> u32 {
        self.count_kinds(input).total()
    }

    /// Tokens in the text pieces of `input` by kind (`calibration.rs`; no overhead). Blocking
    /// CPU work.
    pub fn count_kinds(&self, input: &PromptInput) -> KindCounts {
        let mut counts = KindCounts::default();
        let block = input.tools_block();
        let mut pretty = 0;
        input.for_each_kind_text(|kind, rendered, t| {
            let n = self.count_text(t);
            if is_block(block, t) {
                pretty = n;
            }
            counts.add_piece(kind, rendered, n)
        });
        if let Some(compact) = input.compact_tools() {
            counts.tools_inflated = inflated(pretty, self.count_text(&compact));
        }
        counts
    }
}

/// Whether the text piece `t` is the tools `block` itself (the walk hands it over as it is),
/// counted once for both the kinds and [`inflated`].
fn is_block(block: Option<&str>, t: &str) -> bool {
    block.is_some_and(|b| std::ptr::eq(b, t))
}

/// Whether a tools block counted `pretty` is more than [`MAX_PRETTY_GROWTH`] times its
/// `compact` count (`KindCounts::tools_inflated`).
fn inflated(pretty: u32, compact: u32) -> bool {
    u64::from(compact).saturating_mul(MAX_PRETTY_GROWTH) < u64::from(pretty)
}
