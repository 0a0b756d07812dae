//! What gets classified: a plain prompt or chat messages (with the request's tools), and every
//! piece of text the chat template renders from them.

use serde_json::Value;
pub use tutor_wire::chat::{ChatMessage, ContentPart, MessageContent, PieceKind};

/// Tokens counted for the tools block beyond the tools' JSON: the preamble templates put around
/// it (Qwen 2.5's is about 120 tokens, Llama 3.1's about 100).
pub const TOOLS_OVERHEAD: u32 = 150;

/// The input of a request, as far as token counting is concerned.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// A completion-style prompt (`/v1/completions`, `GET /answer?prompt=`).
    Prompt(String),
    /// Chat messages (`/v1/chat/completions`, `POST /answer`) and the request's tools.
    Chat {
        /// The messages; every piece the template renders counts
        /// ([`ChatMessage::for_each_piece`]).
        messages: Vec<ChatMessage>,
        /// The `tools` array as the template renders it: pretty-printed JSON, which costs at
        /// least what the compact or indented JSON of real templates does.
        tools: Option<String>,
    },
}

/// What the template adds around the pieces, beyond their text.
#[derive(Debug, Clone, Copy)]
pub struct TemplateCosts {
    /// Tokens per message (role header, separators, end of turn).
    pub per_message: u32,
    /// Tokens per non-text content part (an image's or audio clip's tokens), on top of its JSON.
    pub media_part: u32,
}

impl PromptInput {
    /// Chat input from messages and the request's `tools` value (`None` or null: no tools).
    pub fn chat(messages: Vec<ChatMessage>, tools: Option<&Value>) -> Self {
        let tools = tools
            .filter(|t| !t.is_null())
            .map(|t| serde_json::to_string_pretty(t).unwrap_or_else(|_| t.to_string()));
        Self::Chat { messages, tools }
    }

    /// Calls `f` on every text piece that will be tokenized.
    pub fn for_each_text(&self, mut f: impl FnMut(&str)) {
        match self {
            PromptInput::Prompt(text) => f(text),
            PromptInput::Chat { messages, tools } => {
                if let Some(t) = tools {
                    f(t);
                }
                for message in messages {
                    message.for_each_piece(|_, piece| f(piece));
                }
            }
        }
    }

    /// Total UTF-8 bytes of the text pieces, and how many pieces there are.
    pub fn text_bytes_and_pieces(&self) -> (u64, u32) {
        let (mut bytes, mut pieces) = (0u64, 0u32);
        self.for_each_text(|t| {
            bytes += t.len() as u64;
            pieces = pieces.saturating_add(1);
        });
        (bytes, pieces)
    }

    /// Tokens the template adds around the text: one beginning-of-sequence token, plus for chat
    /// `per_message` per message and once more for the assistant turn it ends with, a newline
    /// between two pieces of one message, [`TOOLS_OVERHEAD`] with tools, and `media_part` per
    /// non-text part.
    pub fn template_overhead(&self, costs: TemplateCosts) -> u32 {
        match self {
            PromptInput::Prompt(_) => 1,
            PromptInput::Chat { messages, tools } => {
                let turns = u32::try_from(messages.len())
                    .unwrap_or(u32::MAX)
                    .saturating_add(1);
                let mut extra = if tools.is_some() { TOOLS_OVERHEAD } else { 0 };
                for m in messages {
                    let mut pieces = 0u32;
                    m.for_each_piece(|kind, _| {
                        pieces += 1;
                        if kind == PieceKind::Media {
                            extra = extra.saturating_add(costs.media_part);
                        }
                    });
                    extra = extra.saturating_add(pieces.saturating_sub(1));
                }
                turns
                    .saturating_mul(costs.per_message)
                    .saturating_add(1)
                    .saturating_add(extra)
            }
        }
    }
}
