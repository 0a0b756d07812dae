//! Stage one: the config file exactly as written, in human units (`_ms`), every key optional.
//!
//! Kept as a public path only: each `Raw*` struct lives in the file of the section it belongs
//! to (`file.rs` for [`RawConfig`]) and is re-exported here. Defaults and checks are applied in
//! one place, [`super::validate`], so that every problem in a file is reported at once. Unknown
//! keys are rejected (`deny_unknown_fields`): a typo must not silently fall back to a default.

pub use super::admission::{RawAdmission, RawFifo, RawLane, RawLanes};
pub use super::auth::{RawAuth, RawKey};
pub use super::autopilot::RawAutopilot;
pub use super::classify::RawClassify;
pub use super::fields::RawFields;
pub use super::file::RawConfig;
pub use super::jobs::RawJobs;
pub use super::prefix::{RawCourse, RawPrefixCache};
pub use super::promotion::RawPromotion;
pub use super::quota::RawQuota;
pub use super::server::RawServer;
pub use super::telemetry::RawTelemetry;
pub use super::upstream::{RawAbort, RawUpstream};
