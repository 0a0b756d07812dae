//! A file's outline from a lexical scan, without parsing: where its function definitions are
//! (at the top level and in class, impl and namespace bodies), the names each may define and
//! the names it mentions.
//!
//! Focusing parses only what a trace can reach ([`plan`]): the definitions the frames fall
//! in, those whose names they mention (to the configured depth), and their classes'
//! constructors; every other function definition is left out of the parser's included
//! ranges. Everything that is not a function definition (imports, types, constants, fields,
//! class headers, statements) is always parsed. Parsing is linear in what is parsed, so a
//! frame in a 2,000-line file costs about the functions it touches.
//!
//! The scan errs towards parsing: what it cannot read with confidence is kept (a definition
//! that shares a line with other code, a statement it cannot classify), and a file it cannot
//! lex (an unterminated string, brackets that do not match) is parsed whole. A syntax error
//! inside a definition the trace does not reach goes unseen; one the trace reaches, or one
//! that unbalances the file, sends the code whole as before.

mod braces;
mod lex;
mod python;

use std::collections::HashSet;
use std::ops::Range;

use super::lang::Lang;
use lex::Lexed;

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
}

/// A class, impl or namespace body whose members were outlined.
#[derive(Debug, Clone, Default)]
pub struct Container {
    /// The names in its header, keywords left out (`Cart`, `Display`).
    pub names: Vec<String>,
    /// Python: every member is a definition (one must stay for the body to parse).
    pub only_defs: bool,
}

/// One file's outline.
pub struct Outline {
    lexed: Lexed,
    /// The function definitions found, in source order.
    pub defs: Vec<Def>,
    /// The containers found.
    pub containers: Vec<Container>,
    len: usize,
}

/// Words that are never a definition's or a class's name.
const KEYWORDS: &[&str] = &[
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

impl Outline {
    /// Outlines `src` as `lang`; `None` when the scan cannot read it with confidence.
    pub fn scan(lang: Lang, src: &str) -> Option<Outline> {
        let lexed = lex::lex(lang, src)?;
        let mut out = Outline {
            defs: Vec::new(),
            containers: Vec::new(),
            len: src.len(),
            lexed,
        };
        match lang {
            Lang::Python => python::outline(&mut out, src, lang)?,
            _ => braces::outline(&mut out, src, lang),
        }
        for i in 0..out.defs.len() {
            let (first, last) = out.defs[i].rows;
            out.defs[i].bytes = out.line_bytes(first, last);
        }
        Some(out)
    }

    /// The identifiers of definition `d`.
    fn words<'a>(&'a self, src: &'a str, d: &Def) -> impl Iterator<Item = &'a str> + 'a {
        let lexed = &self.lexed;
        d.toks
            .clone()
            .filter(move |&i| lexed.toks[i].kind == lex::Kind::Ident)
            .map(move |i| lexed.text(src, i))
    }

    /// `ranges` (whole lines) as the parser's included ranges.
    pub fn ts_ranges(&self, ranges: &[Range<usize>]) -> Vec<tree_sitter::Range> {
        let point = |byte: usize| {
            let row = self.lexed.line_starts.partition_point(|&s| s <= byte) - 1;
            tree_sitter::Point {
                row,
                column: byte - self.lexed.line_starts[row],
            }
        };
        ranges
            .iter()
            .map(|r| tree_sitter::Range {
                start_byte: r.start,
                end_byte: r.end,
                start_point: point(r.start),
                end_point: point(r.end),
            })
            .collect()
    }

    /// Byte range of lines `first..=last`.
    fn line_bytes(&self, first: usize, last: usize) -> Range<usize> {
        let starts = &self.lexed.line_starts;
        let end = starts.get(last + 1).copied().unwrap_or(self.len);
        starts[first]..end
    }
}

/// One file to plan for: its outline (`None`: parsed whole), its text and the rows of the
/// frames that may fall in it.
pub struct PlanFile<'a> {
    /// Its outline.
    pub outline: Option<&'a Outline>,
    /// Its text.
    pub src: &'a str,
    /// Frame rows (0-based) that may be in it.
    pub rows: Vec<usize>,
}

/// For each file, the byte ranges to parse (`None`: all of it): everything but the
/// definitions no frame falls in, no frame names, and none of those (to `depth` levels of
/// calls) mentions by name; the constructors of the classes involved stay.
pub fn plan(
    files: &[PlanFile<'_>],
    frame_names: &[&str],
    depth: u32,
) -> Vec<Option<Vec<Range<usize>>>> {
    let mut keep: Vec<Vec<bool>> = files
        .iter()
        .map(|f| vec![false; f.outline.map_or(0, |o| o.defs.len())])
        .collect();
    let wanted_first: HashSet<&str> = frame_names.iter().copied().collect();
    // Level 0: the definitions the frames fall in or name; the classes they belong to.
    let mut level: Vec<(usize, usize)> = Vec::new();
    let mut touched: HashSet<&str> = HashSet::new();
    for (fi, f) in files.iter().enumerate() {
        let Some(o) = f.outline else { continue };
        for (di, d) in o.defs.iter().enumerate() {
            let holds_frame = f.rows.iter().any(|&r| d.rows.0 <= r && r <= d.rows.1);
            if holds_frame || d.names.iter().any(|n| wanted_first.contains(n.as_str())) {
                keep[fi][di] = true;
                level.push((fi, di));
                if let Some(c) = d.container {
                    touched.extend(o.containers[c].names.iter().map(String::as_str));
                }
            }
        }
    }
    // Each further level: what the last one mentions by name, and the constructors of the
    // classes it names (the first level: also those of the frames' own classes).
    for k in 0..depth {
        let mut wanted: HashSet<&str> = HashSet::new();
        for &(fi, di) in &level {
            let o = files[fi].outline.expect("outlined");
            wanted.extend(o.words(files[fi].src, &o.defs[di]));
        }
        let mut next = Vec::new();
        for (fi, f) in files.iter().enumerate() {
            let Some(o) = f.outline else { continue };
            for (di, d) in o.defs.iter().enumerate() {
                if keep[fi][di] {
                    continue;
                }
                let named = d.names.iter().any(|n| wanted.contains(n.as_str()));
                let ctor = d.ctor
                    && d.container.is_some_and(|c| {
                        o.containers[c].names.iter().any(|n| {
                            wanted.contains(n.as_str()) || k == 0 && touched.contains(n.as_str())
                        })
                    });
                if named || ctor {
                    keep[fi][di] = true;
                    next.push((fi, di));
                }
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    files
        .iter()
        .zip(&mut keep)
        .map(|(f, keep)| {
            let o = f.outline?;
            // A Python class body must keep one statement: its smallest definition.
            for (ci, c) in o.containers.iter().enumerate() {
                if !c.only_defs {
                    continue;
                }
                let members = || {
                    o.defs
                        .iter()
                        .enumerate()
                        .filter(|(_, d)| d.container == Some(ci))
                };
                if !members().any(|(di, _)| keep[di]) {
                    if let Some((di, _)) = members().min_by_key(|(_, d)| d.bytes.len()) {
                        keep[di] = true;
                    }
                }
            }
            let mut ranges: Vec<Range<usize>> = Vec::new();
            let mut at = 0;
            let mut left_out = 0;
            for (d, kept) in o.defs.iter().zip(keep.iter()) {
                if *kept || d.bytes.start < at {
                    continue;
                }
                if d.bytes.start > at {
                    ranges.push(at..d.bytes.start);
                }
                left_out += d.bytes.len();
                at = d.bytes.end;
            }
            if at < f.src.len() {
                ranges.push(at..f.src.len());
            }
            (left_out > 0).then_some(ranges)
        })
        .collect()
}

#[cfg(test)]
mod tests;
