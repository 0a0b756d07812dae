//! A tighter upper bound on the tokens of a byte-level BPE tokenizer, read off its merges.
//!
//! The generic upper bound of `bounds.rs` is one token per byte: a 300-token question (about
//! 1.2 KB) with 120 output tokens never fits the small lane by it, so every such request is
//! tokenized, and with a 150k vocabulary that costs 0.3-1 ms of CPU, mostly in the
//! pre-tokenizer's regular expression. This bound costs a few nanoseconds a byte and is still
//! never below the real count, for the tokenizers it accepts.
//!
//! # Why it holds
//!
//! Byte-level BPE (GPT-2, Llama 3, Qwen 2) first splits the text into pieces with a regular
//! expression, then, inside each piece, starts from one token per byte and applies merges until
//! no two adjacent tokens form a merge in the vocabulary. So in the final tokens of a piece, two
//! adjacent **single-byte** tokens `a`, `b` never have a merge `a b`. Every token covers at least
//! one byte. The most tokens a text can have is then the most segments it can be cut into
//! (single bytes, or spans of two or more) without two adjacent single bytes that have a merge
//! and lie in the same piece: a linear-time maximum (two running values), computed here.
//!
//! Which adjacent bytes are surely in the same piece depends on the regular expression. For the
//! patterns accepted ([`PATTERNS`]: GPT-2's, Llama 3's, Qwen 2's), a run of ASCII letters is only
//! ever split right after a contraction (`'s`, `'t`, `'m`, `'d`, `'re`, `'ve`, `'ll`), and a
//! space right before a letter always starts that letter's piece. So the constraint applies to
//! a letter (or a space) followed by a letter, except within two letters after an apostrophe.
//! Digits, punctuation and newlines count one token each (these patterns isolate digits in
//! Qwen 2, and split punctuation runs anywhere).
//!
//! What else must hold, checked when the tokenizer is loaded (otherwise this bound is not used
//! and the generic one applies):
//! - the model is BPE with no dropout (merges always run to the end), no byte fallback, no
//!   subword prefix or word suffix;
//! - the normalizer is none or NFC. NFC leaves ASCII alone and grows other text at most three
//!   times in UTF-8 bytes, so each non-ASCII byte counts three tokens; the ASCII letter right
//!   before a non-ASCII byte (a combining mark may compose with it) is not constrained;
//! - every added token starts and ends with something other than an ASCII letter or a space
//!   (an added token in the text splits it, and must not split a constrained pair).
//!
//! The tests check the bound against the real count on adversarial text for tokenizers trained
//! with each accepted pre-tokenizer; `benches/classify.rs` checks it against a real vocabulary.

use serde_json::Value;

/// GPT-2's pre-tokenizer pattern (the `ByteLevel` pre-tokenizer with `use_regex`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's (also OpenAI's cl100k).
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2 and 2.5's: Llama 3's with single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Split patterns for which the piece rules above were checked.
#[cfg(test)]
pub const PATTERNS: [&str; 3] = [GPT2, LLAMA3, QWEN2];

/// Which of [`PATTERNS`] a byte-level pre-tokenizer splits by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// GPT-2's: case-sensitive contractions, runs of digits, no newline handling.
    Gpt2,
    /// Llama 3's: case-insensitive contractions, digits in threes, newlines apart.
    Llama3,
    /// Qwen 2's: Llama 3's with single digits.
    Qwen2,
}

/// `Some(true)` for an NFC normalizer (alone or in a sequence of them), `Some(false)` for none,
/// `None` for any other: NFC leaves ASCII alone and grows other text at most three times.
pub fn nfc_or_none(normalizer: &Value) -> Option<bool> {
    let nfc = |n: &Value| n["type"] == "NFC";
    if normalizer.is_null() {
        Some(false)
    } else {
        let sequence = normalizer["type"] == "Sequence"
            && normalizer["normalizers"]
                .as_array()
                .is_some_and(|n| n.iter().all(nfc));
        (nfc(normalizer) || sequence).then_some(true)
    }
}

/// The pattern a `tokenizer.json` pre-tokenizer splits by and whether it adds a prefix space,
/// when it is byte-level with one of [`PATTERNS`].
pub fn byte_level_pattern(pre: &Value) -> Option<(Pattern, bool)> {
    let byte_level = |p: &Value, regex: bool| {
        p["type"] == "ByteLevel" && p["use_regex"].as_bool().unwrap_or(true) == regex
    };
    if byte_level(pre, true) {
        return Some((Pattern::Gpt2, pre["add_prefix_space"] == true));
    }
    let [split, level] = pre["pretokenizers"].as_array().map(Vec::as_slice)? else {
        return None;
    };
    let pattern = match split["pattern"]["Regex"].as_str()? {
        p if p == GPT2 => Pattern::Gpt2,
        p if p == LLAMA3 => Pattern::Llama3,
        p if p == QWEN2 => Pattern::Qwen2,
        _ => return None,
    };
    (pre["type"] == "Sequence"
        && split["type"] == "Split"
        && split["behavior"] == "Isolated"
        && split["invert"] != true
        && byte_level(level, false))
    .then(|| (pattern, level["add_prefix_space"] == true))
}

/// GPT-2's byte-to-character map keeps printable ASCII and maps the space to `Ġ`.
const SPACE: &str = "\u{120}";

/// The bound for one tokenizer: which ASCII letter (or space) pairs it always merges.
#[derive(Clone)]
pub struct PairBound {
    /// Bit `a * 128 + b`: a merge `a b` exists (a: letter or space, b: letter).
    merges: Box<[u64; 256]>,
    /// Bytes of non-ASCII text after normalization, per input byte (1, or 3 under NFC).
    non_ascii_factor: u64,
    /// The pre-tokenizer adds a space before each text piece.
    prefix_space: bool,
}

impl std::fmt::Debug for PairBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pairs: u32 = self.merges.iter().map(|w| w.count_ones()).sum();
        f.debug_struct("PairBound")
            .field("letter_pairs", &pairs)
            .field("non_ascii_factor", &self.non_ascii_factor)
            .field("prefix_space", &self.prefix_space)
            .finish()
    }
}

fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

impl PairBound {
    /// The bound for the tokenizer serialized as `json` (a `tokenizer.json`), or why it does not
    /// apply.
    pub fn from_tokenizer_json(json: &Value) -> Result<Self, String> {
        let model = &json["model"];
        if model["type"] != "BPE" {
            return Err(format!("model type {} is not BPE", model["type"]));
        }
        for (key, ok) in [
            ("dropout", model["dropout"].is_null()),
            ("byte_fallback", model["byte_fallback"] != true),
            (
                "continuing_subword_prefix",
                model["continuing_subword_prefix"]
                    .as_str()
                    .unwrap_or("")
                    .is_empty(),
            ),
            (
                "end_of_word_suffix",
                model["end_of_word_suffix"]
                    .as_str()
                    .unwrap_or("")
                    .is_empty(),
            ),
        ] {
            if !ok {
                return Err(format!("BPE sets {key}"));
            }
        }
        let non_ascii_factor = match nfc_or_none(&json["normalizer"]) {
            Some(false) => 1,
            Some(true) => 3,
            None => return Err(format!("normalizer {} is not NFC", json["normalizer"])),
        };
        let (_, prefix_space) = byte_level_pattern(&json["pre_tokenizer"]).ok_or_else(|| {
            "the pre-tokenizer is not byte-level with GPT-2's, Llama 3's or Qwen 2's pattern"
                .to_string()
        })?;
        for added in json["added_tokens"].as_array().into_iter().flatten() {
            let content = added["content"].as_str().unwrap_or("");
            let edge = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphabetic() || c == ' ');
            if edge(content.chars().next()) || edge(content.chars().last()) {
                return Err("an added token starts or ends with a letter or a space".into());
            }
        }
        let mut merges = Box::new([0u64; 256]);
        let single = |s: &str| -> Option<u8> {
            if s == SPACE {
                return Some(b' ');
            }
            let mut chars = s.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) if c.is_ascii_alphabetic() => Some(c as u8),
                _ => None,
            }
        };
        let list = model["merges"]
            .as_array()
            .ok_or_else(|| "BPE has no merges list".to_string())?;
        for merge in list {
            let (left, right) = match merge {
                Value::String(s) => match s.split_once(' ') {
                    Some(pair) => pair,
                    None => continue,
                },
                Value::Array(pair) if pair.len() == 2 => {
                    match (pair[0].as_str(), pair[1].as_str()) {
                        (Some(l), Some(r)) => (l, r),
                        _ => continue,
                    }
                }
                _ => continue,
            };
            if let (Some(a), Some(b)) = (single(left), single(right)) {
                if is_letter(b) {
                    let bit = usize::from(a) * 128 + usize::from(b);
                    merges[bit / 64] |= 1 << (bit % 64);
                }
            }
        }
        Ok(Self {
            merges,
            non_ascii_factor,
            prefix_space,
        })
    }

    fn merges(&self, a: u8, b: u8) -> bool {
        let bit = usize::from(a) * 128 + usize::from(b);
        a < 128 && b < 128 && self.merges[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// Whether bytes `i` and `i + 1` of `t` can never both be single-byte tokens.
    fn joined(&self, t: &[u8], i: usize) -> bool {
        let (a, b) = (t[i], t[i + 1]);
        if !is_letter(b) || !(is_letter(a) || a == b' ') || !self.merges(a, b) {
            return false;
        }
        // A contraction ('s, 're, ...) may end at `a`.
        let apostrophe = |back: usize| i >= back && t[i - back] == b'\'';
        if is_letter(a) && (apostrophe(1) || apostrophe(2)) {
            return false;
        }
        // A combining mark after `b` may compose with it under NFC.
        t.get(i + 2).is_none_or(|&c| c.is_ascii())
    }

    /// At most this many tokens in `text` (no special tokens added).
    pub fn upper(&self, text: &str) -> u64 {
        let t = text.as_bytes();
        // Spans of one or two bytes suffice: a longer token is as many or fewer segments, and
        // the most segments of a prefix never drops as the prefix grows.
        // Most segments of t[..i] ending in a two-byte span (None: i < 2), and of t[..i - 1]
        // and t[..i] however they end.
        let mut multi_prev: Option<u64> = None;
        let (mut best_prev2, mut best_prev1) = (0u64, 0u64);
        for i in 0..t.len() {
            // t[i] alone: after anything, unless t[i - 1] would be alone too and they merge.
            let single = if i > 0 && self.joined(t, i - 1) {
                multi_prev.map(|m| m + 1)
            } else {
                Some(best_prev1 + 1)
            };
            // t[i - 1..=i] as one span.
            let multi = (i >= 1).then_some(best_prev2 + 1);
            let best = single.max(multi).unwrap_or(0);
            multi_prev = multi;
            (best_prev2, best_prev1) = (best_prev1, best);
        }
        let non_ascii = t.iter().filter(|b| !b.is_ascii()).count() as u64;
        best_prev1 + non_ascii * (self.non_ascii_factor - 1) + u64::from(self.prefix_space)
    }
}
