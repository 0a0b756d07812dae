//! Browsers (`server.cors_allow_origins`): which web origins may call the gateway, and CORS.
//!
//! - No `Origin` header (SDKs, curl, servers): the request goes on untouched, unless the browser
//!   says it comes from another site's page (Fetch Metadata: `Sec-Fetch-Site` `cross-site` or
//!   `same-site`) and it is not the top-level navigation of a tab (a link followed). Browsers
//!   send no `Origin` on the GETs of an `<iframe>`, `<img>` or `no-cors` fetch: without this any
//!   page could spend GPU time through its visitors' browsers with hidden iframes of
//!   `/answer?prompt=…` (403 `origin_not_allowed`). SDKs send no `Sec-Fetch-*` headers.
//! - An allowed origin: preflights (`OPTIONS` with `Access-Control-Request-Method`) are answered
//!   here (204, methods, headers, max age); other requests go on, and their answers carry
//!   `Access-Control-Allow-Origin`, `Access-Control-Expose-Headers` and `Vary: Origin`. A POST
//!   must be `application/json` (415 otherwise): a page cannot slip a body past as `text/plain`.
//! - Any other origin: 403 `origin_not_allowed` before the request reaches a lane, so no web
//!   page can spend GPU time through its visitors' browsers. The decision reads the `Origin`
//!   and the configured list only, never the `Host` header: a page on a rebound DNS name
//!   (`evil.example` resolving to the gateway) sends a `Host` that matches its own `Origin`.
//!
//! Every answer carries `Vary: Origin` (a cache must not give one origin's answer to another)
//! and `X-Content-Type-Options: nosniff`.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::denied::{self, Denial};
use crate::error::GatewayError;

/// Methods allowed cross-origin.
const METHODS: &str = "GET, POST, DELETE";
/// Request headers allowed cross-origin.
const HEADERS: &str =
    "content-type, authorization, last-event-id, x-session-id, x-tutor-deadline-ms, \
     x-tutor-preemptible, traceparent, tracestate";
/// Response headers a page may read.
const EXPOSE: &str = "x-request-id, retry-after";

/// The allowed origins.
#[derive(Debug, Clone)]
pub struct Cors {
    origins: Arc<Vec<String>>,
    max_age: HeaderValue,
}

impl Cors {
    /// `origins` as validated (lower case, or `*`), preflights cached `max_age`.
    pub fn new(origins: Vec<String>, max_age: std::time::Duration) -> Self {
        Self {
            origins: Arc::new(origins),
            max_age: HeaderValue::from(max_age.as_secs()),
        }
    }

    fn allows(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        self.origins.iter().any(|o| o == "*" || *o == origin)
    }
}

/// Whether a request without `Origin` comes from another site's page and is not a tab's
/// top-level navigation (Fetch Metadata; requests without those headers are not browsers').
fn from_another_sites_page(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let foreign = matches!(get("sec-fetch-site"), Some("cross-site" | "same-site"));
    let navigation =
        get("sec-fetch-mode") == Some("navigate") && get("sec-fetch-dest") == Some("document");
    foreign && !navigation
}

/// The middleware.
pub async fn cors(State(cors): State<Cors>, req: Request, next: Next) -> Response {
    let mut resp = answer(&cors, req, next).await;
    let h = resp.headers_mut();
    h.append(header::VARY, HeaderValue::from_static("origin"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

async fn answer(cors: &Cors, req: Request, next: Next) -> Response {
    let Some(origin) = req.headers().get(header::ORIGIN).cloned() else {
        if from_another_sites_page(req.headers()) && !cors.allows("*") {
            return denied::mark(GatewayError::OriginNotAllowed, Denial::Origin);
        }
        return next.run(req).await;
    };
    let text = origin.to_str().unwrap_or_default();
    if !cors.allows(text) {
        return denied::mark(GatewayError::OriginNotAllowed, Denial::Origin);
    }
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = if preflight {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(HEADERS),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, cors.max_age.clone());
        resp
    } else if req.method() == Method::POST && !is_json(req.headers()) {
        GatewayError::UnsupportedMediaType.into_response()
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSE),
    );
    resp
}

/// Whether the body is declared as JSON (`application/json`, parameters allowed).
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}
