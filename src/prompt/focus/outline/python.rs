//! Python's outline: statements by their logical lines and indentation; `def` (decorators
//! included) and `class` blocks, class bodies outlined in turn.

use super::braces::MAX_NESTING;
use super::lex::Lexed;
use super::model::{Container, Def, Outline, KEYWORDS};
use crate::prompt::focus::lang::Lang;

struct Scan<'a> {
    l: &'a Lexed,
    src: &'a str,
    /// Token index of each logical line's first token, and its column.
    stmts: Vec<usize>,
    cols: Vec<usize>,
    defs: Vec<Def>,
    containers: Vec<Container>,
}

/// Fills `out` with the definitions of Python `src`; `None` when its indentation is not what
/// the scan expects.
pub fn outline(out: &mut Outline, src: &str, _lang: Lang) -> Option<()> {
    let l = &out.lexed;
    let stmts: Vec<usize> = (0..l.toks.len())
        .filter(|&i| l.toks[i].logical_start)
        .collect();
    let cols = stmts
        .iter()
        .map(|&i| l.toks[i].start - l.line_starts[l.toks[i].line])
        .collect();
    let mut s = Scan {
        l,
        src,
        stmts,
        cols,
        defs: Vec::new(),
        containers: Vec::new(),
    };
    let n = s.stmts.len();
    s.members(0, n, None, (0, 0))?;
    let (defs, containers) = (s.defs, s.containers);
    out.defs = defs;
    out.containers = containers;
    Some(())
}

impl Scan<'_> {
    /// Records the definition (or, `pinned`, the compound statement) of statements
    /// `first..end` whose head token is `head`.
    fn push(
        &mut self,
        first: usize,
        head: usize,
        end: usize,
        container: Option<usize>,
        pinned: bool,
        first_line: usize,
    ) {
        let last_line = self.last_line_before(end).max(first_line);
        let toks = self.stmts[first]..self.tok_of(end);
        let own = if self.text(head) == "async" {
            head + 2
        } else {
            head + 1
        };
        let mut names = Vec::new();
        for t in toks.clone() {
            if t > 0 && matches!(self.text(t - 1), "def" | "class") {
                names.push(self.text(t).to_owned());
            }
        }
        self.defs.push(Def {
            bytes: 0..0,
            rows: (first_line, last_line),
            toks,
            names,
            container,
            ctor: !pinned && container.is_some() && self.text(own) == "__init__",
            pinned,
        });
    }

    fn text(&self, tok: usize) -> &str {
        if tok < self.l.toks.len() {
            self.l.text(self.src, tok)
        } else {
            ""
        }
    }

    /// The statement after statement `k`'s block (the next at its column or less).
    fn block_end(&self, k: usize, to: usize) -> usize {
        let c = self.cols[k];
        (k + 1..to).find(|&j| self.cols[j] <= c).unwrap_or(to)
    }

    /// The last line of the statements before statement `end`.
    fn last_line_before(&self, end: usize) -> usize {
        match self.stmts.get(end) {
            Some(&t) => self.l.toks[t].line - 1,
            None => self.l.line_starts.len() - 1,
        }
    }

    /// The first token of statement `end` (or the end of the tokens).
    fn tok_of(&self, end: usize) -> usize {
        self.stmts.get(end).copied().unwrap_or(self.l.toks.len())
    }

    /// Outlines statements `from..to` at column `col`, `depth` classes deep (past
    /// [`MAX_NESTING`] a class is kept whole, not scanned, so that classes nested thousands
    /// deep cannot overflow the stack); whether every one is a definition.
    fn members(
        &mut self,
        from: usize,
        to: usize,
        container: Option<usize>,
        (col, depth): (usize, usize),
    ) -> Option<bool> {
        let mut only_defs = from < to;
        let mut k = from;
        while k < to {
            if self.cols[k] != col {
                return None;
            }
            let first = k;
            while self.text(self.stmts[k]) == "@" && k + 1 < to && self.cols[k + 1] == col {
                k += 1;
            }
            let head = self.stmts[k];
            let end = self.block_end(k, to);
            let is_def = self.text(head) == "def"
                || self.text(head) == "async" && self.text(head + 1) == "def";
            let is_class = self.text(head) == "class";
            if !is_def && !is_class {
                only_defs = false;
                if end > k + 1 {
                    // A compound statement (`if __name__ == "__main__":`, `try:`) stays, but
                    // what it defines and mentions counts.
                    let first_line = self.l.toks[self.stmts[first]].line;
                    self.push(first, self.stmts[k], end, container, true, first_line);
                }
                k = end;
                continue;
            }
            let first_line = self.l.toks[self.stmts[first]].line;
            let last_line = self.last_line_before(end).max(first_line);
            if is_def {
                self.push(first, head, end, container, false, first_line);
            } else if depth >= MAX_NESTING {
                only_defs = false;
                self.push(first, head, end, container, true, first_line);
            } else {
                only_defs = false;
                let body_from = k + 1;
                let header_end = self.tok_of(body_from);
                let names = (head..header_end)
                    .map(|t| self.text(t))
                    .filter(|w| {
                        w.chars()
                            .next()
                            .is_some_and(|c| c.is_alphabetic() || c == '_')
                            && !KEYWORDS.contains(w)
                    })
                    .map(str::to_owned)
                    .collect();
                let ci = self.containers.len();
                self.containers.push(Container {
                    names,
                    only_defs: false,
                    toks: self.stmts[first]..self.tok_of(end),
                    rows: (first_line, last_line),
                    bytes: 0..0,
                    parent: container,
                    whole_lines: true,
                });
                if body_from < end {
                    let all =
                        self.members(body_from, end, Some(ci), (self.cols[body_from], depth + 1))?;
                    self.containers[ci].only_defs = all;
                }
            }
            k = end;
        }
        Some(only_defs)
    }
}
