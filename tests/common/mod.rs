//! Gateway + simulator on 127.0.0.1:0 for integration tests.
#![allow(dead_code, missing_docs, unused_imports)]

pub mod process;
pub mod traces;

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;
use tutor_gateway::telemetry::RequestLog;

use serde_json::Value;
use tutor_gateway::config::{Config, KeyEntry};
use tutor_gateway::lane::Lane;
use tutor_gateway::server::Gateway;
use vllm_sim::{SimArgs, SimServer};

pub use tutor_testkit::{
    client, delta_text, delta_words, family_total, flags, free_port, get_text, message_words,
    metric, metric_or_zero, post_text, send, send_json, send_text, sse, words, Streamed,
};

pub struct Harness {
    pub sim: SimServer,
    pub gw: Gateway,
    /// The request log lines, kept in memory.
    pub log: Arc<Mutex<Vec<Value>>>,
}

/// A simulator with `sim_flags` and a gateway in front of it, `tweak`ed from the shipped config.
pub async fn harness(sim_flags: &[&str], tweak: impl FnOnce(&mut Config)) -> Harness {
    let sim = vllm_sim::start(&SimArgs::for_test(sim_flags))
        .await
        .expect("sim starts");
    let mut config = Config::default();
    config.upstream.base_url = sim.url();
    tweak(&mut config);
    let (gw, log) = gateway(config).await;
    Harness { sim, gw, log }
}

/// A gateway with `config` on 127.0.0.1:0, and its request log kept in memory.
pub async fn gateway(config: Config) -> (Gateway, Arc<Mutex<Vec<Value>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tasks = TaskTracker::new();
    let (request_log, log) = RequestLog::memory();
    let state = tutor_gateway::server::build_state_with_log(config, tasks.clone(), request_log)
        .expect("gateway state");
    let gw = tutor_gateway::server::serve_state(state, tasks, listener).expect("gateway starts");
    (gw, log)
}

impl Harness {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gw.url())
    }

    pub async fn shutdown(self) {
        self.gw.shutdown().await;
        self.sim.shutdown().await;
    }

    pub fn in_flight(&self, lane: Lane) -> u32 {
        self.gw.state.admission().snapshot().lane(lane).in_flight
    }

    pub fn queued(&self, lane: Lane) -> u32 {
        self.gw.state.admission().snapshot().lane(lane).queue_depth
    }

    /// Every lane at zero in flight, zero reserved tokens, zero queued.
    pub fn idle(&self) -> bool {
        self.gw.state.admission().snapshot().is_idle()
    }

    pub fn sim_aborted(&self) -> u64 {
        self.sim.engine.snapshot().aborted
    }

    /// The generation requests the simulator accepted, oldest first (its `/debug/requests`:
    /// what the engine was sent, never a prompt's text).
    pub async fn sim_requests(&self) -> Vec<Value> {
        let seen = tutor_testkit::get_json(format!("{}/debug/requests", self.sim.url())).await;
        // Strict: an answer that is not a list must not pass for "the engine saw nothing".
        seen.as_array()
            .unwrap_or_else(|| panic!("/debug/requests is not a list: {seen}"))
            .clone()
    }

    /// The gateway's `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        tutor_testkit::metrics_text(&self.gw.url()).await
    }

    pub fn sim_running(&self) -> usize {
        self.sim.engine.snapshot().running
    }
}

pub fn set_lane(config: &mut Config, lane: Lane, max_concurrency: u32) {
    let l = match lane {
        Lane::Small => &mut config.lanes.small,
        Lane::Medium => &mut config.lanes.medium,
        Lane::Large => &mut config.lanes.large,
    };
    // A hard size: the reservation and the ceiling (no borrowing beyond it).
    l.max_concurrency = NonZeroU32::new(max_concurrency).unwrap();
    l.ceiling = l.max_concurrency;
}

/// The counter of requests moved from the small lane to medium.
pub const SMALL_TO_MEDIUM: &str =
    "tutor_gateway_lane_promotions_total{from=\"small\",to=\"medium\"}";

/// Turns auth on with these `(key, tenant)` pairs as the only keys.
pub fn with_keys(config: &mut Config, keys: &[(&str, &str)]) {
    config.auth.enabled = true;
    config.auth.keys = keys
        .iter()
        .map(|(key, tenant)| KeyEntry {
            sha256: sha256(key),
            tenant: (*tenant).into(),
        })
        .collect();
}

/// A key's SHA-256 as the key file and `auth.keys` write it.
pub fn sha256(key: &str) -> String {
    tutor_gateway::sign::sha256_hex(key.as_bytes())
}

/// Asserts that `resp` is an error answer with `status` and the OpenAI-shaped `error.code`
/// `code`; returns its body for further checks.
pub async fn assert_error(resp: reqwest::Response, status: u16, code: &str) -> Value {
    let got = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    assert_eq!(got, status, "{text}");
    let body = json(&text);
    assert_eq!(body["error"]["code"], code, "{body}");
    body
}

/// The whole body of `resp` as JSON.
pub async fn read_json(resp: reqwest::Response) -> Value {
    json(&resp.text().await.unwrap())
}

/// The status of `resp` and its whole body as JSON.
pub async fn status_json(resp: reqwest::Response) -> (reqwest::StatusCode, Value) {
    (resp.status(), read_json(resp).await)
}

pub fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// The SSE events of `body`, whose last is an `error` event `shutdown` (a stream ended by
/// the gateway's shutdown; `/answer`'s shape).
pub fn ended_by_shutdown(body: &str) -> Vec<(String, String)> {
    let events = sse(body);
    let (last, data) = events.last().expect("an event");
    assert_eq!(
        (last.as_str(), json(data)["code"].clone()),
        ("error", serde_json::json!("shutdown")),
        "{events:?}"
    );
    events
}

/// Polls `cond` every 10 ms for up to 30 s.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut cond: F) {
    tutor_testkit::eventually(what, || std::future::ready(cond())).await;
}

/// Waits (up to 30 s) until `gw`, started on the Redis backend, has its first connection to
/// Redis. A request waits only two seconds for it and then falls back (or gets 503), which a
/// loaded machine can exceed. Only for a Redis that is up and takes the gateway's credentials:
/// otherwise the connection never comes and this fails.
pub async fn redis_ready(gw: &Gateway) {
    eventually("the gateway reaches Redis", || {
        gw.state
            .admission()
            .shared()
            .is_some_and(|r| r.connection().is_some())
    })
    .await;
}
