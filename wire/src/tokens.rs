//! The token-count heuristic (`sim/README.md`, "Token counts"): it splits text into pieces and
//! gives each piece an id from a hash of its text, so equal text always gives equal ids and a
//! prefix cache behaves as with a real tokenizer:
//! - a run of letters and digits of length n, with at most one space before it, is ceil(n / 4)
//!   tokens;
//! - a newline is one token; a run of other whitespace of length n is ceil(n / 4) tokens;
//! - a chat template marker `<|name|>` (lowercase letters, digits and `_`, at most 32 of them:
//!   `<|im_start|>`, `<|eot_id|>`) is one token, as special tokens are in real tokenizers;
//! - every other character (punctuation, symbols, non-ASCII) is one token.

/// Id of the beginning-of-sequence token the heuristic puts first.
pub const BOS_ID: u32 = 1;
const VOCAB: u32 = 128_000;

/// Heuristic token ids; see the module docs for the rules.
pub fn heuristic_ids(text: &str, add_bos: bool) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len() / 3 + 2);
    if add_bos {
        ids.push(BOS_ID);
    }
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let start = i;
        if let Some(len) = marker_len(&bytes[i..]) {
            i += len;
            ids.push(piece_id(&text[start..i]));
            continue;
        }
        if b == b' ' && i + 1 < bytes.len() && bytes[i + 1].is_ascii_alphanumeric() {
            i += 1;
        }
        if bytes[i].is_ascii_alphanumeric() {
            let word_start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphanumeric() {
                i += 1;
            }
            push_chunks(&mut ids, &text[start..i], i - word_start);
        } else if b == b'\n' {
            i += 1;
            ids.push(piece_id("\n"));
        } else if b.is_ascii_whitespace() {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() && bytes[i] != b'\n' {
                i += 1;
            }
            push_chunks(&mut ids, &text[start..i], i - start);
        } else {
            let ch_len = text[i..].chars().next().map_or(1, char::len_utf8);
            i += ch_len;
            ids.push(piece_id(&text[start..i]));
        }
    }
    ids
}

/// The length of the `<|name|>` marker `bytes` starts with, if it does.
fn marker_len(bytes: &[u8]) -> Option<usize> {
    if !bytes.starts_with(b"<|") {
        return None;
    }
    let name = bytes[2..]
        .iter()
        .take(33)
        .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || **b == b'_')
        .count();
    (name > 0 && name <= 32 && bytes[2 + name..].starts_with(b"|>")).then_some(name + 4)
}

/// Pushes ceil(len / 4) ids for one piece; chunk k of the piece hashes the piece and k.
fn push_chunks(ids: &mut Vec<u32>, piece: &str, len: usize) {
    let n = len.div_ceil(4).max(1);
    let base = fnv1a(piece.as_bytes());
    for k in 0..n as u64 {
        ids.push(to_id(base ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    }
}

fn piece_id(piece: &str) -> u32 {
    to_id(fnv1a(piece.as_bytes()))
}

fn to_id(h: u64) -> u32 {
    // Ids 0..256 are kept for special tokens.
    256 + (h % u64::from(VOCAB - 256)) as u32
}

/// FNV-1a, 64 bit: stable across runs and platforms.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
