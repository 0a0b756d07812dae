//! Responses that stop early: every request's handler at the end of the shutdown's grace
//! ([`in_drain`]), a handler that panicked ([`caught`]), a job's followers at shutdown
//! (`jobs.rs`), a revoked key's streams (`auth.rs`).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::GatewayError;
use crate::pipeline::AppState;
use crate::relay::Drain;

/// Runs a request's handler under the gateway's [`Drain`]: the relay it starts ends when the
/// grace period is over ([`Drain::current`]), `/readyz` finds the drain in the request's
/// extensions, and a request whose answer has not begun by then (waiting for a seat or for
/// vLLM) gets 503 `shutdown` (its handler is dropped, as when a client goes away).
pub(crate) async fn in_drain(State(drain): State<Drain>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(drain.clone());
    let handler = drain.scope(next.run(req));
    tokio::select! {
        biased;
        resp = handler => resp,
        () = drain.ending() => GatewayError::Shutdown.into_response(),
    }
}

/// Runs a request's handler so that a panic in it (a bug) answers 500 `internal` in the route's
/// error shape (an OpenAI error body; the request id and CORS headers added by the layers
/// around it) instead of dropping the connection. Unwinding has given the seat, the tokens and
/// the engine's work back (their guards drop) and recorded the request `internal` (its request
/// log line); this counts the panic (`tutor_gateway_panics_total{at="handler"}`), logs it with
/// its route's pattern, and answers with the request id of that log line. The
/// panic's place went to stderr with the panic report (`crate::telemetry::panic`). A stream
/// that panics after its response began is the relay's to end (`crate::relay`).
pub(crate) async fn caught(State(state): State<AppState>, req: Request, next: Next) -> Response {
    use futures::FutureExt;
    // The route's pattern (`/jobs/{id}`), never the client's path.
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(String::new, |p| p.as_str().to_owned());
    let issued = std::sync::Arc::new(std::sync::OnceLock::new());
    let handler = crate::pipeline::issuing_request_ids(issued.clone(), next.run(req));
    match std::panic::AssertUnwindSafe(handler).catch_unwind().await {
        Ok(resp) => resp,
        Err(panic) => {
            state.metrics().panicked("handler");
            let request_id = issued.get().map_or("", String::as_str);
            tracing::error!(
                request_id,
                route = route.as_str(),
                panic = crate::telemetry::panic::message(&*panic),
                "a request's handler panicked: answered 500 internal"
            );
            let mut resp = GatewayError::Internal.into_response();
            // The id of its request log line (`internal`), when it had got that far.
            if let Ok(id) = axum::http::HeaderValue::from_str(request_id) {
                if !request_id.is_empty() {
                    resp.headers_mut().insert(super::request_id::HEADER, id);
                }
            }
            resp
        }
    }
}

/// `stream` until `end` resolves, then `last` (if any) and the end: the response bodies that
/// stop early (a job's followers at shutdown, a revoked key's streams). Dropping `stream` stops
/// what feeds it (a relay sees its client go).
pub(crate) fn until<S, T>(
    stream: S,
    end: impl std::future::Future<Output = ()> + Send + 'static,
    last: Option<T>,
) -> futures::stream::BoxStream<'static, T>
where
    S: futures::Stream<Item = T> + Send + Unpin + 'static,
    T: Send + 'static,
{
    use futures::StreamExt;
    let state = Some((stream, Box::pin(end), last));
    futures::stream::unfold(state, |state| async move {
        let (mut stream, mut end, last) = state?;
        tokio::select! {
            biased;
            () = &mut end => {
                drop(stream);
                last.map(|l| (l, None))
            }
            item = stream.next() => item.map(|i| (i, Some((stream, end, last)))),
        }
    })
    .boxed()
}
