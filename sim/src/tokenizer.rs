//! Prompt tokens: a real `tokenizer.json` when given, else the documented deterministic heuristic
//! of [`tutor_wire::tokens`] (`sim/README.md`, "Token counts"), shared with the gateway.
//!
//! Chat messages are rendered with a ChatML-like template ([`render_chat`]), so each message
//! costs a few tokens of overhead beyond its content, as with real chat templates. The chat types,
//! the template and the heuristic live in `tutor-wire` and are re-exported here.

use std::path::Path;

pub use tutor_wire::chat::{
    render_chat, render_chat_ending, render_request, render_request_ending, render_template_kwargs,
    render_tools, ChatMessage, ContentPart, MessageContent, PromptEnd,
};
pub use tutor_wire::tokens::{fnv1a, heuristic_ids, BOS_ID};

/// Counts and ids prompt tokens.
#[derive(Clone)]
pub enum PromptTokenizer {
    /// A HuggingFace tokenizer loaded from `tokenizer.json`.
    HuggingFace(Box<tokenizers::Tokenizer>),
    /// The deterministic heuristic of [`heuristic_ids`].
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
        // BOS; per message the two markers, the role (system: 2 tokens) and two newlines; the
        // assistant turn's marker, role (3 tokens) and newline.
        assert_eq!(
            tok.encode(&rendered, true).len(),
            content_only + 1 + (4 + 2) + (4 + 1) + 5
        );
    }

    #[test]
    fn the_template_renders_roles_reasoning_and_template_values() {
        let msgs: Vec<ChatMessage> = serde_json::from_str(
            r#"[{"role":"reviewer of code","content":"hi","reasoning":"first think","reasoning_content":"then more"}]"#,
        )
        .unwrap();
        let rendered = render_chat(&msgs);
        assert!(
            rendered.starts_with(
                "<|im_start|>reviewer of code\nfirst think\nthen more\nhi<|im_end|>\n"
            ),
            "{rendered}"
        );
        let kwargs = serde_json::json!({"custom_tools": "a tool", "enable_thinking": false});
        assert_eq!(
            render_template_kwargs(Some(&kwargs)),
            "<|im_start|>kwargs\na tool\nfalse<|im_end|>\n"
        );
        assert_eq!(render_template_kwargs(Some(&serde_json::json!({}))), "");
        assert_eq!(render_template_kwargs(None), "");
    }
}
