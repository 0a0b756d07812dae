//! What gets classified: a plain prompt or chat messages (with the request's tools and
//! template values), and every piece of text the chat template renders from them.
//!
//! The rule, stated once in docs/operations.md ("What the estimate counts"): a message's role,
//! `reasoning`, `reasoning_content`, every content part, `name`, `tool_calls` and
//! `tool_call_id` ([`ChatMessage::for_each_piece`]); the request's `tools` and
//! `chat_template_kwargs` as pretty-printed JSON; per message and for the assistant turn the
//! template's markers (`classify.per_message_overhead`); per media part its kind's charge.

use super::bounds::MAX_BYTES_PER_TOKEN;
use super::calibration::{ContentKind, KindCounts, Rendered};
use serde_json::Value;
pub use tutor_wire::chat::{
    text_field, ChatMessage, ContentPart, MediaKind, MessageContent, PieceKind, TEXT_PART_TYPES,
};

/// Tokens counted for the tools block beyond the tools' JSON: the preamble templates put around
/// it (Qwen 2.5's is about 120 tokens, Llama 3.1's about 100).
pub const TOOLS_OVERHEAD: u32 = 150;

/// The input of a request, as far as token counting is concerned.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// A completion-style prompt (`/v1/completions`, `GET /answer?prompt=`).
    Prompt(String),
    /// Chat messages (`/v1/chat/completions`, `POST /answer`), the request's tools and the
    /// values it hands the template.
    Chat {
        /// The messages; every piece the template renders counts
        /// ([`ChatMessage::for_each_piece`]).
        messages: Vec<ChatMessage>,
        /// The `tools` array as the template renders it: JSON indented by four spaces (Llama
        /// 3.1's `tojson(indent=4)`), which costs at least what the compact or indented JSON of
        /// real templates does.
        tools: Option<String>,
        /// `chat_template_kwargs` as pretty-printed JSON: its keys, quotes and indentation cost
        /// at least what a template rendering its values does.
        template_kwargs: Option<String>,
    },
}

/// What the template adds around the pieces, beyond their text.
#[derive(Debug, Clone, Copy)]
pub struct TemplateCosts {
    /// Tokens per message (role header markers, separators, end of turn); the role's own text
    /// is counted as text.
    pub per_message: u32,
    /// Tokens per image part, on top of its JSON: the most a picture costs.
    pub image_part: u32,
    /// Side in pixels of the square one image token covers: a picture whose size its `data:`
    /// URL gives costs a token per square, at most `image_part`; 0: every picture `image_part`.
    pub image_token_pixels: u32,
    /// With `image_token_pixels`: the squares a smaller picture is scaled up to (the model's
    /// `min_pixels`).
    pub image_min_tokens: u32,
    /// Tokens per audio part, on top of its JSON.
    pub audio_part: u32,
    /// Tokens per video part, on top of its JSON.
    pub video_part: u32,
}

impl TemplateCosts {
    /// The charge of one non-text part of `kind` (none for a part that is not media): the
    /// most a part of that kind costs.
    pub fn media_part(&self, kind: MediaKind) -> u32 {
        match kind {
            MediaKind::Image => self.image_part,
            MediaKind::Audio => self.audio_part,
            MediaKind::Video => self.video_part,
            MediaKind::Other => 0,
        }
    }

    /// The charge of `part`: with `image_token_pixels` set, a picture whose size its `data:`
    /// URL's header gives (PNG, JPEG, GIF, WebP: [`ContentPart::image_size`]) costs
    /// `ceil(w / side) * ceil(h / side)` tokens, or when it has fewer than `image_min_tokens`
    /// squares' pixels what its sides scaled up to them cover, rounded up (Qwen2-VL's
    /// `smart_resize` rounds each side to the nearest multiple, scales down past `max_pixels`
    /// and up below `min_pixels`: never more than this); at most `image_part`. Any other part
    /// costs its kind's charge.
    pub fn part_charge(&self, part: &ContentPart) -> u32 {
        let kind = part.media_kind();
        let most = self.media_part(kind);
        if self.image_token_pixels == 0 || kind != MediaKind::Image {
            return most;
        }
        let Some((w, h)) = part.image_size() else {
            return most;
        };
        let side = f64::from(self.image_token_pixels);
        let (w, h) = (f64::from(w), f64::from(h));
        let squares = (w / side).ceil() * (h / side).ceil();
        let least = f64::from(self.image_min_tokens) * side * side;
        let scaled_up = if w * h < least {
            // The same float operations in the same order as `smart_resize`'s (`beta =
            // sqrt(min_pixels / (h * w))`, `ceil(h * beta / factor)`), so the same result.
            let beta = (least / (h * w)).sqrt();
            (h * beta / side).ceil() * (w * beta / side).ceil()
        } else {
            0.0
        };
        let charge = squares.max(scaled_up).min(f64::from(most));
        // Within 0..=most, so the conversion is exact.
        charge as u32
    }
}

/// `value` as the template-facing pretty JSON; `None` for null or absent. The rendering stops
/// past the bytes that no `max_model_len` tokens could fill ([`MAX_BYTES_PER_TOKEN`] a
/// token): a longer text is cut there, one byte over, and is refused as too long by its length
/// alone. Pretty JSON grows with the nesting (two spaces a level on every line): 4 MB of arrays
/// nested 120 deep rendered to about 500 MB and took a second of CPU before the refusal.
fn pretty(value: Option<&Value>, max_model_len: u32) -> Option<String> {
    /// A writer that takes at most `cap + 1` bytes, then fails (ending the serialisation).
    struct Capped {
        buf: Vec<u8>,
        cap: usize,
    }
    impl std::io::Write for Capped {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let room = (self.cap + 1).saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&b[..b.len().min(room)]);
            if self.buf.len() > self.cap {
                Err(std::io::Error::other(
                    "past the longest countable rendering",
                ))
            } else {
                Ok(b.len())
            }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let value = value.filter(|v| !v.is_null())?;
    let cap = u64::from(max_model_len).saturating_mul(MAX_BYTES_PER_TOKEN);
    let mut w = Capped {
        buf: Vec::new(),
        cap: usize::try_from(cap).unwrap_or(usize::MAX - 1),
    };
    // An error is the cap (the text is cut) or a number serde cannot write (not from a parsed
    // body): either way what was written stands.
    // Four spaces an indent: Llama 3.1's template writes each tool as `tojson(indent=4)`.
    let mut ser = serde_json::Serializer::with_formatter(
        &mut w,
        serde_json::ser::PrettyFormatter::with_indent(b"    "),
    );
    let _ = serde::Serialize::serialize(value, &mut ser);
    Some(String::from_utf8_lossy(&w.buf).into_owned())
}

/// Where a text piece of a [`PromptInput`] comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A completions prompt.
    Prompt,
    /// The request's `tools`.
    Tools,
    /// The request's `chat_template_kwargs`.
    TemplateKwargs,
    /// A piece of a message.
    Piece(PieceKind),
}

impl PromptInput {
    /// Chat input from messages and the request's `tools` value (`None` or null: no tools),
    /// for a model of `max_model_len` tokens (what bounds the rendering, see [`pretty`]).
    pub fn chat(messages: Vec<ChatMessage>, tools: Option<&Value>, max_model_len: u32) -> Self {
        Self::Chat {
            messages,
            tools: pretty(tools, max_model_len),
            template_kwargs: None,
        }
    }

    /// The same input, with the request's `chat_template_kwargs` counted too (`None` or null:
    /// none). A prompt is left as it is.
    pub fn with_template_kwargs(self, kwargs: Option<&Value>, max_model_len: u32) -> Self {
        match self {
            PromptInput::Chat {
                messages, tools, ..
            } => PromptInput::Chat {
                messages,
                tools,
                template_kwargs: pretty(kwargs, max_model_len),
            },
            prompt => prompt,
        }
    }

    /// Calls `f` on every text piece that will be tokenized.
    pub fn for_each_text(&self, mut f: impl FnMut(&str)) {
        self.for_each_source(|_, text| f(text));
    }

    /// Calls `f` on every text piece that will be tokenized, with the kind it is corrected as
    /// (`calibration.rs`) and whether templates may leave it out ([`PieceKind::Optional`]):
    /// `tools` and tool calls are tools (JSON each template writes its own way), media parts
    /// media, roles prose, other text (tool results, optional pieces and
    /// `chat_template_kwargs` included) code or prose by [`ContentKind::of_text`]. A tool
    /// result is the text a tool returned (a test run's output, a file), rendered whole, and
    /// the values of `chat_template_kwargs` are text a template renders where it uses them:
    /// never counted at the tools' ratio, which templates that render tools compact teach far
    /// below what rendered text costs. A review sent back as a tool result was estimated at a
    /// quarter of its tokens.
    pub fn for_each_kind_text(&self, mut f: impl FnMut(ContentKind, Rendered, &str)) {
        self.for_each_source(|source, text| {
            let kind = match source {
                Source::Piece(PieceKind::Role) => ContentKind::Prose,
                Source::Piece(PieceKind::Media(_)) => ContentKind::Media,
                Source::Piece(PieceKind::ToolCalls) | Source::Tools => ContentKind::Tools,
                Source::Piece(PieceKind::Text | PieceKind::ToolResult | PieceKind::Optional)
                | Source::Prompt
                | Source::TemplateKwargs => ContentKind::of_text(text),
            };
            let rendered = match source {
                Source::Piece(PieceKind::Optional) => Rendered::Maybe,
                _ => Rendered::Always,
            };
            f(kind, rendered, text)
        });
    }

    /// The one walk over the text pieces, each with where it comes from.
    fn for_each_source(&self, mut f: impl FnMut(Source, &str)) {
        match self {
            PromptInput::Prompt(text) => f(Source::Prompt, text),
            PromptInput::Chat {
                messages,
                tools,
                template_kwargs,
            } => {
                if let Some(block) = tools {
                    f(Source::Tools, block);
                }
                if let Some(block) = template_kwargs {
                    f(Source::TemplateKwargs, block);
                }
                for message in messages {
                    message.for_each_piece(|kind, piece| f(Source::Piece(kind), piece));
                }
            }
        }
    }

    /// The request's `tools` as counted (pretty-printed); `None` without tools.
    pub fn tools_block(&self) -> Option<&str> {
        match self {
            PromptInput::Chat {
                tools: Some(block), ..
            } => Some(block),
            _ => None,
        }
    }

    /// The request's `tools` written compact (`KindCounts::tools_inflated`); `None` without
    /// tools or when their rendering was cut at the context.
    pub fn compact_tools(&self) -> Option<String> {
        let PromptInput::Chat {
            tools: Some(block), ..
        } = self
        else {
            return None;
        };
        serde_json::from_str::<Value>(block)
            .ok()
            .map(|v| v.to_string())
    }

    /// Total UTF-8 bytes of the text pieces, and how many pieces there are.
    pub fn text_bytes_and_pieces(&self) -> (u64, u32) {
        let (mut bytes, mut pieces) = (0u64, 0u32);
        self.for_each_text(|t| {
            bytes = bytes.saturating_add(u64::try_from(t.len()).unwrap_or(u64::MAX));
            pieces = pieces.saturating_add(1);
        });
        (bytes, pieces)
    }

    /// Tokens the template adds around the text: one beginning-of-sequence token, plus for chat
    /// `per_message` per message and once more for the assistant turn it ends with, a newline
    /// between two pieces of one message after its role, [`TOOLS_OVERHEAD`] with tools, and
    /// each media part's charge by kind.
    pub fn template_overhead(&self, costs: TemplateCosts) -> u32 {
        self.template_costs(costs).total()
    }

    /// [`PromptInput::template_overhead`] split as the correction takes it: the tools preamble
    /// counts as tools and the media charges as media (both vary with the model's template);
    /// the rest is `overhead`.
    pub fn template_costs(&self, costs: TemplateCosts) -> KindCounts {
        let mut split = KindCounts::default();
        match self {
            PromptInput::Prompt(_) => split.overhead = 1,
            PromptInput::Chat {
                messages, tools, ..
            } => {
                let turns = u32::try_from(messages.len())
                    .unwrap_or(u32::MAX)
                    .saturating_add(1);
                if tools.is_some() {
                    split.add(ContentKind::Tools, TOOLS_OVERHEAD);
                }
                let mut separators = 0u32;
                for m in messages {
                    let mut pieces = 0u32;
                    m.for_each_piece_of_part(|kind, _, part| match kind {
                        PieceKind::Role => {}
                        PieceKind::Media(media) => {
                            pieces = pieces.saturating_add(1);
                            let charge =
                                part.map_or(costs.media_part(media), |p| costs.part_charge(p));
                            split.add(ContentKind::Media, charge);
                        }
                        PieceKind::Text
                        | PieceKind::Optional
                        | PieceKind::ToolCalls
                        | PieceKind::ToolResult => {
                            pieces = pieces.saturating_add(1);
                        }
                    });
                    separators = separators.saturating_add(pieces.saturating_sub(1));
                }
                split.overhead = turns
                    .saturating_mul(costs.per_message)
                    .saturating_add(1)
                    .saturating_add(separators);
            }
        }
        split
    }
}
