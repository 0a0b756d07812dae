//! The outline's lexer: identifiers and punctuation with their lines, strings and comments
//! skipped, brackets matched. It gives up (`None`) on what it cannot read with confidence:
//! an unterminated string or comment, or brackets that do not match.

use crate::prompt::focus::lang::Lang;

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A name or keyword.
    Ident,
    /// A number.
    Number,
    /// A string or character literal (its contents are not looked at).
    Str,
    /// One byte of punctuation.
    Punct(u8),
}

/// One token.
#[derive(Debug, Clone, Copy)]
pub struct Tok {
    /// What it is.
    pub kind: Kind,
    /// Its bytes.
    pub start: usize,
    /// One past its last byte.
    pub end: usize,
    /// The (0-based) line it starts on.
    pub line: usize,
    /// The line it ends on (strings may span lines).
    pub end_line: usize,
    /// No token ends on its line before it.
    pub first_on_line: bool,
    /// Python: it begins a logical line (not inside brackets or after a `\` continuation).
    pub logical_start: bool,
    /// For an opening bracket, the index of its closing one (and the reverse).
    pub mate: usize,
}

/// A lexed file.
pub struct Lexed {
    /// Its tokens.
    pub toks: Vec<Tok>,
    /// The byte offset each line starts at.
    pub line_starts: Vec<usize>,
}

impl Lexed {
    /// The text of token `i`.
    pub fn text<'s>(&self, src: &'s str, i: usize) -> &'s str {
        let t = &self.toks[i];
        src.get(t.start..t.end).unwrap_or_default()
    }

    /// Whether token `i` is the punctuation `c`.
    pub fn is(&self, i: usize, c: u8) -> bool {
        self.toks.get(i).is_some_and(|t| t.kind == Kind::Punct(c))
    }

    /// Whether token `i` is the last on its line (or of the file).
    pub fn last_on_line(&self, i: usize) -> bool {
        self.toks.get(i + 1).is_none_or(|n| n.first_on_line)
    }
}

fn ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// Lexes `src` as `lang`.
pub fn lex(lang: Lang, src: &str) -> Option<Lexed> {
    let b = src.as_bytes();
    let python = lang == Lang::Python;
    let js = matches!(lang, Lang::JavaScript | Lang::TypeScript | Lang::Tsx);
    let preprocessor = matches!(lang, Lang::C | Lang::Cpp);
    let rust = lang == Lang::Rust;
    // Strings may hold a raw newline (Rust's, Go's raw ones, templates, triple quotes).
    let multiline_strings = rust;
    let mut line_starts = vec![0];
    line_starts.extend(memchr_lines(b));
    let mut lx = Lexer {
        b,
        line_starts: &line_starts,
        line: 0,
        toks: Vec::with_capacity(b.len() / 4),
        prev_end_line: None,
        depth: 0,
        continued_line: None,
        braces: 0,
        templates: Vec::new(),
        stack: Vec::new(),
    };
    let mut i = 0;
    let mut line_began = true;
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line_began = true;
                i += 1;
                continue;
            }
            b' ' | b'\t' | b'\r' | 0x0c => {
                i += 1;
                continue;
            }
            _ => {}
        }
        let first_in_line = std::mem::replace(&mut line_began, false);
        let next = b.get(i + 1).copied();
        let start = i;
        if python && c == b'#' || !python && c == b'/' && next == Some(b'/') {
            i = find_byte(b, i, b'\n').unwrap_or(b.len());
            continue;
        }
        if python && c == b'\\' && next.is_some_and(|n| n == b'\n' || n == b'\r') {
            lx.continued_line = Some(lx.line_of(i) + 1);
            i += 1;
            continue;
        }
        if !python && c == b'/' && next == Some(b'*') {
            i = find(b, i + 2, b"*/")? + 2;
            continue;
        }
        if preprocessor && c == b'#' && first_in_line {
            // A preprocessor line, with its `\` continuations.
            let mut j = i;
            loop {
                let end = find_byte(b, j, b'\n').unwrap_or(b.len());
                let body = &b[j..end];
                let trimmed = body.strip_suffix(b"\r").unwrap_or(body);
                if trimmed.ends_with(b"\\") && end < b.len() {
                    j = end + 1;
                } else {
                    i = end;
                    break;
                }
            }
            continue;
        }
        if ident_byte(c) {
            let mut j = i;
            while j < b.len() && ident_byte(b[j]) {
                j += 1;
            }
            // Rust raw strings: r"..", r#".."#, br#".."#.
            if rust && matches!(&b[i..j], b"r" | b"br") && matches!(b.get(j), Some(b'"' | b'#')) {
                let mut k = j;
                while b.get(k) == Some(&b'#') {
                    k += 1;
                }
                if b.get(k) == Some(&b'"') {
                    let hashes = k - j;
                    let mut close = vec![b'"'];
                    close.extend(std::iter::repeat_n(b'#', hashes));
                    i = find(b, k + 1, &close)? + close.len();
                    lx.push(Kind::Str, start, i)?;
                    continue;
                }
            }
            let kind = if c.is_ascii_digit() {
                Kind::Number
            } else {
                Kind::Ident
            };
            i = j;
            lx.push(kind, start, i)?;
            continue;
        }
        match c {
            b'"' | b'\'' if python => {
                let triple = b.get(i..i + 3).is_some_and(|t| t == [c, c, c]);
                i = if triple {
                    string_end(b, i + 3, &[c, c, c], true)?
                } else {
                    string_end(b, i + 1, &[c], false)?
                };
                lx.push(Kind::Str, start, i)?;
            }
            b'"' => {
                i = string_end(b, i + 1, b"\"", multiline_strings)?;
                lx.push(Kind::Str, start, i)?;
            }
            b'\'' if js => {
                i = string_end(b, i + 1, b"'", false)?;
                lx.push(Kind::Str, start, i)?;
            }
            b'\'' => {
                // A character literal, or (Rust) a lifetime or label.
                let width = b.get(i + 1).map_or(1, |&n| utf8_width(n));
                if next == Some(b'\\') || b.get(i + 1 + width) == Some(&b'\'') {
                    i = string_end(b, i + 1, b"'", false)?;
                    lx.push(Kind::Str, start, i)?;
                } else if rust {
                    i += 1;
                    lx.push(Kind::Punct(b'\''), start, i)?;
                } else {
                    i = string_end(b, i + 1, b"'", false)?;
                    lx.push(Kind::Str, start, i)?;
                }
            }
            b'/' if js && lx.regex_may_start(src) => {
                // A regular expression literal: to its closing `/` (not in a `[...]` class).
                let mut j = i + 1;
                let mut class = false;
                loop {
                    match b.get(j)? {
                        b'\\' => j += 1,
                        b'\n' => return None,
                        b'[' => class = true,
                        b']' => class = false,
                        b'/' if !class => break,
                        _ => {}
                    }
                    j += 1;
                }
                i = j + 1;
                lx.push(Kind::Str, start, i)?;
            }
            b'`' if js => {
                i = lx.template(i + 1)?;
            }
            b'`' if lang == Lang::Go => {
                i = find_byte(b, i + 1, b'`')? + 1;
                lx.push(Kind::Str, start, i)?;
            }
            b'}' if js && lx.templates.last() == Some(&lx.braces) => {
                // The end of a template literal's `${ }`: the template goes on.
                lx.templates.pop();
                i = lx.template(i + 1)?;
            }
            _ => {
                i += 1;
                lx.push(Kind::Punct(c), start, i)?;
            }
        }
    }
    if !lx.stack.is_empty() || !lx.templates.is_empty() {
        return None;
    }
    let toks = lx.toks;
    Some(Lexed { toks, line_starts })
}

struct Lexer<'a> {
    b: &'a [u8],
    line_starts: &'a [usize],
    line: usize,
    toks: Vec<Tok>,
    prev_end_line: Option<usize>,
    /// Python bracket depth.
    depth: usize,
    /// Python: the line a `\` continues onto.
    continued_line: Option<usize>,
    /// JS: open `{` tokens, and the brace depth at each open template `${`.
    braces: usize,
    templates: Vec<usize>,
    /// Open brackets (token indices).
    stack: Vec<usize>,
}

impl Lexer<'_> {
    fn line_of(&mut self, at: usize) -> usize {
        while self.line + 1 < self.line_starts.len() && self.line_starts[self.line + 1] <= at {
            self.line += 1;
        }
        self.line
    }

    fn push(&mut self, kind: Kind, start: usize, end: usize) -> Option<()> {
        let line = self.line_of(start);
        let first_on_line = self.prev_end_line != Some(line);
        let end_line = self.line_of(end.saturating_sub(1).max(start));
        let logical_start = first_on_line && self.depth == 0 && self.continued_line != Some(line);
        let idx = self.toks.len();
        let mut mate = idx;
        if let Kind::Punct(c) = kind {
            match c {
                b'(' | b'[' | b'{' => {
                    self.stack.push(idx);
                    self.depth += 1;
                    self.braces += usize::from(c == b'{');
                }
                b')' | b']' | b'}' => {
                    let open = self.stack.pop()?;
                    let want = match c {
                        b')' => b'(',
                        b']' => b'[',
                        _ => b'{',
                    };
                    if self.toks[open].kind != Kind::Punct(want) {
                        return None;
                    }
                    self.toks[open].mate = idx;
                    mate = open;
                    self.depth -= 1;
                    self.braces -= usize::from(c == b'}');
                }
                _ => {}
            }
        }
        self.toks.push(Tok {
            kind,
            start,
            end,
            line,
            end_line,
            first_on_line,
            logical_start,
            mate,
        });
        self.prev_end_line = Some(end_line);
        Some(())
    }

    /// A `/` here begins a regular expression, not a division: after an operator, an opening
    /// bracket, a `,` / `;`, `return` or `typeof`, or first in the file.
    fn regex_may_start(&self, src: &str) -> bool {
        let Some(prev) = self.toks.last() else {
            return true;
        };
        match prev.kind {
            Kind::Punct(c) => !matches!(c, b')' | b']' | b'}'),
            Kind::Ident => matches!(
                src.get(prev.start..prev.end),
                Some("return" | "typeof" | "case" | "in" | "of" | "yield")
            ),
            _ => false,
        }
    }

    /// Scans a template literal's text from `i` to its closing backtick (pushing it as a
    /// string) or to a `${` (whose expression is then lexed as code); the byte after.
    fn template(&mut self, mut i: usize) -> Option<usize> {
        let start = i.saturating_sub(1);
        while i < self.b.len() {
            match self.b[i] {
                b'\\' => i += 2,
                b'`' => {
                    self.push(Kind::Str, start, i + 1)?;
                    return Some(i + 1);
                }
                b'$' if self.b.get(i + 1) == Some(&b'{') => {
                    self.push(Kind::Str, start, i)?;
                    self.templates.push(self.braces);
                    return Some(i + 2);
                }
                _ => i += 1,
            }
        }
        None
    }
}

/// The byte after the string closing with `close` that began before `i`.
fn string_end(b: &[u8], mut i: usize, close: &[u8], multiline: bool) -> Option<usize> {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'\n' if !multiline => return None,
            c if c == close[0] && b[i..].starts_with(close) => return Some(i + close.len()),
            _ => i += 1,
        }
    }
    None
}

fn find_byte(b: &[u8], from: usize, c: u8) -> Option<usize> {
    b.get(from..)?
        .iter()
        .position(|&x| x == c)
        .map(|p| from + p)
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    b.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

fn memchr_lines(b: &[u8]) -> impl Iterator<Item = usize> + '_ {
    b.iter()
        .enumerate()
        .filter(|(_, &c)| c == b'\n')
        .map(|(i, _)| i + 1)
}

fn utf8_width(first: u8) -> usize {
    match first {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(lang: Lang, src: &str) -> Vec<String> {
        let l = lex(lang, src).expect("lexes");
        (0..l.toks.len())
            .map(|i| l.text(src, i).to_owned())
            .collect()
    }

    #[test]
    fn strings_comments_and_chars_hide_their_brackets() {
        let src = "int f() { char c = '{'; /* } */ return \"}\"; } // {\n";
        let t = texts(Lang::C, src);
        assert_eq!(t.iter().filter(|s| *s == "{").count(), 1);
        assert_eq!(t.iter().filter(|s| *s == "}").count(), 1);
        let l = lex(Lang::C, src).unwrap();
        let open = (0..l.toks.len()).find(|&i| l.is(i, b'{')).unwrap();
        assert!(l.is(l.toks[open].mate, b'}'));
    }

    #[test]
    fn rust_lifetimes_raw_strings_and_js_templates() {
        let t = texts(
            Lang::Rust,
            "fn f<'a>(x: &'a str) -> char { let s = r#\"{\"#; '}' }",
        );
        assert_eq!(t.iter().filter(|s| *s == "{").count(), 1);
        let t = texts(Lang::JavaScript, "const s = `a ${ {x: 1}.x } b`; f(s)");
        assert_eq!(t.iter().filter(|s| *s == "{").count(), 1);
        assert!(t.contains(&"f".to_owned()));
        // A regular expression with a quote and a bracket; a division is not one.
        let t = texts(
            Lang::JavaScript,
            "const re = /[\"{]/g; const h = w / 2 / 3; g(re)",
        );
        assert_eq!(t.iter().filter(|s| *s == "{").count(), 0);
        assert!(t.contains(&"g".to_owned()) && t.contains(&"h".to_owned()));
    }

    #[test]
    fn python_logical_lines() {
        let src = "x = (1,\n  2)\ny = '''\nz'''\nw = 1 + \\\n  2\ndef f():\n    pass\n";
        let l = lex(Lang::Python, src).unwrap();
        let starts: Vec<&str> = (0..l.toks.len())
            .filter(|&i| l.toks[i].logical_start)
            .map(|i| l.text(src, i))
            .collect();
        assert_eq!(starts, ["x", "y", "w", "def", "pass"]);
    }

    #[test]
    fn unreadable_code_is_refused() {
        assert!(lex(Lang::C, "int f() { return 1; ").is_none());
        assert!(lex(Lang::Python, "x = (1,\n").is_none());
        assert!(lex(Lang::Java, "String s = \"open;\n").is_none());
        assert!(lex(Lang::C, "/* never closed").is_none());
    }
}
