//! Byte-length bounds on the token count, used to decide a lane without tokenizing.
//!
//! Let `B` be the UTF-8 bytes of the text pieces, `P` the number of pieces and `O` the template
//! overhead in tokens. Then:
//!
//! - **Upper bound: `B + P + O` tokens.** Every tokenizer we serve with emits at most one token
//!   per input byte: byte-level BPE (Llama 3, GPT-style) merges bytes, SentencePiece with byte
//!   fallback (Llama 2, Mistral) falls back to one token per byte, and the heuristic of
//!   `tutor_wire` never gives more than one token per byte. `P` allows one prefix marker per piece
//!   (SentencePiece's leading `▁`). This bound is strict.
//! - **Lower bound: `ceil(B / 6) + O` tokens.** Llama-3-class 128k vocabularies average about
//!   3-4.5 bytes a token on English and source code (the heuristic at most 5, by its rules), so
//!   6 bytes a token is a safe ceiling on average density for real tutoring content.
//!   Adversarial text (say, 40 KB of one repeated word) can beat it; such a request is then
//!   sorted as large and over-reserves, which only costs its sender.
//! - **A tighter upper bound for byte-level BPE tokenizers** of a known kind (GPT-2, Llama 3,
//!   Qwen 2 patterns): read off the tokenizer's merges in one pass over the bytes, about two
//!   tokens for three bytes of English instead of one a byte (`pair_bound.rs`). It is tried
//!   when the generic one does not settle the small lane, so a 300-token question with 120
//!   output tokens is small without tokenizing.
//!
//! A request is `small` without tokenizing when even the upper bound fits the small lane (and
//! the counter has no fast count for it: a short prompt the heuristic or the hand-written
//! pre-tokenizer can count is counted). A request that even the lower bound puts over
//! `max_model_len` is rejected without tokenizing. Every other request is counted: a large one
//! reserves its corrected count (`calibration.rs`), never a guess from its bytes, which fell
//! below the real count on dense code (3 bytes a token guessed, 2.3 measured).

/// Densest average bytes per token assumed for the lower bound.
pub const MAX_BYTES_PER_TOKEN: u64 = 6;

/// Bounds on the input tokens of one request, from its byte length alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteBounds {
    /// No tokenizer gives fewer tokens than this on real content.
    pub lower: u32,
    /// No tokenizer gives more tokens than this.
    pub upper: u32,
}

impl ByteBounds {
    /// Bounds for `bytes` of text in `pieces` pieces with `overhead` template tokens.
    pub fn new(bytes: u64, pieces: u32, overhead: u32) -> Self {
        let overhead = u64::from(overhead);
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        Self {
            lower: clamp(bytes.div_ceil(MAX_BYTES_PER_TOKEN) + overhead),
            upper: clamp(bytes + u64::from(pieces) + overhead),
        }
    }
}
