//! What an outline holds: its definitions, containers and the scan's tokens (a leaf the
//! scans in `braces.rs` and `python.rs` fill and `mod.rs` plans over).

use std::ops::Range;

use super::lex::Lexed;

/// A function definition the parse may leave out.
#[derive(Debug, Clone)]
pub struct Def {
    /// Its bytes: whole lines, decorators and attributes included.
    pub bytes: Range<usize>,
    /// Its first and last lines (0-based).
    pub rows: (usize, usize),
    /// Its tokens.
    pub toks: Range<usize>,
    /// The names it may define (its own, those of functions nested in it).
    pub names: Vec<String>,
    /// The class (impl, namespace...) it is a member of.
    pub container: Option<usize>,
    /// Whether it is its class's constructor (or may be).
    pub ctor: bool,
    /// Never left out (a statement or definition the scan cannot cut out): only read for
    /// what it defines and mentions.
    pub pinned: bool,
}

/// A class, impl or namespace body whose members were outlined.
#[derive(Debug, Clone, Default)]
pub struct Container {
    /// The names in its header, keywords left out (`Cart`, `Display`).
    pub names: Vec<String>,
    /// Python: every member is a definition (one must stay for the body to parse).
    pub only_defs: bool,
    /// Its tokens, header to closing brace.
    pub toks: Range<usize>,
    /// Its first and last lines.
    pub rows: (usize, usize),
    /// Its bytes (whole lines).
    pub bytes: Range<usize>,
    /// The container it is nested in.
    pub parent: Option<usize>,
    /// It spans whole lines (it may be left out as a whole).
    pub whole_lines: bool,
}

/// One file's outline.
pub struct Outline {
    pub(super) lexed: Lexed,
    /// The function definitions found, in source order.
    pub defs: Vec<Def>,
    /// The containers found.
    pub containers: Vec<Container>,
    pub(super) len: usize,
}

/// Words that are never a definition's or a class's name.
pub(super) const KEYWORDS: &[&str] = &[
    "abstract",
    "async",
    "class",
    "const",
    "crate",
    "data",
    "declare",
    "def",
    "default",
    "enum",
    "export",
    "extends",
    "extern",
    "final",
    "fn",
    "for",
    "func",
    "function",
    "impl",
    "implements",
    "interface",
    "module",
    "mod",
    "namespace",
    "object",
    "partial",
    "private",
    "protected",
    "pub",
    "public",
    "record",
    "sealed",
    "static",
    "struct",
    "super",
    "template",
    "trait",
    "typename",
    "union",
    "unsafe",
    "where",
];
