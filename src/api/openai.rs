//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI-compatible, through the same
//! lanes as `/answer`; the work is [`pipeline::openai`], under the snapshot of the configuration
//! taken here, at the request's arrival ([`RequestCtx::snapshot`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{post, MethodRouter};
use axum::Extension;

use crate::pipeline::{self, AppState, RequestCtx, Tenant};
use crate::relay::ConnectionCloser;
use crate::telemetry::Route;

/// The `POST` handler of one OpenAI route: [`Route::ChatCompletions`] or
/// [`Route::Completions`]; both take the same extractors and differ only in the route passed on.
pub fn post_route(route: Route) -> MethodRouter<AppState> {
    post(
        move |State(state): State<AppState>,
              tenant: Option<Extension<Tenant>>,
              connection: Option<Extension<ConnectionCloser>>,
              headers: HeaderMap,
              body: Result<Bytes, BytesRejection>| async move {
            let ctx = RequestCtx::snapshot(&state).on_connection(connection.map(|c| c.0));
            pipeline::openai(ctx, headers, body, route, tenant.map(|t| t.0)).await
        },
    )
}
