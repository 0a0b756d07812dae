//! Prompts of an exact token length: seeded English-like programming text, measured with the
//! same tokenizer the engine uses (the simulator's heuristic, or a `tokenizer.json`).
//!
//! A builder may carry a per-run salt ([`PromptBuilder::salted`]): it is mixed into every text
//! seed, so a second run with the same seed sends other text (and never hits the prefix cache
//! the first run left in a long-lived engine) while the sizes, which the seed alone draws, stay
//! the same.

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
    /// Mixed into every text seed; `None`: the seed's own text (replay).
    salt: Option<u64>,
}

/// A fresh per-run salt: the clock (nanoseconds) and the process id, mixed.
pub fn fresh_salt() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    SplitMix::new(nanos ^ (u64::from(std::process::id()) << 40)).next_u64()
}

/// `seed` with `salt` mixed in.
fn salted_seed(seed: u64, salt: u64) -> u64 {
    let s = SplitMix::new(salt ^ 0x5a17_5a17_5a17_5a17).next_u64();
    SplitMix::new(seed ^ s).next_u64()
}

impl PromptBuilder {
    /// A builder counting with `tokenizer`.
    pub fn new(tokenizer: PromptTokenizer) -> Self {
        let mut b = Self {
            tokenizer,
            overhead: 0,
            salt: None,
        };
        b.overhead = b.count("");
        b
    }

    /// The same builder with `salt` mixed into every text seed (`None`: the seed's own text).
    pub fn salted(self, salt: Option<u64>) -> Self {
        Self { salt, ..self }
    }

    /// The salt mixed into every text seed, if any.
    pub fn salt(&self) -> Option<u64> {
        self.salt
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
    /// length not above it with a real tokenizer). Same `seed` and salt, same text; another
    /// salt, other text of the same length.
    pub fn build(&self, tokens: u32, seed: u64) -> String {
        let seed = self.salt.map_or(seed, |salt| salted_seed(seed, salt));
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

    #[test]
    fn a_salt_changes_the_text_but_not_its_length_and_replays() {
        let plain = PromptBuilder::new(PromptTokenizer::Heuristic);
        let a = plain.clone().salted(Some(1));
        let b = plain.clone().salted(Some(2));
        for n in [64, 300, 2000] {
            for seed in [7, 8] {
                let (pa, pb) = (a.build(n, seed), b.build(n, seed));
                assert_ne!(pa, pb, "another salt, other text");
                assert_ne!(pa, plain.build(n, seed), "a salt differs from no salt");
                // They part in the first words ("Question <seed>:"), within vLLM's first
                // 16-token block: a prefix cache finds nothing of one in the other.
                assert_ne!(pa.split(':').next(), pb.split(':').next());
                assert_eq!(a.count(&pa), n as usize);
                assert_eq!(b.count(&pb), n as usize);
                assert_eq!(pa, a.clone().build(n, seed), "the same salt replays");
            }
        }
        assert_eq!(
            plain.clone().salted(None).build(300, 7),
            plain.build(300, 7)
        );
    }
}
