//! `[promotion]`: requests that outgrow their lane mid-stream, and continuations (M14).
//!
//! Owns [`RawPromotion`], [`PromotionConfig`] and [`WhenFull`], their defaults and validation.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;

/// Default `promotion.when_full`.
const WHEN_FULL: &str = "cut";
/// Default `promotion.wait_ms`.
const WAIT_MS: u64 = 2_000;
/// Default `promotion.continuation_window_ms`.
const CONTINUATION_WINDOW_MS: u64 = 600_000;
/// Longest `promotion.wait_ms`.
const MAX_WAIT_MS: u64 = 60_000;
/// Longest `promotion.continuation_window_ms`: a day.
const MAX_CONTINUATION_WINDOW_MS: u64 = 86_400_000;
/// Default `promotion.max_sessions`.
const MAX_SESSIONS: u64 = 100_000;

/// `[promotion]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPromotion {
    /// `cut` or `wait`.
    pub when_full: Option<String>,
    /// With `wait`: how long a stream may pause for room, ms.
    pub wait_ms: Option<u64>,
    /// How long a session's output counts toward its next request's lane, ms.
    pub continuation_window_ms: Option<u64>,
    /// Sessions one replica keeps a count for.
    pub max_sessions: Option<u64>,
}

/// What happens when a request must move to a fuller lane mid-stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// End the stream with the cut message and abort the engine's work.
    Cut,
    /// Pause the stream for up to `wait` for room, then cut.
    Wait,
}

/// Mid-stream promotion and continuation tracking (M14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromotionConfig {
    /// Policy when the next lane has no room.
    pub when_full: WhenFull,
    /// With [`WhenFull::Wait`]: longest pause.
    pub wait: Duration,
    /// How long a session's output counts toward its next request's lane.
    pub continuation_window: Duration,
    /// Sessions one replica keeps a count for; the least recently used goes beyond it.
    pub max_sessions: usize,
}

/// Checks `[promotion]`.
pub(super) fn validate(c: &mut Checker, raw: RawPromotion) -> PromotionConfig {
    let when_full = match raw.when_full.as_deref().unwrap_or(WHEN_FULL) {
        "cut" => WhenFull::Cut,
        "wait" => WhenFull::Wait,
        _ => {
            c.fail("promotion.when_full", "must be \"cut\" or \"wait\"");
            WhenFull::Cut
        }
    };
    let max_sessions = raw.max_sessions.unwrap_or(MAX_SESSIONS);
    if !(1..=100_000_000).contains(&max_sessions) {
        c.fail("promotion.max_sessions", "must be between 1 and 100000000");
    }
    // A paused stream is not read, so its pause adds to upstream.total_timeout_ms: a minute.
    let wait_ms = raw.wait_ms.unwrap_or(WAIT_MS);
    if wait_ms > MAX_WAIT_MS {
        c.fail(
            "promotion.wait_ms",
            format!("must be at most {MAX_WAIT_MS} (a paused stream is not read meanwhile)"),
        );
    }
    // The window is a Redis key's time to live (PEXPIRE, which refuses what overflows its
    // clock): a day.
    let window_ms = raw.continuation_window_ms.unwrap_or(CONTINUATION_WINDOW_MS);
    if !(1..=MAX_CONTINUATION_WINDOW_MS).contains(&window_ms) {
        c.fail(
            "promotion.continuation_window_ms",
            format!("must be between 1 and {MAX_CONTINUATION_WINDOW_MS} (a day)"),
        );
    }
    PromotionConfig {
        when_full,
        max_sessions: usize::try_from(max_sessions.clamp(1, 100_000_000)).unwrap_or(1),
        wait: Duration::from_millis(wait_ms.min(MAX_WAIT_MS)),
        continuation_window: Duration::from_millis(window_ms.clamp(1, MAX_CONTINUATION_WINDOW_MS)),
    }
}
