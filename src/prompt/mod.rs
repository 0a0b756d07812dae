//! Prompts: canonical JSON, the prompt fingerprint (M17, M18), course prompt assembly with its
//! stable prefix (built from the checked `[courses.<id>]`, whose placeholder check keeps
//! per-request values out of it, M20, is the config's: [`find_placeholder`]);
//! [`focus`]: the student's code cut down to what the stack trace needs (M11); the tenant's
//! prefix-cache salt ([`salt_for_tenant`]).

mod course;
mod fingerprint;
pub mod focus;
mod salt;

pub use crate::config::find_placeholder;
pub use course::{student_messages, Course, StudentMaterial};
pub use fingerprint::{
    canonical_json, canonical_value, discount_key, fingerprint, fingerprint_of_chat,
};
pub use salt::{salt_for_tenant, tenant_salt};
