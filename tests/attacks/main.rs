//! Issue 29: one test module per way a single client could walk around the lanes or lock other
//! clients out. Each test failed on the gateway before its fix and passes after it.

#[path = "../common/mod.rs"]
mod common;
#[path = "../redis_common/mod.rs"]
mod redis_common;

mod cors_admin;
mod event_id;
mod fields;
mod idle_connections;
mod reasoning;
mod silent_reader;
mod silent_tokens;
mod template_text;
mod token_key;
