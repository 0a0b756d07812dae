//! Configuration in two stages: raw TOML structs ([`raw`]) turned by one [`validate`] into a
//! typed [`Config`].
//!
//! - Stage one (`raw`, `parse`): the file as written, human units (`_ms`), unknown keys rejected.
//! - Stage two (`validate`): defaults applied, every key and cross-key rule checked; all problems
//!   are reported at once, each with its dotted path (`lanes.small.max_concurrency must be > 0`).
//!   Values from the file are never echoed in errors, in case they are secrets.
//!
//! `config/config.toml` documents every key and states every default; [`Config::default`] is
//! exactly that file.

mod defaults;
mod error;
mod parse;
mod prefix;
mod quota;
pub mod raw;
mod types;
mod validate;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use error::{ConfigError, ConfigIssue};
pub use prefix::PrefixCacheConfig;
pub use quota::{OnRedisDown, QuotaBackend, QuotaConfig, RedisUrl};
pub use types::{
    AbortConfig, AbortMethod, AdmissionConfig, ClassifyConfig, Config, FifoConfig, LaneConfig,
    LanesConfig, OtlpProtocol, Policy, PromotionConfig, QueueConfig, RequestLogSink, ServerConfig,
    TelemetryConfig, TokenizerSource, UpstreamConfig, WhenFull,
};
pub use validate::validate;

/// The shipped, documented config file.
pub const SHIPPED_CONFIG: &str = include_str!("../../config/config.toml");

impl Config {
    /// Parses and validates TOML text.
    ///
    /// Problems from reading the file (unknown keys, wrong types) and from validation are
    /// reported together; validation problems inside a section that could not be read are left
    /// out, since they would only repeat the first problem.
    pub fn from_toml_str(src: &str) -> Result<Config, ConfigError> {
        let parsed = parse::parse_raw(src)?;
        match validate(parsed.raw) {
            Ok(config) if parsed.issues.is_empty() => Ok(config),
            Ok(_) => Err(ConfigError::Invalid(parsed.issues)),
            Err(err) => {
                let mut issues = parsed.issues;
                let failed = &parsed.failed_sections;
                issues.extend(
                    err.issues()
                        .iter()
                        .filter(|issue| {
                            let section = issue.path.split('.').next().unwrap_or_default();
                            !failed.iter().any(|f| f == section)
                        })
                        .cloned(),
                );
                Err(ConfigError::Invalid(issues))
            }
        }
    }

    /// Reads, parses and validates the file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&src)
    }
}

impl Default for Config {
    /// The shipped `config/config.toml` (heuristic tokenizer, lanes 32/20/4).
    fn default() -> Self {
        Config::from_toml_str(SHIPPED_CONFIG).expect("the shipped config/config.toml is valid")
    }
}
