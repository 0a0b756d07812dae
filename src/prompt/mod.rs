//! Prompts: canonical JSON and the prompt fingerprint (M17, M18). Course prompt assembly comes
//! with the prefix-cache issue.

mod fingerprint;

pub use fingerprint::{canonical_json, fingerprint, fingerprint_of_chat};
