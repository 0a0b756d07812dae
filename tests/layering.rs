//! The shape of `src/`, checked: the folder tree is the request pipeline, and dependencies only
//! point down it.
//!
//! The test reads every `.rs` file under `src/` (and, for the loop check, under each crate of
//! the workspace: `sim/`, `loadtest/`, `wire/`, `testkit/`), finds each path that starts with `crate::` or
//! `super::` (in `use` items and in expressions, outside comments and string literals; inline
//! `mod name { … }` blocks, such as unit tests, resolve `super::` from where they sit), and
//! resolves it to the file that defines the longest matching module path. A path into a folder
//! resolves to its `mod.rs`, so a re-export counts as an import of the folder's `mod.rs`. Then:
//!
//! - no loop of files that import each other, in any crate;
//! - no module below `api` imports from `api`: only `api/`, `server.rs`, `main.rs`, `lib.rs`;
//! - `telemetry` imports neither `admission` nor `upstream` (it takes plain values);
//! - the gateway's code names `vllm_sim` only in the `--with-sim` wiring.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A source file's module path (`["admission", "redis"]` for `src/admission/redis/mod.rs`).
type ModPath = Vec<String>;

/// Files allowed to import the routes: the wiring above them.
const ABOVE_API: &[&str] = &["api/", "server.rs", "main.rs", "lib.rs"];
/// Files allowed to name the simulator crate: the `serve --with-sim` wiring.
const SIM_WIRING: &[&str] = &["server.rs", "main.rs"];

/// Module path of a file relative to `src/`.
fn mod_path(rel: &str) -> ModPath {
    let stem = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source with comments and string/char literals blanked (same length, newlines kept), so
/// that braces and paths inside them are not seen.
fn blank_non_code(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in out.iter_mut().take(to).skip(from) {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                let mut j = i;
                while j < b.len() {
                    if b[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 2;
                    } else if b[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j);
                i = j;
            }
            b'r' if is_raw_string_start(b, i) => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                let body = i + 2 + hashes;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let end = b[body..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |p| body + p + close.len());
                blank(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i, j + 1);
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only blank literals.
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 2..]
                        .iter()
                        .position(|&c| c == b'\'')
                        .map(|p| i + 2 + p + 1)
                } else {
                    let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                    (b.get(i + 1 + ch_len) == Some(&b'\'')).then_some(i + 2 + ch_len)
                };
                match end {
                    Some(end) => {
                        blank(&mut out, i, end);
                        i = end;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).expect("blanking keeps UTF-8 boundaries")
}

fn is_raw_string_start(b: &[u8], i: usize) -> bool {
    let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    if prev_ident {
        return false;
    }
    let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
    b.get(i + 1 + hashes) == Some(&b'"')
}

/// Tokens that matter for paths: identifiers, `::`, `{`, `}`, `,`, `;`.
fn tokens(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(code[start..i].to_owned());
        } else if b[i..].starts_with(b"::") {
            out.push("::".into());
            i += 2;
        } else {
            if matches!(c, b'{' | b'}' | b',' | b';') {
                out.push((c as char).to_string());
            } else if !c.is_ascii_whitespace() {
                out.push("#".into());
            }
            i += 1;
        }
    }
    out
}

/// Reads a path tail after `crate::`/`super::` at `toks[i]`: every full path it names
/// (expanding `{a::b, c}` groups).
fn read_tree(toks: &[String], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i).map(String::as_str) {
            Some("{") => {
                *i += 1;
                loop {
                    match toks.get(*i).map(String::as_str) {
                        Some("}") => {
                            *i += 1;
                            return;
                        }
                        Some(",") => *i += 1,
                        None => return,
                        _ => read_tree(toks, i, &path, out),
                    }
                }
            }
            Some(t)
                if t.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_') =>
            {
                path.push(t.to_owned());
                *i += 1;
                if toks.get(*i).map(String::as_str) == Some("::") {
                    *i += 1;
                    continue;
                }
                out.push(path);
                return;
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

/// Every `crate::`/`super::` path in `src` of the file at module `me`, made absolute.
fn absolute_paths(src: &str, me: &ModPath) -> Vec<Vec<String>> {
    let toks = tokens(&blank_non_code(src));
    let mut out = Vec::new();
    // The module path at each brace depth: `mod name {` pushes `name`.
    let mut scope: Vec<(usize, String)> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        match t {
            "mod" if toks.get(i + 2).map(String::as_str) == Some("{") => {
                pending_mod = toks.get(i + 1).cloned();
                i += 2;
                continue;
            }
            "{" => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    scope.push((depth, name));
                }
            }
            "}" => {
                if scope.last().is_some_and(|(d, _)| *d == depth) {
                    scope.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "crate" | "super" if toks.get(i + 1).map(String::as_str) == Some("::") => {
                let prev = i.checked_sub(1).map(|p| toks[p].as_str());
                if prev == Some("::") {
                    i += 1;
                    continue;
                }
                let mut here: Vec<String> = me.clone();
                here.extend(scope.iter().map(|(_, n)| n.clone()));
                let mut base = if t == "crate" {
                    Vec::new()
                } else {
                    here.pop();
                    here
                };
                i += 2;
                while toks.get(i).map(String::as_str) == Some("super")
                    && toks.get(i + 1).map(String::as_str) == Some("::")
                {
                    base.pop();
                    i += 2;
                }
                read_tree(&toks, &mut i, &base, &mut out);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The file graph: each file (relative to `src/`) and the files it imports.
fn graph(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let by_mod: BTreeMap<ModPath, &String> = files.keys().map(|f| (mod_path(f), f)).collect();
    let mut edges = BTreeMap::new();
    for (file, src) in files {
        let me = mod_path(file);
        let mut deps = BTreeSet::new();
        for path in absolute_paths(src, &me) {
            let target = (0..=path.len()).rev().find_map(|n| by_mod.get(&path[..n]));
            if let Some(target) = target {
                if *target != file {
                    deps.insert((*target).clone());
                }
            }
        }
        edges.insert(file.clone(), deps);
    }
    edges
}

/// Groups of two or more files that reach each other (Tarjan's strongly connected components).
fn loops(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                let w = w.as_str();
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
                    group.push(w.to_owned());
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
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Every `.rs` file under `dir` (relative to the workspace root), keyed by its path relative to
/// `dir`.
fn read_crate(dir: &str) -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read a source folder")
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root).expect("under the source folder");
                let rel = rel.to_string_lossy().replace('\\', "/");
                out.insert(rel, std::fs::read_to_string(&p).expect("read source"));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The gateway's own sources.
fn read_src() -> BTreeMap<String, String> {
    read_crate("src")
}

/// The source folders of every crate in the workspace.
const CRATES: &[&str] = &["src", "sim/src", "loadtest/src", "wire/src", "testkit/src"];

fn in_module(file: &str, module: &str) -> bool {
    file == format!("{module}.rs") || file.starts_with(&format!("{module}/"))
}

#[test]
fn no_files_import_each_other_in_a_loop() {
    let src = read_src();
    assert!(src.len() > 40, "read the gateway's src/");
    for dir in CRATES {
        let files = read_crate(dir);
        assert!(!files.is_empty(), "read {dir}");
        let found = loops(&graph(&files));
        assert!(
            found.is_empty(),
            "files of {dir} that import each other (break each loop by moving the shared item to a leaf): {found:#?}"
        );
    }
}

#[test]
fn nothing_below_api_imports_from_api() {
    let edges = graph(&read_src());
    let offenders: Vec<String> = edges
        .iter()
        .filter(|(file, _)| !ABOVE_API.iter().any(|a| file.starts_with(a)))
        .flat_map(|(file, deps)| {
            deps.iter()
                .filter(|d| in_module(d, "api"))
                .map(move |d| format!("{file} -> {d}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "imports of api from below it: {offenders:#?}"
    );
}

#[test]
fn telemetry_takes_plain_values() {
    let edges = graph(&read_src());
    let offenders: Vec<String> = edges
        .iter()
        .filter(|(file, _)| in_module(file, "telemetry"))
        .flat_map(|(file, deps)| {
            deps.iter()
                .filter(|d| in_module(d, "admission") || in_module(d, "upstream"))
                .map(move |d| format!("{file} -> {d}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "telemetry reaching into admission/upstream: {offenders:#?}"
    );
}

#[test]
fn the_simulator_is_named_only_by_the_with_sim_wiring() {
    let offenders: Vec<String> = read_src()
        .iter()
        .filter(|(file, _)| !SIM_WIRING.contains(&file.as_str()))
        .filter(|(_, src)| tokens(&blank_non_code(src)).iter().any(|t| t == "vllm_sim"))
        .map(|(file, _)| file.clone())
        .collect();
    assert!(
        offenders.is_empty(),
        "non-wiring files naming vllm_sim: {offenders:?}"
    );
}

#[test]
fn the_checker_finds_loops_through_groups_supers_and_inline_modules() {
    let files: BTreeMap<String, String> = [
        // a -> b through a grouped use; b -> a through `super::` from an inline module.
        ("x/a.rs", "use crate::{lane::Lane, x::b::{B, C}};"),
        (
            "x/b.rs",
            "mod inner {\n use super::super::a::A;\n}\nfn f() { '{'; }",
        ),
        ("x/mod.rs", "pub mod a;\npub mod b;"),
        (
            "lane.rs",
            "// crate::x::a in a comment\nconst S: &str = \"crate::x::a\";",
        ),
        ("c.rs", "fn f() { crate::lane::Lane::Small; }"),
    ]
    .into_iter()
    .map(|(f, s)| (f.to_owned(), s.to_owned()))
    .collect();
    let edges = graph(&files);
    assert_eq!(
        edges["x/a.rs"],
        BTreeSet::from(["lane.rs".to_owned(), "x/b.rs".to_owned()])
    );
    assert!(
        edges["lane.rs"].is_empty(),
        "comments and strings are not imports"
    );
    assert_eq!(edges["c.rs"], BTreeSet::from(["lane.rs".to_owned()]));
    assert_eq!(
        loops(&edges),
        vec![vec!["x/a.rs".to_owned(), "x/b.rs".to_owned()]]
    );
}
