//! Prompts of an exact token length: seeded English-like programming text, measured with the
//! same tokenizer the engine uses (the simulator's heuristic, or a `tokenizer.json`).

use tutor_wire::chat::{render_chat, ChatMessage, MessageContent};
use vllm_sim::text::SplitMix;
use vllm_sim::tokenizer::PromptTokenizer;

/// Short words: with the heuristic tokenizer " word" (space + up to 4 letters) is one token.
const WORDS: &[&str] = &[
    "why", "does", "my", "loop", "not", "end", "when", "i", "set", "the", "flag", "in", "next",
    "call", "this", "code", "fn", "let", "mut", "map", "key", "type", "bug", "test", "fail",
    "file", "line", "var", "list", "sort", "read", "into", "from", "over", "and", "but", "then",
    "use", "data", "user", "page", "run", "step", "fix", "node", "tree", "path", "len", "int",
    "str", "byte", "hash", "each", "item", "find", "case", "more", "less", "same", "time", "work",
    "load", "send", "get", "put", "add", "new", "old", "main", "help", "look", "see", "make",
];

/// Seed of the prompt of request `i` of client `client` in class `class`.
pub fn request_seed(seed: u64, class: usize, client: u64, i: u64) -> u64 {
    let mut r = SplitMix::new(seed ^ ((class as u64) << 48) ^ (client << 24) ^ i);
    r.next_u64()
}

/// Builds prompts whose chat rendering is exactly `n` tokens for the engine.
#[derive(Debug, Clone)]
pub struct PromptBuilder {
    tokenizer: PromptTokenizer,
    overhead: usize,
}

impl PromptBuilder {
    /// A builder counting with `tokenizer`.
    pub fn new(tokenizer: PromptTokenizer) -> Self {
        let mut b = Self {
            tokenizer,
            overhead: 0,
        };
        b.overhead = b.count("");
        b
    }

    /// Prompt tokens the engine counts for one user message holding `content`.
    pub fn count(&self, content: &str) -> usize {
        let msg = ChatMessage {
            role: "user".into(),
            content: Some(MessageContent::Text(content.to_string())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning: None,
            reasoning_content: None,
        };
        self.tokenizer.encode(&render_chat(&[msg]), true).len()
    }

    /// Text whose chat rendering is `tokens` tokens (exact with the heuristic; the nearest
    /// length not above it with a real tokenizer). Same `seed`, same text.
    pub fn build(&self, tokens: u32, seed: u64) -> String {
        let target = (tokens as usize).saturating_sub(self.overhead).max(1);
        let mut rng = SplitMix::new(seed);
        let mut words = Vec::with_capacity(target + 8);
        words.push(format!("Question {seed:x}:"));
        let mut since_stop = 0;
        while words.len() < target * 5 / 4 + 16 {
            since_stop += 1;
            if since_stop > 10 && rng.next_u64().is_multiple_of(6) {
                words.push(".".into());
                since_stop = 0;
            } else {
                let w = WORDS[(rng.next_u64() % WORDS.len() as u64) as usize];
                words.push(format!(" {w}"));
            }
        }
        // Largest prefix of words that fits: the count grows with the number of words.
        let (mut lo, mut hi) = (1usize, words.len());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.count(&words[..mid].concat()) <= tokens as usize {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        words[..lo].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_prompts_have_exact_lengths_and_replay() {
        let b = PromptBuilder::new(PromptTokenizer::Heuristic);
        for n in [64, 300, 2000, 8000] {
            let p = b.build(n, 7);
            assert_eq!(b.count(&p), n as usize, "{n}");
        }
        assert_eq!(b.build(300, 1), b.build(300, 1));
        assert_ne!(b.build(300, 1), b.build(300, 2));
    }
}
