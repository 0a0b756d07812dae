//! Client- or engine-supplied text made safe for a log line, a span or an error message.

/// Client- or engine-supplied text as it may appear in a log, a span or an error message: its
/// first `max_chars` characters, each not a visible ASCII character shown as `?`.
pub fn printable(text: &str, max_chars: usize) -> String {
    text.chars()
        .take(max_chars)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}
