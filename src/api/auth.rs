//! API keys and tenants (`[auth]`): the middleware that lets a request through only with a valid
//! key or EventSource token, and `POST /auth/token`.
//!
//! - `Authorization: Bearer <key>`: the key's SHA-256 is looked up among the configured hashes
//!   (`auth.keys` and `auth.keys_file`, the file re-read when it changes); the raw key is never
//!   kept.
//! - `?token=<tenant>.<key id>.<expiry ms>.<hmac>` (a browser `EventSource` cannot set
//!   headers): an HMAC-SHA256 under the token secret, checked in constant time, refused after
//!   its expiry. The key id names the key that minted it (the first 16 hex digits of the
//!   SHA-256 of the key's SHA-256, never the key): a token is valid only while that key is in
//!   force, so revoking a key revokes its tokens at the next reload of the key file. A token is
//!   accepted only where a browser cannot send a header ([`token_route`]: `GET /answer`,
//!   `GET /jobs/{id}/events`), never on `/v1` nor on `POST /auth/token` (a token cannot mint
//!   tokens). The middleware takes `token` out of the URL before anything else sees it (logs,
//!   the `/answer` query parser).
//! - The tenant goes into the request's extensions as [`Tenant`].
//! - A key revoked while its requests are in (its line left the key file) ends them at the
//!   reload that sees it: a request still waiting for its answer gets 401, a stream ends with
//!   an error (`invalid_api_key`), and with the stream goes the engine's work and its seat (the
//!   relay sees its client go). Its tokens' requests likewise.
//!
//! Open routes (no key): `/healthz`, `/health`, `/ping`, `/version`, `/v1/models`, `/metrics`,
//! `/readyz`, `/demo` (a static page; its `/answer` calls need a key), and CORS preflights
//! (answered before this layer).

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::denied::{self, Denial};
use crate::config::{one_tenant_per_key, parse_keys, AuthConfig, KeyEntry};
use crate::error::GatewayError;
use crate::sign::{hmac_hex, same, sha256_hex};

pub use crate::pipeline::Tenant;

/// Routes that never need a key.
const OPEN: &[&str] = &[
    "/healthz",
    "/health",
    "/ping",
    "/version",
    "/v1/models",
    "/metrics",
    "/readyz",
    "/demo",
];

/// Hex digits of a key id (see [`key_id`]).
const KEY_ID_LEN: usize = 16;

/// Whether a `?token=` may stand in for a key on `method` `path`: only the `GET` routes a
/// browser `EventSource` opens (`/answer`, `/jobs/{id}/events`).
pub fn token_route(method: &axum::http::Method, path: &str) -> bool {
    if method != axum::http::Method::GET {
        return false;
    }
    if path == "/answer" {
        return true;
    }
    path.strip_prefix("/jobs/")
        .and_then(|rest| rest.strip_suffix("/events"))
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// The id a token carries for the key whose SHA-256 is `key_sha256`: not secret (derived from
/// the hash the config already holds), short, and never the key.
pub fn key_id(key_sha256: &str) -> String {
    let mut id = sha256_hex(format!("tutor-gateway key id:{key_sha256}").as_bytes());
    id.truncate(KEY_ID_LEN);
    id
}

/// The keys in force and the token signer. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Auth(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    enabled: bool,
    /// SHA-256 hex -> tenant: the config's keys and the key file's.
    keys: RwLock<HashMap<String, String>>,
    /// Key id ([`key_id`]) -> tenant, of the same keys: the tokens that may still be used.
    key_ids: RwLock<HashMap<String, String>>,
    /// Key id -> when (ms since the epoch) it last left the keys in force (removed, or moved
    /// to another tenant): a token it minted before then stays dead if the key comes back.
    revoked_at: RwLock<HashMap<String, u64>>,
    config_keys: Vec<KeyEntry>,
    file: Option<PathBuf>,
    secret: TokenSecret,
    ttl: Duration,
    /// Bumped each time the keys in force are replaced: requests in flight look again.
    installed: tokio::sync::watch::Sender<u64>,
    /// `tutor_gateway_key_file_refused`: 1 while the key file's last look was refused.
    refused: prometheus::IntGauge,
}

/// The token signing secret: never in debug output (the jobs' context, which holds the keys
/// in force, is printed with `{:?}`).
struct TokenSecret(Vec<u8>);

impl std::fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSecret(<redacted>)")
    }
}

/// What the key file's watcher saw: the stamp put in force, and a new one waiting to stay
/// unchanged for a look.
#[derive(Debug, Default)]
struct KeyFileLook {
    started: bool,
    installed: Option<FileStamp>,
    pending: Option<FileStamp>,
}

/// A key file as the watcher tells it apart: its modification time, length and content's
/// SHA-256 (a rotation deployed with the times kept, `cp -p` or `rsync -t`, has the same time
/// and, key for key, the same length).
type FileStamp = (SystemTime, u64, String);

/// `path`'s stamp; `None` when it cannot be read.
fn stamp_of(path: &std::path::Path) -> Option<FileStamp> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let bytes = std::fs::read(path).ok()?;
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    Some((modified, len, sha256_hex(&bytes)))
}

impl Auth {
    /// Keys from `config` (and its key file, re-read every `config.reload` until `stop`).
    pub fn start(config: &AuthConfig, stop: CancellationToken) -> Self {
        let refused = prometheus::IntGauge::new("tutor_gateway_key_file_refused", "detached")
            .expect("valid gauge");
        Self::start_counted(config, stop, refused)
    }

    /// [`Auth::start`], a refused key file shown in `refused`
    /// (`tutor_gateway_key_file_refused`).
    pub fn start_counted(
        config: &AuthConfig,
        stop: CancellationToken,
        refused: prometheus::IntGauge,
    ) -> Self {
        let secret = match &config.token_secret {
            Some(s) => s.expose().as_bytes().to_vec(),
            None => {
                let mut random = [0u8; 32];
                rand::fill(&mut random);
                random.to_vec()
            }
        };
        let auth = Auth(Arc::new(Inner {
            enabled: config.enabled,
            keys: RwLock::default(),
            key_ids: RwLock::default(),
            revoked_at: RwLock::default(),
            config_keys: config.keys.clone(),
            file: config.keys_file.clone(),
            secret: TokenSecret(secret),
            ttl: config.token_ttl,
            installed: tokio::sync::watch::Sender::new(0),
            refused,
        }));
        let mut look = KeyFileLook::default();
        auth.reload(&mut look);
        if config.enabled && auth.0.file.is_some() {
            let (auth, every) = (auth.clone(), config.reload);
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    // Reading and hashing the file (a slow or network mount) is blocking work:
                    // off the async workers.
                    let reloading = auth.clone();
                    look = tokio::task::spawn_blocking(move || {
                        reloading.reload(&mut look);
                        look
                    })
                    .await
                    .unwrap_or_default();
                }
            });
        }
        auth
    }

    /// Re-reads the key file once it changed (its modification time, length or content) and then stayed
    /// the same for one more look, so a file being written in place (truncated, then written)
    /// is never put in force half-written; the first look at start reads it at once. A file that
    /// cannot be read or parsed, or one that would leave no key in force at all, keeps the keys
    /// in force (logged, never its text).
    fn reload(&self, look: &mut KeyFileLook) {
        let Some(path) = &self.0.file else {
            self.install(Vec::new());
            return;
        };
        let stamp = stamp_of(path);
        let first = !look.started;
        look.started = true;
        if stamp.is_some() && stamp == look.installed {
            return;
        }
        if !first && stamp != look.pending {
            // Changed since the last look: wait one more, unchanged.
            look.pending = stamp;
            return;
        }
        look.installed = stamp;
        match std::fs::read_to_string(path).map_err(|e| e.kind().to_string()) {
            Ok(text) => match parse_keys(&text).and_then(|keys| {
                one_tenant_per_key(self.0.config_keys.iter().chain(&keys)).map(|()| keys)
            }) {
                Ok(keys) if !first && keys.is_empty() && self.0.config_keys.is_empty() => {
                    self.0.refused.set(1);
                    tracing::warn!(
                        "the key file has no key, which would refuse every client; keeping the \
                         keys in force (turn [auth] off, or leave one key, to mean it)"
                    )
                }
                Ok(keys)
                    if first
                        && self.0.enabled
                        && keys.is_empty()
                        && self.0.config_keys.is_empty() =>
                {
                    self.install(keys);
                    self.0.refused.set(0);
                    tracing::warn!(
                        "the key file has no key: every client is refused (401) until one is \
                         added to it (it is watched)"
                    )
                }
                Ok(keys) => {
                    let n = keys.len();
                    self.install(keys);
                    self.0.refused.set(0);
                    tracing::info!(keys = n, "API keys loaded");
                }
                Err(e) if first && self.0.enabled && self.0.config_keys.is_empty() => {
                    self.0.refused.set(1);
                    tracing::warn!(
                        error = %e,
                        "the key file is invalid: no key is in force, every client is refused (401) \
                         until it is mended (it is watched)"
                    )
                }
                Err(e) => {
                    self.0.refused.set(1);
                    tracing::warn!(error = %e, "the key file is invalid; keeping the keys in force");
                    if first {
                        // At start the keys in force are the config's.
                        self.install(Vec::new());
                    }
                }
            },
            Err(e) if first && self.0.enabled && self.0.config_keys.is_empty() => {
                self.0.refused.set(1);
                tracing::warn!(
                    error = %e,
                    "the key file cannot be read: no key is in force, every client is refused \
                     (401) until it can be (it is watched)"
                )
            }
            Err(e) => {
                self.0.refused.set(1);
                tracing::warn!(error = %e, "the key file cannot be read; keeping the keys in force");
                if first {
                    // At start the keys in force are the config's.
                    self.install(Vec::new());
                }
            }
        }
    }

    fn install(&self, file_keys: Vec<KeyEntry>) {
        let all = || self.0.config_keys.iter().chain(&file_keys);
        let keys = all()
            .map(|k| (k.sha256.clone(), k.tenant.clone()))
            .collect();
        let key_ids: HashMap<String, String> = all()
            .map(|k| (key_id(&k.sha256), k.tenant.clone()))
            .collect();
        // The keys' ids and tenants first, the keys that authenticate last: a request that
        // authenticates with a key just put in force (or moved) finds it in force for the
        // tenant it authenticated as, never "revoked" for a moment (401) while the maps
        // disagree. A key just removed may still authenticate meanwhile; it is then revoked.
        let old = std::mem::replace(
            &mut *self.0.key_ids.write().unwrap_or_else(|e| e.into_inner()),
            key_ids.clone(),
        );
        let now = Self::now_ms();
        let mut revoked_at = self.0.revoked_at.write().unwrap_or_else(|e| e.into_inner());
        for (id, tenant) in old {
            if key_ids.get(&id) != Some(&tenant) {
                revoked_at.insert(id, now);
            }
        }
        drop(revoked_at);
        *self.0.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        self.0.installed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether the key with id `id` is in force, still for `tenant`.
    fn in_force(&self, id: &str, tenant: &str) -> bool {
        let key_ids = self.0.key_ids.read().unwrap_or_else(|e| e.into_inner());
        key_ids.get(id).is_some_and(|t| t == tenant)
    }

    /// Whether the key with id `id` left the keys in force (removed, or moved to another
    /// tenant) at `at_ms` or later, as this replica saw it.
    fn left_since(&self, id: &str, at_ms: u64) -> bool {
        let revoked_at = self.0.revoked_at.read().unwrap_or_else(|e| e.into_inner());
        revoked_at.get(id).is_some_and(|&left| at_ms <= left)
    }

    /// Resolves once the key with id `id` is no longer in force for `tenant` (never, while it
    /// is): removed, or moved to another tenant (whose requests these are not).
    async fn revoked(self, id: String, tenant: String) {
        let mut installed = self.0.installed.subscribe();
        loop {
            if !self.in_force(&id, &tenant) {
                return;
            }
            if installed.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// The tenant and key id of `key`, when it is in force.
    fn key(&self, key: &str) -> Option<(String, String)> {
        let keys = self.0.keys.read().unwrap_or_else(|e| e.into_inner());
        let hash = sha256_hex(key.as_bytes());
        let tenant = keys.get(&hash)?.clone();
        Some((tenant, key_id(&hash)))
    }

    fn now_ms() -> u64 {
        let ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// A token for `tenant`, minted by the key with id `key_id`, valid for the configured time.
    fn issue(&self, tenant: &str, key_id: &str) -> (String, u64) {
        let ttl = u64::try_from(self.0.ttl.as_millis()).unwrap_or(u64::MAX);
        let expiry = Self::now_ms().saturating_add(ttl);
        let payload = format!("{tenant}.{key_id}.{expiry}");
        let mac = hmac_hex(&self.0.secret.0, &[payload.as_bytes()]);
        (format!("{payload}.{mac}"), expiry)
    }

    /// The tenant of a valid, unexpired token whose key is still in force, and that key's id.
    fn tenant_of_token(&self, token: &str) -> Result<(String, String), &'static str> {
        const MALFORMED: &str = "the token is malformed";
        let (payload, mac) = token.rsplit_once('.').ok_or(MALFORMED)?;
        let mut parts = payload.split('.');
        let (Some(tenant), Some(id), Some(expiry), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(MALFORMED);
        };
        if !same(&hmac_hex(&self.0.secret.0, &[payload.as_bytes()]), mac) {
            return Err("the token is not valid here");
        }
        let expiry: u64 = expiry.parse().map_err(|_| MALFORMED)?;
        if Self::now_ms() > expiry {
            return Err("the token has expired; ask POST /auth/token for a new one");
        }
        const REVOKED: &str = "the key that issued this token was revoked";
        let key_ids = self.0.key_ids.read().unwrap_or_else(|e| e.into_inner());
        if key_ids.get(id).is_none_or(|owner| owner != tenant) {
            return Err(REVOKED);
        }
        drop(key_ids);
        // Minted before its key last left the keys in force: dead for good, even with the key
        // back (every token a key minted dies with it).
        let ttl = u64::try_from(self.0.ttl.as_millis()).unwrap_or(u64::MAX);
        if self.left_since(id, expiry.saturating_sub(ttl)) {
            return Err(REVOKED);
        }
        Ok((tenant.to_owned(), id.to_owned()))
    }
}

impl crate::pipeline::tenant::KeysInForce for Auth {
    fn in_force(&self, key_id: &str, tenant: &str) -> bool {
        Auth::in_force(self, key_id, tenant)
    }

    fn in_force_since(&self, key_id: &str, tenant: &str, since_ms: u64) -> bool {
        Auth::in_force(self, key_id, tenant) && !self.left_since(key_id, since_ms)
    }

    fn revoked(&self, key_id: &str, tenant: &str) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.clone().revoked(key_id.to_owned(), tenant.to_owned()))
    }
}

/// How a request proved who it is; in the request's extensions next to [`Tenant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// An API key in force, with its key id ([`key_id`]).
    Key(String),
    /// A `?token=` (which cannot mint tokens), with the id of the key that minted it.
    Token(String),
}

impl Credential {
    /// The id of the key behind it.
    fn key_id(&self) -> &str {
        match self {
            Credential::Key(id) | Credential::Token(id) => id,
        }
    }
}

/// The bearer key of `headers`, if it has an `Authorization` header (its scheme in any case,
/// as HTTP has it); `Err` with what is wrong for a header that cannot be read as one key: two
/// of them (which one counts would be a guess), bytes that are not text, another scheme.
pub fn bearer(headers: &HeaderMap) -> Result<Option<&str>, &'static str> {
    let mut all = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err("send one Authorization header, not several");
    }
    const FORM: &str = "the Authorization header must be: Bearer <key>";
    let value = value.to_str().map_err(|_| FORM)?;
    match value.trim().split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") && !key.trim().is_empty() => {
            Ok(Some(key.trim()))
        }
        _ => Err(FORM),
    }
}

/// `uri` without its `token` query parameter, and that parameter.
fn take_token(uri: &Uri) -> (Uri, Option<String>) {
    let Some(query) = uri.query() else {
        return (uri.clone(), None);
    };
    let mut token = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("token=") {
            Some(t) => {
                token = Some(t.to_owned());
                false
            }
            None => true,
        })
        .collect();
    let path_and_query = if rest.is_empty() {
        uri.path().to_owned()
    } else {
        format!("{}?{}", uri.path(), rest.join("&"))
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = path_and_query.parse().ok();
    (
        Uri::from_parts(parts).unwrap_or_else(|_| uri.clone()),
        token,
    )
}

/// The middleware: a valid key or token, or 401.
pub async fn require(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    if !auth.0.enabled || OPEN.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let (uri, token) = take_token(req.uri());
    *req.uri_mut() = uri;
    let key = match bearer(req.headers()) {
        Ok(key) => key,
        // A header that is no key of ours (a proxy's Basic auth, say) beside a ?token=: the
        // token speaks.
        Err(_) if token.is_some() => None,
        Err(why) => return denied::mark(GatewayError::Unauthorized(why), Denial::Auth),
    };
    let tenant = match (key, token) {
        (Some(key), _) => auth
            .key(key)
            .map(|(tenant, id)| (tenant, Credential::Key(id)))
            .ok_or_else(|| match auth.tenant_of_token(key) {
                // One of our tokens sent as a key: say where a token goes.
                Ok(_) => {
                    "that is a token from POST /auth/token, not an API key: a token is accepted \
                     only as ?token= on GET /answer and GET /jobs/{id}/events; send \
                     Authorization: Bearer <key> here"
                }
                Err(_) => "the API key is not valid (unknown or revoked)",
            }),
        (None, Some(_)) if !token_route(req.method(), req.uri().path()) => Err(
            "a ?token= is accepted only on GET /answer and GET /jobs/{id}/events (it cannot \
             mint tokens); send Authorization: Bearer <key> here",
        ),
        (None, Some(token)) => auth
            .tenant_of_token(&token)
            .map(|(tenant, id)| (tenant, Credential::Token(id))),
        (None, None) => Err(
            "an API key is required: Authorization: Bearer <key>, or ?token= from POST /auth/token",
        ),
    };
    match tenant {
        Ok((tenant, credential)) => {
            let id = credential.key_id().to_owned();
            let events = if req.uri().path().starts_with("/v1/") {
                RevokedEvent::OpenAi
            } else {
                RevokedEvent::Gateway
            };
            req.extensions_mut().insert(Tenant(tenant.clone()));
            req.extensions_mut().insert(credential);
            // Until the key is revoked: a request still waiting for its answer gets 401.
            let revoked = auth.clone().revoked(id.clone(), tenant.clone());
            // The key this request came with, for the work that outlives it (a job).
            let caller = crate::pipeline::tenant::CallerKey::new(
                id.clone(),
                tenant.clone(),
                std::sync::Arc::new(auth.clone()),
            );
            let handled = crate::pipeline::tenant::with_caller_key(caller, next.run(req));
            let resp = tokio::select! {
                biased;
                () = revoked => return GatewayError::Unauthorized(REVOKED).into_response(),
                resp = handled => resp,
            };
            // A stream whose key left while it was starting (the key maps are written before
            // the revocation wakes anyone) is dropped (its work stops) and the request gets
            // 401, not a 200 that ends at once. A whole answer is given: its work is done (a
            // job accepted goes on to fail for its key).
            let streaming = axum::body::HttpBody::size_hint(resp.body())
                .exact()
                .is_none();
            if streaming && !auth.in_force(&id, &tenant) {
                drop(resp);
                return GatewayError::Unauthorized(REVOKED).into_response();
            }
            until_revoked(resp, auth, (id, tenant), events)
        }
        Err(why) => denied::mark(GatewayError::Unauthorized(why), Denial::Auth),
    }
}

/// Why a request of a key revoked while it was in flight ends.
const REVOKED: &str = crate::pipeline::tenant::KEY_REVOKED;

/// How a stream says it ended for a revoked key.
#[derive(Debug, Clone, Copy)]
enum RevokedEvent {
    /// `/v1`: `data: {"error": …}` then `data: [DONE]`, as a `/v1` stream's other errors.
    OpenAi,
    /// `/answer` and job events: `event: error` with `{"code","message"}`.
    Gateway,
}

/// `resp`, whose body (a stream) ends when the key with id `id` is revoked (for `tenant`): for an event
/// stream, after one last event saying so. Dropping the body stops the request's work (the
/// relay sees its client go: the engine's work is aborted, the seat given back).
fn until_revoked(
    resp: Response,
    auth: Auth,
    (id, tenant): (String, String),
    events: RevokedEvent,
) -> Response {
    if axum::body::HttpBody::size_hint(resp.body())
        .exact()
        .is_some()
    {
        // A whole body: nothing left running.
        return resp;
    }
    let event_stream = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let last = event_stream.then(|| {
        let error = GatewayError::Unauthorized(REVOKED);
        match events {
            RevokedEvent::OpenAi => format!("data: {}\n\ndata: [DONE]\n\n", error.body()),
            RevokedEvent::Gateway => format!(
                "event: error\ndata: {}\n\n",
                json!({"code": error.code(), "message": REVOKED})
            ),
        }
    });
    let revoked = async move {
        auth.revoked(id, tenant).await;
        tracing::info!("a stream ended: its API key was revoked");
    };
    resp.map(|body| {
        axum::body::Body::from_stream(super::ending::until(
            body.into_data_stream(),
            revoked,
            last.map(|l| Ok(axum::body::Bytes::from(l))),
        ))
    })
}

/// `POST /auth/token` (with a key, never a token): `{"token","tenant","expires_at_ms"}` for an
/// `EventSource`; the token names the key and dies with it.
pub async fn token(
    State(auth): State<Auth>,
    tenant: Option<Extension<Tenant>>,
    credential: Option<Extension<Credential>>,
) -> Response {
    match (tenant, credential) {
        (Some(Extension(Tenant(tenant))), Some(Extension(Credential::Key(id)))) => {
            let (token, expiry) = auth.issue(&tenant, &id);
            let mut resp =
                axum::Json(json!({"token": token, "tenant": tenant, "expires_at_ms": expiry}))
                    .into_response();
            // A bearer credential: never stored by any cache.
            resp.headers_mut().insert(
                header::CACHE_CONTROL,
                axum::http::HeaderValue::from_static("no-store"),
            );
            resp
        }
        (Some(_), _) => GatewayError::Unauthorized(
            "a token cannot mint tokens: POST /auth/token needs Authorization: Bearer <key>",
        )
        .into_response(),
        (None, _) => GatewayError::bad_request(
            "auth is switched off here (auth.enabled = false): no token is needed",
            None,
        )
        .into_response(),
    }
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
