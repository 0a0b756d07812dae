//! Replays the fuzz corpus (`fuzz/corpus/<target>/`: seeds plus every input cargo-fuzz found
//! interesting) through the same checks the fuzz targets run (`tutor_gateway::fuzz`), on the
//! stable toolchain: no panic, every bad input a documented 400.

use std::path::Path;

use tutor_gateway::fuzz;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{} fails its check", path.display());
        inputs += 1;
    }
    assert!(
        inputs >= 10,
        "{target}: only {inputs} inputs in {}",
        dir.display()
    );
}

#[test]
fn answer_query_corpus() {
    replay("answer_query", fuzz::answer_query);
}

#[test]
fn answer_body_corpus() {
    replay("answer_body", fuzz::answer_body);
}

#[test]
fn openai_body_corpus() {
    replay("openai_body", fuzz::openai_body);
}

#[test]
fn upstream_sse_corpus() {
    replay("upstream_sse", fuzz::upstream_sse);
}

#[test]
fn focus_code_corpus() {
    replay("focus_code", fuzz::focus_code);
}

#[test]
fn request_fields_corpus() {
    replay("request_fields", fuzz::request_fields);
}

/// Every fuzz target of `fuzz/` has its corpus replayed here, and every corpus has its target:
/// the fuzz crate is built with cargo-fuzz (nightly) only, so a target added without its replay
/// (or a corpus left without its target) would go unnoticed.
#[test]
fn every_fuzz_target_has_its_corpus_replayed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut targets: Vec<String> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .map(|n| n.trim_end_matches('"').to_owned())
        .filter(|n| n != "tutor-gateway-fuzz")
        .collect();
    targets.sort();
    let mut corpora: Vec<String> = std::fs::read_dir(root.join("corpus"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    corpora.sort();
    assert_eq!(targets, corpora, "fuzz targets and corpus folders");
    let replays = include_str!("fuzz_corpus.rs");
    for target in &targets {
        assert!(
            replays.contains(&format!("replay(\"{target}\", fuzz::{target})")),
            "{target} has no replay test"
        );
        let source = root.join("fuzz_targets").join(format!("{target}.rs"));
        let body = std::fs::read_to_string(&source).unwrap();
        assert!(
            body.contains(&format!("tutor_gateway::fuzz::{target}(")),
            "{} does not run tutor_gateway::fuzz::{target}",
            source.display()
        );
    }
}
