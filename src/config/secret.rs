//! [`Secret`]: a value from the config or the environment that the code uses but never shows
//! (webhook keys, the upstream API key). Its `Debug` prints `<redacted>`, so a logged config
//! cannot leak it. A leaf: it imports nothing from the other sections.

use serde::Deserialize;

/// A secret from the config: usable by the code, never shown by `Debug` (so a logged config
/// cannot leak it).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.to_owned())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
