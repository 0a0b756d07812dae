//! TOML text -> [`RawConfig`], section by section, so one mistyped value does not hide the others.
//!
//! Serde stops at the first error inside a struct, so each top-level section is deserialized on
//! its own and its error (with the dotted path from `serde_path_to_error`) is collected. Serde's
//! messages quote the offending value (`invalid type: string "hunter2"`); [`sanitize`] drops it.

use serde::de::DeserializeOwned;

use super::error::{ConfigError, ConfigIssue};
use super::file::RawConfig;

/// The raw structs, plus the issues found while reading them. A key with a bad value is left
/// out (its default stands) and its table named in `failed` (dotted paths), so that validation
/// does not report follow-on problems for it; a section that could not be read at all is left
/// at its default and named there too.
pub(super) struct Parsed {
    pub raw: RawConfig,
    pub issues: Vec<ConfigIssue>,
    pub failed: Vec<String>,
}

/// Parses `src` into the raw structs; only a TOML syntax error stops it early.
pub(super) fn parse_raw(src: &str) -> Result<Parsed, ConfigError> {
    let table: toml::Table = toml::from_str(src).map_err(|e| syntax_error(src, &e))?;
    let mut issues = Vec::new();
    let mut failed = Vec::new();
    let mut raw = RawConfig::default();
    for (key, value) in table {
        match key.as_str() {
            "listen" => raw.listen = section(&key, value, &mut issues, &mut failed),
            "upstream" => raw.upstream = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "classify" => raw.classify = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "admission" => raw.admission = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "lanes" => raw.lanes = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "server" => raw.server = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "fields" => raw.fields = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "promotion" => raw.promotion = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "telemetry" => raw.telemetry = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "quota" => raw.quota = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "jobs" => raw.jobs = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "auth" => raw.auth = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "prefix_cache" => {
                raw.prefix_cache = section(&key, value, &mut issues, &mut failed).unwrap_or_default()
            }
            "autopilot" => raw.autopilot = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            "courses" => raw.courses = section(&key, value, &mut issues, &mut failed).unwrap_or_default(),
            _ => issues.push(ConfigIssue::new(
                key,
                "is not a known key; expected one of `listen`, `upstream`, `classify`, \
                 `admission`, `lanes`, `server`, `fields`, `promotion`, `telemetry`, `quota`, `jobs`, `auth`, \
                 `prefix_cache`, `autopilot`, `courses`",
            )),
        }
    }
    Ok(Parsed {
        raw,
        issues,
        failed,
    })
}

/// Deserializes section `key`, collecting every problem in it: after each one the offending
/// key is taken out and the rest read again, so one mistyped key hides nothing else. A key
/// with a bad value leaves its table in `failed` (its validation would only repeat it); an
/// unknown key does not. `None` only when the section itself is not a table of the right shape.
fn section<T: DeserializeOwned>(
    key: &str,
    mut value: toml::Value,
    issues: &mut Vec<ConfigIssue>,
    failed: &mut Vec<String>,
) -> Option<T> {
    // Each round takes one key out: a section has far fewer keys than this.
    for _ in 0..256 {
        let err = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(v) => return Some(v),
            Err(err) => err,
        };
        let mut at: Vec<String> = err
            .path()
            .iter()
            .filter_map(|segment| match segment {
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                _ => None,
            })
            .collect();
        let inner = err.path().to_string();
        let mut path = if inner == "." || inner.is_empty() {
            key.to_owned()
        } else {
            format!("{key}.{inner}")
        };
        let message = err.inner().message().to_owned();
        // `unknown field `x`, expected ...`: make sure the key is in the path.
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split_once('`'));
        match unknown {
            Some((name, expected)) => {
                if !path.ends_with(&format!(".{name}")) {
                    path = format!("{path}.{name}");
                }
                if at.last().map(String::as_str) != Some(name) {
                    at.push(name.to_owned());
                }
                let expected = expected.trim_start_matches(", ");
                issues.push(ConfigIssue::new(
                    path,
                    format!("is not a known key; {expected}"),
                ));
            }
            None => {
                issues.push(ConfigIssue::new(path.clone(), sanitize(&message)));
                // Validation of this key's table would only repeat the problem.
                failed.push(match path.rsplit_once('.') {
                    Some((table, _)) => table.to_owned(),
                    None => path,
                });
            }
        }
        if at.is_empty() || !remove(&mut value, &at) {
            failed.push(key.to_owned());
            return None;
        }
    }
    failed.push(key.to_owned());
    None
}

/// Takes the key at `path` (table keys and array indices) out of `value`; false when there is
/// none.
fn remove(value: &mut toml::Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = value;
    for step in parents {
        let next = match at {
            toml::Value::Table(t) => t.get_mut(step),
            toml::Value::Array(a) => step.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        };
        match next {
            Some(v) => at = v,
            None => return false,
        }
    }
    match at {
        toml::Value::Table(t) => t.remove(last).is_some(),
        toml::Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => {
                a.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
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
