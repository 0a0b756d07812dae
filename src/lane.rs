//! The three cost classes a request can fall into. A leaf: config, classify, admission, relay
//! and telemetry all name lanes, so this file imports nothing from the crate.

use std::fmt;

/// A lane: the cost class of a request, decided by its estimated work (input + output tokens).
///
/// Each lane has its own request slots, token budget and wait queue (see [`crate::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// Short questions: estimated work <= `classify.small_max_work` (1200 by default).
    Small,
    /// Debugging with some context: work <= `classify.medium_max_work` (5000 by default).
    Medium,
    /// Project reviews and other long-context work: everything above medium.
    Large,
}

impl Lane {
    /// All lanes, smallest first; the order used for arrays indexed by [`Lane::index`].
    pub const ALL: [Lane; 3] = [Lane::Small, Lane::Medium, Lane::Large];

    /// The lowercase name used in config keys and metric labels: `small`, `medium`, `large`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Lane::Small => "small",
            Lane::Medium => "medium",
            Lane::Large => "large",
        }
    }

    /// Position in [`Lane::ALL`] (0, 1, 2), for per-lane arrays.
    pub const fn index(self) -> usize {
        match self {
            Lane::Small => 0,
            Lane::Medium => 1,
            Lane::Large => 2,
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
