//! Shared by every section: the [`Checker`] that collects problems, and its small helpers.
//!
//! A leaf: it imports only [`super::error`]. Each section file validates its own keys with it;
//! every check returns a placeholder on failure so that validation goes on and all problems are
//! reported at once, each with its dotted path and never with the value from the file.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use super::error::ConfigIssue;

/// Collects issues; each check returns a placeholder on failure so validation can go on.
#[derive(Default)]
pub(super) struct Checker {
    issues: Vec<ConfigIssue>,
}

impl Checker {
    /// Records that the key at `path` is wrong; `message` follows the path and names no value.
    pub(super) fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue::new(path, message));
    }

    /// `value` (or `default`) as a non-zero `u32`; 0 is reported as `must be > 0`.
    pub(super) fn u32(&mut self, path: &str, value: Option<u32>, default: u32) -> NonZeroU32 {
        NonZeroU32::new(value.unwrap_or(default)).unwrap_or_else(|| {
            self.fail(path, "must be > 0");
            NonZeroU32::MIN
        })
    }

    /// `value` (or `default`) as a non-zero `u64`; 0 is reported as `must be > 0`.
    pub(super) fn u64(&mut self, path: &str, value: Option<u64>, default: u64) -> NonZeroU64 {
        NonZeroU64::new(value.unwrap_or(default)).unwrap_or_else(|| {
            self.fail(path, "must be > 0");
            NonZeroU64::MIN
        })
    }

    /// `value` (or `default`) milliseconds as a [`Duration`]; 0 is reported as `must be > 0`.
    pub(super) fn ms(&mut self, path: &str, value: Option<u64>, default: u64) -> Duration {
        let ms = value.unwrap_or(default);
        if ms == 0 {
            self.fail(path, "must be > 0");
        }
        Duration::from_millis(ms)
    }

    /// Every issue recorded so far, in the order found.
    pub(super) fn into_issues(self) -> Vec<ConfigIssue> {
        self.issues
    }
}
