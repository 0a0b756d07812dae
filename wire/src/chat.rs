//! OpenAI chat messages and the simulator's chat template.
//!
//! Everything a chat template renders counts toward the prompt: a message's `role`, its
//! `reasoning` and `reasoning_content` (history of a reasoning model), the text and non-text
//! content parts, `name`, an assistant's `tool_calls` and a tool result's `tool_call_id`
//! ([`ChatMessage::for_each_piece`]), the request's `tools` ([`render_tools`]) and the values of
//! its `chat_template_kwargs` ([`render_template_kwargs`]). The gateway counts the same pieces
//! the simulator renders, so its estimate can be checked against the simulator's count.

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
    /// An assistant's reasoning in the history (vLLM's current name); templates of reasoning
    /// models render it.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// The same under its older name; vLLM hands the template whichever is set.
    #[serde(default)]
    pub reasoning_content: Option<String>,
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

/// Part types vLLM renders as text (vLLM 0.34 `TEXT_PART_TYPES`,
/// `vllm/renderers/chat_utils/chat_message.py`), each with the field that carries the text: the
/// Responses API's `input_text` and `output_text`, an assistant's `refusal` and a reasoning
/// model's `thinking` are rendered exactly as a `text` part with that text.
pub const TEXT_PART_TYPES: &[(&str, &str)] = &[
    ("text", "text"),
    ("input_text", "text"),
    ("output_text", "text"),
    ("refusal", "refusal"),
    ("thinking", "thinking"),
];

/// The field carrying the text of a part of type `kind`, when vLLM renders it as text.
pub fn text_field(kind: &str) -> Option<&'static str> {
    TEXT_PART_TYPES
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|(_, field)| *field)
}

/// One part of a multi-part message.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type: `text` (or another of [`TEXT_PART_TYPES`]), or `image_url`, `input_audio`,
    /// `file`... (non-text parts).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text`, `input_text` or `output_text` part.
    #[serde(default)]
    pub text: Option<String>,
    /// The other fields of the part (a non-text part's payload: URL, data...).
    #[serde(flatten)]
    pub other: Map<String, Value>,
    /// [`ContentPart::rendered_json`], made once: a request's pieces are walked several times
    /// (sized, counted, charged), and a picture's digest reads its whole payload.
    #[serde(skip)]
    rendered: std::sync::OnceLock<String>,
    /// [`ContentPart::image_size`], read once.
    #[serde(skip)]
    size: std::sync::OnceLock<Option<(u32, u32)>>,
}

impl ContentPart {
    /// Whether this part is rendered as text ([`TEXT_PART_TYPES`]).
    pub fn is_text(&self) -> bool {
        text_field(&self.kind).is_some()
    }

    /// The text of a part rendered as text, from the field its type names (`text`, `refusal`,
    /// `thinking`); `None` for other parts or when the field is not a string.
    pub fn text_value(&self) -> Option<&str> {
        match text_field(&self.kind)? {
            "text" => self.text.as_deref(),
            field => self.other.get(field)?.as_str(),
        }
    }

    /// What kind of media a non-text part carries.
    pub fn media_kind(&self) -> MediaKind {
        MediaKind::of(&self.kind)
    }

    /// The JSON a template renders for a non-text part: its fields but the type, `text`
    /// included when the part has one. An image part's inline picture (a base64 `data:` URL's
    /// data) is replaced by `#` and a 128-bit digest of it in hex ([`digest`]): the engine never renders
    /// it as text (it decodes it into the picture's own tokens, which the image charge counts,
    /// by the picture's size where it can be read), and the digest keeps two pictures apart.
    /// An audio or video payload stays as it is: a clip's length is not read, so its text is
    /// what bounds its count.
    pub fn rendered_json(&self) -> &str {
        self.rendered.get_or_init(|| self.render_json())
    }

    fn render_json(&self) -> String {
        let mut fields = self.other.clone();
        if self.media_kind() == MediaKind::Image {
            for value in fields.values_mut() {
                match value {
                    Value::Object(inner) => shorten_urls(inner),
                    Value::String(s) => shorten_url(s),
                    _ => {}
                }
            }
        }
        if let Some(text) = &self.text {
            fields.insert("text".to_owned(), Value::String(text.clone()));
        }
        Value::Object(fields).to_string()
    }

    /// The width and height of an image part's picture when it is inline and its header reads
    /// cleanly ([`crate::image::data_url_size`]): `image_url` as a string or an object's `url`.
    pub fn image_size(&self) -> Option<(u32, u32)> {
        *self.size.get_or_init(|| self.read_image_size())
    }

    fn read_image_size(&self) -> Option<(u32, u32)> {
        if self.media_kind() != MediaKind::Image {
            return None;
        }
        let url = match self.other.get("image_url")? {
            Value::String(url) => url,
            Value::Object(o) => o.get("url")?.as_str()?,
            _ => return None,
        };
        crate::image::data_url_size(url)
    }
}

/// `#` and the first 128 bits of `payload`'s SHA-256, in hex: what stands for a picture in the
/// prompt's fingerprint (the key of the cached-prefix discount), so two pictures with one
/// digest cannot be made (a 64-bit FNV digest could be: a warmed key's discount for a picture
/// the engine had never seen).
fn digest(payload: &str) -> String {
    use sha2::Digest;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = sha2::Sha256::digest(payload.as_bytes());
    let mut out = String::with_capacity(33);
    out.push('#');
    for b in &hash[..16] {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    out
}

/// A base64 `data:` URL with its payload replaced by its [`digest`]; any other string as it is.
fn shorten_url(s: &mut String) {
    if let Some(payload) = crate::image::data_url_payload(s) {
        let kept = s.len() - payload.len();
        let short = format!("{}{}", &s[..kept], digest(payload));
        *s = short;
    }
}

/// [`shorten_url`] on each string field of a part's object (`image_url.url`...).
fn shorten_urls(fields: &mut Map<String, Value>) {
    for value in fields.values_mut() {
        if let Value::String(s) = value {
            shorten_url(s);
        }
    }
}

/// The kind of a non-text content part, for its token charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    /// `image_url`, `input_image`.
    Image,
    /// `audio_url`, `input_audio`.
    Audio,
    /// `video_url`.
    Video,
    /// Any other non-text part type (rendered as its JSON, no media charge).
    Other,
}

impl MediaKind {
    /// Part types of each media kind, as vLLM's OpenAI server names them.
    pub const TYPES: &'static [(&'static str, MediaKind)] = &[
        ("image_url", MediaKind::Image),
        ("input_image", MediaKind::Image),
        ("audio_url", MediaKind::Audio),
        ("input_audio", MediaKind::Audio),
        ("video_url", MediaKind::Video),
    ];

    /// The kind of a part of type `kind`.
    pub fn of(kind: &str) -> Self {
        Self::TYPES
            .iter()
            .find(|(name, _)| *name == kind)
            .map_or(MediaKind::Other, |(_, k)| *k)
    }
}

/// One piece of a message as the template renders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceKind {
    /// The message's role, rendered in its header.
    Role,
    /// Text the client wrote (content).
    Text,
    /// Text some templates render and others leave out: a message's `name`, `reasoning` and
    /// `reasoning_content` (most reasoning models' templates drop earlier turns' reasoning),
    /// `tool_call_id`, and a tool call's `id`. Counted for the estimate as any text; a prompt
    /// made much of it teaches the estimate's correction nothing (left out by the template, it
    /// would teach the correction to count short).
    Optional,
    /// A non-text content part, rendered as its JSON.
    Media(MediaKind),
    /// Tool calls, rendered as their JSON.
    ToolCalls,
    /// A tool result's text (a `tool` or `ipython` message), rendered as a JSON string:
    /// templates write it their own way (Llama 3.1 with `tojson`, others as it is).
    ToolResult,
}

impl ChatMessage {
    /// The text of the message (text parts joined).
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .filter_map(ContentPart::text_value)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Calls `f` on every piece the template renders for this message, in order: the role (in
    /// the message's header), `reasoning` and `reasoning_content`, the content (text parts as
    /// they are, other parts as the JSON of their fields), then `name`, `tool_calls` (JSON) and
    /// `tool_call_id`. The template puts a newline between the pieces after the role.
    pub fn for_each_piece(&self, mut f: impl FnMut(PieceKind, &str)) {
        self.for_each_piece_of_part(|kind, piece, _| f(kind, piece));
    }

    /// [`ChatMessage::for_each_piece`], with the content part a non-text piece renders.
    pub fn for_each_piece_of_part(&self, mut f: impl FnMut(PieceKind, &str, Option<&ContentPart>)) {
        f(PieceKind::Role, &self.role, None);
        for reasoning in [&self.reasoning, &self.reasoning_content]
            .into_iter()
            .flatten()
        {
            f(PieceKind::Optional, reasoning, None);
        }
        // Llama 3.1's template writes a tool result as `message.content | tojson` (a string is
        // iterable to Jinja): quoted, with every control character six bytes (`\u0001`) and
        // every newline, quote and backslash two. Counted as written.
        let as_json = matches!(self.role.as_str(), "tool" | "ipython");
        let text = |f: &mut dyn FnMut(PieceKind, &str, Option<&ContentPart>), s: &str| {
            if as_json {
                f(
                    PieceKind::ToolResult,
                    &serde_json::Value::from(s).to_string(),
                    None,
                );
            } else {
                f(PieceKind::Text, s, None);
            }
        };
        match &self.content {
            None => {}
            Some(MessageContent::Text(s)) => text(&mut f, s),
            Some(MessageContent::Parts(parts)) => {
                for p in parts {
                    if p.is_text() {
                        text(&mut f, p.text_value().unwrap_or(""));
                    } else {
                        f(PieceKind::Media(p.media_kind()), p.rendered_json(), Some(p));
                    }
                }
            }
        }
        if let Some(name) = &self.name {
            f(PieceKind::Optional, name, None);
        }
        if let Some(calls) = self.tool_calls.as_ref().filter(|c| !c.is_null()) {
            f(PieceKind::ToolCalls, &rendered_calls(calls), None);
            for id in call_ids(calls) {
                f(PieceKind::Optional, id, None);
            }
        }
        if let Some(id) = &self.tool_call_id {
            f(PieceKind::Optional, id, None);
        }
    }
}

/// The `id` of each of an assistant's tool calls (a piece of its own: most templates leave it
/// out, [`PieceKind::Optional`]).
fn call_ids(calls: &serde_json::Value) -> impl Iterator<Item = &str> {
    calls
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|call| call.get("id")?.as_str())
}

/// An assistant's `tool_calls` as the template gets them: JSON, each call's `function.arguments`
/// as Python's `json.dumps` writes it back after vLLM parsed it ([`crate::pyjson`]), which can
/// be far longer than what the client sent (`1e15` is `1000000000000000.0`). A call's string
/// `id` is left out here: it is a piece of its own ([`call_ids`]).
fn rendered_calls(calls: &serde_json::Value) -> String {
    let mut calls = calls.clone();
    if let Some(list) = calls.as_array_mut() {
        for call in list {
            if let Some(fields) = call.as_object_mut() {
                if fields.get("id").is_some_and(serde_json::Value::is_string) {
                    fields.remove("id");
                }
            }
            let args = call.pointer_mut("/function/arguments");
            if let Some(serde_json::Value::String(raw)) = args {
                if let Some(dumped) = crate::pyjson::python_dumps(raw) {
                    *raw = dumped;
                }
            }
        }
    }
    calls.to_string()
}

/// How a rendered chat prompt ends: vLLM's `add_generation_prompt` and
/// `continue_final_message` (mutually exclusive there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptEnd {
    /// With the assistant's turn opened (`add_generation_prompt`, vLLM's chat default).
    #[default]
    Generation,
    /// After the last message's end marker, no turn opened (`add_generation_prompt: false`).
    Closed,
    /// Inside the last message, right after its text: the model continues it
    /// (`continue_final_message: true`; Hugging Face's template rendering cuts the prompt
    /// after the final message's content, dropping its end marker).
    ContinueFinal,
}

/// Renders chat messages into one prompt string with a ChatML template, ending with the
/// assistant's turn: `<|im_start|>{role}\n{pieces joined by newlines}<|im_end|>\n` per message
/// (any role string, as vLLM takes it). Under the token heuristic the markers are one token
/// each, so a message costs its role's text, its pieces, the newlines between them, and 4
/// tokens.
pub fn render_chat(messages: &[ChatMessage]) -> String {
    render_chat_ending(messages, PromptEnd::Generation)
}

/// [`render_chat`] ending as `end` says.
pub fn render_chat_ending(messages: &[ChatMessage], end: PromptEnd) -> String {
    render_chat_with(messages, end, None)
}

/// How the simulator's template renders a media part: `None`, as its JSON (a text model's
/// rendering, which the gateway counts as it is); else by this function where it gives a
/// text (a vision model's tokens for the picture), as its JSON where it gives `None`.
pub type Pictures<'a> = Option<&'a dyn Fn(&ContentPart) -> Option<String>>;

/// [`render_chat_ending`] with media parts rendered as `pictures` says.
pub fn render_chat_with(
    messages: &[ChatMessage],
    end: PromptEnd,
    pictures: Pictures<'_>,
) -> String {
    let mut out = String::new();
    for (i, m) in messages.iter().enumerate() {
        out.push_str("<|im_start|>");
        // The header takes the role itself, not its piece: the gateway's count of the role
        // (the piece) is checked against this.
        out.push_str(&m.role);
        out.push('\n');
        let mut first = true;
        m.for_each_piece_of_part(|kind, piece, part| {
            if kind == PieceKind::Role {
                return;
            }
            if !first {
                out.push('\n');
            }
            first = false;
            match part.zip(pictures).and_then(|(part, render)| render(part)) {
                Some(picture) => out.push_str(&picture),
                None => out.push_str(piece),
            }
        });
        if end == PromptEnd::ContinueFinal && i + 1 == messages.len() {
            return out;
        }
        out.push_str("<|im_end|>\n");
    }
    if end == PromptEnd::Generation {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// The block of `chat_template_kwargs` values the simulator's template puts before the
/// messages (real templates render such values where they use them: `custom_tools`, extra
/// instructions): `<|im_start|>kwargs\n{values joined by newlines}<|im_end|>\n`, a string
/// value as it is, any other as its compact JSON. Empty without an object of values.
pub fn render_template_kwargs(kwargs: Option<&Value>) -> String {
    let Some(Value::Object(map)) = kwargs else {
        return String::new();
    };
    if map.is_empty() {
        return String::new();
    }
    let values: Vec<String> = map
        .values()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    format!("<|im_start|>kwargs\n{}<|im_end|>\n", values.join("\n"))
}

/// The whole prompt the simulator's template renders for a chat request: the tools block, the
/// template values, then the messages ([`render_chat`]). Generation and `/tokenize` both render
/// it, so the two count alike (vLLM's `TokenizeChatRequest` takes `tools` and
/// `chat_template_kwargs` as a chat completion does).
pub fn render_request(
    tools: Option<&Value>,
    kwargs: Option<&Value>,
    messages: &[ChatMessage],
) -> String {
    render_request_ending(tools, kwargs, messages, PromptEnd::Generation)
}

/// [`render_request`] ending as `end` says.
pub fn render_request_ending(
    tools: Option<&Value>,
    kwargs: Option<&Value>,
    messages: &[ChatMessage],
    end: PromptEnd,
) -> String {
    render_request_with(tools, kwargs, messages, end, None)
}

/// [`render_request_ending`] with media parts rendered as `pictures` says.
pub fn render_request_with(
    tools: Option<&Value>,
    kwargs: Option<&Value>,
    messages: &[ChatMessage],
    end: PromptEnd,
    pictures: Pictures<'_>,
) -> String {
    let mut text = render_tools(tools);
    text.push_str(&render_template_kwargs(kwargs));
    text.push_str(&render_chat_with(messages, end, pictures));
    text
}

/// The tools block the simulator's template puts before the messages:
/// `<|im_start|>tools\n{tools as compact JSON}<|im_end|>\n`; empty without tools.
pub fn render_tools(tools: Option<&Value>) -> String {
    match tools.filter(|t| !t.is_null()) {
        Some(t) => format!("<|im_start|>tools\n{t}<|im_end|>\n"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(v: Value) -> ContentPart {
        serde_json::from_value(v).unwrap()
    }

    /// An inline picture is never rendered as text: its digest stands for it, so the part's
    /// JSON stays short however large the picture, and two pictures stay apart.
    #[test]
    fn an_inline_payload_renders_as_its_digest() {
        let big = format!("data:image/png;base64,{}", "QUJD".repeat(50_000));
        let other = format!("data:image/png;base64,{}", "QUJE".repeat(50_000));
        let a = part(serde_json::json!({"type": "image_url", "image_url": {"url": big}}));
        let b = part(serde_json::json!({"type": "input_image", "image_url": other}));
        let audio = part(serde_json::json!({"type": "input_audio",
            "input_audio": {"data": "QUJD".repeat(50_000), "format": "wav"}}));
        let video = part(serde_json::json!({"type": "video_url", "video_url": {"url": big}}));
        for p in [&a, &b] {
            let json = p.rendered_json();
            assert!(json.len() < 100, "{json}");
            assert!(json.contains('#'), "{json}");
        }
        assert_ne!(
            a.rendered_json().split('#').nth(1),
            b.rendered_json().split('#').nth(1)
        );
        // A clip's payload is counted as its text: its length is not read.
        for p in [&audio, &video] {
            assert!(p.rendered_json().len() > 200_000);
        }
        // A URL to fetch, or a data URL that is not base64, is rendered as it is.
        let fetched = part(
            serde_json::json!({"type": "image_url", "image_url": {"url": "https://a.example/x.png"}}),
        );
        assert!(fetched.rendered_json().contains("https://a.example/x.png"));
        let plain = part(
            serde_json::json!({"type": "image_url", "image_url": {"url": "data:text/plain,hello"}}),
        );
        assert!(plain.rendered_json().contains("data:text/plain,hello"));
    }
}
