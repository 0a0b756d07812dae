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
