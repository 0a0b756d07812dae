//! A panic while a request is served (a bug, injected by `crate::faults`) costs that request
//! only: its client gets a clear internal error in its route's shape, its seat, tokens and
//! engine work come back, the panic is counted, and the next request is served. A background
//! task that panics takes the replica's probes down, so that it is restarted.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio_util::task::TaskTracker;
use tutor_testkit::{client, eventually, metric, metrics_text, send, sse};

use super::Gateway;
use crate::config::Config;
use crate::faults::{
    AUTOPILOT_PANICS_EVERY, JOB_FINISH_PANICS_TTL, PANICS_BEFORE_SEND, PANICS_MID_STREAM,
};
use crate::telemetry::RequestLog;

struct Harness {
    sim: super::SimServer,
    gw: Gateway,
    log: Arc<Mutex<Vec<Value>>>,
}

impl Harness {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::default();
        // A token a chunk, 50 ms apart: the engine is still writing (for 15 s) when the
        // injected panic at its second chunk ends the request, however slowly a loaded machine
        // reads (an engine that had finished would have nothing to abort).
        let flags = [
            "--profile",
            "fixed",
            "--fixed-ttft-ms",
            "1",
            "--fixed-itl-ms",
            "50",
        ];
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        let sim = super::start_sim(&mut config, &flags)
            .await
            .expect("sim starts");
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tasks = TaskTracker::new();
        let (request_log, log) = RequestLog::memory();
        let state =
            super::build_state_with_log(config, tasks.clone(), request_log).expect("gateway state");
        let gw = super::serve_state(state, tasks, listener).expect("gateway starts");
        Self { sim, gw, log }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gw.url())
    }

    /// Waits until every seat, token and queue place is back, then reads the panics counted
    /// `at`.
    async fn settled_panics(&self, at: &str) -> f64 {
        let admission = self.gw.state.admission();
        eventually("every seat and token back", || {
            std::future::ready(admission.snapshot().is_idle())
        })
        .await;
        let text = metrics_text(&self.gw.url()).await;
        metric(&text, &format!("tutor_gateway_panics_total{{at=\"{at}\"}}"))
    }

    /// Waits for the request log's line with `outcome` and returns it.
    async fn logged(&self, outcome: &str) -> Value {
        let find = || {
            self.log
                .lock()
                .unwrap()
                .iter()
                .find(|l| l["outcome"] == outcome)
                .cloned()
        };
        eventually("the request's log line", || {
            std::future::ready(find().is_some())
        })
        .await;
        find().unwrap()
    }

    /// A request that has nothing to do with the faults is served in full.
    async fn still_serves(&self) {
        let resp = send(
            client()
                .post(self.url("/v1/chat/completions"))
                .json(&json!({
                    "messages": [{"role": "user", "content": "what is a loop?"}],
                    "max_tokens": 8,
                })),
        )
        .await;
        assert_eq!(resp.status(), 200, "served after the panic");
    }

    async fn shutdown(self) {
        self.gw.shutdown().await;
        self.sim.shutdown().await;
    }
}

fn chat(max_tokens: u32, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": "explain recursion with an example"}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

#[tokio::test]
async fn an_answer_stream_that_panics_ends_with_an_internal_error_event_and_gives_all_back() {
    let h = Harness::start().await;
    let resp = send(client().post(h.url("/answer")).json(&json!({
        "prompt": "explain recursion with an example",
        "max_output_tokens": PANICS_MID_STREAM,
    })))
    .await;
    assert_eq!(resp.status(), 200, "the stream had begun");
    let body = resp.text().await.unwrap();
    let events = sse(&body);
    assert_eq!(events.first().map(|e| e.0.as_str()), Some("meta"), "{body}");
    let (kind, data) = events.last().unwrap();
    assert_eq!(kind, "error", "the stream ends with an error event: {body}");
    let data: Value = serde_json::from_str(data).unwrap();
    assert_eq!(data["code"], "internal", "{data}");
    assert!(
        !events.iter().any(|e| e.0 == "done"),
        "an answer cut by a panic is not told as done: {body}"
    );
    assert_eq!(h.settled_panics("relay").await, 1.0);
    let line = h.logged("internal").await;
    assert_eq!(line["route"], "answer", "{line}");
    eventually("the engine's work aborted", || {
        std::future::ready(h.sim.engine.snapshot().aborted >= 1)
    })
    .await;
    h.still_serves().await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_v1_stream_that_panics_ends_with_an_error_chunk_then_done() {
    let h = Harness::start().await;
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&chat(PANICS_MID_STREAM, true)),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let err: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "internal", "{body}");
    assert_eq!(err["error"]["type"], "server_error", "{body}");
    assert_eq!(h.settled_panics("relay").await, 1.0);
    h.logged("internal").await;
    h.still_serves().await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_handler_that_panics_answers_500_internal_and_gives_its_seat_back() {
    let h = Harness::start().await;
    let mut ids = Vec::new();
    for (max_tokens, stream) in [(PANICS_BEFORE_SEND, false), (PANICS_BEFORE_SEND, true)] {
        let resp = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .json(&chat(max_tokens, stream)),
        )
        .await;
        assert_eq!(resp.status(), 500, "stream: {stream}");
        ids.push(resp.headers()["x-request-id"].to_str().unwrap().to_owned());
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["code"], "internal", "{err}");
        assert_eq!(err["error"]["type"], "server_error", "{err}");
    }
    // A non-streaming answer read whole in its handler panics there too.
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&chat(PANICS_MID_STREAM, false)),
    )
    .await;
    assert_eq!(resp.status(), 500);
    assert_eq!(h.settled_panics("handler").await, 3.0);
    let internal = || {
        h.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l["outcome"] == "internal")
            .count()
    };
    eventually(
        "each panic recorded internal, none as a client's cancel",
        || std::future::ready(internal() == 3),
    )
    .await;
    let log = h.log.lock().unwrap().clone();
    assert!(!log.iter().any(|l| l["outcome"] == "cancelled"), "{log:?}");
    for id in ids {
        assert!(
            log.iter()
                .any(|l| l["request_id"] == id.as_str() && l["outcome"] == "internal"),
            "the 500's x-request-id {id} names its request log line: {log:?}"
        );
    }
    h.still_serves().await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_background_task_that_panics_takes_the_probes_down_so_the_replica_is_restarted() {
    let h = Harness::start_with(|c| c.autopilot.interval = AUTOPILOT_PANICS_EVERY).await;
    let get = |path: &'static str| {
        let url = h.url(path);
        async move {
            let resp = send(client().get(url)).await;
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    eventually("the panic is counted", || async {
        let text = metrics_text(&h.gw.url()).await;
        metric(&text, "tutor_gateway_panics_total{at=\"background\"}") == 1.0
    })
    .await;
    for path in ["/healthz", "/readyz"] {
        let (status, body) = get(path).await;
        assert_eq!(status, 503, "{path}: {body}");
        assert_eq!(body["status"], "failed", "{path}: {body}");
        let reason = body["reason"].as_str().unwrap();
        assert!(
            reason.contains("'autopilot'"),
            "{path} names the task: {reason}"
        );
    }
    // Until it is restarted, it still serves what it can.
    h.still_serves().await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_job_whose_finish_panics_gives_its_seat_back_and_takes_the_probes_down() {
    // The run's own panics end the job failed (its catch); one past it, storing the outcome,
    // leaves the job's state unknown: the replica must be restarted, not left serving with a
    // job that reads `running` forever.
    let h = Harness::start_with(|c| c.jobs.result_ttl = JOB_FINISH_PANICS_TTL).await;
    let resp = send(client().post(h.url("/jobs")).json(&json!({
        "prompt": "review this repository's error handling",
        "max_output_tokens": 2,
    })))
    .await;
    assert_eq!(resp.status(), 202, "the job is taken");
    eventually("the finish's panic is counted", || async {
        let text = metrics_text(&h.gw.url()).await;
        metric(&text, "tutor_gateway_panics_total{at=\"background\"}") == 1.0
    })
    .await;
    let resp = send(client().get(h.url("/healthz"))).await;
    assert_eq!(resp.status(), 503);
    let body = resp.json::<Value>().await.unwrap();
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains("'job run'"), "names the task: {reason}");
    // Its seat and tokens came back with the run.
    assert!(h.gw.state.admission().snapshot().is_idle());
    h.still_serves().await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_replica_whose_background_tasks_run_is_live() {
    let h = Harness::start().await;
    let resp = send(client().get(h.url("/healthz"))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "ok");
    h.shutdown().await;
}
