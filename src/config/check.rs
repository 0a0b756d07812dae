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
    /// The built-in defaults are checked without the environment (its secrets are the
    /// operator's file's business, not the defaults').
    without_environment: bool,
}

impl Checker {
    /// A checker that reads no environment variable (for the built-in defaults).
    pub(super) fn without_environment() -> Self {
        Checker {
            issues: Vec::new(),
            without_environment: true,
        }
    }

    /// The environment variable `name`, trimmed, when set and not empty (never for the
    /// built-in defaults).
    pub(super) fn env(&self, name: &str) -> Option<String> {
        if self.without_environment {
            return None;
        }
        std::env::var(name)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// `value` of the key at `path` is at most `max` (`what`: the bound as the message says it);
    /// reported otherwise. A huge value turned a timeout into "never", a period into "once",
    /// a cap into "none", silently.
    pub(super) fn at_most(&mut self, path: &str, value: u64, max: u64, what: &str) {
        if value > max {
            self.fail(path, format!("must be at most {what}"));
        }
    }

    /// Records that the key at `path` is wrong; `message` follows the path and names no value.
    pub(super) fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue::new(path, message));
    }

    /// `value` (or `default`) as a non-zero `u32`; 0 is reported as `must be > 0`.
    pub(super) fn u32(&mut self, path: &str, value: Option<u32>, default: u32) -> NonZeroU32 {
        NonZeroU32::new(value.unwrap_or(default)).unwrap_or_else(|| {
            self.fail(
                path,
                format!("must be > 0 (leave it out for the default, {default})"),
            );
            NonZeroU32::MIN
        })
    }

    /// `value` (or `default`) as a non-zero `u64`; 0 is reported as `must be > 0`.
    pub(super) fn u64(&mut self, path: &str, value: Option<u64>, default: u64) -> NonZeroU64 {
        NonZeroU64::new(value.unwrap_or(default)).unwrap_or_else(|| {
            self.fail(
                path,
                format!("must be > 0 (leave it out for the default, {default})"),
            );
            NonZeroU64::MIN
        })
    }

    /// `value` (or `default`) milliseconds as a [`Duration`]; 0 is reported as `must be > 0`.
    pub(super) fn ms(&mut self, path: &str, value: Option<u64>, default: u64) -> Duration {
        let ms = value.unwrap_or(default);
        if ms == 0 {
            self.fail(
                path,
                format!("must be > 0 (leave it out for the default, {default})"),
            );
        }
        Duration::from_millis(ms)
    }

    /// A secret kept out of the file: read from the environment variable named at `env.0` or
    /// the file named at `file.0` (at most one of the two keys set; surrounding whitespace
    /// trimmed). Problems name the keys and the variable, never the value. `None` when neither
    /// key is set or the secret cannot be had (reported).
    pub(super) fn secret(
        &mut self,
        env: (&str, Option<String>),
        file: (&str, Option<String>),
    ) -> Option<String> {
        let (env_key, var) = (env.0, env.1.filter(|e| !e.is_empty()));
        let (file_key, path) = (file.0, file.1.filter(|f| !f.is_empty()));
        let value = match (var, path) {
            (None, None) => return None,
            (Some(_), Some(_)) => {
                let short = |k: &str| k.rsplit('.').next().unwrap_or(k).to_owned();
                self.fail(
                    env_key,
                    format!("set {} or {}, not both", short(env_key), short(file_key)),
                );
                return None;
            }
            (Some(var), None) => match std::env::var(&var) {
                Ok(v) => v,
                Err(_) => {
                    self.fail(
                        env_key,
                        format!("names the environment variable {var}, which is not set"),
                    );
                    return None;
                }
            },
            (None, Some(path)) => match std::fs::read_to_string(&path) {
                Ok(v) => v,
                Err(e) => {
                    self.fail(file_key, format!("cannot be read ({})", e.kind()));
                    return None;
                }
            },
        };
        Some(value.trim().to_owned())
    }

    /// Every issue recorded so far, in the order found.
    pub(super) fn into_issues(self) -> Vec<ConfigIssue> {
        self.issues
    }
}
