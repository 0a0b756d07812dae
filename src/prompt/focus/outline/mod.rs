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
mod model;
mod python;

use std::collections::HashSet;
use std::ops::Range;

use super::lang::Lang;
pub use model::{Def, Outline};

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
        for i in 0..out.containers.len() {
            let (first, last) = out.containers[i].rows;
            out.containers[i].bytes = out.line_bytes(first, last);
        }
        Some(out)
    }

    /// The identifiers of definition `d`, those in Python f-strings' fields included.
    fn words<'a>(&'a self, src: &'a str, d: &Def) -> Vec<&'a str> {
        let lexed = &self.lexed;
        let mut out = Vec::new();
        for i in d.toks.clone() {
            let t = &lexed.toks[i];
            match t.kind {
                lex::Kind::Ident => out.push(lexed.text(src, i)),
                lex::Kind::Str if i > 0 && self.f_string(src, i) => {
                    let text = lexed.text(src, i);
                    out.extend(
                        text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                            .filter(|w| w.chars().next().is_some_and(|c| !c.is_ascii_digit())),
                    );
                }
                _ => {}
            }
        }
        out
    }

    /// String token `i` is a Python f-string (its prefix, an identifier touching it, has an `f`).
    fn f_string(&self, src: &str, i: usize) -> bool {
        let (l, p) = (&self.lexed, &self.lexed.toks[i - 1]);
        p.kind == lex::Kind::Ident
            && p.end == l.toks[i].start
            && p.end - p.start <= 3
            && l.text(src, i - 1).contains(['f', 'F'])
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
    // A frame in a class but in none of its definitions (its header, a decorator, a field)
    // sends the statement around it, the whole class: keep all of it.
    for (fi, f) in files.iter().enumerate() {
        let Some(o) = f.outline else { continue };
        for &r in &f.rows {
            let holds = |rows: (usize, usize)| rows.0 <= r && r <= rows.1;
            if o.defs.iter().any(|d| holds(d.rows)) {
                continue;
            }
            let Some(c) = o
                .containers
                .iter()
                .filter(|c| holds(c.rows))
                .min_by_key(|c| c.rows.1 - c.rows.0)
            else {
                continue;
            };
            for (di, d) in o.defs.iter().enumerate() {
                if !keep[fi][di] && c.rows.0 <= d.rows.0 && d.rows.1 <= c.rows.1 {
                    keep[fi][di] = true;
                    level.push((fi, di));
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
    // What the kept definitions mention: a class none of them names, holding no kept
    // definition and no frame, is left out whole (its header and fields too).
    // The classes holding them count as named (a method's receiver type is looked up by its
    // impl's name).
    let mut mentioned: HashSet<&str> = frame_names.iter().copied().collect();
    for (fi, f) in files.iter().enumerate() {
        let Some(o) = f.outline else { continue };
        for (di, d) in o.defs.iter().enumerate() {
            if keep[fi][di] {
                mentioned.extend(o.words(f.src, d));
                let mut c = d.container;
                while let Some(ci) = c {
                    mentioned.extend(o.containers[ci].names.iter().map(String::as_str));
                    c = o.containers[ci].parent;
                }
            }
        }
    }
    files
        .iter()
        .zip(&mut keep)
        .map(|(f, keep)| {
            let o = f.outline?;
            let kept_classes = o.kept_containers(f, keep, &mentioned);
            // A Python class body must keep one statement: its smallest definition.
            for (ci, c) in o.containers.iter().enumerate() {
                if !c.only_defs || !kept_classes[ci] {
                    continue;
                }
                let members = || {
                    o.defs
                        .iter()
                        .enumerate()
                        .filter(|(_, d)| d.container == Some(ci))
                };
                if !members().any(|(di, d)| keep[di] || d.pinned) {
                    if let Some((di, _)) = members().min_by_key(|(_, d)| d.bytes.len()) {
                        keep[di] = true;
                    }
                }
            }
            let mut left: Vec<Range<usize>> = o
                .defs
                .iter()
                .zip(keep.iter())
                .filter(|(d, k)| !**k && !d.pinned)
                .map(|(d, _)| d.bytes.clone())
                .chain(
                    o.containers
                        .iter()
                        .zip(&kept_classes)
                        .filter(|(_, k)| !**k)
                        .map(|(c, _)| c.bytes.clone()),
                )
                .collect();
            left.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
            let mut ranges: Vec<Range<usize>> = Vec::new();
            let mut at = 0;
            let mut left_out = 0;
            for r in left {
                if r.start < at {
                    continue;
                }
                if r.start > at {
                    ranges.push(at..r.start);
                }
                left_out += r.len();
                at = r.end;
            }
            if at < f.src.len() {
                ranges.push(at..f.src.len());
            }
            (left_out > 0).then_some(ranges)
        })
        .collect()
}

impl Outline {
    /// Which containers stay: those holding a kept definition, a kept container or a frame,
    /// those a kept definition names (by any word of their own, outside their members'
    /// definitions), and those that cannot be left out as a whole.
    fn kept_containers(
        &self,
        f: &PlanFile<'_>,
        keep: &[bool],
        mentioned: &HashSet<&str>,
    ) -> Vec<bool> {
        let n = self.containers.len();
        let mut kept = vec![false; n];
        // Each container's direct members' token spans.
        let mut inner: Vec<Vec<Range<usize>>> = vec![Vec::new(); n];
        for (d, k) in self.defs.iter().zip(keep) {
            if let Some(c) = d.container {
                kept[c] |= *k;
                inner[c].push(d.toks.clone());
            }
        }
        for c in &self.containers {
            if let Some(p) = c.parent {
                inner[p].push(c.toks.clone());
            }
        }
        for ci in (0..n).rev() {
            let c = &self.containers[ci];
            if !kept[ci] {
                let holds_frame = f.rows.iter().any(|&r| c.rows.0 <= r && r <= c.rows.1);
                kept[ci] = !c.whole_lines
                    || holds_frame
                    || c.names.iter().any(|n| mentioned.contains(n.as_str()))
                    || {
                        // The types declared in its body (`type X = ..`, `typedef .. X;`).
                        inner[ci].sort_by_key(|r| r.start);
                        let mut spans = inner[ci].iter().peekable();
                        let mut t = c.toks.start;
                        let mut named = false;
                        while t < c.toks.end && !named {
                            if let Some(s) = spans.peek() {
                                if t >= s.start {
                                    t = t.max(s.end);
                                    spans.next();
                                    continue;
                                }
                            }
                            named = self.declares_type(f.src, t)
                                && mentioned.contains(self.lexed.text(f.src, t));
                            t += 1;
                        }
                        named
                    };
            }
            if kept[ci] {
                if let Some(p) = c.parent {
                    kept[p] = true;
                }
            }
        }
        kept
    }

    /// Token `t` names a type where it is declared: after `type`, `struct`, `enum`, `union`,
    /// `interface`, `class`, `trait` or `using`, or last before the `;` of a `typedef`.
    fn declares_type(&self, src: &str, t: usize) -> bool {
        let l = &self.lexed;
        if l.toks[t].kind != lex::Kind::Ident || t == 0 {
            return false;
        }
        let before = l.text(src, t - 1);
        let declared = matches!(
            before,
            "type" | "struct" | "enum" | "union" | "interface" | "class" | "trait" | "using"
        );
        declared
            || l.is(t + 1, b';') && (t.saturating_sub(12)..t).any(|u| l.text(src, u) == "typedef")
    }
}

#[cfg(test)]
mod tests;
