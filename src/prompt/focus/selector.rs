//! The selection's state: the parsed files it reads, what it has chosen per file, and the
//! [`Selector`] that `select.rs` drives and `resolve.rs` extends (a leaf both use).

use std::collections::HashSet;

use super::index::Index;

/// A parsed file to select from.
pub struct Parsed<'t> {
    /// Its path, when the request gave one.
    pub path: Option<String>,
    /// Its definitions.
    pub index: Index<'t>,
}

/// The rows chosen in one file and the functions among them.
#[derive(Debug, Default, Clone)]
pub struct FileSelection {
    /// Rows to send (0-based).
    pub rows: Vec<bool>,
    /// Functions sent: (first row, qualified name).
    pub functions: Vec<(usize, String)>,
}

impl FileSelection {
    /// Whether anything of the file is sent.
    pub fn is_empty(&self) -> bool {
        !self.rows.iter().any(|r| *r)
    }
}

pub(super) struct Selector<'a, 't> {
    pub(super) files: &'a [Parsed<'t>],
    pub(super) lines: Vec<Vec<&'t str>>,
    pub(super) out: Vec<FileSelection>,
    pub(super) chosen: HashSet<(usize, usize)>,
    pub(super) count: &'a dyn Fn(&str) -> u32,
    pub(super) used: u32,
}
