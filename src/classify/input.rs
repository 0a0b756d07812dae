//! What gets classified: a plain prompt or chat messages, and the text pieces in them.

pub use tutor_wire::chat::{ChatMessage, ContentPart, MessageContent};

/// The input of a request, as far as token counting is concerned.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// A completion-style prompt (`/v1/completions`, `GET /answer?prompt=`).
    Prompt(String),
    /// Chat messages (`/v1/chat/completions`, `POST /answer` with `messages`). Only text parts count.
    Chat(Vec<ChatMessage>),
}

impl PromptInput {
    /// Calls `f` on every text piece that will be tokenized, without copying.
    pub fn for_each_text(&self, mut f: impl FnMut(&str)) {
        match self {
            PromptInput::Prompt(text) => f(text),
            PromptInput::Chat(messages) => {
                for message in messages {
                    match &message.content {
                        None => {}
                        Some(MessageContent::Text(text)) => f(text),
                        Some(MessageContent::Parts(parts)) => parts
                            .iter()
                            .filter(|p| p.kind == "text")
                            .filter_map(|p| p.text.as_deref())
                            .for_each(&mut f),
                    }
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
    /// `per_message_overhead` per message and once more for the assistant turn it ends with.
    pub fn template_overhead(&self, per_message_overhead: u32) -> u32 {
        match self {
            PromptInput::Prompt(_) => 1,
            PromptInput::Chat(messages) => {
                let turns = u32::try_from(messages.len())
                    .unwrap_or(u32::MAX)
                    .saturating_add(1);
                turns.saturating_mul(per_message_overhead).saturating_add(1)
            }
        }
    }
}
