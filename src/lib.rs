//! tutor-gateway: a reverse proxy in front of vLLM that keeps short tutoring questions fast.
//!
//! # Layout
//!
//! The folder tree is the request pipeline. In the order a request meets them:
//!
//! - [`api`]: thin axum handlers (`/answer`, `/v1/*`, `/jobs`, `/metrics`, `/healthz`,
//!   `/readyz`), each calling one function of [`pipeline`] or [`jobs`], behind the layers every
//!   request meets first: browser origins (`cors.rs`), API keys (`auth.rs`), request limits
//!   (`limits.rs`). Nothing below it imports from it.
//! - [`pipeline`]: one request's journey, in order: `parse.rs` (body and query checks),
//!   `prompt.rs` (course prefix first, canonical tools, the body vLLM sees), then classify ->
//!   admit -> send -> relay in `mod.rs`; `respond.rs` (headers, errors before the stream).
//! - [`prompt`]: canonical JSON, course prompt assembly, the prompt fingerprint (M17, M18).
//! - [`classify`]: the token estimate (`counter.rs`, `bounds.rs`, `classifier.rs`) and every lane
//!   rule in `decision.rs`: first choice by work, continuation choice, mid-stream promotion.
//! - [`admission`]: seats and token budgets. `budget.rs` is where a request's seat and tokens
//!   are checked against the limits; `local.rs` (one process) or `redis/` (shared by replicas,
//!   Lua scripts in `lua/`); `guard.rs` is the [`admission::LaneGuard`] that gives both back on
//!   drop; `session.rs` counts a session's output for continuations.
//! - [`upstream`]: the vLLM client: streaming request with `X-Request-Id` (`client.rs`,
//!   `request.rs`), SSE parsing (`sse.rs`, `chunk.rs`), timeouts (`stream.rs`), and
//!   `abort.rs`: where a client's disconnect (the relay dropped with the response body) becomes
//!   the engine abort call.
//! - [`relay`]: the stream pump back to the client: forwards vLLM's chunks or `/answer` events,
//!   counts tokens, promotes or cuts mid-stream (`cut.rs`), and on every end (its `Drop` when
//!   the client went away) writes the record and frees the seat.
//! - [`telemetry`]: every metric is defined in `metrics.rs` (plus `prefix_metrics.rs`,
//!   `promotion_metrics.rs`, `quota_metrics.rs`); spans in `span.rs`/`otel.rs`; the per-request
//!   record in `record.rs`. It takes plain values and imports neither admission nor upstream.
//!
//! - [`jobs`]: background jobs (`/jobs`): a store, a scheduler that starts them out of idle
//!   large-lane capacity, their event streams and webhooks; it runs the pipeline's steps.
//! - [`autopilot`]: paces the large lane's seats and the prefill budget to the lanes' TTFT
//!   objectives (`controller.rs` is the rule, `mod.rs` the loop that reads and applies it).
//!
//! Beside the pipeline: [`config`] (one file per section: raw struct, typed struct,
//! validation), [`capacity`] (the engine's KV cache against the budgets, the `capacity`
//! planner), [`sign`] (HMAC and SHA-256 as hex, a leaf), [`lane`] (the `Lane` enum, a leaf), [`error`] ([`error::GatewayError`] and its
//! one mapping to HTTP), [`server`] (wiring, the serve loop, graceful shutdown, `--with-sim`).
//! `tests/layering.rs` keeps this shape: no loop of files or of folders that import each other
//! (except those its `PENDING_LOOPS` lists, in `jobs` and `pipeline`, being taken apart),
//! nothing below `api` imports it.
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod autopilot;
pub mod capacity;
pub mod classify;
pub mod config;
pub mod error;
#[cfg(test)]
mod faults;
#[doc(hidden)]
pub mod fuzz;
pub mod jobs;
pub mod lane;
pub mod pipeline;
pub mod prompt;
pub mod relay;
pub mod server;
pub mod sign;
pub mod telemetry;
pub mod upstream;
