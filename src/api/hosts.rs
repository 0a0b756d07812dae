//! Which names a listener answers to (`server.allowed_hosts`): the defence against DNS
//! rebinding.
//!
//! A page on `evil.example` can make its name resolve to the gateway's address (127.0.0.1 on a
//! developer's machine, a campus address behind the firewall). The browser then treats the
//! gateway as `evil.example` itself: its GETs carry no `Origin` and its `Sec-Fetch-Site` says
//! `same-origin`, so no CORS rule stops them, and the page reads the answers. What it cannot
//! change is the `Host` header (HTTP/2: `:authority`), which names `evil.example`. A request
//! whose host is not one the listener answers to gets 403 `host_not_allowed` before anything
//! else.
//!
//! - `server.allowed_hosts` set: those names only (`*.example.edu`: any name under it; `*`:
//!   any name).
//! - Not set, on a loopback address (the default `127.0.0.1:8080`): `localhost` and names
//!   under `.localhost` only.
//! - Any IP address, whatever the list: rebinding needs a DNS name, and a page whose origin is
//!   an address the gateway listens on is the gateway's own (probes and scrapes by a pod's
//!   address pass).
//! - Not set, on any other address: any name (the names a deployment is reached by cannot be
//!   guessed; set the list).
//!
//! A request without any host (HTTP/1.0) is not a browser's and goes on.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use super::denied::{self, Denial};
use crate::error::GatewayError;

/// The names one listener answers to.
#[derive(Debug, Clone)]
pub enum Hosts {
    /// Any name.
    Any,
    /// `localhost`, `*.localhost` and loopback addresses.
    Loopback,
    /// These names (lower case; `*.suffix` entries match names under the suffix).
    Listed(Arc<Vec<String>>),
}

impl Hosts {
    /// The rule for a listener on `listen` with `server.allowed_hosts` = `listed` (validated).
    pub fn new(listed: &[String], listen: SocketAddr) -> Self {
        if listed.iter().any(|h| h == "*") {
            Self::Any
        } else if !listed.is_empty() {
            Self::Listed(Arc::new(listed.to_vec()))
        } else if listen.ip().to_canonical().is_loopback() {
            Self::Loopback
        } else {
            Self::Any
        }
    }

    /// Whether a request naming `authority` (a `Host` header's value) is answered. An IP
    /// address always is: rebinding needs a DNS name, and a page whose origin is the address
    /// itself is the gateway's own (so probes and scrapes by pod address pass whatever names
    /// are listed).
    pub fn allows(&self, authority: &str) -> bool {
        if matches!(self, Self::Any) {
            return true;
        }
        let Some(name) = host_name(authority) else {
            return false;
        };
        if name.parse::<IpAddr>().is_ok() {
            return true;
        }
        match self {
            Self::Any => true,
            Self::Loopback => loopback(&name),
            Self::Listed(names) => names.iter().any(|n| matches(n, &name)),
        }
    }
}

/// The name in a `Host` value: lower case, without its port, brackets or final dot; `None` for
/// a value that is no host.
fn host_name(authority: &str) -> Option<String> {
    let authority = authority.trim();
    let name = if let Some(rest) = authority.strip_prefix('[') {
        // An IPv6 literal: `[::1]` or `[::1]:8080`.
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(port)) {
            return None;
        }
        inside
    } else {
        match authority.rsplit_once(':') {
            Some((name, p)) if port(p) => name,
            Some(_) => return None,
            None => authority,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let fine = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    fine.then_some(name)
}

fn port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// `localhost`, a name under `.localhost` (which resolves to loopback only, RFC 6761), or a
/// loopback address.
fn loopback(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// Whether the listed `entry` (`name` or `*.suffix`) matches `name`.
fn matches(entry: &str, name: &str) -> bool {
    match entry.strip_prefix("*.") {
        Some(suffix) => name
            .strip_suffix(suffix)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => entry == name,
    }
}

/// The middleware: 403 `host_not_allowed` for a request naming a host the listener does not
/// answer to (every host it names: the `Host` header and HTTP/2's `:authority`).
pub async fn check(State(hosts): State<Hosts>, req: Request, next: Next) -> Response {
    let headers = req.headers().get_all(header::HOST);
    let named = headers
        .iter()
        .map(|v| v.to_str().ok())
        .chain(req.uri().authority().map(|a| Some(a.as_str())));
    for host in named {
        if !host.is_some_and(|h| hosts.allows(h)) {
            return denied::mark(GatewayError::HostNotAllowed, Denial::Host);
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::allowed_host;

    fn rule(listed: &[&str], listen: &str) -> Hosts {
        let listed: Vec<String> = listed
            .iter()
            .map(|h| allowed_host(h).expect("a valid entry"))
            .collect();
        Hosts::new(&listed, listen.parse().unwrap())
    }

    #[test]
    fn a_loopback_listener_answers_only_to_loopback_names_by_default() {
        let hosts = rule(&[], "127.0.0.1:8080");
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:80",
            "localhost.:8080",
            "app.localhost:3000",
            "127.1.2.3",
            "[::1]:8080",
            "[::ffff:127.0.0.1]",
            // An address is never a rebound name: a page whose origin it is, is the gateway's.
            "10.0.0.1:8080",
            "[::2]",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "",
            "localhost:80:80",
            "local host",
            "[::1]x",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
        assert!(matches!(rule(&[], "[::1]:8080"), Hosts::Loopback));
    }

    #[test]
    fn another_listener_answers_to_any_name_unless_listed() {
        assert!(rule(&[], "0.0.0.0:8080").allows("tutor.example.edu"));
        assert!(rule(&[], "10.1.2.3:8080").allows("evil.example"));
        assert!(rule(&["*"], "127.0.0.1:8080").allows("evil.example"));
        let listed = rule(
            &["Tutor.Example.edu", "*.campus.edu", "10.0.0.5"],
            "127.0.0.1:80",
        );
        for ok in [
            "tutor.example.edu",
            "TUTOR.example.edu:443",
            "gw.campus.edu",
            "a.b.campus.edu.",
            "10.0.0.5:8080",
            // A probe or a scrape by the pod's address.
            "192.168.1.7:9091",
        ] {
            assert!(listed.allows(ok), "{ok}");
        }
        for refused in ["campus.edu", "evilcampus.edu", "example.edu", "localhost"] {
            assert!(!listed.allows(refused), "{refused}");
        }
    }

    #[test]
    fn entries_are_names_addresses_or_wildcards() {
        assert_eq!(
            allowed_host("Tutor.Example.EDU.").as_deref(),
            Some("tutor.example.edu")
        );
        assert_eq!(allowed_host("[::1]").as_deref(), Some("::1"));
        assert_eq!(
            allowed_host("*.campus.edu").as_deref(),
            Some("*.campus.edu")
        );
        for bad in [
            "",
            "[tutor.example.edu]",
            "https://tutor.example.edu",
            "tutor.example.edu:8080",
            "a..b",
            "*.",
            "*.*.x",
            "a b",
        ] {
            assert_eq!(allowed_host(bad), None, "{bad}");
        }
    }
}
