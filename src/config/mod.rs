//! Configuration in two stages: raw TOML structs ([`raw`]) turned by one [`validate`] into a
//! typed [`Config`].
//!
//! - Stage one (`raw`, `parse`): the file as written, human units (`_ms`), unknown keys rejected.
//! - Stage two (`validate`): defaults applied, every key and cross-key rule checked; all problems
//!   are reported at once, each with its dotted path (`lanes.small.max_concurrency must be > 0`).
//!   Values from the file are never echoed in errors, in case they are secrets.
//!
//! One file per section keeps that section's raw struct, typed struct, defaults and checks
//! together: `server`, `fields`, `upstream` (with `[upstream.abort]`), `classify`, `admission` (with
//! `[admission.fifo]` and `[lanes.*]`), `promotion`, `telemetry`, `quota`, `jobs`, `auth`, `prefix`
//! (`[prefix_cache]` and `[courses.*]`). `file` holds the top-level structs, the one
//! [`validate`] and the cross-section checks; `check` (the problem collector) and `error` are
//! leaves every section may use. No file imports one that imports it back.
//!
//! `config/config.toml` documents every key and states every default; [`Config::default`] is
//! exactly that file.

mod admission;
mod advice;
mod auth;
mod autopilot;
mod check;
mod classify;
pub mod course;
mod error;
mod fields;
mod file;
mod jobs;
mod parse;
mod placeholders;
mod prefix;
mod promotion;
mod quota;
pub mod raw;
mod replicas;
mod secret;
mod server;
mod telemetry;
mod upstream;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use admission::{
    AdmissionConfig, FifoConfig, LaneConfig, LanesConfig, Policy, QueueConfig, TtftObjective,
    PREFILL_PIECE_ALIGN,
};
pub use auth::{
    one_tenant_per_key, parse_keys, AuthConfig, KeyEntry, TenantBudget, TOKEN_SECRET_ENV,
};
pub use autopilot::{AutopilotConfig, MAX_MIN_SAMPLES};
pub use classify::{ClassifyConfig, ExactCount, TokenizerSource};
pub use course::{CourseConfig, FocusMode, FocusSettings};
pub use error::{ConfigError, ConfigIssue};
pub use fields::{FieldsConfig, MAX_TEMPLATE_KWARG_BYTES, NEVER_TEMPLATE_KWARGS, TEMPLATE_KWARGS};
pub use file::{validate, Config};
pub use jobs::{JobsConfig, PreemptAnswers, WebhookPattern, WEBHOOK_SECRET_ENV};
pub use placeholders::find_placeholder;
pub use prefix::PrefixCacheConfig;
pub use promotion::{PromotionConfig, WhenFull};
pub use quota::{OnRedisDown, QuotaBackend, QuotaConfig, RedisUrl};
pub use replicas::{ReplicaConfig, RoutingConfig, RoutingPolicy, MAX_REPLICAS};
pub use secret::Secret;
pub use server::{allowed_host, per_tenant_in_flight, ServerConfig, UnknownFields};
pub use telemetry::{OtlpProtocol, RequestLogSink, TelemetryConfig};
pub use upstream::{AbortConfig, AbortIdFormat, AbortMethod, AbortMode, UpstreamConfig};

/// The shipped, documented config file.
pub const SHIPPED_CONFIG: &str = include_str!("../../config/config.toml");

impl Config {
    /// Parses and validates TOML text.
    ///
    /// Problems from reading the file (unknown keys, wrong types: every one, not only the first
    /// of a section) and from validation are reported together; validation problems inside a
    /// table with a key of the wrong type are left out, since they would only repeat it.
    pub fn from_toml_str(src: &str) -> Result<Config, ConfigError> {
        Self::parsed_with(src, validate)
    }

    /// [`Config::from_toml_str`] checked by `validate`.
    fn parsed_with(
        src: &str,
        validate: fn(file::RawConfig) -> Result<Config, ConfigError>,
    ) -> Result<Config, ConfigError> {
        Self::parsed_overriding(src, validate, None)
    }

    /// [`Config::parsed_with`], `classify.tokenizer` replaced by `tokenizer` (when given)
    /// before it is checked: a file naming a tokenizer this machine lacks is fine then.
    fn parsed_overriding(
        src: &str,
        validate: fn(file::RawConfig) -> Result<Config, ConfigError>,
        tokenizer: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        let mut parsed = parse::parse_raw(src)?;
        if let Some(path) = tokenizer {
            parsed.raw.classify.tokenizer = Some(path.to_string_lossy().into_owned());
        }
        match validate(parsed.raw) {
            Ok(config) if parsed.issues.is_empty() => Ok(config),
            Ok(_) => Err(ConfigError::Invalid(parsed.issues)),
            Err(err) => {
                let mut issues = parsed.issues;
                let failed = &parsed.failed;
                issues.extend(
                    err.issues()
                        .iter()
                        .filter(|issue| {
                            !failed.iter().any(|f| {
                                issue.path == *f || issue.path.starts_with(&format!("{f}."))
                            })
                        })
                        .cloned(),
                );
                Err(ConfigError::Invalid(issues))
            }
        }
    }

    /// Reads, parses and validates the file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        Self::load_with_tokenizer(path, None)
    }

    /// [`Config::load`] with `classify.tokenizer` replaced by `tokenizer` when given (`serve
    /// --tokenizer`) before the file is checked, so the file's own tokenizer path need not
    /// exist here.
    pub fn load_with_tokenizer(
        path: impl AsRef<Path>,
        tokenizer: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parsed_overriding(&src, validate, tokenizer)
    }
}

impl Config {
    /// A short SHA-256 of this configuration (its `Debug` form, where secrets are redacted):
    /// the same file gives the same value on every replica.
    pub fn fingerprint(&self) -> String {
        crate::sign::sha256_hex(format!("{self:?}").as_bytes())[..16].to_owned()
    }
}

impl Default for Config {
    /// The shipped `config/config.toml` (heuristic tokenizer, lanes 32/20/10), whatever the
    /// process's environment holds.
    fn default() -> Self {
        Config::parsed_with(SHIPPED_CONFIG, file::validate_defaults)
            .expect("the shipped config/config.toml is valid")
    }
}
