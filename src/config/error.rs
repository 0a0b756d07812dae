//! Config errors: every bad key at once, each with its dotted path, never echoing a value.

use std::fmt;
use std::path::PathBuf;

/// One problem with one key, e.g. `lanes.small.max_concurrency must be > 0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted key path, e.g. `lanes.small.max_concurrency`.
    pub path: String,
    /// What is wrong, phrased to follow the path (`must be > 0`). Never contains the value.
    pub message: String,
}

impl ConfigIssue {
    /// An issue at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path, self.message)
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file asked for.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not TOML. The offending line is not quoted, in case it holds a secret.
    #[error("config is not valid TOML at line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The TOML parsed but keys are unknown, mistyped or out of range: all of them, in file order
    /// of sections.
    #[error("{}", format_issues(.0))]
    Invalid(Vec<ConfigIssue>),
}

impl ConfigError {
    /// The per-key issues (empty for read and syntax errors).
    pub fn issues(&self) -> &[ConfigIssue] {
        match self {
            ConfigError::Invalid(issues) => issues,
            ConfigError::Read { .. } | ConfigError::Syntax { .. } => &[],
        }
    }
}

fn format_issues(issues: &[ConfigIssue]) -> String {
    let mut out = format!("{} problem(s) in config:", issues.len());
    for issue in issues {
        out.push_str("\n  ");
        out.push_str(&issue.to_string());
    }
    out
}
