//! `[auth]`: API keys (stored as SHA-256 hashes), the tenant each one belongs to, and the signed
//! tokens an `EventSource` uses instead of a header.
//!
//! Owns [`RawAuth`], [`AuthConfig`] and [`KeyEntry`], their defaults and validation, and the
//! key-file format ([`parse_keys`]), which the gateway also uses when it reloads the file.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use super::secret::Secret;

/// Default `auth.token_ttl_ms` (5 minutes).
const TOKEN_TTL_MS: u64 = 300_000;
/// Default `auth.reload_ms`.
const RELOAD_MS: u64 = 1_000;
/// Most `auth.reload_ms`: a removed key's revocation waits up to twice this.
const MAX_RELOAD_MS: u64 = 60_000;
/// Most `auth.token_ttl_ms` (a day): a leaked token is good until it expires or its key goes.
const MAX_TOKEN_TTL_MS: u64 = 86_400_000;
/// The environment variable that may hold the token signing secret.
pub const TOKEN_SECRET_ENV: &str = "TUTOR_GATEWAY_TOKEN_SECRET";

/// One `[[auth.keys]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    /// Hex SHA-256 of the key.
    pub sha256: String,
    /// The tenant the key belongs to.
    pub tenant: String,
}

/// `[auth]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// Require a key on the request routes.
    pub enabled: Option<bool>,
    /// Keys in the config.
    pub keys: Option<Vec<RawKey>>,
    /// A file of `<sha256> <tenant>` lines, reloaded when it changes.
    pub keys_file: Option<String>,
    /// How long an EventSource token lives, ms.
    pub token_ttl_ms: Option<u64>,
    /// How often the key file is checked for changes, ms.
    pub reload_ms: Option<u64>,
    /// The token signing secret (better: [`TOKEN_SECRET_ENV`]).
    pub token_secret: Option<Secret>,
    /// Each tenant's share of a lane queue's turns (default 1).
    pub tenant_shares: Option<std::collections::BTreeMap<String, u32>>,
    /// With the Redis quota: order each replica's lines by the fleet's service counters.
    pub fleet_fairness: Option<bool>,
    /// Tenants share vLLM's prefix cache (no tenant salt).
    pub share_prefix_cache: Option<bool>,
    /// Per-tenant budgets: `[auth.tenants.<name>]`.
    pub tenants: Option<std::collections::BTreeMap<String, RawTenantBudget>>,
}

/// `[auth.tenants.<name>]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenantBudget {
    /// Requests admitted per minute (0: none).
    pub requests_per_minute: Option<u64>,
    /// Prompt + output tokens per minute (0: none).
    pub tokens_per_minute: Option<u64>,
    /// Prompt + output tokens per UTC day (0: none).
    pub tokens_per_day: Option<u64>,
}

/// A tenant's budgets (`[auth.tenants.<name>]`); `None`: no bound of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantBudget {
    /// Requests admitted in any minute.
    pub requests_per_minute: Option<u64>,
    /// Prompt + output tokens (reserved from the estimate, settled to vLLM's usage) in any
    /// minute.
    pub tokens_per_minute: Option<u64>,
    /// Prompt + output tokens per UTC day.
    pub tokens_per_day: Option<u64>,
}

/// A key's hash and its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// Lower-case hex SHA-256 of the key.
    pub sha256: String,
    /// Letters, digits, `_`, `-`; at most 64.
    pub tenant: String,
}

/// Who may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// Whether the request routes need a key.
    pub enabled: bool,
    /// Keys given in the config.
    pub keys: Vec<KeyEntry>,
    /// The key file, if any (its keys are added to `keys`, reloaded on change).
    pub keys_file: Option<PathBuf>,
    /// How long an EventSource token lives.
    pub token_ttl: Duration,
    /// How often the key file is checked.
    pub reload: Duration,
    /// The token signing secret; `None`: a random one per process (tokens then work only on
    /// the replica that issued them).
    pub token_secret: Option<Secret>,
    /// Each tenant's share of a lane queue's turns, when not 1.
    pub tenant_shares: std::collections::BTreeMap<String, u32>,
    /// With the Redis quota: each replica's lines order tenants by their service counted
    /// fleet-wide (tokens over share), not only by their turns in that line.
    pub fleet_fairness: bool,
    /// Tenants share vLLM's prefix cache: a client's `cache_salt` goes as sent. Off (the
    /// default): every request gets its tenant's salt (`src/prompt/salt.rs`), so no tenant can
    /// probe another's prompts through the cache.
    pub share_prefix_cache: bool,
    /// Tenants' budgets, by tenant (tenants not listed have none).
    pub tenants: std::collections::BTreeMap<String, TenantBudget>,
}

/// Whether `tenant` is a valid tenant name.
pub(super) fn tenant_ok(tenant: &str) -> bool {
    (1..=64).contains(&tenant.len())
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `hash` is 64 hex digits.
fn hash_ok(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A key file: one `<hex sha256> <tenant>` per line; blank lines and `#` comments skipped.
/// `Err` names the first bad line (by number, never its content).
pub fn parse_keys(text: &str) -> Result<Vec<KeyEntry>, String> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next(), parts.next()) {
            (Some(hash), Some(tenant), None) if hash_ok(hash) && tenant_ok(tenant) => {
                keys.push(KeyEntry {
                    sha256: hash.to_ascii_lowercase(),
                    tenant: tenant.to_owned(),
                })
            }
            _ => {
                return Err(format!(
                    "line {} is not `<64 hex digits> <tenant>` (tenant: letters, digits, _ -)",
                    n + 1
                ))
            }
        }
    }
    Ok(keys)
}

/// The first key given to two tenants, as `Err` naming both tenants (never the key or its
/// hash): with the key in two places, one tenant would be billed for the other's requests.
/// The same key twice for one tenant is harmless.
pub fn one_tenant_per_key<'a>(keys: impl IntoIterator<Item = &'a KeyEntry>) -> Result<(), String> {
    let mut owner: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for k in keys {
        match owner.insert(&k.sha256, &k.tenant) {
            Some(other) if other != k.tenant => {
                return Err(format!(
                    "one key is listed for two tenants ({other:?} and {:?}); each key belongs to one tenant",
                    k.tenant
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks `[auth]`.
pub(super) fn validate(c: &mut Checker, raw: RawAuth) -> AuthConfig {
    let mut keys = Vec::new();
    for (i, k) in raw.keys.unwrap_or_default().into_iter().enumerate() {
        if !hash_ok(&k.sha256) {
            c.fail(
                format!("auth.keys[{i}].sha256"),
                "must be 64 hex digits (the SHA-256 of the key, never the key)",
            );
        } else if !tenant_ok(&k.tenant) {
            c.fail(
                format!("auth.keys[{i}].tenant"),
                "must be 1 to 64 letters, digits, `_` or `-`",
            );
        } else {
            keys.push(KeyEntry {
                sha256: k.sha256.to_ascii_lowercase(),
                tenant: k.tenant,
            });
        }
    }
    if let Err(e) = one_tenant_per_key(&keys) {
        c.fail("auth.keys", e);
    }
    let keys_file = raw.keys_file.filter(|f| !f.is_empty()).map(PathBuf::from);
    if let Some(path) = &keys_file {
        match std::fs::read_to_string(path) {
            Ok(text) => match parse_keys(&text) {
                Ok(file_keys) => {
                    if let Err(e) = one_tenant_per_key(keys.iter().chain(&file_keys)) {
                        c.fail("auth.keys_file", e);
                    }
                }
                Err(e) => c.fail("auth.keys_file", e),
            },
            Err(e) => c.fail("auth.keys_file", format!("cannot be read ({})", e.kind())),
        }
    }
    let enabled = raw.enabled.unwrap_or(false);
    if enabled && keys.is_empty() && keys_file.is_none() {
        c.fail(
            "auth.enabled",
            "needs auth.keys or auth.keys_file (no key could ever pass)",
        );
    }
    // Trimmed, as every secret: one from a file written by `echo` ends in a newline.
    let token_secret = raw
        .token_secret
        .map(|s| s.expose().trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| c.env(TOKEN_SECRET_ENV))
        .map(Secret::from);
    if token_secret.as_ref().is_some_and(|s| s.expose().len() < 16) {
        c.fail("auth.token_secret", "must be at least 16 bytes");
    }
    let mut tenant_shares = std::collections::BTreeMap::new();
    for (tenant, share) in raw.tenant_shares.unwrap_or_default() {
        if !tenant_ok(&tenant) {
            c.fail(
                "auth.tenant_shares",
                "tenant names are 1 to 64 letters, digits, `_` or `-`",
            );
        } else if !(1..=1000).contains(&share) {
            c.fail(
                format!("auth.tenant_shares.{tenant}"),
                "must be between 1 and 1000",
            );
        } else {
            tenant_shares.insert(tenant, share);
        }
    }
    let mut tenants = std::collections::BTreeMap::new();
    for (tenant, raw) in raw.tenants.unwrap_or_default() {
        if !tenant_ok(&tenant) {
            c.fail(
                "auth.tenants",
                "tenant names are 1 to 64 letters, digits, `_` or `-`",
            );
            continue;
        }
        let limit = |c: &mut Checker, key: &str, v: Option<u64>| match v.unwrap_or(0) {
            0 => None,
            n if n <= 1_000_000_000_000 => Some(n),
            _ => {
                c.fail(
                    format!("auth.tenants.{tenant}.{key}"),
                    "must be at most 10^12",
                );
                None
            }
        };
        tenants.insert(
            tenant.clone(),
            TenantBudget {
                requests_per_minute: limit(c, "requests_per_minute", raw.requests_per_minute),
                tokens_per_minute: limit(c, "tokens_per_minute", raw.tokens_per_minute),
                tokens_per_day: limit(c, "tokens_per_day", raw.tokens_per_day),
            },
        );
    }
    let token_ttl = c.ms("auth.token_ttl_ms", raw.token_ttl_ms, TOKEN_TTL_MS);
    if token_ttl > Duration::from_millis(MAX_TOKEN_TTL_MS) {
        c.fail(
            "auth.token_ttl_ms",
            format!("must be at most {MAX_TOKEN_TTL_MS} (a day)"),
        );
    }
    let reload = c.ms("auth.reload_ms", raw.reload_ms, RELOAD_MS);
    if reload > Duration::from_millis(MAX_RELOAD_MS) {
        c.fail(
            "auth.reload_ms",
            format!(
                "must be at most {MAX_RELOAD_MS}: a removed key stays in force for up to twice this"
            ),
        );
    }
    AuthConfig {
        tenants,
        tenant_shares,
        fleet_fairness: raw.fleet_fairness.unwrap_or(true),
        share_prefix_cache: raw.share_prefix_cache.unwrap_or(false),
        enabled,
        keys,
        keys_file,
        token_ttl,
        reload,
        token_secret,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_keys;

    #[test]
    fn key_files_are_read_strictly() {
        let hash = "ab".repeat(32);
        let keys = parse_keys(&format!(
            "# comment\n\n{hash} cs101\n{} school-2\n",
            "CD".repeat(32)
        ))
        .unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[1].sha256, "cd".repeat(32), "hashes are lower-cased");
        for bad in [
            hash.clone(),
            format!("{hash} cs101 extra"),
            format!("{} cs101", "ab".repeat(31)),
            format!("{hash} cs.101"),
            "sk-a-raw-key cs101".to_owned(),
        ] {
            let err = parse_keys(&bad).unwrap_err();
            assert!(err.contains("line 1"), "{err}");
            assert!(
                !err.contains("sk-a-raw-key"),
                "never echoes the line: {err}"
            );
        }
    }
}
