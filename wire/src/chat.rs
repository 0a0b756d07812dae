//! OpenAI chat messages and the simulator's chat template.
//!
//! Everything a chat template renders counts toward the prompt: the text and non-text content
//! parts, a message's `name`, an assistant's `tool_calls` and a tool result's `tool_call_id`
//! ([`ChatMessage::for_each_piece`]), and the request's `tools` ([`render_tools`]). The
//! gateway counts the same pieces the simulator renders, so its estimate can be checked against
//! the simulator's count.

use serde::Deserialize;
use serde_json::{Map, Value};

/// One chat message as the OpenAI API sends it; `content` may be a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`...
    pub role: String,
    /// The text, or a list of parts; null for an assistant's tool calls.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// The participant's name.
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant's tool calls, as sent.
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// A message's content.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type: `text`, or `image_url`, `input_audio`, `file`... (non-text parts).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
    /// The other fields of the part (a non-text part's payload: URL, data...).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl ContentPart {
    /// Whether this is a text part.
    pub fn is_text(&self) -> bool {
        self.kind == "text"
    }
}

/// One piece of a message as the template renders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceKind {
    /// Text the client wrote (content, name, tool call id).
    Text,
    /// A non-text content part, rendered as its JSON.
    Media,
    /// Tool calls, rendered as their JSON.
    ToolCalls,
}

impl ChatMessage {
    /// The text of the message (text parts joined).
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .filter(|p| p.is_text())
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Calls `f` on every piece the template renders for this message, in order: the content
    /// (text parts as they are, other parts as the JSON of their fields), then `name`,
    /// `tool_calls` (JSON) and `tool_call_id`. The template puts a newline between pieces.
    pub fn for_each_piece(&self, mut f: impl FnMut(PieceKind, &str)) {
        match &self.content {
            None => {}
            Some(MessageContent::Text(s)) => f(PieceKind::Text, s),
            Some(MessageContent::Parts(parts)) => {
                for p in parts {
                    if p.is_text() {
                        f(PieceKind::Text, p.text.as_deref().unwrap_or(""));
                    } else {
                        f(
                            PieceKind::Media,
                            &Value::Object(p.other.clone()).to_string(),
                        );
                    }
                }
            }
        }
        if let Some(name) = &self.name {
            f(PieceKind::Text, name);
        }
        if let Some(calls) = self.tool_calls.as_ref().filter(|c| !c.is_null()) {
            f(PieceKind::ToolCalls, &calls.to_string());
        }
        if let Some(id) = &self.tool_call_id {
            f(PieceKind::Text, id);
        }
    }
}

/// Renders chat messages into one prompt string with a ChatML template, ending with the
/// assistant's turn: `<|im_start|>{role}\n{pieces joined by newlines}<|im_end|>\n` per message.
/// Under the token heuristic the markers are one token each, so a message costs its pieces,
/// the newlines between them, and 4 tokens plus its role (one token for `user`, `tool`; two
/// for `system`; three for `assistant`).
pub fn render_chat(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        let mut first = true;
        m.for_each_piece(|_, piece| {
            if !first {
                out.push('\n');
            }
            first = false;
            out.push_str(piece);
        });
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// The tools block the simulator's template puts before the messages:
/// `<|im_start|>tools\n{tools as compact JSON}<|im_end|>\n`; empty without tools.
pub fn render_tools(tools: Option<&Value>) -> String {
    match tools.filter(|t| !t.is_null()) {
        Some(t) => format!("<|im_start|>tools\n{t}<|im_end|>\n"),
        None => String::new(),
    }
}
