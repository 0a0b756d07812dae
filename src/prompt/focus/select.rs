//! What to send: for each frame in the given code, the innermost function or method holding its
//! line (or, outside any, the statement), with the headers of its classes and enclosing
//! functions, the class's field declarations or the receiver's type, and the short top-level
//! constants and types it names; the file's imports; then, within the token target, the
//! definitions of what the innermost stack frame's function (and each compiler error's or
//! panic's) calls, to the configured depth, and its class's constructor.

use std::collections::HashSet;
use std::time::Instant;

use super::index::{named_children, UnitKind};
use super::selector::{FileSelection, Parsed, Selector};
use super::trace::{normalize, Frame};

/// Most lines of class fields (or a receiver's type definition) sent with a method.
const CONTEXT_LINES: usize = 40;
/// Most lines of a top-level constant sent with a function that names it.
const VALUE_LINES: usize = 10;
/// Most lines of a type definition sent with a function that names it.
const TYPE_LINES: usize = 25;
/// Most lines of an enclosing function sent before the nested function a frame is in.
const PREAMBLE_LINES: usize = 15;
/// Most called definitions weighed for sending, all levels together: each costs a pass over
/// the file's rows and definitions, and a function of 24,500 calls weighed them all (16 s of
/// CPU). A real function's callees are far fewer.
pub const MAX_CALLEES: usize = 256;
/// Most distinct calls resolved to definitions, all levels of one selection together.
pub const MAX_CALLS: usize = 1024;

/// The selection for `frames`; `None` when no frame falls in the given code.
pub fn select(
    files: &[Parsed<'_>],
    frames: &[Frame],
    depth: u32,
    token_target: u32,
    count: &dyn Fn(&str) -> u32,
    deadline: Instant,
) -> Option<Vec<FileSelection>> {
    let lines: Vec<Vec<&str>> = files
        .iter()
        .map(|f| f.index.src.lines().collect())
        .collect();
    let mut s = Selector {
        out: lines
            .iter()
            .map(|l| FileSelection {
                rows: vec![false; l.len()],
                functions: Vec::new(),
            })
            .collect(),
        lines,
        files,
        chosen: HashSet::new(),
        count,
        used: 0,
    };
    let mut frontier: Vec<(usize, usize)> = Vec::new();
    let pathless = pathless_file(files, frames);
    let mut stack_seen = false;
    for frame in frames.iter().filter(|f| !f.library) {
        let Some(fi) = file_for(files, frame, pathless.as_deref()) else {
            continue;
        };
        let idx = &files[fi].index;
        let Some(row) = frame.line.checked_sub(1).filter(|r| *r < s.lines[fi].len()) else {
            continue;
        };
        let unit = idx.function_at(row).or_else(|| {
            let name = frame.function.as_deref()?;
            let mut named = idx
                .units
                .iter()
                .enumerate()
                .filter(|(_, u)| u.kind == UnitKind::Function && u.simple == name);
            match (named.next(), named.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        });
        match unit {
            Some(u) => {
                // Calls are followed from the innermost stack frame in the given code and from
                // each compiler error or panic location, not from every caller up the stack.
                let follow = !frame.stack || !stack_seen;
                if s.chosen.insert((fi, u)) {
                    s.take_unit(fi, u);
                    if follow {
                        frontier.push((fi, u));
                    }
                }
                stack_seen |= frame.stack;
            }
            None => {
                let Some(((a, b), container)) = idx.statement_at(row) else {
                    continue;
                };
                s.mark(fi, a, b);
                if let Some(c) = container {
                    s.take_context(fi, c);
                }
            }
        }
    }
    if s.out.iter().all(FileSelection::is_empty) {
        return None;
    }
    for (fi, file) in files.iter().enumerate() {
        if !s.out[fi].is_empty() {
            for &(a, b) in &file.index.imports {
                s.mark(fi, a, b);
            }
        }
    }
    s.used = s.cost_of_all();
    s.callees(frontier, depth, token_target, deadline);
    for sel in &mut s.out {
        sel.functions.sort();
    }
    Some(s.out)
}

/// For a single file without a path: which file of the trace it is. Among the files the
/// trace names (not libraries, of the code's language), the one whose frames' function names
/// best agree with the functions at their lines; ties go to the innermost.
fn pathless_file(files: &[Parsed<'_>], frames: &[Frame]) -> Option<String> {
    let [only] = files else { return None };
    if only.path.is_some() {
        return None;
    }
    let idx = &only.index;
    let mut best: Option<(usize, String)> = None;
    let mut seen = HashSet::new();
    for f in frames.iter().filter(|f| !f.library) {
        let ext_ok =
            idx.lang.accepts_file(&f.file) || super::lang::Lang::from_path(&f.file).is_none();
        if !ext_ok || !seen.insert(f.file.clone()) {
            continue;
        }
        let score = frames
            .iter()
            .filter(|g| g.file == f.file)
            .filter(|g| {
                let Some(row) = g.line.checked_sub(1) else {
                    return false;
                };
                match (&g.function, idx.function_at(row)) {
                    (Some(name), Some(u)) => idx.units[u].simple == *name,
                    (None, _) => row < idx.src.lines().count(),
                    _ => false,
                }
            })
            .count();
        if best.as_ref().is_none_or(|(s, _)| score > *s) {
            best = Some((score, f.file.clone()));
        }
    }
    best.map(|(_, f)| f)
}

/// The given file a frame points into: the one whose path shares the most trailing path
/// components with the frame's file (at least the file name), or the pathless file.
fn file_for(files: &[Parsed<'_>], frame: &Frame, pathless: Option<&str>) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, f) in files.iter().enumerate() {
        let score = match &f.path {
            None => usize::from(pathless == Some(frame.file.as_str())),
            Some(p) => shared_tail(&normalize(p), &frame.file),
        };
        if score > 0 && best.is_none_or(|(s, _)| score > s) {
            best = Some((score, i));
        }
    }
    best.map(|(_, i)| i)
}

/// Whether `frame` may point into a file at `path` (any file without one).
pub fn may_hold(path: Option<&str>, frame: &Frame) -> bool {
    path.is_none_or(|p| shared_tail(&normalize(p), &frame.file) > 0)
}

fn shared_tail(a: &str, b: &str) -> usize {
    a.rsplit('/')
        .zip(b.rsplit('/'))
        .take_while(|(x, y)| x == y && !x.is_empty())
        .count()
}

impl<'t> Selector<'_, 't> {
    fn mark(&mut self, fi: usize, a: usize, b: usize) {
        let rows = &mut self.out[fi].rows;
        for r in a..=b.min(rows.len().saturating_sub(1)) {
            rows[r] = true;
        }
    }

    /// The unit's rows, its enclosing headers and its class or receiver context.
    fn take_unit(&mut self, fi: usize, u: usize) {
        let idx = &self.files[fi].index;
        let unit = &idx.units[u];
        self.mark(fi, unit.start, unit.end);
        if unit.kind == UnitKind::Function {
            self.out[fi].functions.push((unit.start, unit.qual.clone()));
        }
        self.take_context(fi, u);
        self.take_referenced(fi, u);
    }

    /// The short top-level constants and type definitions (struct, interface, type alias,
    /// small class) that `u` names, from any given file.
    fn take_referenced(&mut self, fi: usize, u: usize) {
        let used = self.files[fi].index.names_used(u);
        for fj in 0..self.files.len() {
            let idx = &self.files[fj].index;
            let mut marks: Vec<(usize, usize)> = Vec::new();
            let mut classes: Vec<usize> = Vec::new();
            for (names, (a, b)) in &idx.values {
                if b - a < VALUE_LINES && names.iter().any(|n| used.contains(n.as_str())) {
                    marks.push((*a, *b));
                }
            }
            for (i, t) in idx.units.iter().enumerate() {
                if !used.contains(t.name.as_str()) || (fj, i) == (fi, u) {
                    continue;
                }
                if t.kind == UnitKind::Type && t.end - t.start < TYPE_LINES {
                    marks.push((t.start, t.end));
                } else if t.kind == UnitKind::Container && idx.lang.typed() && t.parent.is_none() {
                    // A class used as a type: its header and fields.
                    classes.push(i);
                }
            }
            for (a, b) in marks {
                self.mark(fj, a, b);
            }
            for c in classes {
                let t = &self.files[fj].index.units[c];
                self.mark(fj, t.start, t.header_end);
                self.take_fields(fj, c);
            }
        }
    }

    /// Headers of the units around `u` (and `u`'s own when it is a container), fields of
    /// its classes, the type its receiver names.
    fn take_context(&mut self, fi: usize, u: usize) {
        let idx = &self.files[fi].index;
        let mut cur = Some(u);
        let mut inner: Option<usize> = None;
        while let Some(i) = cur {
            let unit = &idx.units[i];
            match (unit.kind, inner) {
                // An enclosing function: its header, and what it sets up before the nested
                // one when that is short (the closure's variables).
                (UnitKind::Function, Some(child)) => {
                    let child_start = idx.units[child].start;
                    if child_start > unit.header_end
                        && child_start - unit.header_end <= PREAMBLE_LINES
                    {
                        self.mark(fi, unit.start, child_start - 1);
                    } else {
                        self.mark(fi, unit.start, unit.header_end);
                    }
                }
                (UnitKind::Function, None) => {}
                _ => {
                    self.mark(fi, unit.start, unit.header_end);
                    if unit.kind == UnitKind::Container {
                        self.take_fields(fi, i);
                    }
                }
            }
            inner = Some(i);
            cur = unit.parent;
        }
        if let Some(owner) = idx.units[u].owner.clone() {
            let found = idx.units.iter().position(|t| {
                matches!(t.kind, UnitKind::Type | UnitKind::Container) && t.name == owner
            });
            if let Some(t) = found {
                let ty = &idx.units[t];
                if ty.kind == UnitKind::Type && ty.end - ty.start < CONTEXT_LINES {
                    self.mark(fi, ty.start, ty.end);
                } else {
                    self.mark(fi, ty.start, ty.header_end);
                    self.take_fields(fi, t);
                }
            }
        }
    }

    fn take_fields(&mut self, fi: usize, c: usize) {
        let idx = &self.files[fi].index;
        let kinds = idx.lang.kinds();
        let Some(body) = idx.units[c].node.child_by_field_name("body") else {
            return;
        };
        let mut lines = 0;
        for m in named_children(body) {
            if !kinds.fields.contains(&m.kind()) {
                continue;
            }
            let (a, b) = (m.start_position().row, m.end_position().row);
            lines += b - a + 1;
            if lines > CONTEXT_LINES {
                break;
            }
            self.mark(fi, a, b);
        }
    }

    fn cost_of_all(&self) -> u32 {
        let mut text = String::new();
        for (fi, sel) in self.out.iter().enumerate() {
            for (r, _) in sel.rows.iter().enumerate().filter(|(_, on)| **on) {
                text.push_str(self.lines[fi][r]);
                text.push('\n');
            }
        }
        (self.count)(&text)
    }

    /// Tokens of the rows of file `fi` marked since `before`.
    fn cost_of_new(&self, fi: usize, before: &[bool]) -> u32 {
        let mut text = String::new();
        for (r, on) in self.out[fi].rows.iter().enumerate() {
            if *on && !before[r] {
                text.push_str(self.lines[fi][r]);
                text.push('\n');
            }
        }
        (self.count)(&text)
    }

    /// Called definitions, breadth first, each level in call order, while the total stays
    /// within `target` tokens: at most [`MAX_CALLEES`] weighed, none after `deadline`.
    fn callees(
        &mut self,
        mut frontier: Vec<(usize, usize)>,
        depth: u32,
        target: u32,
        deadline: Instant,
    ) {
        let mut weighed: HashSet<(usize, usize)> = HashSet::new();
        let mut resolved: HashSet<(usize, usize, super::calls::Call)> = HashSet::new();
        for level in 0..depth {
            let mut next = Vec::new();
            // Distinct definitions not weighed yet, in call order, as many as may still be
            // weighed: a function calling one helper 300 times leaves room for the next one.
            // Each distinct call is resolved once (a pass over the definitions), at most
            // `MAX_CALLS` of them: calls of names defined nowhere find nothing to weigh.
            let mut candidates: Vec<(usize, usize)> = Vec::new();
            let mut listed: HashSet<(usize, usize)> = HashSet::new();
            let room = MAX_CALLEES - weighed.len();
            'calls: for &(fi, u) in &frontier {
                for call in self.files[fi].index.calls(u) {
                    if resolved.len() >= MAX_CALLS {
                        break 'calls;
                    }
                    if !resolved.insert((fi, u, call.clone())) {
                        continue;
                    }
                    for c in self.resolve(fi, u, &call) {
                        if candidates.len() >= room {
                            break 'calls;
                        }
                        if !self.chosen.contains(&c) && !weighed.contains(&c) && listed.insert(c) {
                            candidates.push(c);
                        }
                    }
                }
            }
            if level == 0 {
                for &(fi, u) in &frontier {
                    candidates.extend(self.constructor_of(fi, u));
                }
            }
            for (fi, u) in candidates {
                if weighed.len() >= MAX_CALLEES || Instant::now() >= deadline {
                    return;
                }
                if self.chosen.contains(&(fi, u)) || !weighed.insert((fi, u)) {
                    continue;
                }
                let before = self.out[fi].clone();
                self.take_unit(fi, u);
                let cost = self.used.saturating_add(self.cost_of_new(fi, &before.rows));
                if cost > target {
                    self.out[fi] = before;
                    continue;
                }
                self.used = cost;
                self.chosen.insert((fi, u));
                next.push((fi, u));
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
    }
}
