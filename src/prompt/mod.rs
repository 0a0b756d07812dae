//! Prompts: canonical JSON, the prompt fingerprint (M17, M18), course prompt assembly with its
//! stable prefix, and the placeholder check that keeps per-request values out of it (M20);
//! [`focus`]: the student's code cut down to what the stack trace needs (M11).

mod course;
mod fingerprint;
pub mod focus;
mod placeholders;

pub use course::{student_messages, Course, StudentMaterial};
pub use fingerprint::{canonical_json, canonical_value, fingerprint, fingerprint_of_chat};
pub use placeholders::find_placeholder;
