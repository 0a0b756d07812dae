//! Exact token counts in tens of microseconds for byte-level BPE tokenizers of a known pattern.
//!
//! Most of the time a `tokenizer.json` takes to encode a prompt goes into its pre-tokenizer's
//! regular expression (Llama 3's and Qwen 2's have a lookahead, so they run in a backtracking
//! engine): about 0.5 ms for a 1.7 KB question with Qwen 2.5's tokenizer. For ASCII text, the
//! pieces those patterns cut are simple to find by hand, so [`FastCount`] scans them in one pass
//! and hands each piece to the tokenizer's own BPE model (with its cache of frequent words),
//! which does the merging exactly as `encode` would. The counts are the same as
//! `Tokenizer::encode_fast` without special tokens; the tests compare them on adversarial text.
//!
//! Text that is not ASCII, or that contains one of the tokenizer's added tokens (the chat
//! template's markers), goes the full way, as does every tokenizer that is not byte-level with
//! one of the known patterns, adds a prefix space, or normalizes with anything but NFC (which
//! leaves ASCII alone).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;
use tokenizers::{Model, Tokenizer};

use super::pair_bound::{byte_level_pattern, nfc_or_none, Pattern};

/// A prompt this long or shorter is counted on the calling thread when [`FastCount`] applies:
/// tens of microseconds, shorter than a hand-off to a blocking thread and back.
pub const INLINE_BYTES: u64 = 4096;

/// Pieces this long or shorter have their counts remembered (words, numbers, punctuation runs).
const CACHED_PIECE_BYTES: usize = 24;

/// At most this many pieces are remembered; once full, new pieces are counted each time.
const CACHED_PIECES: usize = 65_536;

/// The hand-written pre-tokenizer and the tokenizer whose model merges its pieces.
pub struct FastCount {
    tokenizer: Arc<Tokenizer>,
    pattern: Pattern,
    /// Added tokens (special or not): text containing one goes the full way.
    added: Vec<String>,
    /// First bytes of the added tokens, to rule them out in one pass.
    added_first: [bool; 256],
    /// GPT-2's byte-to-character map (the alphabet of byte-level vocabularies).
    chars: [char; 256],
    /// Token counts of short pieces already merged: prompts repeat their words, and a lookup
    /// is several times cheaper than the model's own cache (which builds the tokens' strings).
    known: RwLock<HashMap<Box<[u8]>, u32, ahash::RandomState>>,
}

impl std::fmt::Debug for FastCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastCount")
            .field("pattern", &self.pattern)
            .field("added_tokens", &self.added.len())
            .finish()
    }
}

/// GPT-2's map: printable Latin-1 bytes stand for themselves, the others for U+0100 onward.
fn byte_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for (b, c) in chars.iter_mut().enumerate() {
        let b = b as u32;
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        *c = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    chars
}

fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// `\s` on ASCII (Unicode `White_Space`): tab, newline, vertical tab, form feed, return, space.
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

fn is_newline(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

/// `[^\s\p{L}\p{N}]` on ASCII.
fn is_other(b: u8) -> bool {
    !is_letter(b) && !is_digit(b) && !is_space(b)
}

/// End of the run of bytes from `p` that satisfy `class`.
fn run_end(t: &[u8], p: usize, class: impl Fn(u8) -> bool) -> usize {
    p + t[p..].iter().take_while(|&&b| class(b)).count()
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `p` (ASCII case-insensitive when `fold`): the end.
fn contraction(t: &[u8], p: usize, fold: bool) -> Option<usize> {
    let at = |i: usize| {
        t.get(p + i)
            .map(|&b| if fold { b.to_ascii_lowercase() } else { b })
    };
    if t[p] != b'\'' {
        return None;
    }
    match (at(1)?, at(2)) {
        (b's' | b't' | b'm' | b'd', _) => Some(p + 2),
        (b'r' | b'v', Some(b'e')) | (b'l', Some(b'l')) => Some(p + 3),
        _ => None,
    }
}

/// `\s*[\r\n]+|\s+(?!\S)|\s+` at whitespace `p`: the end.
fn whitespace(t: &[u8], p: usize, newlines_apart: bool) -> usize {
    let end = run_end(t, p, is_space);
    if newlines_apart {
        if let Some(last) = t[p..end].iter().rposition(|&b| is_newline(b)) {
            return p + last + 1;
        }
    }
    if end == t.len() || end - p < 2 {
        end
    } else {
        end - 1
    }
}

/// End of the piece that starts at `p` under Llama 3's or Qwen 2's pattern (`digits`: at most
/// this many digits in a piece).
fn llama3_piece(t: &[u8], p: usize, digits: usize) -> usize {
    let b = t[p];
    if let Some(end) = contraction(t, p, true) {
        return end;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if is_letter(b) {
        return run_end(t, p, is_letter);
    }
    if !is_newline(b) && !is_digit(b) && t.get(p + 1).is_some_and(|&n| is_letter(n)) {
        return run_end(t, p + 1, is_letter);
    }
    // \p{N}{1,3} (Qwen 2: \p{N})
    if is_digit(b) {
        // Looks at no more than `digits` bytes: scanning the whole run for every piece of it
        // was quadratic (a 96 KB run of digits took 0.4 s to 1.3 s of a counting slot).
        let stop = (p + digits).min(t.len());
        return run_end(&t[..stop], p, is_digit);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let start = if b == b' ' && t.get(p + 1).is_some_and(|&n| is_other(n)) {
        p + 1
    } else {
        p
    };
    if is_other(t[start]) {
        let end = run_end(t, start, is_other);
        return run_end(t, end, is_newline);
    }
    whitespace(t, p, true)
}

/// End of the piece that starts at `p` under GPT-2's pattern.
fn gpt2_piece(t: &[u8], p: usize) -> usize {
    if let Some(end) = contraction(t, p, false) {
        return end;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`, in that order.
    let classes: [fn(u8) -> bool; 3] = [is_letter, is_digit, is_other];
    for class in classes {
        if class(t[p]) {
            return run_end(t, p, class);
        }
        if t[p] == b' ' && t.get(p + 1).is_some_and(|&n| class(n)) {
            return run_end(t, p + 1, class);
        }
    }
    whitespace(t, p, false)
}

impl FastCount {
    /// The fast counter for `tokenizer`, serialized as `json`, or `None` where it does not apply.
    pub fn new(tokenizer: Arc<Tokenizer>, json: &Value) -> Option<Self> {
        let (pattern, prefix_space) = byte_level_pattern(&json["pre_tokenizer"])?;
        let ascii_unchanged = nfc_or_none(&json["normalizer"]).is_some();
        if prefix_space || !ascii_unchanged || json["model"]["type"] != "BPE" {
            return None;
        }
        let added: Vec<String> = json["added_tokens"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["content"].as_str())
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        let mut added_first = [false; 256];
        for a in &added {
            added_first[usize::from(a.as_bytes()[0])] = true;
        }
        Some(Self {
            tokenizer,
            pattern,
            added,
            added_first,
            chars: byte_chars(),
            known: RwLock::default(),
        })
    }

    /// Whether `text` can be counted here (ASCII, no added token in it).
    pub fn applies(&self, text: &str) -> bool {
        text.is_ascii()
            && (!text.bytes().any(|b| self.added_first[usize::from(b)])
                || !self.added.iter().any(|a| text.contains(a.as_str())))
    }

    /// The pieces' cache held for reading, as a long count holds it.
    #[cfg(test)]
    pub(super) fn reading(&self) -> impl Drop + '_ {
        self.known.read().unwrap()
    }

    /// Tokens in `text`, which [`FastCount::applies`] to; `None` if the model fails on a piece.
    pub fn count(&self, text: &str) -> Option<usize> {
        let t = text.as_bytes();
        let model = self.tokenizer.get_model();
        let mut piece = String::with_capacity(64);
        let (mut p, mut total) = (0, 0);
        let mut learned: Vec<(&[u8], u32)> = Vec::new();
        {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            while p < t.len() {
                let end = match self.pattern {
                    Pattern::Gpt2 => gpt2_piece(t, p),
                    Pattern::Llama3 => llama3_piece(t, p, 3),
                    Pattern::Qwen2 => llama3_piece(t, p, 1),
                };
                let bytes = &t[p..end];
                p = end;
                let short = bytes.len() <= CACHED_PIECE_BYTES;
                if let Some(&n) = short.then(|| known.get(bytes)).flatten() {
                    total += n as usize;
                    continue;
                }
                piece.clear();
                piece.extend(bytes.iter().map(|&b| self.chars[usize::from(b)]));
                let n = model.tokenize(&piece).ok()?.len();
                total += n;
                if short && known.len() + learned.len() < CACHED_PIECES {
                    learned.push((bytes, n as u32));
                }
            }
        }
        // What it learned is kept only when no count is reading the cache: waiting for the
        // write lock would hold this thread (an async worker, for a short prompt) behind a long
        // count on the blocking pool, and every new reader behind the waiting writer.
        let kept = (!learned.is_empty())
            .then(|| match self.known.try_write() {
                Ok(known) => Some(known),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            })
            .flatten();
        if let Some(mut known) = kept {
            for (bytes, n) in learned {
                if known.len() >= CACHED_PIECES {
                    break;
                }
                known.insert(bytes.into(), n);
            }
        }
        Some(total)
    }
}
