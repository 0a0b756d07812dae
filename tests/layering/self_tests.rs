//! The analysis on small in-memory crates: one fixture per kind of import, each failing if that
//! kind is not seen (or, for re-exports, if it is resolved to the wrong file).

use std::collections::BTreeSet;

use super::analysis::{folder_loops, graph, lex, loops, unreached, Sources, Tok};

fn crate_of(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(f, s)| ((*f).to_owned(), (*s).to_owned()))
        .collect()
}

fn set(files: &[&str]) -> BTreeSet<String> {
    files.iter().map(|f| (*f).to_owned()).collect()
}

fn group(files: &[&str]) -> Vec<String> {
    files.iter().map(|f| (*f).to_owned()).collect()
}

fn no_skip(_: &str, _: &str) -> bool {
    false
}

#[test]
fn the_issue_s_four_files_are_a_loop() {
    // a -> crate::b::g (b/mod.rs), b/mod.rs -> c::h (a bare child path), b/c.rs -> crate::a::f.
    let files = crate_of(&[
        ("lib.rs", "mod a;\nmod b;"),
        ("a.rs", "pub fn f() {}\nfn x() { crate::b::g(); }"),
        ("b/mod.rs", "mod c;\npub fn g() { c::h(); }"),
        ("b/c.rs", "pub fn h() { crate::a::f(); }"),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["a.rs"], set(&["b/mod.rs"]));
    assert_eq!(edges["b/mod.rs"], set(&["b/c.rs"]));
    assert_eq!(edges["b/c.rs"], set(&["a.rs"]));
    assert_eq!(loops(&edges), vec![group(&["a.rs", "b/c.rs", "b/mod.rs"])]);
}

#[test]
fn a_bare_child_path_is_an_import() {
    // The parent reaches its child only by `child::`, in an expression, a `pub use` and a
    // grouped `use`; the child reaches back by `super::`.
    for parent in [
        "mod c;\npub fn g() { c::h(); }",
        "mod c;\npub use c::h;\npub fn g() {}",
        "mod c;\nuse c::{h, k::{self}};\npub fn g() {}",
    ] {
        let files = crate_of(&[
            ("lib.rs", "mod b;"),
            ("b/mod.rs", parent),
            ("b/c.rs", "pub fn h() { super::g(); }\npub mod k {}"),
        ]);
        let edges = graph(&files);
        assert_eq!(edges["b/mod.rs"], set(&["b/c.rs"]), "{parent}");
        assert_eq!(
            loops(&edges),
            vec![group(&["b/c.rs", "b/mod.rs"])],
            "{parent}"
        );
    }
}

#[test]
fn a_self_path_is_an_import() {
    for parent in [
        "mod c;\npub fn g() { self::c::h(); }",
        "mod c;\nuse self::c::h;\npub fn g() { h(); }",
    ] {
        let files = crate_of(&[
            ("lib.rs", "mod b;"),
            ("b/mod.rs", parent),
            ("b/c.rs", "use super::g;\npub fn h() { g(); }"),
        ]);
        let edges = graph(&files);
        assert_eq!(edges["b/mod.rs"], set(&["b/c.rs"]), "{parent}");
        assert_eq!(edges["b/c.rs"], set(&["b/mod.rs"]), "{parent}");
    }
}

#[test]
fn a_re_export_resolves_to_the_defining_file() {
    // a imports `Y` through the folder; it is defined in b/c.rs, which imports a: the loop is
    // a <-> b/c.rs, and b/mod.rs (which only re-exports) is not in it.
    let files = crate_of(&[
        ("lib.rs", "mod a;\nmod b;"),
        ("a.rs", "use crate::b::Y;\npub fn f() {}"),
        ("b/mod.rs", "mod c;\npub use c::Y;"),
        ("b/c.rs", "pub struct Y;\nfn x() { crate::a::f(); }"),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["a.rs"], set(&["b/c.rs"]));
    assert_eq!(loops(&edges), vec![group(&["a.rs", "b/c.rs"])]);

    // Siblings that use each other's items through the folder's re-exports: no loop, since
    // the mod.rs defines nothing. Resolved to the mod.rs, `d` and the mod.rs would be one.
    let files = crate_of(&[
        ("lib.rs", "mod b;"),
        (
            "b/mod.rs",
            "mod c;\nmod d;\npub use self::c::{Y as Renamed};\npub use d::*;",
        ),
        ("b/c.rs", "pub struct Y;"),
        ("b/d.rs", "use super::Renamed;\npub struct Z(Renamed);"),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["b/d.rs"], set(&["b/c.rs"]));
    assert_eq!(edges["b/mod.rs"], set(&["b/c.rs", "b/d.rs"]));
    assert!(loops(&edges).is_empty(), "{edges:#?}");
    // A re-export through a glob, from the root, with a `use` of the module and a path through
    // it.
    let files = crate_of(&[
        ("lib.rs", "mod b;\nmod u;\npub use b::*;"),
        ("b/mod.rs", "mod d;\npub use d::Z;"),
        ("b/d.rs", "pub struct Z;"),
        ("u.rs", "use crate::b;\nfn f() { b::Z; crate::Z; }"),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["u.rs"], set(&["b/d.rs"]));
}

#[test]
fn lib_rs_and_main_rs_are_apart() {
    // Both roots define `top`; each file's `crate::top` is its own root's. Taken as one module
    // path, a.rs would import main.rs (or cli.rs lib.rs) and the loop would be wrong.
    let files = crate_of(&[
        ("lib.rs", "pub mod a;\npub fn top() {}"),
        ("a.rs", "pub fn f() { crate::top(); }"),
        (
            "main.rs",
            "mod cli;\nfn top() {}\nfn main() { cli::run(); tutor::a::f(); }",
        ),
        ("cli.rs", "pub fn run() { crate::top(); }"),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["a.rs"], set(&["lib.rs"]));
    assert_eq!(edges["cli.rs"], set(&["main.rs"]));
    assert_eq!(edges["main.rs"], set(&["cli.rs"]));
    assert!(edges["lib.rs"].is_empty());
    assert_eq!(loops(&edges), vec![group(&["cli.rs", "main.rs"])]);
}

#[test]
fn folders_that_import_each_other_are_a_loop() {
    // No two files import each other, but x/a.rs -> y/c.rs and y/d.rs -> x/b.rs.
    let files = crate_of(&[
        ("lib.rs", "mod x;\nmod y;"),
        ("x/mod.rs", "pub mod a;\npub mod b;"),
        ("x/a.rs", "use crate::y::c::C;"),
        ("x/b.rs", "pub struct B;"),
        ("y.rs", "pub mod c;\npub mod d;"),
        ("y/c.rs", "pub struct C;"),
        ("y/d.rs", "use crate::x::b::B;"),
    ]);
    let edges = graph(&files);
    assert!(loops(&edges).is_empty(), "{edges:#?}");
    let found = folder_loops(&files, &no_skip);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].module, Vec::<String>::new());
    assert_eq!(found[0].parts, group(&["x", "y"]));
    assert_eq!(
        found[0].witnesses,
        vec![
            ("x/a.rs".to_owned(), "y/c.rs".to_owned()),
            ("y/d.rs".to_owned(), "x/b.rs".to_owned())
        ]
    );
    // Dropping one side (as for a pending loop) leaves none.
    assert!(folder_loops(&files, &|a, _| a == "y/d.rs").is_empty());

    // A module's own file is a part: mod.rs defines what a child's folder uses, and calls into
    // that folder.
    let files = crate_of(&[
        ("lib.rs", "mod p;"),
        (
            "p/mod.rs",
            "mod q;\npub struct T;\npub fn g() { q::r::h(); }",
        ),
        ("p/q/mod.rs", "pub mod r;\npub mod s;"),
        ("p/q/r.rs", "pub fn h() {}"),
        ("p/q/s.rs", "use crate::p::T;"),
    ]);
    assert!(loops(&graph(&files)).is_empty());
    let found = folder_loops(&files, &no_skip);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].module, group(&["p"]));
    assert_eq!(found[0].parts, group(&["q", "self"]));
}

#[test]
fn groups_supers_inline_modules_and_literals() {
    let files = crate_of(&[
        ("lib.rs", "mod x;\nmod lane;\nmod c;"),
        // a -> b through a grouped use; b -> a through `super::super` from an inline module.
        ("x/a.rs", "use crate::{lane::Lane, x::b::{B, C}};\npub struct A;"),
        (
            "x/b.rs",
            "pub struct B; pub struct C;\nmod inner {\n use super::super::a::A;\n}\nfn f() { '{'; }",
        ),
        ("x/mod.rs", "pub mod a;\npub mod b;"),
        (
            "lane.rs",
            "// crate::x::a in a comment\nconst S: &str = \"crate::x::a\";\nconst R: &str = r#\"crate::x::b\"#;\npub enum Lane { Small }",
        ),
        ("c.rs", "fn f<'a>(_: &'a str) { crate::lane::Lane::Small; let _ = '\\''; }\nuse super::x::a::*;"),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["x/a.rs"], set(&["lane.rs", "x/b.rs"]));
    assert!(
        edges["lane.rs"].is_empty(),
        "comments and strings are not imports"
    );
    assert_eq!(edges["c.rs"], set(&["lane.rs", "x/a.rs"]));
    assert_eq!(loops(&edges), vec![group(&["x/a.rs", "x/b.rs"])]);
}

#[test]
fn path_attributes_and_unreached_files() {
    let files = crate_of(&[
        ("lib.rs", "mod up;"),
        (
            "up.rs",
            "pub fn f() {}\n#[cfg(test)]\n#[path = \"up_tests.rs\"]\nmod tests;",
        ),
        ("up_tests.rs", "use super::*;"),
        ("stray.rs", "use crate::up::f;"),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["up_tests.rs"], set(&["up.rs"]));
    assert_eq!(unreached(&files), vec!["stray.rs".to_owned()]);
}

#[test]
fn the_lexer_keeps_literals_whole() {
    let toks = lex(
        "let s = \"a::b { }\"; let c = '}'; fn f<'a>() {} // x::y\n/* p::q /* n */ */ r#type::z",
    );
    assert!(toks.contains(&Tok::Str("a::b { }".into())));
    let idents: Vec<&Tok> = toks.iter().filter(|t| matches!(t, Tok::Ident(_))).collect();
    assert_eq!(
        idents,
        ["let", "s", "let", "c", "fn", "f", "type", "z"]
            .iter()
            .map(|s| Tok::Ident((*s).into()))
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );
    let braces = toks
        .iter()
        .filter(|t| matches!(t, Tok::P('{') | Tok::P('}')))
        .count();
    assert_eq!(braces, 2);
}

#[test]
fn a_split_inherent_impl_ties_the_type_to_its_methods() {
    // p.rs defines `Req` and calls `req.course()`, a method that p/course.rs adds: the two files
    // depend on each other though only course.rs writes a path. A trait impl does not count,
    // nor a split impl whose methods the type's file never names (q.rs).
    let files = crate_of(&[
        ("lib.rs", "mod p;\nmod t;\nmod q;"),
        (
            "p.rs",
            "mod course;\npub struct Req;\npub fn f(r: Req) { r.course(); }",
        ),
        (
            "p/course.rs",
            "use super::Req;\nimpl Req {\n pub fn course(&self) {}\n}",
        ),
        (
            "t.rs",
            "impl<T: Fn() -> u8> std::fmt::Debug for crate::p::Req {}",
        ),
        (
            "q.rs",
            "impl crate::p::Req {\n fn unused(&self) { self.course() }\n}",
        ),
    ]);
    let edges = graph(&files);
    assert_eq!(edges["p.rs"], set(&["p/course.rs"]));
    assert_eq!(edges["t.rs"], set(&["p.rs"]));
    assert_eq!(edges["q.rs"], set(&["p.rs"]));
    assert_eq!(loops(&edges), vec![group(&["p.rs", "p/course.rs"])]);
}
