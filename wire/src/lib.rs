//! tutor-wire: what the gateway, the simulator (`vllm-sim`) and the load tool (`tutor-load`)
//! share about the wire, so none of them imports it from another.
//!
//! - [`chat`]: OpenAI chat messages as requests carry them, and the ChatML-like rendering.
//! - [`tokens`]: the documented, deterministic token-count heuristic.
//! - [`sse`]: an incremental Server-Sent Events parser (bytes in, events out).
//! - [`prom`]: reading values out of a Prometheus text exposition.
//! - [`pyjson`]: a JSON text as Python's `json.dumps` writes it (tool-call arguments as vLLM's
//!   chat templates render them).
//! - [`stats`]: the one quantile (nearest rank) every report and bench prints.

pub mod chat;
pub mod image;
pub mod prom;
pub mod pyjson;
pub mod sse;
pub mod stats;
pub mod tokens;
