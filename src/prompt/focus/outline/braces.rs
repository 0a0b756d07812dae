//! The outline of the brace languages (JavaScript, TypeScript, Java, Rust, Go, C, C++):
//! members are read up to a `;` or a `{ }` body at bracket depth 0; a member is a class (impl,
//! trait, namespace...) whose body is outlined in turn, a function definition, or anything
//! else (always parsed).

use super::lex::{Kind, Lexed};
use super::model::{Container, Def, Outline, KEYWORDS};
use crate::prompt::focus::lang::Lang;

/// Words that begin a statement, never a definition.
const CONTROL: &[&str] = &[
    "if",
    "else",
    "for",
    "while",
    "do",
    "switch",
    "try",
    "catch",
    "finally",
    "match",
    "loop",
    "return",
    "throw",
    "with",
    "synchronized",
    "foreach",
    "using",
    "case",
    "defer",
    "go",
    "select",
    "new",
    "delete",
    "typeof",
    "await",
    "yield",
    "sizeof",
    "static_assert",
];

/// Words before a definition's or class's keyword.
const MODIFIERS: &[&str] = &[
    "pub",
    "export",
    "default",
    "declare",
    "abstract",
    "public",
    "private",
    "protected",
    "static",
    "final",
    "sealed",
    "partial",
    "inline",
    "virtual",
    "explicit",
    "constexpr",
    "extern",
    "const",
    "async",
    "unsafe",
    "override",
    "readonly",
    "get",
    "set",
    "native",
    "strictfp",
    "transient",
    "volatile",
    "friend",
    "consteval",
    "noexcept",
];

/// Words that make a member a class-like body whose members are outlined.
const CONTAINERS: &[&str] = &[
    "class",
    "struct",
    "interface",
    "impl",
    "trait",
    "mod",
    "namespace",
    "enum",
    "union",
    "module",
    "record",
];

/// Words that start a new statement on a new line in the languages without required `;`.
const ITEM_STARTS: &[&str] = &[
    "function",
    "class",
    "export",
    "const",
    "let",
    "var",
    "async",
    "import",
    "interface",
    "type",
    "enum",
    "namespace",
    "declare",
    "abstract",
    "func",
];

enum Member {
    Container(Vec<String>),
    Def,
    Other,
}

struct Scan<'a> {
    l: &'a Lexed,
    src: &'a str,
    lang: Lang,
    defs: Vec<Def>,
    containers: Vec<Container>,
}

/// Fills `out` with the definitions of `src`.
/// Containers (classes, namespaces, impls) scanned inside one another; deeper ones are kept
/// whole. Real code nests a few.
pub const MAX_NESTING: usize = 32;

pub fn outline(out: &mut Outline, src: &str, lang: Lang) {
    let l = &out.lexed;
    let mut s = Scan {
        l,
        src,
        lang,
        defs: Vec::new(),
        containers: Vec::new(),
    };
    s.members(0, l.toks.len(), None, 0);
    let (defs, containers) = (s.defs, s.containers);
    out.defs = defs;
    out.containers = containers;
}

impl Scan<'_> {
    fn js(&self) -> bool {
        matches!(self.lang, Lang::JavaScript | Lang::TypeScript | Lang::Tsx)
    }

    fn text(&self, i: usize) -> &str {
        if i < self.l.toks.len() {
            self.l.text(self.src, i)
        } else {
            ""
        }
    }

    fn ident(&self, i: usize) -> bool {
        self.l.toks.get(i).is_some_and(|t| t.kind == Kind::Ident)
    }

    fn is(&self, i: usize, c: u8) -> bool {
        self.l.is(i, c)
    }

    /// `i` is a bracket: the token after its mate.
    fn past(&self, i: usize) -> usize {
        self.l.toks[i].mate + 1
    }

    /// `=>`.
    fn arrow(&self, i: usize) -> bool {
        self.is(i, b'=') && self.is(i + 1, b'>') && self.l.toks[i].end == self.l.toks[i + 1].start
    }

    /// The items between tokens `from` and `to`, inside `container` (`depth` containers deep:
    /// past [`MAX_NESTING`] a container is kept whole, not scanned, so that code nested a
    /// hundred thousand classes deep cannot overflow the stack).
    fn members(&mut self, from: usize, to: usize, container: Option<usize>, depth: usize) {
        let asi = self.js() || self.lang == Lang::Go;
        let typed_js = matches!(self.lang, Lang::TypeScript | Lang::Tsx);
        let mut i = from;
        while i < to {
            // C++ access labels (`public:`) stand alone.
            let label = self.lang == Lang::Cpp
                && matches!(
                    self.text(i),
                    "public" | "private" | "protected" | "signals" | "slots"
                )
                && self.is(i + 1, b':')
                && !self.is(i + 2, b':');
            if label {
                i += 2;
                continue;
            }
            let start = i;
            let mut j = i;
            let mut body = None;
            while j < to {
                // (Decorators go with what follows them, on whatever line.)
                let decorated = self.is(start, b'@');
                if j > start
                    && asi
                    && !decorated
                    && self.l.toks[j].first_on_line
                    && self.starts_item(j)
                {
                    break;
                }
                match self.l.toks[j].kind {
                    Kind::Punct(b'(' | b'[') => {
                        j = self.past(j);
                        continue;
                    }
                    // A TypeScript object type (`f(): { a: T } {`) is part of the header.
                    Kind::Punct(b'{') if typed_js && j > start && self.is(j - 1, b':') => {
                        j = self.past(j);
                        continue;
                    }
                    Kind::Punct(b'{') => {
                        body = Some(j);
                        break;
                    }
                    Kind::Punct(b';') => break,
                    _ => j += 1,
                }
            }
            let Some(open) = body else {
                let next = if self.is(j, b';') {
                    j + 1
                } else {
                    j.max(start + 1)
                };
                // A statement with a function inside (`app.get("/", (req, res) => {..});`)
                // stays, but what it defines and mentions counts.
                let last = (next - 1).min(to - 1);
                if (start..=last).any(|t| self.is(t, b'{')) {
                    self.push_def(start, last, container, true);
                }
                i = next;
                continue;
            };
            let close = self.l.toks[open].mate;
            let end = if close + 1 < to && self.is(close + 1, b';') {
                close + 1
            } else {
                close
            };
            match self.classify(start, open, container) {
                Member::Container(_) if depth >= MAX_NESTING => {
                    self.push_def(start, end, container, true);
                }
                Member::Container(names) => {
                    let ci = self.containers.len();
                    self.containers.push(Container {
                        names,
                        only_defs: false,
                        toks: start..end + 1,
                        rows: (self.l.toks[start].line, self.l.toks[end].end_line),
                        bytes: 0..0,
                        parent: container,
                        whole_lines: self.clean(start, end),
                    });
                    self.members(open + 1, close, Some(ci), depth + 1);
                }
                Member::Def if self.clean(start, end) => {
                    self.push_def(start, end, container, false);
                }
                // What the scan cannot leave out stays, but what it defines and mentions
                // counts (an `operator<<`, a definition sharing its line).
                _ => self.push_def(start, end, container, true),
            }
            i = end + 1;
        }
    }

    /// A word that begins an item on its own line (`function`, `const`, `func`...), after a
    /// token that does not continue an expression.
    fn starts_item(&self, j: usize) -> bool {
        let word = self.ident(j) && ITEM_STARTS.contains(&self.text(j));
        let decorator = self.js() && self.is(j, b'@');
        let continued = matches!(
            self.l.toks[j - 1].kind,
            Kind::Punct(c) if !matches!(c, b')' | b']' | b'}')
        );
        (word || decorator) && !continued
    }

    /// The definition spans whole lines and nothing of an expression goes on after it.
    fn clean(&self, start: usize, end: usize) -> bool {
        let l = self.l;
        if !l.toks[start].first_on_line || !l.last_on_line(end) {
            return false;
        }
        let next = end + 1;
        !(self.js()
            && !self.is(end, b';')
            && matches!(
                l.toks.get(next).map(|t| t.kind),
                Some(Kind::Punct(
                    b'.' | b'('
                        | b'['
                        | b','
                        | b'?'
                        | b':'
                        | b'+'
                        | b'-'
                        | b'*'
                        | b'/'
                        | b'='
                        | b'&'
                        | b'|'
                ))
            ))
    }

    /// What the member whose header is `start..open` (its body opening at `open`) is.
    fn classify(&self, start: usize, open: usize, container: Option<usize>) -> Member {
        let mut h = start;
        // Annotations, decorators and attributes.
        loop {
            if self.is(h, b'@') && self.ident(h + 1) {
                h += 2;
                while self.is(h, b'.') && self.ident(h + 1) {
                    h += 2;
                }
                if self.is(h, b'(') {
                    h = self.past(h);
                }
            } else if self.is(h, b'#') && self.is(h + 1, b'!') && self.is(h + 2, b'[') {
                h = self.past(h + 2);
            } else if self.is(h, b'#') && self.is(h + 1, b'[') {
                h = self.past(h + 1);
            } else if self.is(h, b'[') && self.is(h + 1, b'[') {
                h = self.past(h);
            } else {
                break;
            }
        }
        // Modifiers, `pub(crate)`, `template <...>`, `extern "C"`.
        let mut m = h;
        while m < open {
            let w = self.text(m);
            if self.ident(m) && MODIFIERS.contains(&w) && !self.is(m + 1, b'(') {
                m += 1;
                if w == "extern" && self.l.toks.get(m).is_some_and(|t| t.kind == Kind::Str) {
                    if m + 1 == open {
                        return Member::Container(Vec::new());
                    }
                    m += 1;
                }
            } else if w == "pub" && self.is(m + 1, b'(') {
                m = self.past(m + 1);
            } else if w == "template" && self.is(m + 1, b'<') {
                m = self.past_angles(m + 1, open);
            } else if self.lang == Lang::Java && self.is(m, b'<') {
                // A generic method's type parameters.
                m = self.past_angles(m, open);
            } else {
                break;
            }
        }
        if m >= open || !self.ident(m) {
            return Member::Other;
        }
        let kw = self.text(m);
        if CONTROL.contains(&kw) {
            return Member::Other;
        }
        let group = (m..open).find(|&t| self.is(t, b'('));
        let c_like = matches!(self.lang, Lang::C | Lang::Cpp);
        let member_access = self.is(m + 1, b'.') || self.is(m + 1, b'=');
        if CONTAINERS.contains(&kw) && !member_access && !(c_like && group.is_some()) {
            let names = (h..open)
                .filter(|&t| self.ident(t) && !KEYWORDS.contains(&self.text(t)))
                .map(|t| self.text(t).to_owned())
                .collect();
            return Member::Container(names);
        }
        let def = match self.lang {
            Lang::Rust => kw == "fn",
            Lang::Go => kw == "func",
            Lang::JavaScript | Lang::TypeScript | Lang::Tsx => {
                self.js_def(m, open, container.is_some())
            }
            _ => self.c_def(m, open),
        };
        if def {
            Member::Def
        } else {
            Member::Other
        }
    }

    /// Past the `<...>` opening at `i` (angle brackets counted), at most to `limit`.
    fn past_angles(&self, mut i: usize, limit: usize) -> usize {
        let mut depth = 0usize;
        while i < limit {
            if self.is(i, b'<') {
                depth += 1;
            } else if self.is(i, b'>') {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            } else if self.is(i, b'(') || self.is(i, b'[') {
                i = self.past(i);
                continue;
            }
            i += 1;
        }
        limit
    }

    /// C, C++, Java: `type name(...) ... {` with no `=` before the parameters, nor `=`, `;`
    /// or `=>` between them and the body.
    fn c_def(&self, m: usize, open: usize) -> bool {
        let mut t = m;
        while t < open {
            if self.is(t, b'=') {
                return false;
            }
            if self.is(t, b'(') {
                let named = t > m && (self.ident(t - 1) || self.is(t - 1, b'>'));
                if !named {
                    return false;
                }
                let mut u = self.past(t);
                while u < open {
                    if self.is(u, b'(') || self.is(u, b'[') {
                        u = self.past(u);
                        continue;
                    }
                    if self.is(u, b'=') || self.is(u, b';') {
                        return false;
                    }
                    u += 1;
                }
                return true;
            }
            if self.is(t, b'[') {
                t = self.past(t);
                continue;
            }
            t += 1;
        }
        false
    }

    /// JavaScript, TypeScript: `function f(...) {`, `const f = (...) => {`, `a.b = function
    /// (...) {`, and in a class body a method `name(...) {` or field `name = (...) => {`.
    fn js_def(&self, m: usize, open: usize, in_class: bool) -> bool {
        let kw = self.text(m);
        if kw == "function" {
            return true;
        }
        if matches!(kw, "const" | "let" | "var") {
            let eq = (m + 1..open).find(|&t| self.is(t, b'=') && !self.arrow(t));
            let single = eq.is_some_and(|e| !(m..e).any(|t| self.is(t, b',')));
            return single && eq.is_some_and(|e| self.function_value(e + 1, open));
        }
        // `a.b.c = function ..` / `name = (..) => ..`.
        let mut t = m;
        while self.ident(t) && self.is(t + 1, b'.') {
            t += 2;
        }
        if self.ident(t) && self.is(t + 1, b'=') && !self.arrow(t + 1) && !self.is(t + 2, b'=') {
            return self.function_value(t + 2, open);
        }
        if !in_class {
            return false;
        }
        // A method: `name<T>(...)`, `*name(...)`, `[computed](...)`, then `: Type` to the body.
        let mut t = m;
        if self.is(t, b'*') || self.is(t, b'#') {
            t += 1;
        }
        if self.is(t, b'[') {
            t = self.past(t);
        } else if self.ident(t) || self.l.toks.get(t).is_some_and(|x| x.kind == Kind::Str) {
            t += 1;
        } else {
            return false;
        }
        if self.is(t, b'?') || self.is(t, b'!') {
            t += 1;
        }
        if self.is(t, b'<') {
            t = self.past_angles(t, open);
        }
        if !self.is(t, b'(') {
            return false;
        }
        let mut u = self.past(t);
        while u < open {
            if self.is(u, b'(') || self.is(u, b'[') || self.is(u, b'{') {
                u = self.past(u);
                continue;
            }
            if self.is(u, b'=') || self.is(u, b';') {
                return false;
            }
            u += 1;
        }
        true
    }

    /// The value from `v` is a function whose body opens at `open`: `[async] function`,
    /// `[async] (...) [: T] =>`, `[async] x =>`.
    fn function_value(&self, mut v: usize, open: usize) -> bool {
        if self.text(v) == "async" {
            v += 1;
        }
        if self.text(v) == "function" {
            return true;
        }
        if self.is(v, b'<') {
            v = self.past_angles(v, open);
        }
        if self.is(v, b'(') {
            let mut u = self.past(v);
            while u < open {
                if self.arrow(u) {
                    return u + 2 == open;
                }
                if self.is(u, b'(') || self.is(u, b'[') || self.is(u, b'{') {
                    u = self.past(u);
                    continue;
                }
                u += 1;
            }
            return false;
        }
        self.ident(v) && self.arrow(v + 1) && v + 3 == open
    }

    fn push_def(&mut self, start: usize, end: usize, container: Option<usize>, pinned: bool) {
        let mut names: Vec<String> = Vec::new();
        let js = self.js();
        for t in start..=end {
            if !self.ident(t) {
                continue;
            }
            // A nested type's name where it is defined (`struct Point {`), not where a
            // parameter's type names one (`struct Point *p`).
            let defines_type = || {
                self.is(t + 1, b'{')
                    || self.is(t + 1, b':')
                    || self.is(t + 1, b'<')
                    || matches!(self.text(t + 1), "extends" | "implements")
            };
            let after_keyword = t > 0
                && match self.text(t - 1) {
                    "fn" | "function" => true,
                    "class" | "struct" | "interface" | "trait" | "enum" => defines_type(),
                    _ => false,
                };
            if after_keyword
                || self.is(t + 1, b'(') && self.opens_body(t + 1, end)
                || js && self.binds_function(t, end)
            {
                let w = self.text(t);
                if !self.reserved(w) && !names.iter().any(|n| n == w) {
                    names.push(w.to_owned());
                }
            }
        }
        let ctor_word = match self.lang {
            Lang::JavaScript | Lang::TypeScript | Lang::Tsx => Some("constructor"),
            Lang::Rust => Some("new"),
            _ => None,
        };
        // Named by the language (`new`, `constructor`), or else after the class (Java, C++).
        let ctor = container.is_some_and(|c| {
            names.iter().any(|n| match ctor_word {
                Some(w) => n == w,
                None => self.containers[c].names.iter().any(|k| k == n),
            })
        });
        let (first, last) = (self.l.toks[start].line, self.l.toks[end].end_line);
        self.defs.push(Def {
            bytes: 0..0,
            rows: (first, last),
            toks: start..end + 1,
            names,
            container,
            ctor,
            pinned,
        });
    }

    /// A word the language reserves, so never a definition's name (`if (..) {`, Go's `func
    /// (r T) M(..) {`).
    fn reserved(&self, w: &str) -> bool {
        let everywhere = matches!(w, "if" | "for" | "while" | "switch" | "return" | "else");
        let c_family = !matches!(self.lang, Lang::Go | Lang::Rust)
            && matches!(w, "catch" | "try" | "throw" | "do" | "sizeof" | "typeof");
        everywhere
            || c_family
            || match self.lang {
                Lang::Go => w == "func",
                Lang::Rust => w == "fn",
                Lang::JavaScript | Lang::TypeScript | Lang::Tsx => w == "function",
                _ => false,
            }
    }

    /// The `(` at `p` closes into `) ... {`: a definition's parameters (or a block's
    /// condition), not a call's arguments.
    fn opens_body(&self, p: usize, limit: usize) -> bool {
        let mut u = self.past(p);
        // `lines().enumerate() {`: a call's result used, not parameters.
        if self.is(u, b'.') {
            return false;
        }
        let stop = (u + 64).min(limit + 1);
        while u < stop {
            match self.l.toks[u].kind {
                Kind::Punct(b'{') => return true,
                Kind::Punct(b'(' | b'[') => {
                    u = self.past(u);
                    continue;
                }
                Kind::Punct(b';' | b'=' | b')' | b']' | b'}') => return false,
                _ => u += 1,
            }
        }
        false
    }

    /// JS / TS: `name = <function>` or `name: <function>`: `[async] function`, `[async]
    /// (...) [: T] =>` or `[async] x =>`, with a block body or an expression.
    fn binds_function(&self, t: usize, limit: usize) -> bool {
        let binder = self.is(t + 1, b':') || self.is(t + 1, b'=') && !self.arrow(t + 1);
        if !binder || self.is(t + 2, b'=') {
            return false;
        }
        let mut v = t + 2;
        if self.text(v) == "async" {
            v += 1;
        }
        if self.text(v) == "function" {
            return true;
        }
        if self.is(v, b'<') {
            v = self.past_angles(v, limit);
        }
        if self.is(v, b'(') {
            let mut u = self.past(v);
            let stop = (u + 40).min(limit + 1);
            while u < stop {
                if self.arrow(u) {
                    return true;
                }
                match self.l.toks[u].kind {
                    Kind::Punct(b'(' | b'[') => {
                        u = self.past(u);
                        continue;
                    }
                    Kind::Punct(b'{' | b';' | b',' | b')' | b']' | b'}' | b'=') => return false,
                    _ => u += 1,
                }
            }
            return false;
        }
        self.ident(v) && self.arrow(v + 1)
    }
}
