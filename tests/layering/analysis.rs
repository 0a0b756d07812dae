//! The import graph of one crate, read from its sources: a small Rust lexer, the module tree
//! from each root's `mod` declarations, every path in `use` items and expressions resolved to
//! the file that defines what it names, and the loops (strongly connected components) of that
//! graph, by file and by folder.
//!
//! Plain functions over `Sources` (path relative to the crate's source folder -> text), so the
//! self-tests can run them on in-memory fixtures.

use std::collections::{BTreeMap, BTreeSet};

/// One crate's sources: path relative to its source folder (`"b/mod.rs"`) -> text.
pub type Sources = BTreeMap<String, String>;
/// A module path from a crate root (`["admission", "redis"]`).
pub type ModPath = Vec<String>;
/// The file graph: each file and the files it imports.
pub type Edges = BTreeMap<String, BTreeSet<String>>;

/// The files a crate can start from: each is a separate root with its own `crate::`.
pub const ROOTS: &[&str] = &["lib.rs", "main.rs"];

// ---------------------------------------------------------------------------------------------
// Lexer

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// An identifier or keyword (`r#type` is read as `type`).
    Ident(String),
    /// A string literal's raw text (attributes such as `#[path = "x.rs"]` need it).
    Str(String),
    /// `::`
    Sep,
    /// Any other character; numbers and lifetimes become `'0'`.
    P(char),
}

impl Tok {
    fn is(&self, s: &str) -> bool {
        matches!(self, Tok::Ident(t) if t == s)
    }
    fn ident(&self) -> Option<&str> {
        match self {
            Tok::Ident(t) => Some(t),
            _ => None,
        }
    }
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}
fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The tokens of `src`, without comments; string and char literals are single tokens, so
/// paths and braces inside them are not seen.
pub fn lex(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let prev_ident = i > 0 && is_ident_char(b[i - 1]);
        if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            i = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if !prev_ident && raw_string_at(b, i).is_some() {
            let (body, hashes) = raw_string_at(b, i).expect("checked");
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| body + p);
            out.push(Tok::Str(src[body..end].to_owned()));
            i = (end + close.len()).min(b.len());
        } else if c == b'"'
            || (!prev_ident && matches!(c, b'b' | b'c') && b.get(i + 1) == Some(&b'"'))
        {
            let start = if c == b'"' { i + 1 } else { i + 2 };
            let mut j = start;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let j = j.min(b.len());
            out.push(Tok::Str(src[start..j].to_owned()));
            i = j + 1;
        } else if c == b'\'' || (!prev_ident && c == b'b' && b.get(i + 1) == Some(&b'\'')) {
            // A char literal ('x', '\n', b'x') or a lifetime ('a).
            let q = if c == b'\'' { i } else { i + 1 };
            let end = if b.get(q + 1) == Some(&b'\\') {
                // Skip the escaped character itself: `'\''` ends at the second quote.
                b.get(q + 3..)
                    .and_then(|rest| rest.iter().position(|&c| c == b'\'').map(|p| q + 3 + p + 1))
            } else {
                let ch_len = src[q + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(q + 1 + ch_len) == Some(&b'\'')).then_some(q + 2 + ch_len)
            };
            match end {
                Some(end) => i = end,
                None => {
                    // A lifetime: skip its name too.
                    i = q + 1;
                    while i < b.len() && is_ident_char(b[i]) {
                        i += 1;
                    }
                }
            }
            out.push(Tok::P('0'));
        } else if c == b'r'
            && b.get(i + 1) == Some(&b'#')
            && b.get(i + 2).is_some_and(|&c| is_ident_start(c))
        {
            let start = i + 2;
            i = start;
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            out.push(Tok::Ident(src[start..i].to_owned()));
        } else if is_ident_start(c) {
            let start = i;
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            out.push(Tok::Ident(src[start..i].to_owned()));
        } else if c.is_ascii_digit() {
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            out.push(Tok::P('0'));
        } else if b[i..].starts_with(b"::") {
            out.push(Tok::Sep);
            i += 2;
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(Tok::P(ch));
            i += ch.len_utf8();
        }
    }
    out
}

/// `r"`, `r#"`, `br"`, `br#"` at `i`: the body's start and the number of `#`.
fn raw_string_at(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let r = match b[i] {
        b'r' => i,
        b'b' | b'c' if b.get(i + 1) == Some(&b'r') => i + 1,
        _ => return None,
    };
    let hashes = b[r + 1..].iter().take_while(|&&c| c == b'#').count();
    (b.get(r + 1 + hashes) == Some(&b'"')).then_some((r + 2 + hashes, hashes))
}

// ---------------------------------------------------------------------------------------------
// One file, parsed

/// One leaf of a `use` tree: `use a::{b as c, d::*}` has leaves `a::b` (bound as `c`) and
/// `a::d::*`.
#[derive(Clone, Debug, PartialEq)]
pub struct UseLeaf {
    /// The path as written (`["super", "x", "Y"]`); a leading `::` is the segment `"::"`.
    pub segs: Vec<String>,
    /// The name it binds (`None` for `as _` and for globs).
    pub bind: Option<String>,
    pub glob: bool,
}

/// A module's body inside a file: the file's top level, or an inline `mod name { .. }`.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// The scope's module path relative to the file's module (`[]` at the top level).
    pub rel: Vec<String>,
    /// Names of the items defined at the scope's top level (fn, struct, enum, trait, ...).
    pub items: BTreeSet<String>,
    pub uses: Vec<UseLeaf>,
    /// Every other path of two or more segments (`child::f`, `super::X::new`, `crate::a::b`).
    pub paths: Vec<Vec<String>>,
    /// `mod name;` declarations: the name and its `#[path = ".."]`, if any.
    pub outlined: Vec<(String, Option<String>)>,
    /// `macro_rules!` names marked `#[macro_export]`: they live at the crate root.
    pub exported_macros: BTreeSet<String>,
    /// The inherent `impl Type { .. }` blocks at the scope's top level (not `impl Trait for
    /// Type`): the type's path and the names of the functions in the block.
    pub inherent_impls: Vec<(Vec<String>, BTreeSet<String>)>,
    /// Every identifier of the file (kept on the file's top-level scope only).
    pub idents: BTreeSet<String>,
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn", "struct", "enum", "union", "trait", "type", "const", "static",
];
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type", "union",
    "unsafe", "use", "where", "while",
];

/// The attributes right before the item that starts at `at` (after `pub`, `pub(..)`): their
/// token ranges, innermost first.
fn attributes_before(toks: &[Tok], mut at: usize) -> Vec<&[Tok]> {
    // Step back over visibility.
    if at > 0 && toks[at - 1] == Tok::P(')') {
        if let Some(open) = toks[..at - 1].iter().rposition(|t| *t == Tok::P('(')) {
            if open > 0 && toks[open - 1].is("pub") {
                at = open - 1;
            }
        }
    } else if at > 0 && toks[at - 1].is("pub") {
        at -= 1;
    }
    let mut out = Vec::new();
    while at > 0 && toks[at - 1] == Tok::P(']') {
        let mut depth = 0;
        let mut j = at - 1;
        loop {
            match toks[j] {
                Tok::P(']') => depth += 1,
                Tok::P('[') => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            if j == 0 {
                return out;
            }
            j -= 1;
        }
        if j == 0 || toks[j - 1] != Tok::P('#') {
            return out;
        }
        out.push(&toks[j + 1..at - 1]);
        at = j - 1;
    }
    out
}

/// The index after the balanced `<..>` that starts at `toks[i]`.
fn skip_generics(toks: &[Tok], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < toks.len() {
        match toks[i] {
            Tok::P('<') => depth += 1,
            Tok::P('>') if i > 0 && toks[i - 1] == Tok::P('-') => {}
            Tok::P('>') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            Tok::P('{') | Tok::P(';') => return i,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Parses the use tree at `toks[*i]` under `prefix` into `out`.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<UseLeaf>) {
    let mut path = prefix.to_vec();
    if toks.get(*i) == Some(&Tok::Sep) {
        path.push("::".into());
        *i += 1;
    }
    loop {
        match toks.get(*i) {
            Some(Tok::P('{')) => {
                *i += 1;
                loop {
                    match toks.get(*i) {
                        Some(Tok::P('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::P(',')) => *i += 1,
                        None | Some(Tok::P(';')) => return,
                        _ => {
                            let before = *i;
                            use_tree(toks, i, &path, out);
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
            }
            Some(Tok::P('*')) => {
                *i += 1;
                out.push(UseLeaf {
                    segs: path,
                    bind: None,
                    glob: true,
                });
                return;
            }
            Some(Tok::Ident(name)) => {
                *i += 1;
                if name == "self" && !path.is_empty() && toks.get(*i) != Some(&Tok::Sep) {
                    // `a::{self}`: binds `a`.
                    let mut bind = path.last().cloned();
                    if toks.get(*i).is_some_and(|t| t.is("as")) {
                        bind = toks.get(*i + 1).and_then(Tok::ident).map(str::to_owned);
                        *i += 2;
                    }
                    out.push(UseLeaf {
                        segs: path,
                        bind: bind.filter(|b| b != "_"),
                        glob: false,
                    });
                    return;
                }
                path.push(name.clone());
                if toks.get(*i) == Some(&Tok::Sep) {
                    *i += 1;
                    continue;
                }
                let mut bind = Some(name.clone());
                if toks.get(*i).is_some_and(|t| t.is("as")) {
                    bind = toks.get(*i + 1).and_then(Tok::ident).map(str::to_owned);
                    *i += 2;
                }
                out.push(UseLeaf {
                    segs: path,
                    bind: bind.filter(|b| b != "_"),
                    glob: false,
                });
                return;
            }
            _ => return,
        }
    }
}

/// The scopes of one file: `[0]` is its top level, then each inline module.
pub fn parse_file(src: &str) -> Vec<Scope> {
    let toks = lex(src);
    let mut scopes = vec![Scope::default()];
    // (brace depth inside the module's braces, scope index)
    let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    // The inherent impl whose body opens next, and the one being read: (scope, index, depth).
    let mut pending_impl: Option<(usize, usize)> = None;
    let mut in_impl: Option<(usize, usize, usize)> = None;
    let mut i = 0;
    while i < toks.len() {
        let (top_depth, cur) = *stack.last().expect("the file's scope");
        match &toks[i] {
            Tok::P('{') => {
                depth += 1;
                if let Some((s, k)) = pending_impl.take() {
                    in_impl = Some((s, k, depth));
                }
                if let Some(name) = pending_mod.take() {
                    let mut rel = scopes[cur].rel.clone();
                    rel.push(name);
                    scopes.push(Scope {
                        rel,
                        ..Scope::default()
                    });
                    stack.push((depth, scopes.len() - 1));
                }
                i += 1;
            }
            Tok::P('}') => {
                if in_impl.is_some_and(|(_, _, d)| d == depth) {
                    in_impl = None;
                }
                if depth == top_depth && stack.len() > 1 {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(kw) if kw == "use" => {
                i += 1;
                let mut leaves = Vec::new();
                use_tree(&toks, &mut i, &[], &mut leaves);
                scopes[cur].uses.extend(leaves);
            }
            Tok::Ident(kw) if kw == "mod" && toks.get(i + 1).and_then(Tok::ident).is_some() => {
                let name = toks[i + 1].ident().expect("checked").to_owned();
                match toks.get(i + 2) {
                    Some(Tok::P(';')) => {
                        let path = attributes_before(&toks, i)
                            .into_iter()
                            .find_map(|a| match a {
                                [Tok::Ident(p), Tok::P('='), Tok::Str(s)] if p == "path" => {
                                    Some(s.clone())
                                }
                                _ => None,
                            });
                        scopes[cur].outlined.push((name, path));
                        i += 3;
                    }
                    Some(Tok::P('{')) => {
                        pending_mod = Some(name);
                        i += 2;
                    }
                    _ => i += 1,
                }
            }
            Tok::Ident(kw) if kw == "macro_rules" && toks.get(i + 1) == Some(&Tok::P('!')) => {
                if let Some(name) = toks.get(i + 2).and_then(Tok::ident) {
                    if depth == top_depth {
                        scopes[cur].items.insert(name.to_owned());
                    }
                    let exported = attributes_before(&toks, i)
                        .iter()
                        .any(|a| a.first().is_some_and(|t| t.is("macro_export")));
                    if exported {
                        scopes[cur].exported_macros.insert(name.to_owned());
                    }
                }
                i += 3;
            }
            Tok::Ident(kw) if kw == "impl" && depth == top_depth => {
                i += 1;
                if toks.get(i) == Some(&Tok::P('<')) {
                    i = skip_generics(&toks, i);
                }
                let start = i;
                let mut path = Vec::new();
                while let Some(Tok::Ident(seg)) = toks.get(i) {
                    path.push(seg.clone());
                    i += 1;
                    if toks.get(i) == Some(&Tok::Sep) {
                        i += 1;
                    } else {
                        break;
                    }
                }
                let mut after = i;
                if toks.get(after) == Some(&Tok::P('<')) {
                    after = skip_generics(&toks, after);
                }
                let body_next = toks
                    .get(after)
                    .is_some_and(|t| *t == Tok::P('{') || t.is("where"));
                if body_next
                    && path
                        .first()
                        .is_some_and(|p| !KEYWORDS.contains(&p.as_str()))
                {
                    scopes[cur].inherent_impls.push((path, BTreeSet::new()));
                    pending_impl = Some((cur, scopes[cur].inherent_impls.len() - 1));
                }
                // Read the path (and its generics) again as ordinary tokens.
                i = start;
            }
            Tok::Ident(kw) if ITEM_KEYWORDS.contains(&kw.as_str()) => {
                if let Some((s, k, d)) = in_impl {
                    if kw == "fn" && depth == d {
                        if let Some(name) = toks.get(i + 1).and_then(Tok::ident) {
                            scopes[s].inherent_impls[k].1.insert(name.to_owned());
                        }
                    }
                }
                if depth == top_depth {
                    if let Some(name) = toks.get(i + 1).and_then(Tok::ident) {
                        if !KEYWORDS.contains(&name) && name != "_" {
                            scopes[cur].items.insert(name.to_owned());
                        }
                    }
                }
                i += 1;
            }
            Tok::Ident(first) => {
                // A path of two or more segments, not the tail of a longer one.
                let after_sep = i > 0 && toks[i - 1] == Tok::Sep;
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::Sep) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(next)) => {
                            path.push(next.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                if !after_sep && path.len() > 1 {
                    scopes[cur].paths.push(path);
                }
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
    scopes[0].idents = toks
        .iter()
        .filter_map(Tok::ident)
        .map(str::to_owned)
        .collect();
    scopes
}

// ---------------------------------------------------------------------------------------------
// The module tree and the resolver

/// Where a module's body is: a file and one of its scopes.
#[derive(Clone, Debug)]
struct ModLoc {
    file: String,
    scope: usize,
}

/// One crate root's module tree.
pub struct Tree<'a> {
    pub root: String,
    parsed: &'a BTreeMap<String, Vec<Scope>>,
    mods: BTreeMap<ModPath, ModLoc>,
    /// Each file of the tree and its module path.
    pub files: BTreeMap<String, ModPath>,
    /// `#[macro_export]` macros: name -> defining file.
    macros: BTreeMap<String, String>,
}

/// What a path names.
#[derive(Debug, PartialEq)]
enum Res {
    /// An item defined in this file.
    Item(String),
    /// A module.
    Module(ModPath),
    /// Something outside the crate.
    External,
    /// A name the module's file was expected to define but does not visibly: count the file.
    Unknown(String),
}

fn dir_of(file: &str) -> &str {
    file.rfind('/').map_or("", |p| &file[..p])
}

fn join(dir: &str, rel: &str) -> String {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for p in rel.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

impl<'a> Tree<'a> {
    /// The module tree that starts at `root`, following `mod` declarations.
    pub fn build(root: &str, parsed: &'a BTreeMap<String, Vec<Scope>>) -> Tree<'a> {
        let mut tree = Tree {
            root: root.to_owned(),
            parsed,
            mods: BTreeMap::new(),
            files: BTreeMap::new(),
            macros: BTreeMap::new(),
        };
        tree.add_file(root, Vec::new(), true);
        tree
    }

    fn add_file(&mut self, file: &str, path: ModPath, owns_dir: bool) {
        let Some(scopes) = self.parsed.get(file) else {
            return;
        };
        if self.files.contains_key(file) {
            return;
        }
        self.files.insert(file.to_owned(), path.clone());
        // Where this file's `mod x;` children live: beside a mod.rs/lib.rs/main.rs, or in the
        // folder named after a non-mod.rs file.
        let dir = dir_of(file);
        let child_dir = if owns_dir {
            dir.to_owned()
        } else {
            let stem = file
                .rsplit('/')
                .next()
                .expect("a name")
                .trim_end_matches(".rs");
            join(dir, stem)
        };
        for (s, scope) in scopes.iter().enumerate() {
            let mut mpath = path.clone();
            mpath.extend(scope.rel.iter().cloned());
            self.mods.insert(
                mpath.clone(),
                ModLoc {
                    file: file.to_owned(),
                    scope: s,
                },
            );
            for m in &scope.exported_macros {
                self.macros.insert(m.clone(), file.to_owned());
            }
            for (name, attr) in &scope.outlined {
                let mut cpath = mpath.clone();
                cpath.push(name.clone());
                if let Some(attr) = attr {
                    let target = join(dir, attr);
                    let owns = target.ends_with("/mod.rs") || target == "mod.rs";
                    self.add_file(&target, cpath, owns);
                    continue;
                }
                let base = join(&child_dir, &scope.rel.join("/"));
                let flat = join(&base, &format!("{name}.rs"));
                let folder = join(&base, &format!("{name}/mod.rs"));
                if self.parsed.contains_key(&flat) {
                    self.add_file(&flat, cpath, false);
                } else {
                    self.add_file(&folder, cpath, true);
                }
            }
        }
    }

    fn scope(&self, m: &ModPath) -> Option<&Scope> {
        let loc = self.mods.get(m)?;
        Some(&self.parsed[&loc.file][loc.scope])
    }

    /// `segs` as written in module `at`, made absolute from the crate root; `None` when it
    /// starts outside the crate (another crate, `std`, a local item's associated path).
    fn absolute(&self, at: &ModPath, segs: &[String], depth: usize) -> Option<ModPath> {
        if depth > 24 || segs.is_empty() {
            return None;
        }
        let first = segs[0].as_str();
        match first {
            "::" => None,
            "crate" => Some(segs[1..].to_vec()),
            "self" | "super" => {
                let mut base = at.clone();
                let mut k = 0;
                while k < segs.len() && matches!(segs[k].as_str(), "self" | "super") {
                    if segs[k] == "super" {
                        base.pop()?;
                    }
                    k += 1;
                }
                base.extend(segs[k..].iter().cloned());
                Some(base)
            }
            name => {
                let mut child = at.clone();
                child.push(name.to_owned());
                if self.mods.contains_key(&child) {
                    child.extend(segs[1..].iter().cloned());
                    return Some(child);
                }
                let scope = self.scope(at)?;
                if let Some(leaf) = scope
                    .uses
                    .iter()
                    .find(|u| !u.glob && u.bind.as_deref() == Some(name))
                {
                    let mut target = self.absolute(at, &leaf.segs, depth + 1)?;
                    target.extend(segs[1..].iter().cloned());
                    return Some(target);
                }
                for glob in scope.uses.iter().filter(|u| u.glob) {
                    let Some(g) = self.absolute(at, &glob.segs, depth + 1) else {
                        continue;
                    };
                    let mut probe = g.clone();
                    probe.push(name.to_owned());
                    let found = self.mods.contains_key(&probe)
                        || self.scope(&g).is_some_and(|s| {
                            s.items.contains(name)
                                || s.uses.iter().any(|u| u.bind.as_deref() == Some(name))
                        });
                    if found {
                        probe.extend(segs[1..].iter().cloned());
                        return Some(probe);
                    }
                }
                None
            }
        }
    }

    /// The file that defines what the absolute path `abs` names, through re-exports.
    fn resolve(&self, abs: &[String], depth: usize) -> Res {
        if depth > 24 {
            return Res::External;
        }
        let k = (0..=abs.len())
            .rev()
            .find(|&k| self.mods.contains_key(&abs[..k]))
            .expect("the root is a module");
        if k == abs.len() {
            return Res::Module(abs.to_vec());
        }
        let m = abs[..k].to_vec();
        let loc = &self.mods[&m];
        let scope = &self.parsed[&loc.file][loc.scope];
        let name = abs[k].as_str();
        if scope.items.contains(name) {
            return Res::Item(loc.file.clone());
        }
        if let Some(leaf) = scope
            .uses
            .iter()
            .find(|u| !u.glob && u.bind.as_deref() == Some(name))
        {
            return match self.absolute(&m, &leaf.segs, depth + 1) {
                None => Res::External,
                Some(mut target) => {
                    target.extend(abs[k + 1..].iter().cloned());
                    self.resolve(&target, depth + 1)
                }
            };
        }
        for glob in scope.uses.iter().filter(|u| u.glob) {
            let Some(mut target) = self.absolute(&m, &glob.segs, depth + 1) else {
                continue;
            };
            if target == m {
                continue;
            }
            target.extend(abs[k..].iter().cloned());
            if let found @ (Res::Item(_) | Res::Module(_)) = self.resolve(&target, depth + 1) {
                return found;
            }
        }
        if k == 0 {
            if let Some(file) = self.macros.get(name) {
                return Res::Item(file.clone());
            }
        }
        Res::Unknown(loc.file.clone())
    }

    /// The files `file` imports, by every path it writes.
    pub fn imports(&self, file: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Some(path) = self.files.get(file) else {
            return out;
        };
        for scope in &self.parsed[file] {
            let mut at = path.clone();
            at.extend(scope.rel.iter().cloned());
            let leaves = scope
                .uses
                .iter()
                .map(|u| (&u.segs, u.glob))
                .chain(scope.paths.iter().map(|p| (p, false)));
            for (segs, glob) in leaves {
                let Some(abs) = self.absolute(&at, segs, 0) else {
                    continue;
                };
                let target = match self.resolve(&abs, 0) {
                    Res::Item(f) | Res::Unknown(f) => f,
                    Res::Module(m) if glob => self.mods[&m].file.clone(),
                    Res::Module(_) | Res::External => continue,
                };
                if target != file {
                    out.insert(target);
                }
            }
        }
        out
    }

    /// The files whose types have inherent methods in `file` and that name one of those
    /// methods: each imports `file`, where the methods it calls live (a split `impl`).
    pub fn impl_homes(&self, file: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Some(path) = self.files.get(file) else {
            return out;
        };
        for scope in &self.parsed[file] {
            let mut at = path.clone();
            at.extend(scope.rel.iter().cloned());
            for (ty, methods) in &scope.inherent_impls {
                let Some(abs) = self.absolute(&at, ty, 0) else {
                    continue;
                };
                if let Res::Item(home) = self.resolve(&abs, 0) {
                    let calls = self.parsed[&home][0]
                        .idents
                        .iter()
                        .any(|i| methods.contains(i));
                    if home != file && calls {
                        out.insert(home);
                    }
                }
            }
        }
        out
    }

    /// Every import of the tree's files: the paths each writes, plus a type's file to each file
    /// holding inherent methods of that type that it names.
    pub fn edges(&self) -> Edges {
        let mut edges: Edges = self
            .files
            .keys()
            .map(|f| (f.clone(), self.imports(f)))
            .collect();
        for file in self.files.keys() {
            for home in self.impl_homes(file) {
                edges.entry(home).or_default().insert(file.clone());
            }
        }
        edges
    }
}

/// Every file of a crate, parsed.
pub fn parse_all(sources: &Sources) -> BTreeMap<String, Vec<Scope>> {
    sources
        .iter()
        .map(|(f, s)| (f.clone(), parse_file(s)))
        .collect()
}

/// The module trees of a crate's roots (those present).
pub fn trees(parsed: &BTreeMap<String, Vec<Scope>>) -> Vec<Tree<'_>> {
    ROOTS
        .iter()
        .filter(|r| parsed.contains_key(**r))
        .map(|r| Tree::build(r, parsed))
        .collect()
}

/// The file graph of a crate: every root's files and what each imports.
pub fn graph(sources: &Sources) -> Edges {
    let parsed = parse_all(sources);
    let mut edges: Edges = BTreeMap::new();
    for tree in trees(&parsed) {
        for (file, deps) in tree.edges() {
            edges.entry(file).or_default().extend(deps);
        }
    }
    edges
}

/// Files that no root's module tree reaches (their imports would go unseen).
pub fn unreached(sources: &Sources) -> Vec<String> {
    let parsed = parse_all(sources);
    let trees = trees(&parsed);
    sources
        .keys()
        .filter(|f| !trees.iter().any(|t| t.files.contains_key(*f)))
        .cloned()
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Loops

/// Groups of two or more nodes that reach each other (Tarjan's strongly connected
/// components), each sorted.
pub fn loops<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct Walk<'a, N: Ord> {
        edges: &'a BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<&'a N, usize>,
        low: BTreeMap<&'a N, usize>,
        stack: Vec<&'a N>,
        on_stack: BTreeSet<&'a N>,
        found: Vec<Vec<N>>,
    }
    impl<'a, N: Ord + Clone> Walk<'a, N> {
        fn visit(&mut self, v: &'a N) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    // Targets that are not keys still count as nodes.
    let mut nodes: BTreeSet<&N> = edges.keys().collect();
    nodes.extend(edges.values().flatten());
    for v in nodes {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

/// A loop between the parts of one module: the module's own file (`self`) and its children
/// (a child file and the folder below it are one part), with the file imports that make it.
#[derive(Debug, Clone, PartialEq)]
pub struct FolderLoop {
    /// The root the module belongs to (`lib.rs`, `main.rs`).
    pub root: String,
    /// The module whose parts import each other (`[]` is the crate root).
    pub module: ModPath,
    /// The parts in the loop, sorted: child names, or `self` for the module's own file.
    pub parts: Vec<String>,
    /// The file imports between parts of the loop, `from -> to`.
    pub witnesses: Vec<(String, String)>,
}

/// The module's own file, as a part.
pub const SELF_PART: &str = "self";

/// Folder-level loops: for each import `f -> g`, the nearest module that holds both files, and
/// the two parts of it they lie in; a loop among a module's parts is a folder loop. `skip`
/// drops file imports (those of a tolerated file loop) first.
pub fn folder_loops(sources: &Sources, skip: &dyn Fn(&str, &str) -> bool) -> Vec<FolderLoop> {
    let parsed = parse_all(sources);
    let mut out = Vec::new();
    for tree in trees(&parsed) {
        // module -> part graph, and the file imports behind each part edge.
        let mut levels: BTreeMap<ModPath, Edges> = BTreeMap::new();
        let mut why: BTreeMap<(ModPath, String, String), Vec<(String, String)>> = BTreeMap::new();
        let edges = tree.edges();
        for (file, fpath) in &tree.files {
            for dep in edges.get(file).into_iter().flatten() {
                let dep = dep.clone();
                if skip(file, &dep) {
                    continue;
                }
                let Some(dpath) = tree.files.get(&dep) else {
                    continue;
                };
                let common = fpath.iter().zip(dpath).take_while(|(a, b)| a == b).count();
                let part = |p: &ModPath| p.get(common).cloned().unwrap_or(SELF_PART.into());
                let (from, to) = (part(fpath), part(dpath));
                if from == to {
                    continue;
                }
                let module = fpath[..common].to_vec();
                levels
                    .entry(module.clone())
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .insert(to.clone());
                why.entry((module, from, to))
                    .or_default()
                    .push((file.clone(), dep.clone()));
            }
        }
        for (module, parts) in &levels {
            for group in loops(parts) {
                let mut witnesses = Vec::new();
                for a in &group {
                    for b in &group {
                        if let Some(w) = why.get(&(module.clone(), a.clone(), b.clone())) {
                            witnesses.extend(w.iter().cloned());
                        }
                    }
                }
                witnesses.sort();
                out.push(FolderLoop {
                    root: tree.root.clone(),
                    module: module.clone(),
                    parts: group,
                    witnesses,
                });
            }
        }
    }
    out
}
