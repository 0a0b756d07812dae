//! Focusing (M11): send the function, not the file.
//!
//! A course request's code is parsed with tree-sitter and its stack trace (or compiler error)
//! read into frames ([`trace`]); what the model gets instead of the whole code is, for each
//! frame in the given code, the innermost function or method holding its line with its class
//! header (and field declarations, or a Go / Rust receiver's type), the enclosing functions'
//! headers, the file's imports, and within the course's token target the definitions of what
//! those functions call, to the configured depth, plus their class's constructor
//! ([`select`]). It is rendered in source order with `...` markers and the original line
//! numbers ([`render`]).
//!
//! The whole code is sent instead when it does not parse (syntax errors, a language focusing
//! does not know, over `focus_max_bytes`, past `focus_timeout_ms`: `fallback_parse`), when no
//! frame falls in it (`fallback_nomatch`), or when the selection would not be smaller
//! (`fallback_whole`). Token counts are the gateway's own counter's, so the lane is chosen by
//! what is sent.
//!
//! Files: `lang.rs` (languages, grammars, node kinds), `trace.rs` (frames), `index.rs` (a
//! file's definitions), `calls.rs` (what a function calls and names), `select.rs` (the
//! choice; its state in `selector.rs`), `resolve.rs` (which definitions a call reaches), `render.rs` (the text),
//! `source.rs` ([`SourceFile`], a leaf).

mod calls;
mod index;
mod lang;
mod outline;
mod render;
mod resolve;
mod select;
mod selector;
mod source;
mod trace;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tree_sitter::{ParseOptions, ParseState, Parser, Tree};

pub use lang::{Lang, LANGUAGE_NAMES};
pub use render::{whole, FOCUSED_HEADING};
pub use select::{MAX_CALLEES, MAX_CALLS};
pub use source::SourceFile;
pub use trace::{frames, Frame, MAX_FRAMES};

pub use crate::config::course::{
    FocusMode, FocusSettings, DEPTH, MAX_BYTES, TIMEOUT_MS, TOKEN_TARGET,
};

/// What focusing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The focused selection was sent.
    Focused,
    /// The code did not parse (syntax errors, unknown language, over the size cap or the
    /// time limit): sent whole.
    FallbackParse,
    /// No frame of the trace falls in the given code (or there is no trace): sent whole.
    FallbackNomatch,
    /// The selection was not smaller than the whole code: sent whole.
    FallbackWhole,
    /// The course has `focus = "off"`: sent whole.
    Off,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 5] = [
        Outcome::Focused,
        Outcome::FallbackParse,
        Outcome::FallbackNomatch,
        Outcome::FallbackWhole,
        Outcome::Off,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Focused => "focused",
            Outcome::FallbackParse => "fallback_parse",
            Outcome::FallbackNomatch => "fallback_nomatch",
            Outcome::FallbackWhole => "fallback_whole",
            Outcome::Off => "off",
        }
    }
}

/// The result of focusing one request's code.
#[derive(Debug, Clone, PartialEq)]
pub struct Focus {
    /// What happened.
    pub outcome: Outcome,
    /// Tokens of the whole code section; `None` when not counted (`off`, over the size cap).
    pub original_tokens: Option<u32>,
    /// Tokens of the code section sent.
    pub sent_tokens: Option<u32>,
    /// The functions sent (`Cart.total`; `path:Cart.total` with several files), in file and
    /// source order.
    pub functions: Vec<String>,
    /// The focused code section, when [`Outcome::Focused`].
    pub text: Option<String>,
    /// Time spent (parse, select, render, count).
    pub elapsed: Duration,
    /// Bytes of code handed to the parser (less than the whole when definitions the trace
    /// cannot reach were left out); 0 when nothing was parsed.
    pub parsed_bytes: usize,
}

impl Focus {
    fn whole(outcome: Outcome, tokens: Option<u32>, started: Instant) -> Self {
        Self {
            outcome,
            original_tokens: tokens,
            sent_tokens: tokens,
            functions: Vec::new(),
            text: None,
            elapsed: started.elapsed(),
            parsed_bytes: 0,
        }
    }

    /// Tokens saved (0 unless focused).
    pub fn saved(&self) -> u32 {
        match (self.original_tokens, self.sent_tokens) {
            (Some(o), Some(s)) => o.saturating_sub(s),
            _ => 0,
        }
    }

    /// The `focus` object of the `/answer` `meta` event.
    pub fn meta(&self) -> Value {
        json!({
            "outcome": self.outcome.as_str(),
            "original_tokens": self.original_tokens,
            "sent_tokens": self.sent_tokens,
            "functions": self.functions,
        })
    }
}

/// Focuses `files` on the frames of `trace` (or, without one, of `question`), counting with
/// `count`. Blocking CPU work: run it off the async workers.
pub fn focus(
    files: &[SourceFile],
    language: Option<Lang>,
    trace: Option<&str>,
    question: Option<&str>,
    settings: &FocusSettings,
    count: &dyn Fn(&str) -> u32,
) -> Focus {
    let started = Instant::now();
    // One deadline for the whole of focusing: parsing not done by then is given up (the code
    // is sent whole), and called definitions not weighed by then are left out.
    let deadline = started + settings.timeout;
    if settings.mode == FocusMode::Off {
        return Focus::whole(Outcome::Off, None, started);
    }
    let bytes: usize = files.iter().map(|f| f.code.len()).sum();
    if bytes > settings.max_bytes {
        return Focus::whole(Outcome::FallbackParse, None, started);
    }
    let whole_text = whole(files);
    let original = count(&whole_text);
    let fallback = |o: Outcome| Focus::whole(o, Some(original), started);
    let mut frames = trace.map(trace::frames).unwrap_or_default();
    if frames.is_empty() {
        frames = question.map(trace::frames).unwrap_or_default();
    }
    if !frames.iter().any(|f| !f.library) {
        return fallback(Outcome::FallbackNomatch);
    }
    // A file's language: its extension's; for a path without a known one, the request's
    // `language`; for code without a path, that or the trace's.
    let guessed = language.or_else(|| guess(&frames));
    let mut langs = Vec::with_capacity(files.len());
    for f in files {
        let lang = match f.path.as_deref() {
            Some(p) => Lang::from_path(p).or(language),
            None => guessed,
        };
        match lang {
            Some(l) => langs.push(l),
            None => return fallback(Outcome::FallbackParse),
        }
    }
    // Lines numbered as each language's runtime numbers them (the trace's numbers are its):
    // parsing and selection count `\n` only.
    let ended: Vec<SourceFile> = files
        .iter()
        .zip(&langs)
        .map(|(f, lang)| SourceFile {
            path: f.path.clone(),
            code: lang.with_its_line_ends(&f.code).into_owned(),
        })
        .collect();
    let files = &ended[..];
    let outlines: Vec<Option<outline::Outline>> = files
        .iter()
        .zip(&langs)
        .map(|(f, lang)| {
            (!settings.whole_parse)
                .then(|| outline::Outline::scan(*lang, &f.code))
                .flatten()
        })
        .collect();
    let plan_files: Vec<outline::PlanFile<'_>> = files
        .iter()
        .zip(&outlines)
        .map(|(f, o)| outline::PlanFile {
            outline: o.as_ref(),
            src: &f.code,
            rows: frames
                .iter()
                .filter(|fr| !fr.library && select::may_hold(f.path.as_deref(), fr))
                .filter_map(|fr| fr.line.checked_sub(1))
                .collect(),
        })
        .collect();
    let frame_names: Vec<&str> = frames
        .iter()
        .filter(|f| !f.library)
        .filter_map(|f| f.function.as_deref())
        .collect();
    let plans = outline::plan(&plan_files, &frame_names, settings.depth);
    let mut trees: Vec<Tree> = Vec::with_capacity(files.len());
    let mut parsed_bytes = 0;
    for (((f, lang), o), plan) in files.iter().zip(&langs).zip(&outlines).zip(&plans) {
        // Only what the trace can reach; the whole file when that does not parse cleanly.
        let part = match (o, plan) {
            (Some(o), Some(ranges)) => parse(*lang, &f.code, &o.ts_ranges(ranges), deadline)
                .filter(|t| !t.root_node().has_error())
                .map(|t| (t, ranges.iter().map(|r| r.len()).sum::<usize>())),
            _ => None,
        };
        let tree = part.or_else(|| parse(*lang, &f.code, &[], deadline).map(|t| (t, f.code.len())));
        match tree {
            Some((t, bytes)) if !t.root_node().has_error() => {
                trees.push(t);
                parsed_bytes += bytes;
            }
            _ => return fallback(Outcome::FallbackParse),
        }
    }
    let parsed: Vec<selector::Parsed<'_>> = files
        .iter()
        .zip(&langs)
        .zip(&trees)
        .map(|((f, lang), tree)| selector::Parsed {
            path: f.path.clone(),
            index: index::Index::build(*lang, &f.code, tree),
        })
        .collect();
    let Some(selections) = select::select(
        &parsed,
        &frames,
        settings.depth,
        settings.token_target,
        count,
        deadline,
    ) else {
        return fallback(Outcome::FallbackNomatch);
    };
    let text = render::focused(files, &langs, &selections);
    let sent = count(&text);
    if sent >= original {
        return fallback(Outcome::FallbackWhole);
    }
    let several = files.len() > 1;
    let functions = files
        .iter()
        .zip(&selections)
        .flat_map(|(f, sel)| {
            sel.functions
                .iter()
                .map(move |(_, name)| match (&f.path, several) {
                    (Some(p), true) => format!("{p}:{name}"),
                    _ => name.clone(),
                })
        })
        .collect();
    Focus {
        outcome: Outcome::Focused,
        original_tokens: Some(original),
        sent_tokens: Some(sent),
        functions,
        text: Some(text),
        elapsed: started.elapsed(),
        parsed_bytes,
    }
}

/// The language of the trace's innermost frame in a file of known extension.
fn guess(frames: &[Frame]) -> Option<Lang> {
    frames
        .iter()
        .filter(|f| !f.library)
        .find_map(|f| Lang::from_path(&f.file))
}

/// Parses `code` (only `ranges` of it, when given), giving up at `deadline`.
fn parse(lang: Lang, code: &str, ranges: &[tree_sitter::Range], deadline: Instant) -> Option<Tree> {
    let mut parser = Parser::new();
    parser.set_language(&lang.grammar()).ok()?;
    if !ranges.is_empty() {
        parser.set_included_ranges(ranges).ok()?;
    }
    let bytes = code.as_bytes();
    let mut past_deadline = |_: &ParseState| Instant::now() >= deadline;
    let options = ParseOptions::new().progress_callback(&mut past_deadline);
    parser.parse_with_options(
        &mut |at, _| bytes.get(at..).unwrap_or_default(),
        None,
        Some(options),
    )
}
