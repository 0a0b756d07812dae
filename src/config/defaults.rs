//! Built-in defaults: the values a key takes when the file leaves it out.
//!
//! `config/config.toml` states every one of them explicitly; a test checks that the two agree.

use crate::classify::Lane;

pub(super) const LISTEN: &str = "127.0.0.1:8080";
pub(super) const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
pub(super) const SHUTDOWN_GRACE_MS: u64 = 30_000;
pub(super) const BASE_URL: &str = "http://127.0.0.1:8000";
pub(super) const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
pub(super) const MAX_MODEL_LEN: u32 = 16_384;
pub(super) const CONNECT_TIMEOUT_MS: u64 = 2_000;
pub(super) const FIRST_TOKEN_TIMEOUT_MS: u64 = 60_000;
pub(super) const IDLE_TIMEOUT_MS: u64 = 30_000;
pub(super) const TOTAL_TIMEOUT_MS: u64 = 600_000;

pub(super) const ABORT_ENABLED: bool = true;
pub(super) const ABORT_URL: &str = "{base_url}/abort_requests";
pub(super) const ABORT_METHOD: &str = "POST";
pub(super) const ABORT_BODY: &str = r#"{"request_ids":["{id}"]}"#;

pub(super) const SMALL_MAX_WORK: u32 = 1_200;
pub(super) const MEDIUM_MAX_WORK: u32 = 5_000;
pub(super) const DEFAULT_OUTPUT_TOKENS: u32 = 512;
pub(super) const PER_MESSAGE_OVERHEAD: u32 = 5;

pub(super) const POLICY: &str = "lanes";
pub(super) const GLOBAL_MAX_TOKENS_IN_FLIGHT: u64 = 196_608;
pub(super) const FIFO_MAX_CONCURRENCY: u32 = 0;
pub(super) const FIFO_QUEUE_LEN: u32 = 1_024;
pub(super) const FIFO_QUEUE_TIMEOUT_MS: u64 = 60_000;

pub(super) const QUOTA_BACKEND: &str = "local";
pub(super) const QUOTA_REDIS_URL: &str = "redis://127.0.0.1:6379/0";
pub(super) const QUOTA_LEASE_TTL_MS: u64 = 10_000;
pub(super) const QUOTA_HEARTBEAT_MS: u64 = 2_000;
pub(super) const QUOTA_KEY_PREFIX: &str = "tg:v1";
pub(super) const QUOTA_ON_REDIS_DOWN: &str = "fail_open";
pub(super) const QUOTA_EXPECTED_REPLICAS: u32 = 2;

/// Per-lane defaults.
pub(super) struct LaneDefaults {
    pub max_concurrency: u32,
    pub max_tokens_in_flight: u64,
    pub queue_len: u32,
    pub queue_timeout_ms: u64,
    pub mid_stream_limit: u32,
    pub ceiling: u32,
    pub lend: bool,
    pub borrow: bool,
}

pub(super) const SEATS: u32 = 96;

pub(super) const PROMOTION_WHEN_FULL: &str = "cut";
pub(super) const PROMOTION_WAIT_MS: u64 = 2_000;
pub(super) const CONTINUATION_WINDOW_MS: u64 = 600_000;

/// Seed limits 32/20/4; token budgets = concurrency x the lane's largest request.
pub(super) const fn lane(lane: Lane) -> LaneDefaults {
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
        },
        Lane::Large => LaneDefaults {
            max_concurrency: 4,
            max_tokens_in_flight: 65_536,
            queue_len: 64,
            queue_timeout_ms: 60_000,
            mid_stream_limit: 0,
            ceiling: 4,
            lend: true,
            borrow: false,
        },
    }
}

pub(super) const CANONICALIZE_TOOLS: bool = true;
pub(super) const FINGERPRINT_LABELS: u32 = 20;
pub(super) const LABEL_AFTER_REQUESTS: u32 = 3;
pub(super) const DRIFT_FACTOR_PERCENT: u32 = 300;
pub(super) const DRIFT_MIN_SAMPLES: u32 = 5;
pub(super) const DRIFT_LOG_WINDOW_MS: u64 = 300_000;
