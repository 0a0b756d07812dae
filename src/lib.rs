//! tutor-gateway: a reverse proxy in front of vLLM that keeps short tutoring questions fast.
//!
//! # Layout
//!
//! Modules in the order a request meets them:
//!
//! - [`config`]: raw TOML structs turned by one `validate()` into a typed [`config::Config`].
//! - [`classify`]: token estimate (tokenizer or heuristic, skipped when byte length decides) and
//!   lane choice by estimated work.
//! - [`admission`]: per-lane request slots + token budget (or the FIFO baseline), bounded wait
//!   queues, and the [`admission::LaneGuard`] that gives both back on drop.
//! - [`upstream`]: the vLLM client: streaming request with `X-Request-Id`, SSE parsing,
//!   upstream timeouts, and the engine abort ([`upstream::AbortGuard`]) on every unclean end.
//!
//! Still to come (see `docs/architecture.md`): `api` (HTTP routes), `relay` (the stream pump),
//! `prompt`, `telemetry`.
#![forbid(unsafe_code)]

pub mod admission;
pub mod classify;
pub mod config;
pub mod upstream;
