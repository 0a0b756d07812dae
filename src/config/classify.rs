//! `[classify]`: where token counts come from and the work thresholds of the lanes (M12).
//!
//! Owns [`RawClassify`], [`ClassifyConfig`] and [`TokenizerSource`], their defaults and
//! validation. The rules that tie these thresholds to `upstream` and `lanes` are cross-section
//! checks, in `file.rs`.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;

/// Default `classify.small_max_work`.
const SMALL_MAX_WORK: u32 = 1_200;
/// Default `classify.medium_max_work`.
const MEDIUM_MAX_WORK: u32 = 5_000;
/// Default `classify.default_output_tokens`.
const DEFAULT_OUTPUT_TOKENS: u32 = 512;
/// Default `classify.per_message_overhead`.
const PER_MESSAGE_OVERHEAD: u32 = 5;
/// Default `classify.image_part_tokens`.
const IMAGE_PART_TOKENS: u32 = 1_024;
/// Largest `classify.image_token_pixels`.
const MAX_IMAGE_TOKEN_PIXELS: u32 = 4_096;
/// Default `classify.image_min_tokens`: Qwen2-VL's and Qwen2.5-VL's `min_pixels` (3,136) in
/// squares of 28 pixels.
const IMAGE_MIN_TOKENS: u32 = 4;
/// Default `classify.audio_part_tokens`.
const AUDIO_PART_TOKENS: u32 = 1_024;
/// Default `classify.video_part_tokens`.
const VIDEO_PART_TOKENS: u32 = 8_192;
/// Default `classify.exact_count_margin_percent`.
const EXACT_COUNT_MARGIN_PERCENT: u32 = 10;
/// Default `classify.exact_count_timeout_ms`.
const EXACT_COUNT_TIMEOUT_MS: u64 = 1_000;
/// Largest `classify.exact_count_timeout_ms`.
const MAX_EXACT_COUNT_TIMEOUT_MS: u64 = 30_000;
/// Longest role name `classify.extra_roles` may add, bytes.
const MAX_ROLE_BYTES: usize = 1 << 20;

/// `[classify]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClassify {
    /// Path to `tokenizer.json`, or the literal `heuristic`. Required.
    pub tokenizer: Option<String>,
    /// Largest estimated work (tokens) that is still `small`.
    pub small_max_work: Option<u32>,
    /// Largest estimated work (tokens) that is still `medium`.
    pub medium_max_work: Option<u32>,
    /// Output budget (tokens) assumed when the client sends no max tokens.
    pub default_output_tokens: Option<u32>,
    /// Chat template tokens per message (role header, separators).
    pub per_message_overhead: Option<u32>,
    /// Tokens counted per image part, on top of its JSON.
    pub image_part_tokens: Option<u32>,
    /// Side in pixels of the square one image token covers; 0: every image costs
    /// `image_part_tokens`.
    pub image_token_pixels: Option<u32>,
    /// Tokens the smallest picture costs (the model's `min_pixels` in squares).
    pub image_min_tokens: Option<u32>,
    /// Tokens counted per audio part, on top of its JSON.
    pub audio_part_tokens: Option<u32>,
    /// Tokens counted per video part, on top of its JSON.
    pub video_part_tokens: Option<u32>,
    /// Message roles accepted beyond vLLM's own.
    pub extra_roles: Option<Vec<String>>,
    /// Prompts tokenized at once; 0: one per CPU.
    pub max_concurrent_tokenizations: Option<u32>,
    /// `"off"` or `"near_limits"`: when vLLM's `/tokenize` counts exactly.
    pub exact_count: Option<String>,
    /// How near a limit, in percent of it, an estimate must come to be counted exactly.
    pub exact_count_margin_percent: Option<u32>,
    /// Longest wait for `/tokenize` before the estimate stands, milliseconds.
    pub exact_count_timeout_ms: Option<u64>,
    /// Whether a request that ended before the engine reported its prompt is counted by
    /// `/tokenize` afterwards.
    pub count_unreported_prompts: Option<bool>,
}

/// `[classify]`: token estimate and lane thresholds (M12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassifyConfig {
    /// Where token counts come from.
    pub tokenizer: TokenizerSource,
    /// Estimated work (input + output tokens) up to which a request is `small`.
    pub small_max_work: NonZeroU32,
    /// Estimated work up to which a request is `medium`; above it, `large`.
    pub medium_max_work: NonZeroU32,
    /// Output tokens assumed (and reserved) when the client sends no max tokens.
    pub default_output_tokens: NonZeroU32,
    /// Tokens the chat template adds per message (role header and separators).
    pub per_message_overhead: u32,
    /// Tokens counted per image part (`image_url`, `input_image`), on top of
    /// its JSON: the most one picture costs.
    pub image_part_tokens: u32,
    /// Side in pixels of the square one image token covers (28 for Qwen2-VL and Qwen2.5-VL): a
    /// picture whose size its `data:` URL's header gives costs `ceil(w / side) * ceil(h /
    /// side)` tokens, at most `image_part_tokens`; 0: every picture `image_part_tokens`.
    pub image_token_pixels: u32,
    /// With `image_token_pixels`: the squares a picture is scaled up to when it has fewer (the
    /// model's `min_pixels`): such a picture costs what its scaled sides, rounded up, cover.
    pub image_min_tokens: u32,
    /// Tokens counted per audio part (`audio_url`, `input_audio`), on top of
    /// its JSON.
    pub audio_part_tokens: u32,
    /// Tokens counted per video part (`video_url`), on top of its JSON.
    pub video_part_tokens: u32,
    /// Message roles accepted beyond vLLM's (`system`, `developer`, `user`, `assistant`,
    /// `tool`, `function`); their text is counted like any role's.
    pub extra_roles: Vec<String>,
    /// Prompts tokenized at once (the rest wait); 0: one per CPU.
    pub max_concurrent_tokenizations: u32,
    /// When vLLM's `/tokenize` counts a request exactly.
    pub exact_count: ExactCount,
    /// How near a limit (a lane boundary or `max_model_len`), in percent of it, an estimate
    /// must come to be counted exactly (1 to 100).
    pub exact_count_margin_percent: u32,
    /// Longest wait for `/tokenize`; past it the estimate stands.
    pub exact_count_timeout: Duration,
    /// A request that reached the engine and ended before vLLM reported its prompt's tokens
    /// (its client gone before the first token, a timeout, an engine error) is counted by
    /// vLLM's `/tokenize` once it ended: the count teaches the correction and settles the
    /// tenant's budget (`crate::relay::late_count`).
    pub count_unreported_prompts: bool,
}

/// When the gateway asks the engine for a request's exact count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactCount {
    /// Never: the corrected estimate decides.
    Off,
    /// When the estimate comes within the margin of a lane boundary or of `max_model_len`
    /// (a refusal for length included).
    NearLimits,
}

/// Where token counts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The documented heuristic of `tutor_wire::tokens` (chosen explicitly with `"heuristic"`).
    Heuristic,
    /// A HuggingFace `tokenizer.json`, ideally the one vLLM serves with.
    File(PathBuf),
}

/// Checks `[classify]`. The tokenizer has no default: it must be chosen explicitly.
pub(super) fn validate(c: &mut Checker, raw: RawClassify) -> ClassifyConfig {
    let tokenizer = match raw.tokenizer.as_deref() {
        None => {
            c.fail(
                "classify.tokenizer",
                "is required: a path to tokenizer.json, or \"heuristic\"",
            );
            TokenizerSource::Heuristic
        }
        Some("heuristic") => TokenizerSource::Heuristic,
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.is_file() {
                c.fail(
                    "classify.tokenizer",
                    "names a file that does not exist (a path to the model's tokenizer.json, \
                     relative to the working directory, or \"heuristic\")",
                );
            }
            TokenizerSource::File(path)
        }
    };
    ClassifyConfig {
        tokenizer,
        small_max_work: c.u32(
            "classify.small_max_work",
            raw.small_max_work,
            SMALL_MAX_WORK,
        ),
        medium_max_work: c.u32(
            "classify.medium_max_work",
            raw.medium_max_work,
            MEDIUM_MAX_WORK,
        ),
        default_output_tokens: c.u32(
            "classify.default_output_tokens",
            raw.default_output_tokens,
            DEFAULT_OUTPUT_TOKENS,
        ),
        per_message_overhead: raw.per_message_overhead.unwrap_or(PER_MESSAGE_OVERHEAD),
        image_part_tokens: raw.image_part_tokens.unwrap_or(IMAGE_PART_TOKENS),
        image_token_pixels: match raw.image_token_pixels {
            Some(n) if n > MAX_IMAGE_TOKEN_PIXELS => {
                c.fail(
                    "classify.image_token_pixels",
                    "must be at most 4096 (pixels a side of one token's square; 0: every image costs image_part_tokens)",
                );
                0
            }
            n => n.unwrap_or(0),
        },
        image_min_tokens: match raw.image_min_tokens {
            Some(n) if n > 1 << 20 => {
                c.fail(
                    "classify.image_min_tokens",
                    "must be at most 1048576 (the model's min_pixels in squares of image_token_pixels)",
                );
                IMAGE_MIN_TOKENS
            }
            n => n.unwrap_or(IMAGE_MIN_TOKENS),
        },
        audio_part_tokens: raw.audio_part_tokens.unwrap_or(AUDIO_PART_TOKENS),
        video_part_tokens: raw.video_part_tokens.unwrap_or(VIDEO_PART_TOKENS),
        extra_roles: extra_roles(c, raw.extra_roles.unwrap_or_default()),
        max_concurrent_tokenizations: {
            let n = raw.max_concurrent_tokenizations.unwrap_or(0);
            if n > 1024 {
                c.fail(
                    "classify.max_concurrent_tokenizations",
                    "must be at most 1024 (0: one per CPU)",
                );
            }
            n.min(1024)
        },
        exact_count: match raw.exact_count.as_deref() {
            None | Some("off") => ExactCount::Off,
            Some("near_limits") => ExactCount::NearLimits,
            Some(_) => {
                c.fail("classify.exact_count", "must be \"off\" or \"near_limits\"");
                ExactCount::Off
            }
        },
        exact_count_margin_percent: match raw.exact_count_margin_percent {
            None => EXACT_COUNT_MARGIN_PERCENT,
            Some(n @ 1..=100) => n,
            Some(_) => {
                c.fail(
                    "classify.exact_count_margin_percent",
                    "must be 1 to 100 (percent of the limit)",
                );
                EXACT_COUNT_MARGIN_PERCENT
            }
        },
        exact_count_timeout: match raw.exact_count_timeout_ms {
            Some(ms) if ms > MAX_EXACT_COUNT_TIMEOUT_MS => {
                c.fail(
                    "classify.exact_count_timeout_ms",
                    format!(
                        "must be at most {MAX_EXACT_COUNT_TIMEOUT_MS} (a request waits for it)"
                    ),
                );
                Duration::from_millis(EXACT_COUNT_TIMEOUT_MS)
            }
            ms => c.ms(
                "classify.exact_count_timeout_ms",
                ms,
                EXACT_COUNT_TIMEOUT_MS,
            ),
        },
        count_unreported_prompts: raw.count_unreported_prompts.unwrap_or(true),
    }
}

/// Checks `classify.extra_roles`: each a non-empty role of at most 1 MiB.
fn extra_roles(c: &mut Checker, roles: Vec<String>) -> Vec<String> {
    if roles
        .iter()
        .any(|r| r.is_empty() || r.len() > MAX_ROLE_BYTES)
    {
        c.fail(
            "classify.extra_roles",
            "roles must be non-empty and at most 1 MiB",
        );
    }
    roles
}
