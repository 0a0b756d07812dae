//! The focusing corpus's loader (`tests/fixtures/focus/<case>/case.toml`), shared by
//! `tests/focus_corpus.rs` and `benches/focus.rs`.
#![allow(dead_code, missing_docs)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tutor_gateway::prompt::focus::{Lang, SourceFile};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRef {
    pub path: String,
    pub source: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseFile {
    pub language: Option<String>,
    pub source: Option<String>,
    pub path: Option<String>,
    pub files: Option<Vec<FileRef>>,
    pub question: Option<String>,
    pub trace: Option<String>,
    pub depth: Option<u32>,
    pub token_target: Option<u32>,
    pub expected_outcome: String,
    pub expected_functions: Vec<String>,
    #[serde(default)]
    pub must_include: Vec<String>,
    #[serde(default)]
    pub must_exclude: Vec<String>,
}

pub struct Case {
    pub name: String,
    pub spec: CaseFile,
    pub files: Vec<SourceFile>,
    pub lang: Option<Lang>,
}

pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/focus")
}

pub fn load() -> Vec<Case> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("tests/fixtures/focus exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.toml").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(dir.join("case.toml")).unwrap();
        let spec: CaseFile =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{name}/case.toml: {e}"));
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{name}/{f}: {e}"))
        };
        let files = match (&spec.source, &spec.files) {
            (Some(src), None) => vec![SourceFile {
                path: spec.path.clone(),
                code: read(src),
            }],
            (None, Some(files)) => files
                .iter()
                .map(|f| SourceFile {
                    path: Some(f.path.clone()),
                    code: read(&f.source),
                })
                .collect(),
            _ => panic!("{name}: give `source` or `files`"),
        };
        let lang = spec
            .language
            .as_deref()
            .map(|l| Lang::from_name(l).unwrap_or_else(|| panic!("{name}: unknown language {l}")));
        out.push(Case {
            name,
            spec,
            files,
            lang,
        });
    }
    out
}
