//! tutor-gateway: a reverse proxy in front of vLLM that keeps short tutoring questions fast.
//!
//! # Layout
//!
//! Modules in the order a request meets them:
//!
//! - [`config`]: raw TOML structs turned by one `validate()` into a typed [`config::Config`].
//! - [`prompt`]: canonical JSON and the prompt fingerprint (M18).
//! - [`classify`]: token estimate (tokenizer or heuristic, skipped when byte length decides) and
//!   lane choice by estimated work.
//! - [`admission`]: per-lane request slots + token budget (or the FIFO baseline), bounded wait
//!   queues, and the [`admission::LaneGuard`] that gives both back on drop.
//! - [`api`]: axum routes (`/answer`, `/v1/*`, `/metrics`, `/healthz`, `/readyz`); parsing,
//!   the pipeline that runs classify -> admit -> upstream, and the one error -> HTTP mapping.
//! - [`upstream`]: the vLLM client: streaming request with `X-Request-Id`, SSE parsing,
//!   upstream timeouts, and the engine abort ([`upstream::AbortGuard`]) on every unclean end.
//! - [`relay`]: the stream pump: forwards vLLM's chunks (or `/answer` events), counts tokens,
//!   records the outcome, gives the lane slot back, notices a client that went away.
//! - [`telemetry`]: the Prometheus families ([`telemetry::Metrics`]).
//! - [`server`]: wiring and the serve loop with graceful shutdown (and `--with-sim`).
//!
//! Still to come (see `docs/architecture.md`): course prompt assembly in `prompt`.
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod classify;
pub mod config;
pub mod error;
pub mod lane;
pub mod pipeline;
pub mod prompt;
pub mod relay;
pub mod server;
pub mod telemetry;
pub mod upstream;
