//! An incremental Server-Sent Events parser: bytes in as they arrive, complete events out (their
//! `data` payload, and their `event` name for those who ask).
//!
//! Follows the SSE spec (WHATWG HTML, "event stream interpretation") for what the gateway, the
//! tests and the load tool need: lines end in `\r\n`, `\n` or `\r`; a blank line ends an event;
//! `data:` lines of one event are joined with `\n`; one space after the colon is dropped; the
//! last `event:` line names the event (`message` when none); comment lines (`:`) and other fields
//! (`id:`, `retry:`) are ignored; an event whose data is empty is not dispatched. A partial event
//! at end of stream is discarded, as the spec says.
//!
//! Works on bytes, so a read that ends inside a UTF-8 character or between `\r` and `\n` is just
//! another split; UTF-8 is checked later, when the payload is parsed as JSON.
//!
//! One event may hold at most `max_event_bytes` (the pending line plus the data gathered so far);
//! beyond that [`SseParser::feed`] fails and the parser stays failed, so an upstream that never
//! sends a line break cannot grow the buffer without bound.

use std::collections::VecDeque;

use bytes::Bytes;

/// Largest event accepted by default: 1 MiB. A vLLM chunk is a few hundred bytes (a few KiB
/// with logprobs); anything near this is a broken upstream, not a token.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Why the byte stream cannot be read as SSE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event (or one line) grew past the cap.
    #[error("an SSE event exceeded {limit} bytes")]
    EventTooLarge {
        /// The cap in force, in bytes.
        limit: usize,
    },
}

/// One complete event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The value of the event's last `event:` line, `None` when it had none.
    pub event: Option<String>,
    /// The data payload: the event's `data:` lines joined with `\n`.
    pub data: Bytes,
}

impl SseEvent {
    /// The event's name: its `event:` field, or `message` (the spec's default) when it had none.
    pub fn name(&self) -> &str {
        self.event.as_deref().unwrap_or("message")
    }
}

/// Incremental SSE parser. Feed it chunks with [`SseParser::feed`], take payloads with
/// [`SseParser::pop`] (or whole events with [`SseParser::pop_event`]).
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of the current line not yet terminated.
    line: Vec<u8>,
    /// The current event's data so far (lines joined by `\n`).
    data: Vec<u8>,
    /// Whether the current event has had a `data` field (so the next one is preceded by `\n`).
    has_data: bool,
    /// The current event's `event:` field, if it had one.
    event: Option<String>,
    /// The previous read ended with `\r`: a `\n` at the start of the next read belongs to it.
    skip_lf: bool,
    /// Bytes of a byte-order mark at the stream's start matched so far (the spec drops one);
    /// `None` once past the start.
    bom: Option<usize>,
    /// Complete events not yet taken.
    ready: VecDeque<SseEvent>,
    max_event_bytes: usize,
    failed: Option<SseError>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser that rejects events larger than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            event: None,
            skip_lf: false,
            bom: Some(0),
            ready: VecDeque::new(),
            max_event_bytes,
            failed: None,
        }
    }

    /// Consumes one read. Events completed by it become available through [`SseParser::pop`],
    /// including those completed before an error in the same read.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), SseError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        if let Some(seen) = self.bom {
            const MARK: &[u8] = b"\xEF\xBB\xBF";
            let want = &MARK[seen..];
            let n = want.len().min(bytes.len());
            if bytes[..n] == want[..n] {
                bytes = &bytes[n..];
                if n < want.len() {
                    // All of this read was the mark's start: the next read tells.
                    self.bom = Some(seen + n);
                    return Ok(());
                }
            } else {
                // Not a mark after all: what matched is the first line's start.
                self.line.extend_from_slice(&MARK[..seen]);
            }
            self.bom = None;
        }
        // An empty read tells nothing of the `\n` that may follow a `\r`: the next one does.
        if self.skip_lf && !bytes.is_empty() {
            self.skip_lf = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = bytes.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let (head, tail) = bytes.split_at(end);
            self.check_size(head.len())?;
            if self.line.is_empty() {
                self.process_line(head)?;
            } else {
                self.line.extend_from_slice(head);
                let line = std::mem::take(&mut self.line);
                self.process_line(&line)?;
                self.line = line;
                self.line.clear();
            }
            // Swallow the line ending: `\r\n` (possibly split across reads), `\r` or `\n`.
            bytes = match tail {
                [b'\r', b'\n', rest @ ..] => rest,
                [b'\r'] => {
                    self.skip_lf = true;
                    &[]
                }
                [_, rest @ ..] => rest,
                [] => &[],
            };
        }
        self.check_size(bytes.len())?;
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// The oldest complete event's data payload, if any.
    pub fn pop(&mut self) -> Option<Bytes> {
        self.ready.pop_front().map(|e| e.data)
    }

    /// The oldest complete event, with its name, if any.
    pub fn pop_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }

    /// Whether bytes of an unfinished event are buffered (they are dropped at end of stream).
    pub fn has_partial_event(&self) -> bool {
        !self.line.is_empty() || self.has_data
    }

    fn check_size(&mut self, extra: usize) -> Result<(), SseError> {
        if self.line.len() + self.data.len() + extra > self.max_event_bytes {
            let err = SseError::EventTooLarge {
                limit: self.max_event_bytes,
            };
            self.failed = Some(err.clone());
            self.line = Vec::new();
            self.data = Vec::new();
            return Err(err);
        }
        Ok(())
    }

    fn process_line(&mut self, line: &[u8]) -> Result<(), SseError> {
        if line.is_empty() {
            self.dispatch();
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            self.check_size(value.len() + 1)?;
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        } else if field == b"event" {
            self.event = Some(String::from_utf8_lossy(value).into_owned());
        }
        // `id`, `retry` and unknown fields: vLLM sends none; nothing here needs them.
        Ok(())
    }

    fn dispatch(&mut self) {
        if self.has_data && !self.data.is_empty() {
            self.ready.push_back(SseEvent {
                event: self.event.take(),
                data: Bytes::from(std::mem::take(&mut self.data)),
            });
        }
        self.event = None;
        self.data.clear();
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_kept_and_default_to_message() {
        let mut p = SseParser::default();
        p.feed(b"event: token\ndata: {\"a\":1}\n\ndata: x\n\nevent: ping\n\ndata: y\n\n")
            .unwrap();
        let names: Vec<(String, Bytes)> = std::iter::from_fn(|| p.pop_event())
            .map(|e| (e.name().to_owned(), e.data))
            .collect();
        assert_eq!(
            names,
            [
                ("token".to_owned(), Bytes::from_static(b"{\"a\":1}")),
                ("message".to_owned(), Bytes::from_static(b"x")),
                ("message".to_owned(), Bytes::from_static(b"y")),
            ]
        );
    }
}
