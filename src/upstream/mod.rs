//! The vLLM client (issue 3, items 6 and 7): sends a streaming request with `X-Request-Id` and
//! `traceparent`, reads vLLM's SSE robustly, enforces the upstream timeouts, and aborts the
//! request in the engine on every way out except a clean finish (M21).
//!
//! # Flow
//! [`UpstreamClient::stream`] forces `stream: true` with usage ([`request`]), sends, and returns
//! an [`UpstreamStream`] once headers arrive (or an [`UpstreamError`]). The stream feeds the
//! body's reads to the [`sse::SseParser`], turns each `data:` payload into a [`Chunk`] (raw
//! bytes kept, for a faithful relay), counts tokens, records [`StreamTimings`] and applies the
//! end-of-stream rules documented in [`stream`]. It owns an [`AbortGuard`]: when the stream
//! ends in any way but a finish reason, the connection is closed (what stops a default vLLM),
//! and the engine's abort endpoint is called once where it exists (`abort.rs`).
//!
//! # Errors
//! One enum, [`UpstreamError`]; the api layer maps it to HTTP (each variant's doc names the
//! status). Error texts never contain prompt or output text.
//!
//! # Replicas
//! Several vLLM replicas (`[[upstream.replicas]]`) are one client: [`replica`] keeps each
//! one's health and load, [`route`] picks one per request (prefix affinity bounded by load),
//! and the stream's abort goes to the replica that served it.
//!
//! Files: `request.rs` (endpoint, body rules), `client.rs`, `replica.rs`, `route.rs`, `sse.rs` (framing), `chunk.rs`
//! (one payload), `stream.rs` (timeouts, end rules, counting), `abort.rs`, `error.rs`.

mod abort;
mod chunk;
mod client;
mod error;
pub mod replica;
pub mod request;
pub mod route;
pub mod sse;
pub mod stream;
mod view;

pub use abort::{
    engine_request_id, AbortCaller, AbortEndpoint, AbortGuard, AbortState, AbortWatch,
    ABORT_TIMEOUT, PROBE_ID_PREFIX, PROBE_RETRY,
};
pub use chunk::{parse_payload, Chunk, EngineMetrics, Payload, ToolCallDelta, Usage};
pub use client::{RawResponse, UpstreamClient, MAX_BODY_BYTES, PROBE_TIMEOUT};
pub use error::{EngineError, UpstreamError};
pub use replica::{Replica, ReplicaStatus, Replicas, Ticket};
pub use request::{prepare_body, Endpoint, UpstreamRequest};
pub use stream::{OutputTokens, StreamLimits, StreamTimings, UpstreamStream};
