//! `[admission]`, `[admission.fifo]` and `[lanes.<lane>]`: the admission policy, its global
//! budget, the FIFO baseline and the per-lane limits.
//!
//! Owns [`RawAdmission`], [`RawFifo`], [`RawLanes`], [`RawLane`] and the typed
//! [`AdmissionConfig`], [`Policy`], [`FifoConfig`], [`QueueConfig`], [`LanesConfig`],
//! [`LaneConfig`], with their defaults and validation. The rules that tie lane budgets to
//! `classify` and `upstream` are cross-section checks, in `file.rs`.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use crate::lane::Lane;

/// Default `admission.policy`.
const POLICY: &str = "lanes";
/// Default `admission.max_tokens_in_flight`.
const GLOBAL_MAX_TOKENS_IN_FLIGHT: u64 = 393_216;
/// Default `admission.seats`.
const SEATS: u32 = 96;
/// Default `admission.prefill_budget_tokens` (one scheduler step of the reference engine; see
/// `config/config.toml` and `docs/results/fifo-vs-lanes`).
const PREFILL_BUDGET_TOKENS: u64 = 12_288;
/// Default `admission.long_prompt_tokens`.
const LONG_PROMPT_TOKENS: u32 = 2_048;
/// Default `admission.early_refusal_margin_percent`.
const EARLY_REFUSAL_MARGIN_PERCENT: u16 = 25;
/// Smallest non-zero `admission.prefill_piece_tokens`.
pub const MIN_PREFILL_PIECE_TOKENS: u32 = 256;
/// What `admission.prefill_piece_tokens` must be a multiple of: vLLM's default KV block size
/// (its prefix cache keeps whole blocks only).
pub const PREFILL_PIECE_ALIGN: u32 = 16;
/// Default `admission.fifo.max_concurrency` (0: unlimited).
const FIFO_MAX_CONCURRENCY: u32 = 0;
/// Default `admission.fifo.queue_len`.
const FIFO_QUEUE_LEN: u32 = 1_024;
/// Default `admission.fifo.queue_timeout_ms`.
const FIFO_QUEUE_TIMEOUT_MS: u64 = 60_000;

/// `[admission]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmission {
    /// `lanes` or `fifo`.
    pub policy: Option<String>,
    /// Global token budget in flight across all lanes (policy `lanes`).
    pub max_tokens_in_flight: Option<u64>,
    /// Seats in all under policy `lanes`.
    pub seats: Option<u32>,
    /// Send the lane as vLLM's `priority` (small 0, medium 1, large 2).
    pub engine_priority: Option<bool>,
    /// Estimated prompt tokens of all requests between dispatch and first token; 0 = off.
    pub prefill_budget_tokens: Option<u64>,
    /// Prompts above this many estimated tokens wait for prefill room.
    pub long_prompt_tokens: Option<u32>,
    /// Count a prompt's prefill without the prefix tokens its fingerprint usually finds cached.
    pub prefill_discount_cached: Option<bool>,
    /// How far, in percent, a predicted wait must exceed a request's deadline to refuse it.
    pub early_refusal_margin_percent: Option<u16>,
    /// Prefill long prompts in pieces of this many tokens through vLLM's prefix cache; 0 = off.
    pub prefill_piece_tokens: Option<u32>,
    /// `[admission.fifo]`.
    #[serde(default)]
    pub fifo: RawFifo,
}

/// `[admission.fifo]` as written: the baseline policy.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFifo {
    /// Concurrent requests; 0 = unlimited.
    pub max_concurrency: Option<u32>,
    /// Waiters allowed in the one queue.
    pub queue_len: Option<u32>,
    /// Longest wait in the queue, ms.
    pub queue_timeout_ms: Option<u64>,
}

/// `[lanes]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLanes {
    /// `[lanes.small]`.
    #[serde(default)]
    pub small: RawLane,
    /// `[lanes.medium]`.
    #[serde(default)]
    pub medium: RawLane,
    /// `[lanes.large]`.
    #[serde(default)]
    pub large: RawLane,
}

/// `[lanes.<lane>]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLane {
    /// Concurrent requests in this lane (reserved share under `lanes`, cap under `strict`).
    pub max_concurrency: Option<u32>,
    /// Most concurrent requests including borrowed seats (`lanes`).
    pub ceiling: Option<u32>,
    /// Lend idle reserved seats to other lanes.
    pub lend: Option<bool>,
    /// Borrow idle seats beyond the reservation.
    pub borrow: Option<bool>,
    /// Tokens (input + output budget) reserved by this lane's requests in flight.
    pub max_tokens_in_flight: Option<u64>,
    /// Waiters allowed in this lane's queue.
    pub queue_len: Option<u32>,
    /// Longest wait in this lane's queue, ms.
    pub queue_timeout_ms: Option<u64>,
    /// Output tokens after which a request moves to the next lane (0: no limit).
    pub mid_stream_limit: Option<u32>,
    /// The lane's time-to-first-token objective, ms (0: none).
    pub ttft_slo_ms: Option<u64>,
    /// The quantile the objective is for (0.5 to 0.999).
    pub ttft_slo_quantile: Option<f64>,
}

/// Which admission policy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Work-conserving lanes (the product): each lane's `max_concurrency` is a reserved share,
    /// idle seats are lent and borrowed up to each lane's `ceiling` within `admission.seats`;
    /// token budgets per lane and global.
    Lanes,
    /// The seed's literal caps: `max_concurrency` is a hard cap, nothing is lent or borrowed.
    Strict,
    /// One queue, one concurrency limit or none (the baseline experiments compare against).
    Fifo,
}

/// `[admission]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// The policy in force.
    pub policy: Policy,
    /// Tokens reserved across all lanes at once (policy `lanes`); size it from KV capacity (M10).
    pub max_tokens_in_flight: NonZeroU64,
    /// Seats in all (policy `lanes`): lanes borrow only while fewer are taken. Match the
    /// engine's `--max-num-seqs`.
    pub seats: NonZeroU32,
    /// Send the lane as vLLM's `priority` (small 0, medium 1, large 2; vLLM needs
    /// `--scheduling-policy priority`).
    pub engine_priority: bool,
    /// Estimated prompt tokens that may be between dispatch and first token at once (policies
    /// `lanes` and `strict`); 0 = off. Only prompts above `long_prompt_tokens` wait for it; every
    /// prompt is counted in it.
    pub prefill_budget_tokens: u64,
    /// Prompts above this many estimated input tokens wait for room in the prefill budget.
    pub long_prompt_tokens: NonZeroU32,
    /// The prefill reservation leaves out the prompt tokens the request's prefix fingerprint
    /// found cached in vLLM lately (a running average; none until a few requests measured it).
    pub prefill_discount_cached: bool,
    /// A request with `x-tutor-deadline-ms` whose predicted wait exceeds what is left of its
    /// deadline by more than this percent is refused at once (503, `deadline_unmet`).
    pub early_refusal_margin_percent: u16,
    /// A prompt longer than this many tokens is prefilled in pieces of this size, each a
    /// one-token request that leaves its prefix in vLLM's prefix cache, before the request
    /// itself (`crate::pipeline::pieces`); 0 = off.
    pub prefill_piece_tokens: u32,
    /// Settings of the `fifo` policy.
    pub fifo: FifoConfig,
}

/// `[admission.fifo]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FifoConfig {
    /// Concurrent requests; `None` = unlimited (the queue is then never used).
    pub max_concurrency: Option<NonZeroU32>,
    /// The one wait queue.
    pub queue: QueueConfig,
}

/// A bounded wait queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Waiters allowed; a request arriving at a full queue gets 429. 0 = never wait.
    pub len: u32,
    /// Longest wait before giving up with a timeout error.
    pub timeout: Duration,
}

/// `[lanes]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanesConfig {
    /// `[lanes.small]`.
    pub small: LaneConfig,
    /// `[lanes.medium]`.
    pub medium: LaneConfig,
    /// `[lanes.large]`.
    pub large: LaneConfig,
}

impl LanesConfig {
    /// The settings of `lane`.
    pub fn get(&self, lane: Lane) -> &LaneConfig {
        match lane {
            Lane::Small => &self.small,
            Lane::Medium => &self.medium,
            Lane::Large => &self.large,
        }
    }
}

/// `[lanes.<lane>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneConfig {
    /// Output tokens after which a request moves to the next lane; `None`: no limit.
    pub mid_stream_limit: Option<NonZeroU32>,
    /// Seats reserved to this lane (policy `lanes`), or its hard cap (policy `strict`).
    pub max_concurrency: NonZeroU32,
    /// Most seats this lane may hold, borrowed ones included (policy `lanes`).
    pub ceiling: NonZeroU32,
    /// Whether other lanes may borrow this lane's idle reserved seats.
    pub lend: bool,
    /// Whether this lane may borrow idle seats beyond its reservation.
    pub borrow: bool,
    /// Tokens (input + output budget) this lane's requests may hold in flight at once.
    pub max_tokens_in_flight: NonZeroU64,
    /// This lane's wait queue.
    pub queue: QueueConfig,
    /// The lane's time-to-first-token objective, if any (what the autopilot paces to).
    pub ttft_slo: Option<TtftObjective>,
}

/// A time-to-first-token objective: `quantile` of the lane's first tokens (from arrival at the
/// gateway) within `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtftObjective {
    /// The time.
    pub target: Duration,
    /// The quantile, in thousandths (990: p99).
    pub quantile_permille: u32,
}

impl TtftObjective {
    /// The quantile as a fraction (0.99).
    pub fn quantile(&self) -> f64 {
        f64::from(self.quantile_permille) / 1000.0
    }
}

/// Per-lane defaults.
struct LaneDefaults {
    max_concurrency: u32,
    max_tokens_in_flight: u64,
    queue_len: u32,
    queue_timeout_ms: u64,
    mid_stream_limit: u32,
    ceiling: u32,
    lend: bool,
    borrow: bool,
    /// `ttft_slo_ms` (0: none).
    ttft_slo_ms: u64,
}

/// Default `lanes.<lane>.ttft_slo_quantile`.
const TTFT_SLO_QUANTILE: f64 = 0.99;

/// Reserved seats 32/20/10 (the seed's 32/20/4, large raised under the prefill budget, see
/// `docs/results/fifo-vs-lanes`); token budgets = concurrency x the lane's largest request.
const fn lane_defaults(lane: Lane) -> LaneDefaults {
    match lane {
        Lane::Small => LaneDefaults {
            max_concurrency: 32,
            max_tokens_in_flight: 115_200,
            queue_len: 256,
            queue_timeout_ms: 5_000,
            mid_stream_limit: 256,
            ceiling: 96,
            lend: false,
            borrow: true,
            ttft_slo_ms: 500,
        },
        Lane::Medium => LaneDefaults {
            max_concurrency: 20,
            max_tokens_in_flight: 100_000,
            queue_len: 128,
            queue_timeout_ms: 15_000,
            mid_stream_limit: 2_048,
            ceiling: 40,
            lend: true,
            borrow: true,
            ttft_slo_ms: 2_000,
        },
        Lane::Large => LaneDefaults {
            max_concurrency: 10,
            max_tokens_in_flight: 163_840,
            queue_len: 64,
            queue_timeout_ms: 60_000,
            mid_stream_limit: 0,
            ceiling: 10,
            lend: true,
            borrow: false,
            ttft_slo_ms: 0,
        },
    }
}

/// Checks `[admission]` and `[admission.fifo]`.
pub(super) fn validate(c: &mut Checker, raw: RawAdmission) -> AdmissionConfig {
    let policy = match raw.policy.as_deref().unwrap_or(POLICY) {
        "lanes" => Policy::Lanes,
        "strict" => Policy::Strict,
        "fifo" => Policy::Fifo,
        _ => {
            c.fail(
                "admission.policy",
                "must be \"lanes\", \"strict\" or \"fifo\"",
            );
            Policy::Lanes
        }
    };
    let prefill_budget_tokens = raw.prefill_budget_tokens.unwrap_or(PREFILL_BUDGET_TOKENS);
    let long_prompt_tokens = c.u32(
        "admission.long_prompt_tokens",
        raw.long_prompt_tokens,
        LONG_PROMPT_TOKENS,
    );
    if prefill_budget_tokens != 0 && prefill_budget_tokens < u64::from(long_prompt_tokens.get()) {
        c.fail(
            "admission.prefill_budget_tokens",
            "must be 0 (off) or >= admission.long_prompt_tokens",
        );
    }
    let fifo = &raw.fifo;
    let max_concurrency = NonZeroU32::new(fifo.max_concurrency.unwrap_or(FIFO_MAX_CONCURRENCY));
    AdmissionConfig {
        policy,
        engine_priority: raw.engine_priority.unwrap_or(false),
        prefill_budget_tokens,
        long_prompt_tokens,
        prefill_discount_cached: raw.prefill_discount_cached.unwrap_or(true),
        early_refusal_margin_percent: match raw.early_refusal_margin_percent {
            None => EARLY_REFUSAL_MARGIN_PERCENT,
            Some(n @ 0..=1000) => n,
            Some(_) => {
                c.fail(
                    "admission.early_refusal_margin_percent",
                    "must be 0 to 1000 (percent of the deadline)",
                );
                EARLY_REFUSAL_MARGIN_PERCENT
            }
        },
        prefill_piece_tokens: piece_tokens(
            c,
            "admission.prefill_piece_tokens",
            raw.prefill_piece_tokens,
        ),
        seats: c.u32("admission.seats", raw.seats, SEATS),
        max_tokens_in_flight: c.u64(
            "admission.max_tokens_in_flight",
            raw.max_tokens_in_flight,
            GLOBAL_MAX_TOKENS_IN_FLIGHT,
        ),
        fifo: FifoConfig {
            max_concurrency,
            queue: queue(
                c,
                "admission.fifo",
                fifo.queue_len.unwrap_or(FIFO_QUEUE_LEN),
                fifo.queue_timeout_ms.unwrap_or(FIFO_QUEUE_TIMEOUT_MS),
            ),
        },
    }
}

/// A piece size (`admission.prefill_piece_tokens`, `jobs.prefill_piece_tokens`): 0 (off, the
/// default) or at least [`MIN_PREFILL_PIECE_TOKENS`] and a multiple of [`PREFILL_PIECE_ALIGN`].
pub(super) fn piece_tokens(c: &mut Checker, key: &str, raw: Option<u32>) -> u32 {
    match raw.unwrap_or(0) {
        0 => 0,
        n if n >= MIN_PREFILL_PIECE_TOKENS && n % PREFILL_PIECE_ALIGN == 0 => n,
        _ => {
            c.fail(
                key,
                format!(
                    "must be 0 (off) or at least {MIN_PREFILL_PIECE_TOKENS} and a multiple of \
                     {PREFILL_PIECE_ALIGN} (vLLM's KV block size: pieces end on block boundaries)"
                ),
            );
            0
        }
    }
}

/// Checks `[lanes.small]`, `[lanes.medium]` and `[lanes.large]`, in that order.
pub(super) fn lanes(c: &mut Checker, raw: RawLanes) -> LanesConfig {
    LanesConfig {
        small: lane(c, Lane::Small, raw.small),
        medium: lane(c, Lane::Medium, raw.medium),
        large: lane(c, Lane::Large, raw.large),
    }
}

/// Checks `[lanes.<lane>]`.
fn lane(c: &mut Checker, lane: Lane, raw: RawLane) -> LaneConfig {
    let def = lane_defaults(lane);
    let path = format!("lanes.{lane}");
    LaneConfig {
        mid_stream_limit: NonZeroU32::new(raw.mid_stream_limit.unwrap_or(def.mid_stream_limit)),
        ceiling: c.u32(&format!("{path}.ceiling"), raw.ceiling, def.ceiling),
        lend: raw.lend.unwrap_or(def.lend),
        borrow: raw.borrow.unwrap_or(def.borrow),
        max_concurrency: c.u32(
            &format!("{path}.max_concurrency"),
            raw.max_concurrency,
            def.max_concurrency,
        ),
        max_tokens_in_flight: c.u64(
            &format!("{path}.max_tokens_in_flight"),
            raw.max_tokens_in_flight,
            def.max_tokens_in_flight,
        ),
        queue: queue(
            c,
            &path,
            raw.queue_len.unwrap_or(def.queue_len),
            raw.queue_timeout_ms.unwrap_or(def.queue_timeout_ms),
        ),
        ttft_slo: objective(c, &path, &raw, def.ttft_slo_ms),
    }
}

/// A lane's TTFT objective: `ttft_slo_ms` (0: none; at most an hour) at `ttft_slo_quantile`
/// (0.5 to 0.999, in thousandths).
fn objective(c: &mut Checker, path: &str, raw: &RawLane, default_ms: u64) -> Option<TtftObjective> {
    // Both keys are checked before either refuses, so every problem is reported at once.
    let quantile = raw.ttft_slo_quantile.unwrap_or(TTFT_SLO_QUANTILE);
    let quantile_ok = (0.5..=0.999).contains(&quantile);
    if !quantile_ok {
        c.fail(
            format!("{path}.ttft_slo_quantile"),
            "must be from 0.5 to 0.999 (0.99: p99)",
        );
    }
    let ms = raw.ttft_slo_ms.unwrap_or(default_ms);
    let ms_ok = ms <= 3_600_000;
    if !ms_ok {
        c.fail(
            format!("{path}.ttft_slo_ms"),
            "must be at most 3600000 (an hour); 0: none",
        );
    }
    if !(quantile_ok && ms_ok) {
        return None;
    }
    (ms > 0).then(|| TtftObjective {
        target: Duration::from_millis(ms),
        quantile_permille: (quantile * 1000.0).round() as u32,
    })
}

/// A wait queue at `section`: a queue that may hold waiters needs a timeout.
fn queue(c: &mut Checker, section: &str, len: u32, timeout_ms: u64) -> QueueConfig {
    if len > 0 && timeout_ms == 0 {
        c.fail(
            format!("{section}.queue_timeout_ms"),
            format!("must be > 0 when {section}.queue_len > 0"),
        );
    }
    QueueConfig {
        len,
        timeout: Duration::from_millis(timeout_ms),
    }
}
