//! Byte-length bounds on the token count, used to decide a lane without tokenizing.
//!
//! Let `B` be the UTF-8 bytes of the text pieces, `P` the number of pieces and `O` the template
//! overhead in tokens. Then:
//!
//! - **Upper bound: `B + P + O` tokens.** Every tokenizer we serve with emits at most one token
//!   per byte it splits: byte-level BPE (Llama 3, GPT-style) merges bytes, SentencePiece with
//!   byte fallback (Llama 2, Mistral) falls back to one token per byte, and the heuristic of
//!   `tutor_wire` never gives more than one token per byte. `P` allows one prefix marker per piece
//!   (SentencePiece's leading `▁`). The bytes split are the text after the tokenizer's
//!   normalizer ([`ByteGrowth`]): none, or SentencePiece's space marker, leaves the count at
//!   `B`; NFC grows non-ASCII text up to three times (U+1D160, 4 bytes, decomposes into 12),
//!   so `B` counts those bytes three times; any other normalizer (NFKC grows U+FDFA from 3
//!   bytes to 33) has no bound here, and its requests are counted. This bound is strict.
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

use serde_json::Value;

/// How much a tokenizer's normalizer can grow text before it is split into tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteGrowth {
    /// Not at all (no normalizer, or one that only puts SentencePiece's `▁` for spaces and
    /// before the text: one vocabulary token for one byte, a prefix counted per piece).
    None,
    /// NFC: ASCII unchanged, other text at most three times its bytes (Unicode's bound on NFC
    /// expansion in UTF-8, UAX #15).
    Nfc,
    /// Any other normalizer: no bound from the raw bytes.
    Unbounded,
}

impl ByteGrowth {
    /// The growth of a `tokenizer.json` `normalizer` (`null` when it has none).
    pub fn of_normalizer(normalizer: &Value) -> Self {
        let one = |n: &Value| match n["type"].as_str() {
            Some("NFC") => ByteGrowth::Nfc,
            Some("Prepend") if n["prepend"] == "▁" => ByteGrowth::None,
            Some("Replace") if n["pattern"]["String"] == " " && n["content"] == "▁" => {
                ByteGrowth::None
            }
            _ => ByteGrowth::Unbounded,
        };
        match normalizer["type"].as_str() {
            None if normalizer.is_null() => ByteGrowth::None,
            Some("Sequence") => {
                normalizer["normalizers"]
                    .as_array()
                    .map_or(ByteGrowth::Unbounded, |all| {
                        all.iter()
                            .map(one)
                            .fold(ByteGrowth::None, |a, b| match (a, b) {
                                (ByteGrowth::Unbounded, _) | (_, ByteGrowth::Unbounded) => {
                                    ByteGrowth::Unbounded
                                }
                                (ByteGrowth::Nfc, _) | (_, ByteGrowth::Nfc) => ByteGrowth::Nfc,
                                _ => ByteGrowth::None,
                            })
                    })
            }
            _ => one(normalizer),
        }
    }

    /// The bytes one-token-a-byte counts for text of `bytes` bytes, `non_ascii` of them not
    /// ASCII; `None` when the normalizer gives no bound.
    pub fn split_bytes(self, bytes: u64, non_ascii: impl FnOnce() -> u64) -> Option<u64> {
        match self {
            ByteGrowth::None => Some(bytes),
            ByteGrowth::Nfc => Some(bytes.saturating_add(non_ascii().saturating_mul(2))),
            ByteGrowth::Unbounded => None,
        }
    }
}

impl ByteGrowth {
    /// Tokens for `text` when the tokenizer failed to count it: one a byte of what the
    /// normalizer may make of it. A normalizer without a bound is taken as NFC (three bytes a
    /// non-ASCII byte), not at its worst case (NFKC's eleven), which would refuse as too long
    /// every prompt of a few KB; the estimate still learns from the engine's count.
    pub fn most_tokens(self, text: &str) -> usize {
        let bytes = text.len() as u64;
        let non_ascii = || text.bytes().filter(|b| !b.is_ascii()).count() as u64;
        let most = match self {
            ByteGrowth::Unbounded => ByteGrowth::Nfc.split_bytes(bytes, non_ascii),
            other => other.split_bytes(bytes, non_ascii),
        };
        usize::try_from(most.unwrap_or(bytes)).unwrap_or(usize::MAX)
    }
}

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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::ByteGrowth;

    /// A count the tokenizer failed to make is never below what the normalizer may make of
    /// the text: NFC's three bytes a non-ASCII byte, and as much for a normalizer without a
    /// bound.
    #[test]
    fn a_failed_count_is_bounded_by_the_normalized_bytes() {
        let text = "a\u{1D160}"; // 1 + 4 bytes
        assert_eq!(ByteGrowth::None.most_tokens(text), 5);
        assert_eq!(ByteGrowth::Nfc.most_tokens(text), 1 + 12);
        assert_eq!(ByteGrowth::Unbounded.most_tokens(text), 1 + 12);
    }

    #[test]
    fn normalizers_are_read_for_what_they_do_to_bytes() {
        let llama2 = json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]});
        for (normalizer, growth) in [
            (json!(null), ByteGrowth::None),
            (llama2, ByteGrowth::None),
            (json!({"type": "NFC"}), ByteGrowth::Nfc),
            (
                json!({"type": "Sequence", "normalizers": [{"type": "NFC"}]}),
                ByteGrowth::Nfc,
            ),
            (json!({"type": "NFKC"}), ByteGrowth::Unbounded),
            (json!({"type": "Lowercase"}), ByteGrowth::Unbounded),
            (
                json!({"type": "Replace", "pattern": {"String": "a"}, "content": "aaaa"}),
                ByteGrowth::Unbounded,
            ),
            (
                json!({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "NFKD"}]}),
                ByteGrowth::Unbounded,
            ),
            (json!({"type": "Sequence"}), ByteGrowth::Unbounded),
        ] {
            assert_eq!(
                ByteGrowth::of_normalizer(&normalizer),
                growth,
                "{normalizer}"
            );
        }
        assert_eq!(ByteGrowth::Nfc.split_bytes(10, || 4), Some(18));
        assert_eq!(ByteGrowth::None.split_bytes(10, || 4), Some(10));
        assert_eq!(ByteGrowth::Unbounded.split_bytes(10, || 4), None);
    }
}
