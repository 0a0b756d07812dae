//! Counts the requests denied before they reach a route: a key that is missing or wrong
//! (`auth`, also the admin listener's token), a `Host` the listener does not answer to
//! (`host`), a browser page from a foreign origin (`origin`), a body refused before it was read
//! (`body`). Each denial marks its response
//! ([`mark`]); an outer layer ([`count`]) counts the marked ones in
//! `tutor_gateway_denied_total{reason}`, so a client trying keys or a rebound page shows on the
//! dashboard, not only in that client's 401s and 403s. (Not `tutor_gateway_refused_total`: that
//! one counts a gateway too full to serve, and its overload alert must not fire on bad keys.)

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::GatewayError;
use crate::pipeline::AppState;

/// Why a request was denied before a route: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// No valid API key or token (401), or no admin token on the admin listener.
    Auth,
    /// A `Host` not in `server.allowed_hosts` (403 `host_not_allowed`).
    Host,
    /// An `Origin` not in `server.cors_allow_origins` (403 `origin_not_allowed`).
    Origin,
    /// A body refused before it was read: a `Content-Length` above `server.max_body_bytes`
    /// (413) or a `Content-Encoding` (415).
    Body,
}

impl Denial {
    /// The `reason` label of `tutor_gateway_denied_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::Host => "host",
            Self::Origin => "origin",
            Self::Body => "body",
        }
    }

    /// Every label value, for registering them at start.
    pub const ALL: [Denial; 4] = [Self::Auth, Self::Host, Self::Origin, Self::Body];
}

/// `error`'s response, marked as denied for `why`.
pub fn mark(error: GatewayError, why: Denial) -> Response {
    let mut resp = error.into_response();
    resp.extensions_mut().insert(why);
    resp
}

/// The layer: counts every response marked by [`mark`].
pub async fn count(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if let Some(why) = resp.extensions().get::<Denial>() {
        state.metrics().denied(why.as_str());
    }
    resp
}
