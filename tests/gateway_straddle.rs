//! A request sees one configuration from its entry to its end (issue 31, item 4): its route
//! handler takes one snapshot of the set in force (`RequestCtx::snapshot`: the configuration,
//! the classifier and its lane rules, the upstream client) and every step reads that. A reload
//! while a request waits for its seat changes nothing it sees (its lane, its reservation, the
//! engine it is sent to); a request that arrives after the reload sees the new set.
//!
//! Nothing here is timed: the requests are held where the test wants them (a stream stalled by
//! the simulator holds the small lane's only seat; the others wait in its queue, whose timeout
//! is an hour) and released by closing that stream.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tutor_gateway::config::Config;
use tutor_gateway::lane::Lane;
use tutor_gateway::pipeline::parse::AnswerRequest;
use tutor_gateway::pipeline::{self, prompt, reload, RequestCtx};
use tutor_gateway::telemetry::Route;

/// Every stream stalls after two tokens, its connection open: a stream holds its seat until
/// its client goes away.
const STALLS: &str = "--speed 50 --profile tiny-test --stall-after-tokens 2";

/// Answers every request 500 before streaming: a request sent here never streams.
const FAILS: &str = "--speed 50 --profile tiny-test --fail-rate 1";

const PROMPT: &str = "why does my loop never end";

/// One seat in the small lane and no borrowing; waits and stalls that outlast the test, so that
/// only the test's own steps move a request.
fn one_small_seat(c: &mut Config) {
    set_lane(c, Lane::Small, 1);
    c.lanes.small.queue.timeout = Duration::from_secs(3_600);
    c.upstream.first_token_timeout = Duration::from_secs(3_600);
    c.upstream.idle_timeout = Duration::from_secs(3_600);
    c.upstream.total_timeout = Duration::from_secs(3_600);
}

/// `base` with another engine behind it and another lane cut and per-message count: the same
/// question is now medium work, reserved at more tokens, and sent elsewhere.
fn reloaded(base: &Config, upstream: String) -> Config {
    let mut c = base.clone();
    c.upstream.base_url = upstream;
    c.classify.small_max_work = 10.try_into().unwrap();
    c.classify.per_message_overhead = base.classify.per_message_overhead + 400;
    c
}

/// A streaming response read until its body holds `marker`.
struct Open {
    resp: reqwest::Response,
    body: String,
}

impl Open {
    async fn until(req: reqwest::RequestBuilder, marker: &str) -> Open {
        let resp = send(req).await;
        assert_eq!(resp.status(), 200, "{:?}", resp.headers());
        let mut open = Open {
            resp,
            body: String::new(),
        };
        while !open.body.contains(marker) {
            match open.resp.chunk().await.unwrap() {
                Some(b) => open.body.push_str(std::str::from_utf8(&b).unwrap()),
                None => panic!("the stream ended before {marker:?}: {}", open.body),
            }
        }
        open
    }

    fn request_id(&self) -> String {
        self.resp.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// The `/answer` `meta` event's data.
    fn meta(&self) -> Value {
        let events = sse(&self.body);
        let (_, data) = events
            .iter()
            .find(|(n, _)| n == "meta")
            .expect("a meta event");
        json(data)
    }
}

fn answer_req(h: &Harness) -> reqwest::RequestBuilder {
    client()
        .post(h.url("/answer"))
        .json(&json!({"prompt": PROMPT, "max_output_tokens": 50}))
}

fn chat_req(h: &Harness) -> reqwest::RequestBuilder {
    client().post(h.url("/v1/chat/completions")).json(&json!({
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 50,
        "stream": true,
    }))
}

/// The request log line of `request_id`, once written.
async fn log_line(h: &Harness, request_id: &str) -> Value {
    let find = || {
        h.log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l["request_id"] == request_id)
            .cloned()
    };
    eventually("the request's log line", || find().is_some()).await;
    find().unwrap()
}

#[tokio::test]
async fn a_request_waiting_for_its_seat_keeps_the_configuration_of_its_arrival() {
    let h = harness(&flags(STALLS), one_small_seat).await;
    let other = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(FAILS)))
        .await
        .unwrap();
    // The small lane's only seat, held by a stalled stream.
    let holder = Open::until(answer_req(&h), "event: token").await;
    assert_eq!(holder.meta()["lane"], "small");
    // Two requests, one per route, wait for it in turn.
    let parked_answer = tokio::spawn(Open::until(answer_req(&h), "event: token"));
    eventually("the /answer waits", || h.queued(Lane::Small) == 1).await;
    let parked_chat = tokio::spawn(Open::until(chat_req(&h), "data: "));
    eventually("the /v1 waits too", || h.queued(Lane::Small) == 2).await;
    let before = (*h.gw.state.config()).clone();
    let waited_estimate = holder.meta()["estimated_input_tokens"].clone();

    let r = reload::apply(&h.gw.state, reloaded(&before, other.url())).unwrap();
    assert!(r.changed.contains(&"upstream"), "{r:?}");
    assert!(r.changed.contains(&"classify"), "{r:?}");
    assert_eq!(h.gw.state.config().upstream.base_url, other.url());
    assert_eq!(h.queued(Lane::Small), 2, "a reload moves no waiter");

    // Released one by one, each streams from the engine of its arrival (the new one never
    // streams), in the lane and with the estimate it had.
    drop(holder);
    let first = parked_answer.await.unwrap();
    let meta = first.meta();
    assert_eq!(meta["lane"], "small", "{meta}");
    assert_eq!(meta["estimated_input_tokens"], waited_estimate, "{meta}");
    assert_eq!(h.queued(Lane::Small), 1);
    let first_id = first.request_id();
    drop(first);
    let second = parked_chat.await.unwrap();
    let second_id = second.request_id();
    drop(second);
    for id in [&first_id, &second_id] {
        let line = log_line(&h, id).await;
        assert_eq!(line["lane"], "small", "{line}");
        assert_eq!(line["outcome"], "cancelled", "{line}");
        assert_eq!(line["error_code"], Value::Null, "{line}");
        assert_eq!(line["input_tokens_estimated"], waited_estimate, "{line}");
    }

    // A request that arrives now: the new cut, the new count, the new engine (which fails it).
    for (req, route) in [
        (answer_req(&h), "answer"),
        (chat_req(&h), "chat_completions"),
    ] {
        let resp = send(req).await;
        assert_eq!(resp.status(), 502, "{route}");
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        let line = log_line(&h, &id).await;
        assert_eq!(line["lane"], "medium", "{line}");
        assert_ne!(line["outcome"], "ok", "{line}");
        assert!(
            line["input_tokens_estimated"].as_u64().unwrap()
                >= waited_estimate.as_u64().unwrap() + 400,
            "{line}"
        );
    }
    eventually("every seat back", || h.idle()).await;
    h.shutdown().await;
    other.shutdown().await;
}

/// The steps below the entry read the snapshot, never the live set: a request whose entry came
/// before a reload is prepared and classified under the old set even when those steps run
/// after it (here, by calling them in that order).
#[tokio::test]
async fn the_steps_after_the_entry_read_its_snapshot() {
    let h = harness(&flags(STALLS), one_small_seat).await;
    let before = (*h.gw.state.config()).clone();
    let old = RequestCtx::snapshot(&h.gw.state);
    reload::apply(&h.gw.state, reloaded(&before, "http://127.0.0.1:9".into())).unwrap();
    let new = RequestCtx::snapshot(&h.gw.state);
    assert_eq!(old.config().upstream.base_url, h.sim.url());
    assert_eq!(new.config().upstream.base_url, "http://127.0.0.1:9");

    let mut lanes = Vec::new();
    for ctx in [&old, &new] {
        let req =
            AnswerRequest::from_value(json!({"prompt": PROMPT, "max_output_tokens": 50})).unwrap();
        let prepared = prompt::answer_request(ctx, req, None).await.unwrap();
        let mut record = h.gw.state.record(Route::Answer);
        let ready = pipeline::classify(ctx, prepared, &mut record)
            .await
            .unwrap();
        lanes.push((ready.class.lane, ready.class.input_tokens_estimate));
    }
    let (old_class, new_class) = (lanes[0], lanes[1]);
    assert_eq!(old_class.0, Lane::Small);
    assert_eq!(new_class.0, Lane::Medium);
    assert!(
        new_class.1 >= old_class.1 + 400,
        "the count of the new set, 400 more per message: {lanes:?}"
    );
    // The old snapshot's rules are the old cut, whatever the live set says now.
    assert_eq!(old.rules().first(20), Lane::Small);
    assert_eq!(new.rules().first(20), Lane::Medium);
    h.shutdown().await;
}
