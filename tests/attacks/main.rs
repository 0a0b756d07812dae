//! Issue 29: one test module per way a single client could walk around the lanes or lock other
//! clients out. Each test failed on the gateway before its fix and passes after it.

#[path = "../common/mod.rs"]
mod common;
#[path = "../redis_common/mod.rs"]
mod redis_common;

mod cache_probe;
mod cors_admin;
mod counted_short;
mod event_id;
mod fields;
mod idle_connections;
mod rapid_reset;
mod reasoning;
mod silent_reader;
mod silent_tokens;
mod template_text;
mod token_key;

use common::{eventually, metric, Harness};

/// After one stream cut at the small lane's limit: the engine's work was aborted, every
/// counter is back to zero, and the cut is counted once.
async fn one_small_cut_cleaned_up(h: &Harness) {
    eventually("the engine aborted the cut request", || {
        h.sim_aborted() == 1
    })
    .await;
    eventually("every counter back to zero", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(&m, "tutor_gateway_stream_cuts_total{lane=\"small\"}"),
        1.0
    );
}
