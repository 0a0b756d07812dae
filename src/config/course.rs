//! A course as configured (`[courses.<id>]`, M17), checked and typed but not yet a prompt: the
//! prompt layer builds its stable prefix from it ([`crate::prompt::Course::from_config`]), so
//! the config names no type of the layers above it. Also the course's focusing settings (M11),
//! which are not part of its prefix.

use std::time::Duration;

use serde_json::Value;

/// One `[courses.<id>]`, checked: no placeholder in its texts, `tools` a JSON array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CourseConfig {
    /// The course id (`[courses.<id>]`).
    pub id: String,
    /// `version`.
    pub version: String,
    /// `instructions`.
    pub instructions: String,
    /// `rubric` (may be empty).
    pub rubric: String,
    /// `safety` (may be empty).
    pub safety: String,
    /// `tools`, parsed (a JSON array), if any.
    pub tools: Option<Value>,
    /// `focus*`: how the student's code is focused on its stack trace.
    pub focus: FocusSettings,
    /// `tenants`: the only tenants whose requests may name the course; `None`: every tenant.
    pub tenants: Option<Vec<String>>,
}

impl CourseConfig {
    /// A course with these texts and the default focusing settings.
    pub fn new(
        id: &str,
        version: &str,
        instructions: &str,
        rubric: &str,
        safety: &str,
        tools: Option<Value>,
    ) -> Self {
        Self {
            id: id.to_owned(),
            version: version.to_owned(),
            instructions: instructions.to_owned(),
            rubric: rubric.to_owned(),
            safety: safety.to_owned(),
            tools,
            focus: FocusSettings::default(),
            tenants: None,
        }
    }

    /// The same course, open only to `tenants` (`None`: to every tenant).
    #[must_use]
    pub fn for_tenants(self, tenants: Option<Vec<String>>) -> Self {
        Self { tenants, ..self }
    }

    /// The same course with these focusing settings.
    #[must_use]
    pub fn with_focus(self, focus: FocusSettings) -> Self {
        Self { focus, ..self }
    }
}

/// `focus` in `[courses.<id>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FocusMode {
    /// Focus when it parses, a frame matches and the selection is smaller.
    Auto,
    /// Always the whole code.
    Off,
}

/// A course's focusing settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FocusSettings {
    /// `focus`.
    pub mode: FocusMode,
    /// `focus_token_target`: called definitions are added while the focused code stays within
    /// this many tokens (the frames' own functions are always sent).
    pub token_target: u32,
    /// `focus_depth`: levels of calls followed (0: none).
    pub depth: u32,
    /// `focus_max_bytes`: larger code is sent whole without parsing.
    pub max_bytes: usize,
    /// `focus_timeout_ms`: focusing's time; parsing not done by then is given up (the code is
    /// sent whole), called definitions not weighed by then are left out.
    pub timeout: Duration,
    /// Parse every definition instead of only those the trace can reach (see [`outline`]):
    /// slower, the same selection; for comparison in tests and benchmarks, not configurable.
    pub whole_parse: bool,
}

/// Default `focus_token_target`.
pub const TOKEN_TARGET: u32 = 2000;
/// Default `focus_depth`.
pub const DEPTH: u32 = 1;
/// Default `focus_max_bytes`.
pub const MAX_BYTES: usize = 1 << 20;
/// Default `focus_timeout_ms`.
pub const TIMEOUT_MS: u64 = 250;

impl Default for FocusSettings {
    fn default() -> Self {
        Self {
            mode: FocusMode::Auto,
            token_target: TOKEN_TARGET,
            depth: DEPTH,
            max_bytes: MAX_BYTES,
            timeout: Duration::from_millis(TIMEOUT_MS),
            whole_parse: false,
        }
    }
}
