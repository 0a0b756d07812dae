//! OpenAI chat messages: `content` may be a string or a list of parts.

use serde::Deserialize;

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

/// Renders chat messages into one prompt string with a ChatML-like template, ending with the
/// assistant's turn, so each message costs a few tokens of overhead beyond its content, as with
/// real chat templates.
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
