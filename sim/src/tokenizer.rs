//! Prompt tokens: a real `tokenizer.json` when given, else a documented deterministic heuristic.
//!
//! The heuristic (`sim/README.md`, "Token counts") splits text into pieces and gives each piece
//! an id from a hash of its text, so equal text always gives equal ids and the prefix cache
//! behaves as with a real tokenizer:
//! - a run of letters and digits of length n, with at most one space before it, is ceil(n / 4)
//!   tokens;
//! - a newline is one token; a run of other whitespace of length n is ceil(n / 4) tokens;
//! - every other character (punctuation, symbols, non-ASCII) is one token.
//!
//! Chat messages are rendered with a ChatML-like template, so each message costs a few tokens of
//! overhead beyond its content, as with real chat templates.

use std::path::Path;

use serde::Deserialize;

/// Id of the beginning-of-sequence token the heuristic puts first.
pub const BOS_ID: u32 = 1;
const VOCAB: u32 = 128_000;

/// Counts and ids prompt tokens.
#[derive(Clone)]
pub enum PromptTokenizer {
    /// A HuggingFace tokenizer loaded from `tokenizer.json`.
    HuggingFace(Box<tokenizers::Tokenizer>),
    /// The deterministic heuristic described in the module docs.
    Heuristic,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::HuggingFace(_) => f.write_str("PromptTokenizer::HuggingFace"),
            Self::Heuristic => f.write_str("PromptTokenizer::Heuristic"),
        }
    }
}

/// One chat message as the OpenAI API sends it; `content` may be a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`...
    pub role: String,
    /// The text, or a list of `{ "type": "text", "text": ... }` parts; null for tool calls.
    #[serde(default)]
    pub content: Option<MessageContent>,
}

/// A message's content.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts; only text parts count.
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type, `text` for the parts that count.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

impl ChatMessage {
    /// The text of the message (text parts joined).
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .filter(|p| p.kind == "text")
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// Renders chat messages into one prompt string, ending with the assistant's turn.
pub fn render_chat(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.text());
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

impl PromptTokenizer {
    /// Loads `tokenizer.json`, or the heuristic when `path` is `None`.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        match path {
            None => Ok(Self::Heuristic),
            Some(p) => {
                let tok = tokenizers::Tokenizer::from_file(p)
                    .map_err(|e| anyhow::anyhow!("cannot load tokenizer {}: {e}", p.display()))?;
                Ok(Self::HuggingFace(Box::new(tok)))
            }
        }
    }

    /// Token ids of `text`, with the beginning-of-sequence token when `add_special_tokens`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Vec<u32> {
        match self {
            Self::HuggingFace(tok) => match tok.encode_fast(text, add_special_tokens) {
                Ok(enc) => enc.get_ids().to_vec(),
                // A tokenizer that cannot encode falls back rather than failing the request.
                Err(_) => heuristic_ids(text, add_special_tokens),
            },
            Self::Heuristic => heuristic_ids(text, add_special_tokens),
        }
    }
}

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
    use super::*;

    #[test]
    fn heuristic_counts_follow_the_documented_rules() {
        // "why"=1, " does"=1, " this"=1, " TypeScript"=3 (10 letters), " error"=2, "?"=1, "\n"=1
        assert_eq!(
            heuristic_ids("why does this TypeScript error?\n", false).len(),
            10
        );
        assert_eq!(heuristic_ids("", true), vec![BOS_ID]);
        // Indentation: 8 spaces = 2 tokens, then "x" = 1.
        assert_eq!(heuristic_ids("        x", false).len(), 3);
    }

    #[test]
    fn equal_text_gives_equal_ids_and_different_text_differs() {
        let a = heuristic_ids("fn main() { println!(\"hi\"); }", true);
        let b = heuristic_ids("fn main() { println!(\"hi\"); }", true);
        let c = heuristic_ids("fn main() { println!(\"ho\"); }", true);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn chat_template_adds_overhead_per_message() {
        let msgs: Vec<ChatMessage> = serde_json::from_str(
            r#"[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}]"#,
        )
        .unwrap();
        let rendered = render_chat(&msgs);
        assert!(rendered.ends_with("<|im_start|>assistant\n"));
        let tok = PromptTokenizer::Heuristic;
        let content_only = tok.encode("Be brief. Hi", false).len();
        assert!(tok.encode(&rendered, true).len() > content_only + 6);
    }
}
