//! `[upstream]` and `[upstream.abort]`: where vLLM is, how long to wait for it, and how to stop
//! its work when a client goes away (M21).
//!
//! Owns [`RawUpstream`], [`RawAbort`], [`UpstreamConfig`], [`AbortConfig`], [`AbortMode`],
//! [`AbortIdFormat`] and [`AbortMethod`], their defaults and validation. Closing the upstream
//! connection is always done; `[upstream.abort]` only decides about the extra abort call.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use super::replicas::{self, RawReplica, RawRouting, ReplicaConfig, RoutingConfig};
use super::secret::Secret;

/// Default `upstream.base_url`.
const BASE_URL: &str = "http://127.0.0.1:8000";
/// Default `upstream.model`.
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// Default `upstream.max_model_len`.
const MAX_MODEL_LEN: u32 = 16_384;
/// Default `upstream.connect_timeout_ms`.
const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Default `upstream.health_cache_ms`.
const HEALTH_CACHE_MS: u64 = 1_000;
/// Default `upstream.first_token_timeout_ms`.
const FIRST_TOKEN_TIMEOUT_MS: u64 = 60_000;
/// Default `upstream.idle_timeout_ms`.
const IDLE_TIMEOUT_MS: u64 = 30_000;
/// Default `upstream.total_timeout_ms`.
const TOTAL_TIMEOUT_MS: u64 = 600_000;

/// Default `upstream.abort.mode`.
const ABORT_MODE: AbortMode = AbortMode::Auto;
/// Default `upstream.abort.url`: vLLM's abort endpoint under `vllm serve --enable-scale-out`.
const ABORT_URL: &str = "{base_url}/inference/v1/abort_requests";
/// Default `upstream.abort.id_format`.
const ABORT_ID_FORMAT: AbortIdFormat = AbortIdFormat::Vllm;
/// Default `upstream.abort.method`.
const ABORT_METHOD: &str = "POST";
/// Default `upstream.abort.body`.
const ABORT_BODY: &str = r#"{"request_ids":["{id}"]}"#;

/// `[upstream]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Base URL of the vLLM OpenAI-compatible server, without `/v1`.
    pub base_url: Option<String>,
    /// Model name sent upstream.
    pub model: Option<String>,
    /// The `--max-model-len` vLLM was started with, in tokens.
    pub max_model_len: Option<u32>,
    /// TCP connect timeout, ms.
    pub connect_timeout_ms: Option<u64>,
    /// Time from sending the request to the first token, ms.
    pub first_token_timeout_ms: Option<u64>,
    /// Longest gap between two tokens, ms.
    pub idle_timeout_ms: Option<u64>,
    /// Longest whole request, ms.
    pub total_timeout_ms: Option<u64>,
    /// How long one `/health` probe of vLLM answers `/readyz`, ms.
    pub health_cache_ms: Option<u64>,
    /// The environment variable holding vLLM's `--api-key`.
    pub api_key_env: Option<String>,
    /// A file holding vLLM's `--api-key`.
    pub api_key_file: Option<String>,
    /// PEM certificates of the CAs that sign vLLM's TLS certificate (besides the public roots).
    pub ca_file: Option<String>,
    /// `[upstream.abort]`.
    #[serde(default)]
    pub abort: RawAbort,
    /// `[[upstream.replicas]]`: several vLLM replicas instead of `base_url`.
    #[serde(default)]
    pub replicas: Vec<RawReplica>,
    /// `[upstream.routing]`.
    #[serde(default)]
    pub routing: RawRouting,
}

/// `[upstream.abort]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAbort {
    /// When to call the engine's abort endpoint: `auto`, `on` or `off`.
    pub mode: Option<String>,
    /// Older files' switch: `false` is `mode = "off"`.
    pub enabled: Option<bool>,
    /// Which id `{id}` stands for: `vllm` or `as_sent`.
    pub id_format: Option<String>,
    /// URL template; `{base_url}` and `{id}` (the engine's id) are substituted.
    pub url: Option<String>,
    /// HTTP method, e.g. `POST`.
    pub method: Option<String>,
    /// JSON body template; `{id}` is substituted (JSON-escaped).
    pub body: Option<String>,
}

/// `[upstream]`: where vLLM is and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Base URL without a trailing slash and without `/v1`, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    /// Model name sent upstream for `/answer` and jobs, and for a `/v1` request that names none
    /// (a `/v1` request's own `model` is forwarded as sent).
    pub model: String,
    /// vLLM's `--max-model-len`, in tokens: requests estimated above it are rejected before
    /// admission.
    pub max_model_len: NonZeroU32,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait from sending the request to the first token (covers engine queue + prefill).
    pub first_token_timeout: Duration,
    /// Longest gap between two streamed tokens.
    pub idle_timeout: Duration,
    /// Longest whole upstream request.
    pub total_timeout: Duration,
    /// How long one `/health` probe of vLLM answers `/readyz` (0: every call probes).
    pub health_cache: Duration,
    /// vLLM's `--api-key`, sent as `Authorization: Bearer` on every upstream request.
    pub api_key: Option<Secret>,
    /// PEM certificates of extra CAs trusted for `https://` upstreams (read at start-up).
    pub ca_pem: Option<Vec<u8>>,
    /// The engine-side abort call made when a client goes away.
    pub abort: AbortConfig,
    /// `[[upstream.replicas]]` as checked; empty when the file names only `base_url` (see
    /// [`UpstreamConfig::replica_set`]).
    pub replicas: Vec<ReplicaConfig>,
    /// How requests pick a replica and how replicas' health is watched.
    pub routing: RoutingConfig,
}

impl UpstreamConfig {
    /// The replicas requests go to: `[[upstream.replicas]]`, or the one at `base_url`.
    pub fn replica_set(&self) -> Vec<ReplicaConfig> {
        if self.replicas.is_empty() {
            vec![ReplicaConfig::single(&self.base_url)]
        } else {
            self.replicas.clone()
        }
    }
}

/// `[upstream.abort]`: the engine's abort call, made besides closing the upstream connection
/// (which is what stops a request in stock vLLM) when a client goes away (M21).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortConfig {
    /// When the abort call is made: always, never, or when a probe found the endpoint.
    pub mode: AbortMode,
    /// When false no abort call is made whatever `mode` says (the older `enabled = false`;
    /// validation sets it to `mode != Off`). [`AbortConfig::call_mode`] combines the two.
    pub enabled: bool,
    /// Which id `{id}` is replaced by.
    pub id_format: AbortIdFormat,
    /// URL template with `{base_url}` and `{id}` placeholders.
    pub url_template: String,
    /// HTTP method of the abort call.
    pub method: AbortMethod,
    /// JSON body template with `{id}` placeholders; empty for no body.
    pub body_template: String,
}

impl AbortConfig {
    /// The mode in force: [`AbortMode::Off`] when `enabled` is false, else `mode`.
    pub fn call_mode(&self) -> AbortMode {
        if self.enabled {
            self.mode
        } else {
            AbortMode::Off
        }
    }

    /// The abort URL for request `id` (the engine's id, see [`AbortIdFormat`]) against
    /// `base_url`.
    pub fn url(&self, base_url: &str, id: &str) -> String {
        self.url_template
            .replace("{base_url}", base_url)
            .replace("{id}", id)
    }

    /// The abort body for request `id`; the id is JSON-escaped so the body stays valid JSON.
    pub fn body(&self, id: &str) -> String {
        let quoted = serde_json::Value::String(id.to_owned()).to_string();
        self.body_template
            .replace("{id}", &quoted[1..quoted.len() - 1])
    }
}

/// `upstream.abort.mode`: when the engine's abort endpoint is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortMode {
    /// Probe the endpoint once at start-up and call it only if it answered 2xx (stock vLLM has
    /// none: then closing the connection is the only abort).
    Auto,
    /// Always call it; a refusal is logged at `warn`.
    On,
    /// Never call it.
    Off,
}

impl AbortMode {
    /// The name as written in the config file.
    pub const fn as_str(self) -> &'static str {
        match self {
            AbortMode::Auto => "auto",
            AbortMode::On => "on",
            AbortMode::Off => "off",
        }
    }
}

/// `upstream.abort.id_format`: the id `{id}` stands for in the abort URL and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortIdFormat {
    /// The id vLLM's OpenAI server gives the request and its abort endpoint expects:
    /// `chatcmpl-<X-Request-Id>` for chat completions, `cmpl-<X-Request-Id>-0` for completions
    /// (one prompt per request).
    Vllm,
    /// The `X-Request-Id` the gateway sent, unchanged (engines that key requests by it).
    AsSent,
}

/// HTTP method for the abort call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortMethod {
    /// `POST` (vLLM's `/abort_requests`).
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
    /// `GET`.
    Get,
}

impl AbortMethod {
    /// The method name as sent on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            AbortMethod::Post => "POST",
            AbortMethod::Put => "PUT",
            AbortMethod::Delete => "DELETE",
            AbortMethod::Get => "GET",
        }
    }
}

/// Checks `[upstream]` and `[upstream.abort]`. Never echoes the URL: it may hold a password.
pub(super) fn validate(c: &mut Checker, raw: RawUpstream) -> UpstreamConfig {
    if raw.base_url.is_some() && !raw.replicas.is_empty() {
        c.fail(
            "upstream.base_url",
            "set upstream.base_url (one replica) or [[upstream.replicas]], not both",
        );
    }
    let replicas = replicas::replicas(c, raw.replicas);
    let base_url = match replicas.first() {
        Some(first) => first.url.clone(),
        None => raw.base_url.unwrap_or_else(|| BASE_URL.to_owned()),
    };
    if replicas.is_empty() && !replicas::is_http_url(&base_url) {
        c.fail(
            "upstream.base_url",
            "must be an http:// or https:// URL with a host",
        );
    } else if replicas.is_empty() && replicas::ends_in_v1(&base_url) {
        c.fail("upstream.base_url", replicas::NOT_V1);
    }
    let model = raw.model.unwrap_or_else(|| MODEL.to_owned());
    if model.trim().is_empty() {
        c.fail("upstream.model", "must not be empty");
    }
    let connect = c.ms(
        "upstream.connect_timeout_ms",
        raw.connect_timeout_ms,
        CONNECT_TIMEOUT_MS,
    );
    let first = c.ms(
        "upstream.first_token_timeout_ms",
        raw.first_token_timeout_ms,
        FIRST_TOKEN_TIMEOUT_MS,
    );
    let idle = c.ms(
        "upstream.idle_timeout_ms",
        raw.idle_timeout_ms,
        IDLE_TIMEOUT_MS,
    );
    let total = c.ms(
        "upstream.total_timeout_ms",
        raw.total_timeout_ms,
        TOTAL_TIMEOUT_MS,
    );
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    c.at_most(
        "upstream.connect_timeout_ms",
        ms(connect),
        60_000,
        "60000 (a minute)",
    );
    c.at_most(
        "upstream.total_timeout_ms",
        ms(total),
        86_400_000,
        "86400000 (a day)",
    );
    let health_cache_ms = raw.health_cache_ms.unwrap_or(HEALTH_CACHE_MS);
    c.at_most(
        "upstream.health_cache_ms",
        health_cache_ms,
        60_000,
        "60000 (a minute)",
    );
    for (path, value) in [
        ("upstream.first_token_timeout_ms", first),
        ("upstream.idle_timeout_ms", idle),
    ] {
        if value > total {
            c.fail(path, "must be <= upstream.total_timeout_ms");
        }
    }
    let ca_pem = ca_pem(c, "upstream.ca_file", raw.ca_file);
    let abort = abort(c, raw.abort);
    // Each replica's abort goes to that replica: a fixed URL would send every one to one host,
    // where an id it does not know is answered 200 (the engine's work goes on unseen).
    if replicas.len() > 1 && abort.enabled && !abort.url_template.starts_with("{base_url}") {
        c.fail(
            "upstream.abort.url",
            "must start with {base_url} with several [[upstream.replicas]]: an abort goes to \
             the replica that served the request",
        );
    }
    // A CA file checks a TLS peer: with none the operator believes prompts and the API key are
    // protected that go in the clear.
    let tls = replicas.iter().any(|r| r.url.starts_with("https://"))
        || (replicas.is_empty() && base_url.starts_with("https://"))
        || abort.url_template.starts_with("https://");
    if ca_pem.is_some() && !tls {
        c.fail(
            "upstream.ca_file",
            "needs an https:// upstream.base_url (or replica, or abort URL): with http:// \
             nothing is checked and everything goes in the clear",
        );
    }
    UpstreamConfig {
        base_url: base_url.trim_end_matches('/').to_owned(),
        model,
        max_model_len: c.u32("upstream.max_model_len", raw.max_model_len, MAX_MODEL_LEN),
        connect_timeout: connect,
        first_token_timeout: first,
        idle_timeout: idle,
        total_timeout: total,
        health_cache: Duration::from_millis(health_cache_ms.min(60_000)),
        api_key: api_key(c, raw.api_key_env, raw.api_key_file),
        ca_pem,
        abort,
        replicas,
        routing: replicas::routing(c, raw.routing),
    }
}

/// Checks `[upstream.abort]`: a known mode (not contradicted by the older `enabled`), id format
/// and method, templates that give a URL and valid JSON.
fn abort(c: &mut Checker, raw: RawAbort) -> AbortConfig {
    let named = match raw.mode.as_deref() {
        None => None,
        Some("auto") => Some(AbortMode::Auto),
        Some("on") => Some(AbortMode::On),
        Some("off") => Some(AbortMode::Off),
        Some(_) => {
            c.fail("upstream.abort.mode", "must be one of auto, on, off");
            None
        }
    };
    let mode = match (named, raw.enabled) {
        (None, Some(false)) => AbortMode::Off,
        (Some(m), Some(enabled)) if enabled != (m != AbortMode::Off) => {
            c.fail(
                "upstream.abort.enabled",
                "contradicts upstream.abort.mode; set mode alone (enabled = false is mode = \"off\")",
            );
            m
        }
        (named, _) => named.unwrap_or(ABORT_MODE),
    };
    let id_format = match raw.id_format.as_deref() {
        None => ABORT_ID_FORMAT,
        Some("vllm") => AbortIdFormat::Vllm,
        Some("as_sent") => AbortIdFormat::AsSent,
        Some(_) => {
            c.fail("upstream.abort.id_format", "must be vllm or as_sent");
            ABORT_ID_FORMAT
        }
    };
    let method = match raw.method.as_deref().unwrap_or(ABORT_METHOD) {
        "POST" => AbortMethod::Post,
        "PUT" => AbortMethod::Put,
        "DELETE" => AbortMethod::Delete,
        "GET" => AbortMethod::Get,
        _ => {
            c.fail(
                "upstream.abort.method",
                "must be one of POST, PUT, DELETE, GET",
            );
            AbortMethod::Post
        }
    };
    let config = AbortConfig {
        mode,
        enabled: mode != AbortMode::Off,
        id_format,
        url_template: raw.url.unwrap_or_else(|| ABORT_URL.to_owned()),
        method,
        body_template: raw.body.unwrap_or_else(|| ABORT_BODY.to_owned()),
    };
    if !config.url_template.starts_with("{base_url}")
        && !config.url_template.starts_with("http://")
        && !config.url_template.starts_with("https://")
    {
        c.fail(
            "upstream.abort.url",
            "must start with {base_url}, http:// or https://",
        );
    }
    if !config.body_template.is_empty()
        && serde_json::from_str::<serde_json::Value>(&config.body("id")).is_err()
    {
        c.fail(
            "upstream.abort.body",
            "must be JSON once {id} is substituted (or empty for no body)",
        );
    }
    if config.enabled
        && !config.url_template.contains("{id}")
        && !config.body_template.contains("{id}")
    {
        c.fail(
            "upstream.abort.url",
            "or upstream.abort.body must contain {id}, or the engine cannot tell which request \
             to abort",
        );
    }
    config
}

/// vLLM's API key, from the environment variable `env` or the file `file` (one of them; its
/// surrounding whitespace trimmed). Problems name the key, never its value.
fn api_key(c: &mut Checker, env: Option<String>, file: Option<String>) -> Option<Secret> {
    // A problem with the value is named by the key it came through.
    let from = if file.as_deref().is_some_and(|f| !f.is_empty()) {
        "upstream.api_key_file"
    } else {
        "upstream.api_key_env"
    };
    let key = c.secret(
        ("upstream.api_key_env", env),
        ("upstream.api_key_file", file),
    )?;
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        c.fail(from, "must hold a non-empty key of visible ASCII");
        return None;
    }
    Some(Secret::from(key))
}

/// The PEM certificates in `file` (the config key `key`), checked to hold at least one
/// certificate.
pub(super) fn ca_pem(c: &mut Checker, key: &str, file: Option<String>) -> Option<Vec<u8>> {
    let path = file.filter(|f| !f.is_empty())?;
    match std::fs::read(&path) {
        Ok(pem) if reqwest::Certificate::from_pem_bundle(&pem).is_ok_and(|v| !v.is_empty()) => {
            Some(pem)
        }
        Ok(_) => {
            c.fail(key, "holds no PEM certificate");
            None
        }
        Err(e) => {
            c.fail(key, format!("cannot be read ({})", e.kind()));
            None
        }
    }
}
