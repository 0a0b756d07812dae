//! Changing the configuration without a restart (issue 18): `SIGHUP`, or `POST /admin/reload`
//! on the admin listener, re-reads the file the gateway started from.
//!
//! 1. The whole new file is checked first (parse, then every key; every problem is reported)
//!    and what is built from it (the classifier with its tokenizer, the upstream client) is
//!    built; any failure refuses the reload and the old configuration stays in force.
//! 2. Settings that cannot change in a running process ([`FIXED`]: listeners, TLS files, the
//!    quota backend and its Redis, the admission policy, telemetry exporters, the jobs service,
//!    auth and CORS, which are wired into the listeners) keep their running values; the reload
//!    names them ("left alone: restart to change").
//! 3. The rest is swapped in at once, as one set ([`AppState::swap`]): lane limits, budgets,
//!    seats, ceilings, lending, queue bounds and timeouts, classification thresholds,
//!    promotion, upstream timeouts and client, courses, prefix-cache settings, queued-bytes
//!    limits, `[fields]`, `[autopilot]` and `auth.tenant_shares`. Requests that arrive afterwards see the new set; requests already
//!    in (waiting for a seat or streaming) keep the set of their entry (their `RequestCtx`:
//!    lane rules, classification, upstream client, client limits), while admission's limits
//!    apply to every waiter at once: a lane whose limit was lowered admits nobody until it is
//!    under the new limit (nothing is cut).
//!
//! Every reload is logged and counted (`tutor_gateway_config_reloads_total{outcome}`); the
//! config in force is named by `tutor_gateway_config_info{sha256}`.

use std::path::Path;

use sha2::Digest;

use super::state::AppState;
use crate::admission::LimitsChange;
use crate::classify::Classifier;
use crate::config::{Config, ConfigError, ConfigIssue};

/// Settings a running gateway cannot change, by their config path.
pub const FIXED: &[&str] = &[
    "listen",
    "server.admin_listen",
    "server.tls_cert / tls_key",
    "server.max_connections",
    "server.max_requests_in_flight",
    "server.max_body_bytes",
    "server.max_head_bytes",
    "server.header_read_timeout_ms",
    "server.keep_alive_idle_ms",
    "server.body_read_timeout_ms",
    "server.client_write_timeout_ms",
    "server.cors_allow_origins",
    "server.cors_max_age_s",
    "server.allowed_hosts",
    "server.shutdown_grace_ms",
    "server.config_watch_ms",
    "admission.policy",
    "quota",
    "telemetry",
    "jobs",
    "auth (but auth.tenant_shares)",
    "promotion.continuation_window_ms / max_sessions",
];

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The sections whose settings changed and are now in force.
    pub changed: Vec<&'static str>,
    /// Settings that differ in the file but keep their running values (restart to change).
    pub left_alone: Vec<&'static str>,
    /// Short SHA-256 of the configuration now in force.
    pub sha256: String,
    /// What became of the admission limits (with Redis: whether the shared record was
    /// written; a record from `limits push` is replaced only with force).
    pub limits: LimitsChange,
}

/// Why a reload was refused (the old configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file could not be read, or has problems (each one listed).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The gateway started without a file to re-read.
    #[error("this gateway was not started from a config file; nothing to reload")]
    NoFile,
    /// Something the new configuration names could not be built.
    #[error("{0}")]
    Build(String),
}

impl ReloadError {
    /// The metric label.
    pub fn outcome(&self) -> &'static str {
        match self {
            ReloadError::Invalid(_) | ReloadError::NoFile => "invalid",
            ReloadError::Build(_) => "failed",
        }
    }
}

/// Re-reads `path` and puts it in force (see the module doc).
pub fn reload_file(state: &AppState, path: &Path) -> Result<Reloaded, ReloadError> {
    let one_at_a_time = state.reload_lock();
    let result = Config::load(path)
        .map_err(ReloadError::from)
        .and_then(|config| apply_locked(state, config, false));
    drop(one_at_a_time);
    counted(state, result)
}

/// Re-reads the file the gateway started from ([`AppState::config_source`]), with the command
/// line's overrides applied again. `force`: see [`apply`].
///
/// Reloads run one at a time (SIGHUP, `POST /admin/reload` and the file watcher alike), each
/// reading the file when its turn comes: the last to read it puts the file's latest state in
/// force, never an older file read by a slower reload.
pub fn reload(state: &AppState, force: bool) -> Result<Reloaded, ReloadError> {
    let one_at_a_time = state.reload_lock();
    let result = match state.config_source() {
        Some(source) => Config::load_with_tokenizer(&source.path, source.tokenizer.as_deref())
            .map_err(ReloadError::from)
            .and_then(|mut config| {
                (source.overrides)(&mut config);
                apply_locked(state, config, force)
            }),
        None => Err(ReloadError::NoFile),
    };
    drop(one_at_a_time);
    counted(state, result)
}

/// Looks at an unchanged file that was refused before it is tried again (100 s at a 5 s
/// `server.config_watch_ms`).
pub const RETRY_LOOKS: u32 = 20;

/// With `server.config_watch_ms` set: reads the file the gateway started from at that period
/// until `stop`, and reloads it (as SIGHUP does) when its bytes differ from the last read. A
/// Kubernetes ConfigMap volume is updated by swapping a symlink, so the change is seen whole.
/// An unreadable file (mid-swap, removed) is skipped until it reads again; a file refused (by
/// its check, or what it names could not be built) is tried again when it changes, and every
/// [`RETRY_LOOKS`] looks meanwhile: a file it names that another volume mounts later (a
/// tokenizer, a CA) is then picked up without an edit.
pub fn watch(state: AppState, stop: tokio_util::sync::CancellationToken) {
    let Some(every) = state.config().server.config_watch else {
        return;
    };
    let watch = state.metrics().background().clone();
    tokio::spawn(watch.watch("config watcher", async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<[u8; 32]> = None;
        // Looks since the file in `last` was refused (`None`: it was not).
        let mut refused: Option<u32> = None;
        // Whether the file was unreadable at the last look: said once, when it becomes so.
        let mut unreadable = false;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Set by `serve` after the listeners are up; a gateway built in code has none.
            let Some(source) = state.config_source() else {
                continue;
            };
            let bytes = match tokio::fs::read(&source.path).await {
                Ok(bytes) => {
                    if std::mem::take(&mut unreadable) {
                        tracing::info!("the config file can be read again");
                    }
                    bytes
                }
                Err(e) => {
                    if !std::mem::replace(&mut unreadable, true) {
                        tracing::warn!(
                            error = %e.kind(),
                            "the config file cannot be read; the configuration in force stays"
                        );
                    }
                    continue;
                }
            };
            let digest: [u8; 32] = sha2::Sha256::digest(&bytes).into();
            // (the first look, the same file refused before and tried again)
            let (first, again) = match last.replace(digest) {
                Some(seen) if seen == digest => match refused.as_mut() {
                    Some(looks) if *looks + 1 >= RETRY_LOOKS => {
                        *looks = 0;
                        (false, true)
                    }
                    Some(looks) => {
                        *looks += 1;
                        continue;
                    }
                    None => continue,
                },
                Some(_) => (false, false),
                None => (true, false),
            };
            let state = state.clone();
            // As on SIGHUP: reading and building block; logged and counted by the reload.
            let ok = tokio::task::spawn_blocking(move || {
                // The first look has nothing to compare with but the configuration in force:
                // the file may have changed between its reading at start and this look.
                if first && !differs_from_force(&state, &source) {
                    return true;
                }
                match again {
                    true => tracing::info!("the refused config file: trying it again"),
                    false => tracing::info!("the config file changed: reloading it"),
                }
                reload(&state, false).is_ok()
            })
            .await
            .unwrap_or(false);
            refused = match (ok, refused) {
                (true, _) => None,
                (false, Some(looks)) if again => Some(looks),
                (false, _) => Some(0),
            };
        }
    }));
}

/// Whether the file of `source` (read as a reload reads it: with `serve --tokenizer` and the
/// overrides) states another configuration than the one in force, or cannot be read as one.
/// Compared whole, secrets included: the fingerprint leaves them out (it is shown), and a file
/// rewritten before this look with only a rotated key was taken as the same, its key never put
/// in force.
fn differs_from_force(state: &AppState, source: &super::state::ConfigSource) -> bool {
    match Config::load_with_tokenizer(&source.path, source.tokenizer.as_deref()) {
        Ok(mut config) => {
            (source.overrides)(&mut config);
            config != *state.config()
        }
        Err(_) => true,
    }
}

/// Logs and counts a reload's outcome.
fn counted(
    state: &AppState,
    result: Result<Reloaded, ReloadError>,
) -> Result<Reloaded, ReloadError> {
    let metrics = state.metrics();
    match &result {
        Ok(r) => {
            metrics.config_reloaded("applied", &r.sha256);
            tracing::info!(
                changed = ?r.changed,
                left_alone = ?r.left_alone,
                sha256 = %r.sha256,
                limits = %r.limits.describe(),
                "configuration reloaded"
            );
            if let LimitsChange::KeptPushed { .. } = r.limits {
                tracing::warn!(limits = %r.limits.describe(), "the reloaded limits are not shared");
            }
            if !r.left_alone.is_empty() {
                tracing::warn!(left_alone = ?r.left_alone, "these settings changed in the file but need a restart; their running values stay");
            }
            for warning in state.config().warnings() {
                tracing::warn!("{warning}");
            }
        }
        Err(e) => {
            metrics.config_reloaded(e.outcome(), "");
            tracing::error!(error = %e, "configuration reload refused; the running configuration stays");
        }
    }
    result
}

/// Puts `new` in force over the running configuration (see the module doc); not forced (see
/// [`apply_with`]).
pub fn apply(state: &AppState, new: Config) -> Result<Reloaded, ReloadError> {
    apply_with(state, new, false)
}

/// [`apply`]. With the Redis quota, the shared limits record is written only when the limits
/// changed, and a record written by `tutor-gateway limits push` is replaced only with `force`.
pub fn apply_with(state: &AppState, new: Config, force: bool) -> Result<Reloaded, ReloadError> {
    let _one_at_a_time = state.reload_lock();
    apply_locked(state, new, force)
}

/// [`apply_with`], the caller holding [`AppState::reload_lock`].
fn apply_locked(state: &AppState, mut new: Config, force: bool) -> Result<Reloaded, ReloadError> {
    let old = state.config();
    let left_alone = keep_fixed(&old, &mut new);
    if let Err(ConfigError::Invalid(issues)) = new.cross_checked() {
        // The new values do not hold with the running ones kept: nothing changes.
        let kept = left_alone.join(", ");
        let issues = issues
            .into_iter()
            .map(|i| match kept.as_str() {
                "" => i,
                kept => ConfigIssue {
                    message: format!(
                        "{} (with the running {kept}, which a reload leaves as it is)",
                        i.message
                    ),
                    ..i
                },
            })
            .collect();
        return Err(ReloadError::Invalid(ConfigError::Invalid(issues)));
    }
    let changed = changed_sections(&old, &new);
    let mut classifier = Classifier::from_config(&new)
        .map_err(|e| ReloadError::Build(format!("classifier: {e}")))?;
    // What the engine's counts taught holds while counts are made the same way.
    let (a, b) = (&old.classify, &new.classify);
    let same_counts = a.tokenizer == b.tokenizer
        && a.per_message_overhead == b.per_message_overhead
        && (
            a.image_part_tokens,
            a.image_token_pixels,
            a.image_min_tokens,
            a.audio_part_tokens,
            a.video_part_tokens,
        ) == (
            b.image_part_tokens,
            b.image_token_pixels,
            b.image_min_tokens,
            b.audio_part_tokens,
            b.video_part_tokens,
        );
    classifier.inherit(&state.live().classifier, same_counts);
    let upstream = if new.upstream == old.upstream {
        state.upstream()
    } else {
        state
            .upstream()
            .with_config(new.upstream.clone())
            .map_err(|e| ReloadError::Build(format!("upstream client: {e}")))?
    };
    let sha256 = new.fingerprint();
    let limits = state.swap(new, classifier, upstream, force);
    Ok(Reloaded {
        changed,
        left_alone,
        sha256,
        limits,
    })
}

/// Puts the running values of the [`FIXED`] settings back into `new`; the ones that differed.
fn keep_fixed(old: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut kept = Vec::new();
    macro_rules! keep {
        ($name:literal, $($field:tt)+) => {
            if new.$($field)+ != old.$($field)+ {
                new.$($field)+ = old.$($field)+.clone();
                kept.push($name);
            }
        };
    }
    keep!("listen", listen);
    keep!("server.admin_listen", server.admin_listen);
    keep!("server.tls_cert / tls_key", server.tls);
    keep!("server.max_connections", server.max_connections);
    keep!(
        "server.max_requests_in_flight",
        server.max_requests_in_flight
    );
    if kept.last() == Some(&"server.max_requests_in_flight") {
        // The per-tenant limit (a quarter of it by default) follows the running value.
        new.server.max_requests_in_flight_per_tenant = crate::config::per_tenant_in_flight(
            new.server.max_requests_in_flight_per_tenant_set,
            new.server.max_requests_in_flight,
        );
    }
    // The routes' body limit is built into the router at start.
    keep!("server.max_body_bytes", server.max_body_bytes);
    keep!("server.max_head_bytes", server.max_head_bytes);
    keep!("server.header_read_timeout_ms", server.header_read_timeout);
    keep!("server.keep_alive_idle_ms", server.keep_alive_idle);
    keep!("server.body_read_timeout_ms", server.body_read_timeout);
    // The listener's connections time their writes out with it too.
    keep!(
        "server.client_write_timeout_ms",
        server.client_write_timeout
    );
    keep!("server.cors_allow_origins", server.cors_allow_origins);
    keep!("server.cors_max_age_s", server.cors_max_age);
    keep!("server.allowed_hosts", server.allowed_hosts);
    keep!("server.shutdown_grace_ms", server.shutdown_grace);
    keep!("server.config_watch_ms", server.config_watch);
    keep!("admission.policy", admission.policy);
    keep!("quota", quota);
    keep!("telemetry", telemetry);
    keep!("jobs", jobs);
    keep!(
        "promotion.continuation_window_ms",
        promotion.continuation_window
    );
    keep!("promotion.max_sessions", promotion.max_sessions);
    // The auth layer is wired into the listeners; tenant shares also steer admission, which
    // takes them live.
    let without_shares = |auth: &crate::config::AuthConfig| {
        let mut a = auth.clone();
        a.tenant_shares = Default::default();
        a
    };
    if without_shares(&new.auth) != without_shares(&old.auth) {
        kept.push("auth (but auth.tenant_shares)");
    }
    let shares = std::mem::take(&mut new.auth.tenant_shares);
    new.auth = old.auth.clone();
    new.auth.tenant_shares = shares;
    kept
}

/// The top-level sections that differ between `old` and `new`.
fn changed_sections(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    macro_rules! section {
        ($name:literal, $field:ident) => {
            if old.$field != new.$field {
                changed.push($name);
            }
        };
    }
    section!("upstream", upstream);
    section!("classify", classify);
    section!("admission", admission);
    section!("lanes", lanes);
    section!("server", server);
    section!("fields", fields);
    section!("promotion", promotion);
    section!("auth", auth);
    section!("prefix_cache", prefix_cache);
    section!("autopilot", autopilot);
    section!("courses", courses);
    changed
}
