//! A job's webhook: the `notify` URL checked against `jobs.webhook_allow` at submission, and the
//! signed delivery of the result when the job ends.
//!
//! The request is a `POST` of the job's status JSON (as `GET /jobs/{id}` shows it, answer
//! included) with `content-type: application/json`, `x-tutor-job-id`, and
//! `x-tutor-signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` under
//! `jobs.webhook_secret`. A receiver recomputes the HMAC over the exact body bytes and refuses
//! old timestamps (replays). A 2xx delivers it; any other status, a timeout or a connection error
//! is retried after `jobs.webhook_backoff`, doubled each time and drawn between half and all of
//! it (jitter), up to `jobs.webhook_attempts` attempts. Redirects are not followed.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::Rng;
use serde_json::Value;

use super::context::Context;
use super::entry::{unix, Attempt, Webhook};
use crate::config::{JobsConfig, WebhookPattern};
use crate::error::GatewayError;
use crate::sign::hmac_hex;

/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-tutor-signature";

/// The longest `notify` URL accepted, in bytes: a job keeps it (and shows its delivery) until
/// the job is forgotten, and an allowed path pattern says nothing of the query.
pub const MAX_NOTIFY_BYTES: usize = 2048;

/// `notify` as a URL that matches one of `allow`; 400 naming `notify` otherwise (the URL itself
/// is not echoed).
pub fn check_notify(raw: &Value, allow: &[WebhookPattern]) -> Result<reqwest::Url, GatewayError> {
    let bad = |why: &str| GatewayError::bad_request(format!("`notify` {why}"), Some("notify"));
    let text = raw.as_str().ok_or_else(|| bad("must be a URL string"))?;
    if text.len() > MAX_NOTIFY_BYTES {
        return Err(bad(&format!("is longer than {MAX_NOTIFY_BYTES} bytes")));
    }
    if allow.is_empty() {
        return Err(bad(
            "is not accepted here: no webhook destinations are allowed (jobs.webhook_allow)",
        ));
    }
    let url = reqwest::Url::parse(text).map_err(|_| bad("is not a valid URL"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("must not carry user information"));
    }
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return Err(bad("must have a host"));
    };
    // An encoded `/`, `\` or `.` could take a decoding receiver out of the allowed path; so
    // could an encoded `%` (`%252e%252e`: `..` to a receiver that decodes twice), and a path
    // parameter (`/tutor/..;/admin`: Tomcat and Spring drop `;...` from a segment, then resolve
    // the `..` the URL parser left alone).
    let path = url.path().to_ascii_lowercase();
    if ["%2f", "%5c", "%2e", "%25"]
        .iter()
        .any(|e| path.contains(e))
    {
        return Err(bad(
            "must not carry encoded `/`, `\\`, `.` or `%` in its path",
        ));
    }
    if path.contains(';') {
        return Err(bad("must not carry `;` (path parameters) in its path"));
    }
    let host = host.to_ascii_lowercase();
    if allow
        .iter()
        .any(|p| p.matches(url.scheme(), &host, port, url.path()))
    {
        Ok(url)
    } else {
        Err(bad(
            "does not match any allowed webhook destination (jobs.webhook_allow)",
        ))
    }
}

/// The webhook client: no redirects (an allowed host cannot send the gateway elsewhere), each
/// attempt bounded by `jobs.webhook_timeout`, and (unless `jobs.webhook_allow_private`) host
/// names resolved to public addresses only ([`PublicOnly`]). No proxy from the environment
/// (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`): a proxy resolves the host itself, out of
/// [`PublicOnly`]'s sight, and a loopback receiver's signed result would leave the machine.
/// `None` when the client cannot be built (its TLS set-up failed): every delivery then fails,
/// logged, rather than go out through a client without these guards.
pub fn client(config: &JobsConfig) -> Option<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(config.webhook_timeout)
        .no_proxy();
    let builder = if config.webhook_allow_private {
        builder
    } else {
        builder.dns_resolver(Arc::new(PublicOnly))
    };
    match builder.build() {
        Ok(client) => Some(client),
        Err(e) => {
            tracing::error!(error = %e, "the webhook client cannot be built: no webhook will be delivered");
            None
        }
    }
}

/// Resolves a webhook's host name and keeps only public addresses: the allow-list names
/// hosts, and whoever controls a listed name's DNS could point it at the gateway's own host,
/// the cloud metadata service (169.254.169.254) or the private network. An IP literal on the
/// allow-list is not resolved (an explicit choice of the operator).
#[derive(Debug)]
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| public(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(
                    "the webhook host resolves to no public address (jobs.webhook_allow_private)"
                        .into(),
                );
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether `ip` is a public unicast address: not loopback, unspecified, link-local, private
/// (RFC 1918, shared 100.64/10, unique-local fc00::/7, site-local fec0::/10), broadcast,
/// documentation, multicast or reserved, nor an IPv6 address carrying an IPv4 one (mapped,
/// compatible, translated, NAT64, 6to4, Teredo).
fn public(ip: IpAddr) -> bool {
    let v4 = match ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4,
            None => {
                let s = v6.segments();
                let [first, second, ..] = s;
                // NAT64 (64:ff9b::/96, 64:ff9b:1::/48), 6to4 (2002::/16), Teredo (2001::/32),
                // IPv4-compatible (::a.b.c.d, deprecated) and IPv4-translated (::ffff:0:a.b.c.d)
                // addresses carry an IPv4 address (a translating network maps the metadata
                // service into them); site-local (fec0::/10, deprecated) is private: not public.
                let compatible = s[..6] == [0; 6];
                let translated = s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0;
                return !(v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || (first & 0xfe00) == 0xfc00
                    || (first & 0xffc0) == 0xfe80
                    || (first & 0xffc0) == 0xfec0
                    || (first == 0x64 && (second == 0xff9b))
                    || first == 0x2002
                    || (first == 0x2001 && second == 0)
                    || compatible
                    || translated);
            }
        },
    };
    let [a, b, ..] = v4.octets();
    !(v4.is_loopback()
        || v4.is_unspecified()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_broadcast()
        || v4.is_documentation()
        || v4.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments (192.0.0/24), benchmarking (198.18/15), reserved (240/4).
        || (a == 192 && b == 0 && v4.octets()[2] == 0)
        || (a == 198 && (b & 0xfe) == 18)
        || a >= 240)
}

/// `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn signature(secret: &[u8], t: u64, body: &[u8]) -> String {
    let mac = hmac_hex(secret, &[t.to_string().as_bytes(), b".", body]);
    format!("t={t},v1={mac}")
}

/// The body POSTed for a job: its `status` (as `GET /jobs/{id}` shows it) with the URL it is
/// sent to (`notify`) and the job's tenant (`tenant`, null without `[auth]`), both under the
/// signature: a receiver checks that a delivery was meant for it and for its tenant, so one
/// tenant cannot send its own job's signed result to another's receiver, nor a delivery be
/// replayed to another URL.
pub fn body(mut status: serde_json::Value, url: &reqwest::Url, tenant: Option<&str>) -> String {
    if let Some(o) = status.as_object_mut() {
        o.insert("notify".into(), url.as_str().into());
        o.insert("tenant".into(), tenant.into());
    }
    status.to_string()
}

/// POSTs `body` (a [`body`]), job `id`'s result, to `url`, signed and retried as configured;
/// after each attempt `record` gets the webhook's state so far (kept with the job) and answers
/// whether the job still keeps its result (no retry once it does not: expired, or dropped by a
/// `DELETE`), and the attempt is counted.
pub async fn send<F, Fut>(ctx: &Context, id: &str, url: reqwest::Url, body: String, mut record: F)
where
    F: FnMut(Webhook) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let config = &ctx.config;
    let Some(secret) = config.webhook_secret.as_ref().map(|s| s.expose()) else {
        return;
    };
    let metrics = ctx.metrics();
    let mut webhook = Webhook::default();
    let mut backoff = config.webhook_backoff.min(BACKOFF_MAX);
    let started = tokio::time::Instant::now();
    for attempt in 1..=config.webhook_attempts {
        // Not once the job is no longer kept (a `DELETE` while this waited to retry).
        if attempt > 1 && !record(webhook.clone()).await {
            // Given up with no further attempt: the delivery ends `failed`, as every delivery
            // ends with one `delivered` or `failed`.
            webhook.delivered = Some(false);
            record(webhook.clone()).await;
            metrics.webhook("failed");
            tracing::info!(job = %id, attempt, outcome = "failed", "webhook given up before its next attempt: the job's result was dropped");
            return;
        }
        let at = SystemTime::now();
        let t = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let permit = ctx.webhook_permits.clone().try_acquire_owned().ok();
        let sent = match (&ctx.http, permit) {
            (_, None) => Some(Err(Busy)),
            (Some(http), Some(_permit)) => Some(Ok(http
                .post(url.clone())
                .header("content-type", "application/json")
                .header("x-tutor-job-id", id)
                .header(
                    SIGNATURE_HEADER,
                    signature(secret.as_bytes(), t, body.as_bytes()),
                )
                .body(body.clone())
                .send()
                .await)),
            (None, Some(_)) => None,
        };
        let (status, error) = match &sent {
            Some(Ok(Ok(resp))) => (Some(resp.status().as_u16()), None),
            Some(Ok(Err(e))) if e.is_timeout() => (None, Some("timeout")),
            Some(Ok(Err(_))) => (None, Some("connect")),
            Some(Err(Busy)) => (None, Some("busy")),
            None => (None, Some("no_client")),
        };
        let delivered = status.is_some_and(|s| (200..300).contains(&s));
        let wait = jittered(backoff);
        backoff = backoff.saturating_mul(2).min(BACKOFF_MAX);
        // No attempt after the job's result expires: its status no longer lists them, and the
        // body would be held past the store's bounds.
        let last = attempt == config.webhook_attempts
            || started.elapsed().saturating_add(wait) > config.result_ttl;
        webhook.attempts.push(Attempt {
            at: unix(at),
            status,
            error,
        });
        if delivered || last {
            webhook.delivered = Some(delivered);
        }
        // Nor after a DELETE dropped it: given up as at its expiry.
        let kept = record(webhook.clone()).await;
        if !kept && webhook.delivered.is_none() {
            webhook.delivered = Some(false);
            record(webhook.clone()).await;
        }
        let last = last || !kept;
        let outcome = match (delivered, last) {
            (true, _) => "delivered",
            (false, false) => "retried",
            (false, true) => "failed",
        };
        metrics.webhook(outcome);
        tracing::info!(job = %id, attempt, status, error, outcome, "webhook attempt");
        if delivered || last {
            return;
        }
        tokio::select! {
            _ = ctx.stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Webhook attempts out at once, for every job together: a receiver that takes the connection
/// and never answers holds each attempt's socket to `jobs.webhook_timeout`, and a loop of
/// submits and `DELETE`s ends a job (a webhook) per round. An attempt that finds them all out
/// fails as `busy` and is retried as any failed attempt.
pub const MAX_ATTEMPTS_OUT: usize = 64;

/// An attempt not made: [`MAX_ATTEMPTS_OUT`] were out.
struct Busy;

/// The semaphore of [`MAX_ATTEMPTS_OUT`] permits.
pub fn permits() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_ATTEMPTS_OUT))
}

/// The longest wait between two attempts of a webhook (the doubling stops there).
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// A delay drawn between half of `d` and `d`.
fn jittered(d: Duration) -> Duration {
    let ms = d.as_millis().min(u128::from(u64::MAX)) as u64;
    Duration::from_millis(rand::rng().random_range(ms / 2..=ms.max(1)))
}

#[cfg(test)]
mod tests {
    use super::{public, signature};

    /// With every permit out (a receiver holding sockets open for other jobs), an attempt is
    /// not made: listed as `busy`, and given up here as the last of one.
    #[tokio::test]
    async fn an_attempt_past_the_sockets_out_is_not_made() {
        use std::sync::{Arc, Mutex};
        let mut config = crate::config::Config::default();
        config.jobs.webhook_secret = Some("a-test-secret-of-32-bytes-length".into());
        config.jobs.webhook_attempts = 1;
        let tasks = tokio_util::task::TaskTracker::new();
        let state = crate::pipeline::AppState::for_tests(config, tasks.clone());
        let ctx = super::Context {
            http: super::client(&state.config().jobs),
            webhook_permits: super::permits(),
            config: state.config().jobs.clone(),
            state,
            stop: tokio_util::sync::CancellationToken::new(),
            tasks,
            wake: tokio::sync::Notify::new(),
            resuming: std::sync::atomic::AtomicUsize::new(0),
            keys: None,
            engine_pause: std::sync::Mutex::default(),
        };
        let held = ctx
            .webhook_permits
            .clone()
            .acquire_many_owned(super::MAX_ATTEMPTS_OUT as u32)
            .await
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let send = |seen: Arc<Mutex<Vec<_>>>| {
            // Nothing listens there: an attempt made fails to connect.
            let url = reqwest::Url::parse("http://127.0.0.1:9/hooks/x").unwrap();
            super::send(&ctx, "j", url, "{}".into(), move |w| {
                seen.lock().unwrap().push(w);
                async { true }
            })
        };
        send(seen.clone()).await;
        let errors = |seen: &Mutex<Vec<crate::jobs::entry::Webhook>>| -> Vec<Option<&'static str>> {
            let w = seen.lock().unwrap();
            w.last().unwrap().attempts.iter().map(|a| a.error).collect()
        };
        assert_eq!(errors(&seen), [Some("busy")]);
        assert_eq!(seen.lock().unwrap().last().unwrap().delivered, Some(false));
        drop(held);
        let seen = Arc::new(Mutex::new(Vec::new()));
        send(seen.clone()).await;
        assert_eq!(
            errors(&seen),
            [Some("connect")],
            "made once a permit is free"
        );
    }

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            // The metadata service through NAT64 and 6to4; benchmarking and reserved space.
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "198.18.0.1",
            "198.19.255.1",
            "240.0.0.1",
            // The metadata service as IPv4-compatible, IPv4-translated and Teredo addresses;
            // site-local; the IETF's 192.0.0/24.
            "::a9fe:a9fe",
            "::ffff:0:a9fe:a9fe",
            "2001:0:4136:e378:8000:63bf:56fe:5601",
            "fec0::1",
            "192.0.0.8",
        ] {
            assert!(!public(private.parse().unwrap()), "{private}");
        }
        for open in [
            "93.184.216.34",
            "2606:2800:220:1::1",
            "8.8.8.8",
            "198.20.0.1",
        ] {
            assert!(public(open.parse().unwrap()), "{open}");
        }
    }

    #[test]
    fn signature_is_the_hmac_of_timestamp_dot_body() {
        // The expected value comes from an independent HMAC-SHA256
        // (python3 -c 'import hmac,hashlib; print(hmac.new(b"Jefe", b"1700000000.{}", hashlib.sha256).hexdigest())').
        let sig = signature(b"Jefe", 1_700_000_000, b"{}");
        assert_eq!(
            sig,
            "t=1700000000,v1=d3793e2b4103edfbd98cc19591832f5fad701d413db9fcae0ae7dab8184ed207"
        );
        assert_ne!(sig, signature(b"Jefe", 1_700_000_000, b"{ }"));
        assert_ne!(sig, signature(b"Jefx", 1_700_000_000, b"{}"));
    }
}
