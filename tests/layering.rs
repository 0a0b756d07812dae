//! The shape of the workspace, checked: the folder tree of `src/` is the request pipeline, and
//! dependencies only point down it.
//!
//! The test reads every `.rs` file of every crate (`src/`, `sim/src`, `loadtest/src`,
//! `wire/src`, `testkit/src`) and builds each root's module tree from its `mod` declarations
//! (`#[path]` included; `lib.rs` and `main.rs` are separate roots, each with its own
//! `crate::`). Then it reads every path a file writes, in `use` items (grouped `{..}`, globs,
//! `as`) and in expressions (outside comments and string literals): `crate::`, `super::`,
//! `self::`, bare child paths (`child::f()`, `pub use child::X`), and names brought in by a
//! `use` (`use crate::b; b::g()`); inline `mod name { .. }` blocks resolve from where they sit.
//! Each path resolves to the file that *defines* what it names: through re-exports (a
//! `pub use c::Y` in `b/mod.rs` makes `crate::b::Y` an import of `b/c.rs`, not of `b/mod.rs`)
//! and globs. A path that names a module only (`use crate::b;`) is no import by itself; a glob
//! (`use super::*`) imports the module's file. Method calls are not paths, so a split impl is
//! read from the other side: an inherent `impl Type { .. }` in another file than `Type`'s makes
//! the type's file import the impl's file when it names one of those methods. Not seen: trait
//! dispatch, and items a macro defines. The analysis, with its self-tests on small in-memory
//! fixtures (one per kind of import, each failing if that kind is ignored), is in
//! `tests/layering/`. Then:
//!
//! - no loop of files that import each other, in any crate (except the `PENDING_LOOPS` below,
//!   which other branches are taking apart);
//! - no loop of folders: within each module, its own file and its children (a child file and
//!   its folder are one part) import each other in no loop;
//! - every file is reached by a root's module tree (else its imports would go unseen);
//! - no module below `api` imports from `api`: only `api/`, `server.rs`, `main.rs`, `lib.rs`;
//! - `telemetry` imports neither `admission` nor `upstream` (it takes plain values);
//! - `config` imports nothing but itself, `lane.rs` and `sign.rs` (the prompt layer builds a
//!   course's prompt from its checked config, not the other way round);
//! - the gateway's code names `vllm_sim` only in the `--with-sim` wiring.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[path = "layering/analysis.rs"]
mod analysis;
#[cfg(test)]
#[path = "layering/self_tests.rs"]
mod self_tests;

use analysis::{folder_loops, graph, lex, loops, unreached, Edges, Sources, Tok};

/// Files allowed to import the routes: the wiring above them, and the fuzz targets' entry
/// points (`fuzz.rs`, which run the request parsers of every layer, the routes' own included).
const ABOVE_API: &[&str] = &["api/", "server.rs", "main.rs", "lib.rs", "fuzz.rs"];
/// Files allowed to name the simulator crate: the `serve --with-sim` wiring.
const SIM_WIRING: &[&str] = &["server.rs", "main.rs"];

/// The source folders of every crate in the workspace.
const CRATES: &[&str] = &["src", "sim/src", "loadtest/src", "wire/src", "testkit/src"];

/// File loops still to take apart, each tolerated as exactly this file set in this crate folder
/// (none today: the jobs backends' loops went with the `JobBackend` trait, issue 31 item 3).
/// Imports between two files of one pending loop are left out of the folder check too. An
/// entry whose loop is gone fails the test, so the list cannot go stale.
const PENDING_LOOPS: &[(&str, &[&str])] = &[];

/// Every `.rs` file under `dir` (relative to the workspace root), keyed by its path relative to
/// `dir`.
fn read_crate(dir: &str) -> Sources {
    fn walk(dir: &Path, root: &Path, out: &mut Sources) {
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
    assert!(!out.is_empty(), "read {dir}");
    out
}

/// The gateway's own sources.
fn read_src() -> Sources {
    let src = read_crate("src");
    assert!(src.len() > 40, "read the gateway's src/");
    src
}

fn in_module(file: &str, module: &str) -> bool {
    file == format!("{module}.rs") || file.starts_with(&format!("{module}/"))
}

/// The pending loop of `dir` that holds both files, if any.
fn pending_pair(dir: &str, a: &str, b: &str) -> bool {
    PENDING_LOOPS
        .iter()
        .any(|(d, files)| *d == dir && files.contains(&a) && files.contains(&b))
}

#[test]
fn every_file_is_in_a_module_tree() {
    for dir in CRATES {
        let missed = unreached(&read_crate(dir));
        assert!(
            missed.is_empty(),
            "files of {dir} that no `mod` declaration reaches from lib.rs or main.rs (the \
             layering test cannot see their imports): {missed:?}"
        );
    }
}

#[test]
fn no_files_import_each_other_in_a_loop() {
    let mut report = Vec::new();
    for dir in CRATES {
        let edges = graph(&read_crate(dir));
        let found = loops(&edges);
        for group in &found {
            let pending = PENDING_LOOPS.iter().any(|(d, files)| {
                d == dir && files.iter().copied().eq(group.iter().map(String::as_str))
            });
            if !pending {
                report.push(describe_file_loop(dir, group, &edges));
            }
        }
        for (d, files) in PENDING_LOOPS.iter().filter(|(d, _)| d == dir) {
            let still = found
                .iter()
                .any(|g| files.iter().copied().eq(g.iter().map(String::as_str)));
            if !still {
                report.push(format!(
                    "{d}: the pending loop {files:?} is gone (or changed shape): take it out of \
                     PENDING_LOOPS"
                ));
            }
        }
    }
    assert!(
        report.is_empty(),
        "files that import each other (break each loop by moving the shared item to a leaf \
         file; a mod.rs declares and re-exports only):\n{}",
        report.join("\n")
    );
}

fn describe_file_loop(dir: &str, group: &[String], edges: &Edges) -> String {
    let mut out = format!("{dir}: loop of {} files {group:?}", group.len());
    for from in group {
        for to in edges.get(from).into_iter().flatten() {
            if group.contains(to) {
                out.push_str(&format!("\n    {from} -> {to}"));
            }
        }
    }
    out
}

#[test]
fn no_folders_import_each_other_in_a_loop() {
    let mut report = Vec::new();
    for dir in CRATES {
        let skip = |a: &str, b: &str| pending_pair(dir, a, b);
        for l in folder_loops(&read_crate(dir), &skip) {
            let module = if l.module.is_empty() {
                "the crate root".to_owned()
            } else {
                l.module.join("::")
            };
            let mut line = format!(
                "{dir} ({}): in {module}, the parts {:?} import each other",
                l.root, l.parts
            );
            for (from, to) in &l.witnesses {
                line.push_str(&format!("\n    {from} -> {to}"));
            }
            report.push(line);
        }
    }
    assert!(
        report.is_empty(),
        "folders that import each other (`self` is the module's own file):\n{}",
        report.join("\n")
    );
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

/// Files the config may import besides its own: the lane names and the hash it fingerprints with.
const CONFIG_VOCABULARY: &[&str] = &["lane.rs", "sign.rs"];

#[test]
fn the_config_names_no_type_of_the_layers_above_it() {
    let edges = graph(&read_src());
    let offenders: Vec<String> = edges
        .iter()
        .filter(|(file, _)| in_module(file, "config"))
        .flat_map(|(file, deps)| {
            deps.iter()
                .filter(|d| !in_module(d, "config") && !CONFIG_VOCABULARY.contains(&d.as_str()))
                .map(move |d| format!("{file} -> {d}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "the config importing from the layers it configures: {offenders:#?}"
    );
}

#[test]
fn the_simulator_is_named_only_by_the_with_sim_wiring() {
    let offenders: Vec<String> = read_src()
        .iter()
        .filter(|(file, _)| !SIM_WIRING.contains(&file.as_str()))
        .filter(|(_, src)| lex(src).iter().any(|t| *t == Tok::Ident("vllm_sim".into())))
        .map(|(file, _)| file.clone())
        .collect();
    assert!(
        offenders.is_empty(),
        "non-wiring files naming vllm_sim: {offenders:?}"
    );
}
