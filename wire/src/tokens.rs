//! The token-count heuristic (`sim/README.md`, "Token counts"): it splits text into pieces and
//! gives each piece an id from a hash of its text, so equal text always gives equal ids and a
//! prefix cache behaves as with a real tokenizer:
//! - a run of ASCII letters of length n, with at most one space before it, is ceil(n / 4)
//!   tokens;
//! - every digit is one token, and a space before a number is a token of its own (Qwen 2.5 and
//!   Mistral's tokenizers split numbers into digits and leave the space before them apart;
//!   Llama 3's split them into groups of three): a number never counts fewer tokens than these
//!   tokenizers give it;
//! - a newline is one token; a run of other whitespace of length n is ceil(n / 4) tokens;
//! - a chat template marker that real tokenizers hold as one special token ([`SPECIAL_MARKERS`]:
//!   `<|im_start|>`, `<|eot_id|>`...) is one token; any other `<|name|>` is counted by the
//!   rules here, as a real tokenizer splits it;
//! - a character of four UTF-8 bytes (emoji, rare CJK, private use) is four tokens: real
//!   tokenizers have no merge for most of them and fall back to one token per byte;
//! - every other character (punctuation, symbols, other non-ASCII) is one token.

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
        if b == b' ' && i + 1 < bytes.len() && bytes[i + 1].is_ascii_alphabetic() {
            i += 1;
        }
        if bytes[i].is_ascii_alphabetic() {
            let word_start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            push_chunks(&mut ids, &text[start..i], i - word_start);
        } else if bytes[i].is_ascii_digit() {
            // One token a digit.
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
                ids.push(piece_id(&text[i - 1..i]));
            }
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
            if ch_len == 4 {
                // No merge for it in most vocabularies: a token a byte.
                push_chunks(&mut ids, &text[start..i], 16);
            } else {
                ids.push(piece_id(&text[start..i]));
            }
        }
    }
    ids
}

/// The names of the `<|name|>` markers counted as one token: the special tokens of the chat
/// templates the gateway meets (ChatML and Qwen, Llama 3, gpt-oss's harmony). Any other
/// `<|name|>` is ordinary text to a real tokenizer, many tokens.
pub const SPECIAL_MARKERS: &[&str] = &[
    "im_start",
    "im_end",
    "im_sep",
    "endoftext",
    "begin_of_text",
    "end_of_text",
    "start_header_id",
    "end_header_id",
    "eot_id",
    "eom_id",
    "python_tag",
    "finetune_right_pad_id",
    "start",
    "end",
    "message",
    "channel",
    "constrain",
    "return",
    "call",
    "tool_call",
    "vision_start",
    "vision_end",
    "image_pad",
    "video_pad",
];

/// The length of the special `<|name|>` marker `bytes` starts with, if it does.
fn marker_len(bytes: &[u8]) -> Option<usize> {
    if !bytes.starts_with(b"<|") {
        return None;
    }
    let name = bytes[2..]
        .iter()
        .take(33)
        .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || **b == b'_')
        .count();
    let known = std::str::from_utf8(&bytes[2..2 + name])
        .is_ok_and(|n| SPECIAL_MARKERS.contains(&n) || is_reserved_special(n));
    (known && bytes[2 + name..].starts_with(b"|>")).then_some(name + 4)
}

/// Llama 3's `reserved_special_token_<n>`.
fn is_reserved_special(name: &str) -> bool {
    name.strip_prefix("reserved_special_token_")
        .is_some_and(|n| !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit()))
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

#[cfg(test)]
mod tests {
    use super::heuristic_ids;

    fn count(text: &str) -> usize {
        heuristic_ids(text, false).len()
    }

    #[test]
    fn letters_go_four_to_a_token_and_digits_one_each() {
        assert_eq!(count("function"), 2);
        assert_eq!(count(" function"), 2);
        // A number is never fewer tokens than a tokenizer that splits it into digits gives.
        // The space before a number is a token of its own, as Qwen 2.5 and Mistral have it.
        assert_eq!(count(" 12345678"), 9);
        assert_eq!(count("12345678"), 8);
        assert_eq!(count("utf8"), 2);
        assert_eq!(count("x1y2"), 4);
        // Equal text, equal ids.
        assert_eq!(heuristic_ids(" 42", false), heuristic_ids(" 42", false));
    }

    #[test]
    fn only_known_special_markers_are_one_token() {
        assert_eq!(count("<|im_start|>"), 1);
        assert_eq!(count("<|eot_id|>"), 1);
        assert_eq!(count("<|reserved_special_token_7|>"), 1);
        // Any other marker is text to a real tokenizer: `<`, `|`, the name, `|`, `>`.
        assert_eq!(count("<|abcdefgh|>"), 6);
        assert!(count("<|qz7k2m9x4w8v3n6b5c1d0f2g4h6j8k|>") > 20);
    }

    #[test]
    fn a_four_byte_character_is_a_token_a_byte_and_never_more() {
        assert_eq!(count("😀"), 4);
        assert_eq!(count("\u{20000}"), 4);
        assert_eq!(count("é"), 1);
        assert_eq!(count("中"), 1);
        for text in ["😀x 12 <|foo|>\u{20000}", "  \n\t9"] {
            assert!(count(text) <= text.len(), "{text}");
        }
    }
}
