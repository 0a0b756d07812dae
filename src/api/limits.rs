//! Bounds every request meets before its route: at most `server.max_requests_in_flight` handled
//! at once (503 + `Retry-After` beyond, the permit held until the response body ends, streams
//! included), and a body that must arrive within `server.body_read_timeout` (408 after).
//! The liveness probes and the scrape (`GET /healthz`, `/health`, `/ping`, `/metrics`) have
//! [`PROBE_PERMITS`] places of their own instead: a gateway full of streams still answers that it
//! is alive (else an orchestrator restarts it, and every stream with it) and still shows its
//! operators the refusals.
//! Bodies being received hold at most `server.max_receiving_bytes` together (503 beyond): a
//! body counts from its first byte until it is whole; one alone always passes.
//!
//! With `[auth]` on, a tenant's request bodies still arriving count against its
//! `server.max_requests_in_flight_per_tenant` too (429 `tenant_overloaded` beyond): the
//! per-tenant slot its route takes comes only once the body is whole, and without this one
//! tenant's uploads that never finish (each held up to the body timeout, re-opened as they are
//! cut) took every permit of all, for everyone.
//!
//! A whole answer (a non-streaming `/v1` answer, a job's status with its text) keeps its permit,
//! as a stream does, until the server has taken its last byte ([`crate::relay::held`]): answers
//! nobody reads count. With `[auth]` on, a tenant's whole answers not yet taken count against
//! its `server.max_requests_in_flight_per_tenant` too: while it has that many, its next
//! requests get 429 `tenant_overloaded` (an answer beyond them, made meanwhile, gives its permit
//! back at once), so one tenant's clients that never read cannot take every permit of all; the
//! open routes' answers asked without a key give theirs back at once, as before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, StreamExt};
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{BodyTimedOut, GatewayError, ReceivingFull};
use crate::pipeline::tenant::{TenantSlot, TenantSlots};
use crate::pipeline::{AppState, Tenant};
use crate::telemetry::Metrics;

/// Probes and scrapes answered at once, apart from `server.max_requests_in_flight` (each is a
/// short answer of the gateway's own, never a stream).
pub const PROBE_PERMITS: usize = 16;

/// What the middleware needs.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    in_flight: Arc<Semaphore>,
    /// The probes' and scrapes' own places ([`PROBE_PERMITS`]).
    probes: Arc<Semaphore>,
    body_timeout: Duration,
    metrics: Metrics,
    /// Each tenant's request bodies still arriving.
    uploading: Arc<TenantSlots>,
    /// Each tenant's whole answers not yet taken by their clients.
    unsent: Arc<TenantSlots>,
    /// Bytes of the bodies being received now.
    receiving: Arc<AtomicU64>,
    /// The per-tenant limit in force (a reload may change it).
    state: AppState,
}

impl RequestLimits {
    /// Limits of `max_in_flight` requests and `body_timeout`.
    pub fn new(max_in_flight: usize, body_timeout: Duration, state: AppState) -> Self {
        Self {
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            probes: Arc::new(Semaphore::new(PROBE_PERMITS)),
            body_timeout,
            metrics: state.metrics().clone(),
            uploading: Arc::default(),
            unsent: Arc::default(),
            receiving: Arc::default(),
            state,
        }
    }

    /// A slot among `req`'s tenant's bodies arriving, when it has a tenant and a body;
    /// `Err` with the refusal when the tenant has its limit's worth arriving already, or of
    /// whole answers its clients have not taken.
    fn upload_slot(&self, req: &Request) -> Result<Option<TenantSlot>, GatewayError> {
        let Some(tenant) = req.extensions().get::<Tenant>() else {
            return Ok(None);
        };
        let max = self.state.config().server.max_requests_in_flight_per_tenant;
        if self.unsent.held(Some(&tenant.0)) >= max {
            return Err(GatewayError::TenantOverloaded {
                tenant: tenant.0.clone(),
                held: max,
            });
        }
        if req.body().is_end_stream() {
            return Ok(None);
        }
        match self.uploading.take(Some(tenant), max) {
            Some(slot) => Ok(Some(slot)),
            None => Err(GatewayError::TenantOverloaded {
                tenant: tenant.0.clone(),
                held: max,
            }),
        }
    }
}

/// A liveness probe or a scrape: `GET`/`HEAD` of `/healthz`, `/health`, `/ping` or `/metrics`.
fn is_probe(req: &Request) -> bool {
    matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    ) && matches!(
        req.uri().path(),
        "/healthz" | "/health" | "/ping" | "/metrics"
    )
}

/// The middleware: takes a permit (or answers 503), puts a deadline on the body, and keeps the
/// permit until the response body is done.
pub async fn limit(State(limits): State<RequestLimits>, req: Request, next: Next) -> Response {
    if is_probe(&req) {
        // Their own places, not counted as the tier's load; the answer is whole when the
        // handler returns (none reads a body).
        let Ok(_permit) = Arc::clone(&limits.probes).try_acquire_owned() else {
            // Counted apart: a scrape storm is not the tier's load (nor its overload alert's).
            limits.metrics.refused("probes");
            return GatewayError::Overloaded.into_response();
        };
        return next.run(req).await;
    }
    if let Some(refused) = unreadable_body(&req, limits.state.config().server.max_body_bytes) {
        // Before a byte of it is read (and before hyper sends `100 Continue`).
        return super::denied::mark(refused, super::denied::Denial::Body);
    }
    let Ok(permit) = Arc::clone(&limits.in_flight).try_acquire_owned() else {
        limits.metrics.refused("requests_in_flight");
        return GatewayError::Overloaded.into_response();
    };
    let mut uploading = match limits.upload_slot(&req) {
        Ok(slot) => slot,
        Err(refused) => {
            // Before any route: no request record counts it.
            limits.metrics.refused("tenant_requests_in_flight");
            return refused.into_response();
        }
    };
    let permit = Counted::new(permit, limits.metrics.requests_in_flight().clone());
    let timeout = limits.body_timeout;
    let mut received = Received {
        pool: Arc::clone(&limits.receiving),
        max: limits.state.config().server.max_receiving_bytes,
        mine: 0,
    };
    let metrics = limits.metrics.clone();
    let req = req.map(|body| {
        let mut stream = body.into_data_stream();
        let mut deadline = Box::pin(tokio::time::sleep(timeout));
        let mut timed_out = false;
        Body::from_stream(futures::stream::poll_fn(move |cx| {
            if timed_out {
                return Poll::Ready(None);
            }
            let item = match stream.poll_next_unpin(cx) {
                Poll::Pending if deadline.poll_unpin(cx).is_ready() => {
                    timed_out = true;
                    Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(timeout)))))
                }
                Poll::Ready(Some(Ok(chunk))) if !received.take(chunk.len()) => {
                    metrics.refused("receiving_bytes");
                    timed_out = true;
                    Poll::Ready(Some(Err(axum::Error::new(ReceivingFull))))
                }
                other => other,
            };
            // The body is whole (or failed): the tenant's upload slot is free again (else it
            // goes with the body, dropped).
            if matches!(item, Poll::Ready(None | Some(Err(_)))) {
                uploading.take();
                received.give_back();
            }
            item
        }))
    });
    let tenant = req.extensions().get::<Tenant>().cloned();
    let resp = next.run(req).await;
    // The request is in flight until its answer's last byte is taken, streamed or whole. With
    // [auth] on, a tenant's whole answer counts among its unsent ones meanwhile (one beyond
    // them, made while they filled up, lets its permit go at once), and an open route's whole
    // answer asked without a key (a few hundred bytes: the model list, the version, readiness)
    // lets it go at once, as before: no client without a key may hold permits (nor make
    // `/readyz` answer 503 to a load balancer) by not reading.
    let config = limits.state.config();
    let write_timeout = config.server.client_write_timeout;
    if config.auth.enabled && resp.body().size_hint().exact().is_some() {
        let max = config.server.max_requests_in_flight_per_tenant;
        let Some(slot) = tenant.and_then(|t| limits.unsent.take(Some(&t), max)) else {
            return resp;
        };
        return crate::relay::held::until_taken_within(resp, (permit, slot), write_timeout);
    }
    crate::relay::held::until_taken_within(resp, permit, write_timeout)
}

/// Why `req`'s body is refused before it is read: a `Content-Length` above `max_body_bytes`
/// (413 at once, not after reading that much), or a `Content-Encoding` other than `identity`
/// (415: the gateway reads bodies as sent).
fn unreadable_body(req: &Request, max_body_bytes: usize) -> Option<GatewayError> {
    if req.body().size_hint().lower() > max_body_bytes as u64 {
        return Some(GatewayError::BodyTooLarge {
            limit: max_body_bytes,
        });
    }
    if req.body().is_end_stream() {
        // No body (a GET through a proxy that adds the header): nothing to decode.
        return None;
    }
    let encodings = req.headers().get_all(axum::http::header::CONTENT_ENCODING);
    let encoded = encodings.iter().find(|v| {
        v.to_str().map_or(true, |v| {
            v.split(',')
                .any(|e| !e.trim().is_empty() && !e.trim().eq_ignore_ascii_case("identity"))
        })
    });
    encoded.map(|v| {
        GatewayError::CompressedBody(crate::telemetry::printable(
            &String::from_utf8_lossy(v.as_bytes()),
            32,
        ))
    })
}

/// One body's bytes received so far, counted in the pool of all bodies being received until
/// it is whole (or dropped).
struct Received {
    pool: Arc<AtomicU64>,
    /// `server.max_receiving_bytes` when the request came.
    max: u64,
    mine: u64,
}

impl Received {
    /// Counts `n` more bytes, unless that would pass the bound while other bodies hold some
    /// of it.
    fn take(&mut self, n: usize) -> bool {
        let n = n as u64;
        let mine = self.mine;
        let max = self.max;
        let taken = self
            .pool
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                let others = held.saturating_sub(mine);
                let after = held.saturating_add(n);
                (others == 0 || after <= max).then_some(after)
            })
            .is_ok();
        if taken {
            self.mine = self.mine.saturating_add(n);
        }
        taken
    }

    /// The body is whole (or failed): its bytes no longer count.
    fn give_back(&mut self) {
        let mine = std::mem::take(&mut self.mine);
        if mine > 0 {
            self.pool.fetch_sub(mine, Ordering::AcqRel);
        }
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// A request's permit, counted in `tutor_gateway_requests_in_flight` for as long as it is held:
/// the gauge goes down when the permit is dropped, on every path.
struct Counted {
    _permit: OwnedSemaphorePermit,
    gauge: IntGauge,
}

impl Counted {
    fn new(permit: OwnedSemaphorePermit, gauge: IntGauge) -> Self {
        gauge.inc();
        Self {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
