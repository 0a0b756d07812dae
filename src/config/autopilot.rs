//! `[autopilot]`: pacing long work against the lanes' time-to-first-token objectives
//! (`[lanes.<lane>] ttft_slo_ms`, `ttft_slo_quantile`).
//!
//! Owns [`RawAutopilot`] and [`AutopilotConfig`], their defaults and validation. The lanes'
//! objectives themselves are `[lanes.<lane>]` keys, in `admission.rs`.

use std::time::Duration;

use serde::Deserialize;

use super::admission::{MIN_PREFILL_PIECE_TOKENS, PREFILL_PIECE_ALIGN};
use super::check::Checker;

/// Default `autopilot.interval_ms`.
const INTERVAL_MS: u64 = 1_000;
/// Default `autopilot.window_ms`.
const WINDOW_MS: u64 = 30_000;
/// Largest `autopilot.min_samples`: the samples the engine step window keeps
/// (`crate::telemetry::step_window`; the TTFT window keeps more).
pub const MAX_MIN_SAMPLES: u32 = 4_096;
/// Default `autopilot.min_samples`.
const MIN_SAMPLES: u32 = 20;
/// Default `autopilot.tighten_percent`.
const TIGHTEN_PERCENT: u32 = 50;
/// Default `autopilot.loosen_prefill_tokens`.
const LOOSEN_PREFILL_TOKENS: u64 = 1_024;
/// Default `autopilot.loosen_large_seats`.
const LOOSEN_LARGE_SEATS: u32 = 1;
/// Default `autopilot.headroom_percent`.
const HEADROOM_PERCENT: u32 = 80;
/// Default `autopilot.hold_ms`.
const HOLD_MS: u64 = 5_000;
/// Default `autopilot.max_large_wait_ms`.
const MAX_LARGE_WAIT_MS: u64 = 10_000;
/// Default `autopilot.min_large_seats`.
const MIN_LARGE_SEATS: u32 = 1;
/// Default `autopilot.long_step_percent`.
const LONG_STEP_PERCENT: u32 = 300;
/// Default `autopilot.min_piece_tokens`.
const MIN_PIECE_TOKENS: u32 = 512;
/// Default `autopilot.max_piece_tokens`.
const MAX_PIECE_TOKENS: u32 = 2_048;

/// `[autopilot]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAutopilot {
    /// Whether the controller runs.
    pub enabled: Option<bool>,
    /// Time between two looks, ms.
    pub interval_ms: Option<u64>,
    /// The sliding window the objectives are measured over, ms.
    pub window_ms: Option<u64>,
    /// First tokens a lane needs in the window before its objective is judged.
    pub min_samples: Option<u32>,
    /// On a miss, the budget and seats drop by this percent.
    pub tighten_percent: Option<u32>,
    /// While every objective holds with headroom: prefill budget added per look, tokens.
    pub loosen_prefill_tokens: Option<u64>,
    /// While every objective holds with headroom: large seats added per look.
    pub loosen_large_seats: Option<u32>,
    /// Loosen only while every measured quantile is below this percent of its objective.
    pub headroom_percent: Option<u32>,
    /// After a tightening, no change for this long, ms.
    pub hold_ms: Option<u64>,
    /// Lowest prefill budget, tokens (default `admission.long_prompt_tokens`).
    pub min_prefill_budget_tokens: Option<u64>,
    /// Fewest large seats (the reviews' floor share).
    pub min_large_seats: Option<u32>,
    /// A large request predicted to wait longer than this is starving, ms.
    pub max_large_wait_ms: Option<u64>,
    /// Whether the autopilot prefills long prompts in pieces when it sees long engine steps.
    pub pieces: Option<bool>,
    /// Whether the autopilot raises the small lane's reserved seats when its objective is at
    /// risk while its requests wait for seats.
    pub reserve_small_seats: Option<bool>,
    /// A stream's longest gap between tokens above this percent of its typical gap is a long
    /// step.
    pub long_step_percent: Option<u32>,
    /// Smallest piece the autopilot picks, tokens.
    pub min_piece_tokens: Option<u32>,
    /// Largest piece the autopilot picks (the first it tries), tokens.
    pub max_piece_tokens: Option<u32>,
}

/// `[autopilot]`: the controller that paces the large lane's seats and the prefill budget to
/// the lanes' TTFT objectives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutopilotConfig {
    /// Whether the controller runs; off, the configured values hold as they are.
    pub enabled: bool,
    /// Time between two looks.
    pub interval: Duration,
    /// The sliding window each objective's quantile is measured over.
    pub window: Duration,
    /// First tokens a lane needs in the window before its objective is judged.
    pub min_samples: u32,
    /// On a miss, the budget and seats are multiplied by `(100 - tighten_percent) / 100`.
    pub tighten_percent: u32,
    /// Prefill budget added per look while every objective holds with headroom.
    pub loosen_prefill_tokens: u64,
    /// Large seats added per look while every objective holds with headroom.
    pub loosen_large_seats: u32,
    /// Headroom: every measured quantile below this percent of its objective.
    pub headroom_percent: u32,
    /// After a tightening, no change for this long (the window still holds the samples that
    /// caused it).
    pub hold: Duration,
    /// Lowest prefill budget; `None`: `admission.long_prompt_tokens`.
    pub min_prefill_budget_tokens: Option<u64>,
    /// Fewest large seats: reviews always progress.
    pub min_large_seats: u32,
    /// The large lane is starving when the last request in its queue is predicted to wait
    /// longer than this (at its admissions of the last 10 s): the knobs go up whatever the
    /// objectives.
    pub max_large_wait: Duration,
    /// Whether the autopilot prefills long prompts in pieces (`crate::pipeline::pieces`) when
    /// it sees long engine steps; only while `admission.prefill_piece_tokens` is 0 (a
    /// configured size is used as it is).
    pub pieces: bool,
    /// Whether the autopilot raises the small lane's reservation (its `max_concurrency`, up to
    /// the seats the other lanes' reservations leave) while the small lane's objective is at
    /// risk and its requests wait for seats, and lowers it back while the objective holds with
    /// headroom
    /// (`crate::autopilot::reserve`).
    pub reserve_small_seats: bool,
    /// Long steps are seen when the streams' longest gaps between tokens (their 90th
    /// percentile) pass this percent of their typical gap (the median of their mean gaps).
    pub long_step_percent: u32,
    /// The pieces' size bounds, tokens (each at least 256 and a multiple of 16).
    pub min_piece_tokens: u32,
    /// The first size tried, and the ceiling.
    pub max_piece_tokens: u32,
}

impl Default for AutopilotConfig {
    fn default() -> Self {
        validate(&mut Checker::default(), RawAutopilot::default())
    }
}

/// Checks `[autopilot]`.
pub(super) fn validate(c: &mut Checker, raw: RawAutopilot) -> AutopilotConfig {
    let percent = |c: &mut Checker, key: &str, value: Option<u32>, default: u32| {
        let v = value.unwrap_or(default);
        if !(1..=99).contains(&v) {
            c.fail(format!("autopilot.{key}"), "must be 1 to 99 (percent)");
            return default;
        }
        v
    };
    let interval = c.ms("autopilot.interval_ms", raw.interval_ms, INTERVAL_MS);
    let window = c.ms("autopilot.window_ms", raw.window_ms, WINDOW_MS);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if (1..100).contains(&ms(interval)) {
        c.fail("autopilot.interval_ms", "must be at least 100");
    }
    c.at_most(
        "autopilot.interval_ms",
        ms(interval),
        60_000,
        "60000 (a minute)",
    );
    c.at_most(
        "autopilot.window_ms",
        ms(window),
        3_600_000,
        "3600000 (an hour)",
    );
    c.at_most(
        "autopilot.max_large_wait_ms",
        raw.max_large_wait_ms.unwrap_or(MAX_LARGE_WAIT_MS),
        3_600_000,
        "3600000 (an hour)",
    );
    let hold_ms = raw.hold_ms.unwrap_or(HOLD_MS);
    c.at_most(
        "autopilot.hold_ms",
        hold_ms,
        600_000,
        "600000 (ten minutes: a tightened limit is held that long)",
    );
    if window < interval {
        c.fail(
            "autopilot.window_ms",
            "must be at least autopilot.interval_ms",
        );
    }
    let min_large_seats = raw.min_large_seats.unwrap_or(MIN_LARGE_SEATS);
    if min_large_seats == 0 {
        c.fail(
            "autopilot.min_large_seats",
            "must be > 0: reviews must always progress",
        );
    }
    let long_step_percent = raw.long_step_percent.unwrap_or(LONG_STEP_PERCENT);
    if !(101..=10_000).contains(&long_step_percent) {
        c.fail(
            "autopilot.long_step_percent",
            "must be 101 to 10000 (percent of the streams' typical gap between tokens)",
        );
    }
    let piece = |c: &mut Checker, key: &str, value: Option<u32>, default: u32| {
        let v = value.unwrap_or(default);
        if v < MIN_PREFILL_PIECE_TOKENS || !v.is_multiple_of(PREFILL_PIECE_ALIGN) {
            c.fail(
                format!("autopilot.{key}"),
                format!(
                    "must be at least {MIN_PREFILL_PIECE_TOKENS} and a multiple of \
                     {PREFILL_PIECE_ALIGN} (vLLM's KV block size)"
                ),
            );
            return default;
        }
        v
    };
    let min_piece_tokens = piece(
        c,
        "min_piece_tokens",
        raw.min_piece_tokens,
        MIN_PIECE_TOKENS,
    );
    let max_piece_tokens = piece(
        c,
        "max_piece_tokens",
        raw.max_piece_tokens,
        MAX_PIECE_TOKENS,
    );
    if min_piece_tokens > max_piece_tokens {
        c.fail(
            "autopilot.min_piece_tokens",
            "must be at most autopilot.max_piece_tokens",
        );
    }
    AutopilotConfig {
        enabled: raw.enabled.unwrap_or(false),
        interval,
        window,
        min_samples: {
            let n = c
                .u32("autopilot.min_samples", raw.min_samples, MIN_SAMPLES)
                .get();
            // More than the windows keep would never be judged (silently).
            if n > MAX_MIN_SAMPLES {
                c.fail(
                    "autopilot.min_samples",
                    format!(
                        "must be at most {MAX_MIN_SAMPLES} (the samples the step window keeps)"
                    ),
                );
            }
            n
        },
        tighten_percent: percent(c, "tighten_percent", raw.tighten_percent, TIGHTEN_PERCENT),
        // 0 would keep a knob down for good after its first tighten (rescue included).
        loosen_prefill_tokens: c
            .u64(
                "autopilot.loosen_prefill_tokens",
                raw.loosen_prefill_tokens,
                LOOSEN_PREFILL_TOKENS,
            )
            .get(),
        loosen_large_seats: c
            .u32(
                "autopilot.loosen_large_seats",
                raw.loosen_large_seats,
                LOOSEN_LARGE_SEATS,
            )
            .get(),
        headroom_percent: percent(
            c,
            "headroom_percent",
            raw.headroom_percent,
            HEADROOM_PERCENT,
        ),
        hold: Duration::from_millis(hold_ms.min(600_000)),
        min_prefill_budget_tokens: raw.min_prefill_budget_tokens,
        min_large_seats: min_large_seats.max(1),
        max_large_wait: c.ms(
            "autopilot.max_large_wait_ms",
            raw.max_large_wait_ms,
            MAX_LARGE_WAIT_MS,
        ),
        pieces: raw.pieces.unwrap_or(true),
        reserve_small_seats: raw.reserve_small_seats.unwrap_or(true),
        long_step_percent: long_step_percent.clamp(101, 10_000),
        min_piece_tokens: min_piece_tokens.min(max_piece_tokens),
        max_piece_tokens,
    }
}
