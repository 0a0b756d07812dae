//! The incremental Server-Sent Events parser the relay reads upstream bodies with. It lives in
//! `tutor-wire` ([`tutor_wire::sse`]), so the tests, benches and the load tool parse SSE the same
//! way; see there for the rules it follows and the cap on one event's size.

pub use tutor_wire::sse::{SseError, SseParser, DEFAULT_MAX_EVENT_BYTES};

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
