//! TOML text -> [`RawConfig`], section by section, so one mistyped value does not hide the others.
//!
//! Serde stops at the first error inside a struct, so each top-level section is deserialized on
//! its own and its error (with the dotted path from `serde_path_to_error`) is collected. Serde's
//! messages quote the offending value (`invalid type: string "hunter2"`); [`sanitize`] drops it.

use serde::de::DeserializeOwned;

use super::error::{ConfigError, ConfigIssue};
use super::file::RawConfig;

/// The raw structs, plus the issues found while reading them. A section that failed to
/// deserialize is left at its default and named in `failed_sections`, so that validation does not
/// report follow-on problems for it.
pub(super) struct Parsed {
    pub raw: RawConfig,
    pub issues: Vec<ConfigIssue>,
    pub failed_sections: Vec<String>,
}

/// Parses `src` into the raw structs; only a TOML syntax error stops it early.
pub(super) fn parse_raw(src: &str) -> Result<Parsed, ConfigError> {
    let table: toml::Table = toml::from_str(src).map_err(|e| syntax_error(src, &e))?;
    let mut issues = Vec::new();
    let mut raw = RawConfig::default();
    for (key, value) in table {
        match key.as_str() {
            "listen" => raw.listen = section(&key, value, &mut issues),
            "upstream" => raw.upstream = section(&key, value, &mut issues).unwrap_or_default(),
            "classify" => raw.classify = section(&key, value, &mut issues).unwrap_or_default(),
            "admission" => raw.admission = section(&key, value, &mut issues).unwrap_or_default(),
            "lanes" => raw.lanes = section(&key, value, &mut issues).unwrap_or_default(),
            "server" => raw.server = section(&key, value, &mut issues).unwrap_or_default(),
            "fields" => raw.fields = section(&key, value, &mut issues).unwrap_or_default(),
            "promotion" => raw.promotion = section(&key, value, &mut issues).unwrap_or_default(),
            "telemetry" => raw.telemetry = section(&key, value, &mut issues).unwrap_or_default(),
            "quota" => raw.quota = section(&key, value, &mut issues).unwrap_or_default(),
            "jobs" => raw.jobs = section(&key, value, &mut issues).unwrap_or_default(),
            "auth" => raw.auth = section(&key, value, &mut issues).unwrap_or_default(),
            "prefix_cache" => {
                raw.prefix_cache = section(&key, value, &mut issues).unwrap_or_default()
            }
            "courses" => raw.courses = section(&key, value, &mut issues).unwrap_or_default(),
            _ => issues.push(ConfigIssue::new(
                key,
                "is not a known key; expected one of `listen`, `upstream`, `classify`, \
                 `admission`, `lanes`, `server`, `fields`, `promotion`, `telemetry`, `quota`, `jobs`, `auth`, \
                 `prefix_cache`, `courses`",
            )),
        }
    }
    let failed_sections = issues
        .iter()
        .map(|i: &ConfigIssue| i.path.split('.').next().unwrap_or_default().to_owned())
        .collect();
    Ok(Parsed {
        raw,
        issues,
        failed_sections,
    })
}

fn section<T: DeserializeOwned>(
    key: &str,
    value: toml::Value,
    issues: &mut Vec<ConfigIssue>,
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(err) => {
            let inner = err.path().to_string();
            let mut path = if inner == "." || inner.is_empty() {
                key.to_owned()
            } else {
                format!("{key}.{inner}")
            };
            let message = err.inner().message().to_owned();
            // `unknown field `x`, expected ...`: make sure the key is in the path.
            if let Some(rest) = message.strip_prefix("unknown field `") {
                if let Some((name, expected)) = rest.split_once('`') {
                    if !path.ends_with(&format!(".{name}")) {
                        path = format!("{path}.{name}");
                    }
                    let expected = expected.trim_start_matches(", ");
                    issues.push(ConfigIssue::new(
                        path,
                        format!("is not a known key; {expected}"),
                    ));
                    return None;
                }
            }
            issues.push(ConfigIssue::new(path, sanitize(&message)));
            None
        }
    }
}

/// Rewrites serde's `invalid type: string "secret", expected u32` into
/// `has an invalid type: expected u32`, so no value from the file is ever echoed.
pub(super) fn sanitize(message: &str) -> String {
    let Some((head, expected)) = message.split_once(", expected ") else {
        return message.to_owned();
    };
    let kind = head.split([':', '`', '"']).next().unwrap_or(head).trim();
    match kind {
        "invalid type" => format!("has an invalid type: expected {expected}"),
        "invalid value" => format!("has an invalid value: expected {expected}"),
        "unknown variant" => format!("is not one of the allowed values: expected {expected}"),
        other => format!("{other}: expected {expected}"),
    }
}

fn syntax_error(src: &str, err: &toml::de::Error) -> ConfigError {
    let offset = err.span().map_or(0, |s| s.start).min(src.len());
    let before = &src[..src.floor_char_boundary_compat(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    ConfigError::Syntax {
        line,
        column,
        message: err.message().to_owned(),
    }
}

/// `str::floor_char_boundary` is not stable on our MSRV; this is the same for our use.
trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, index: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, mut index: usize) -> usize {
        while index > 0 && !self.is_char_boundary(index) {
            index -= 1;
        }
        index
    }
}
