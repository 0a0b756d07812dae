//! The student's code as focusing receives it: a leaf every focusing file may use.

/// One file of the student's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Its path (`path`, or `files[].path`), when given.
    pub path: Option<String>,
    /// Its text.
    pub code: String,
}
