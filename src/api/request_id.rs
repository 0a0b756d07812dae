//! `x-request-id` on every response (M22): the pipeline's routes set their request's own id
//! (the one in its log line and spans); every other answer (probes, `/v1/models`, jobs, a
//! refusal by auth, CORS or the request limits) gets a fresh one here, so a client can always
//! quote one.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

use crate::pipeline::new_request_id;

/// The response header.
pub const HEADER: &str = "x-request-id";

/// Adds a fresh `x-request-id` to a response that has none.
pub async fn ensure(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if !resp.headers().contains_key(HEADER) {
        if let Ok(id) = HeaderValue::from_str(&new_request_id()) {
            resp.headers_mut().insert(HEADER, id);
        }
    }
    resp
}
