use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::config::{AbortIdFormat, AbortMethod, AbortMode, Config};

/// A tiny HTTP server that records each request's first line and body and answers `status`
/// (changed by [`Recorder::answer`]) after `delay`.
struct Recorder {
    base_url: String,
    seen: Arc<Mutex<Vec<(String, String)>>>,
    status: Arc<std::sync::atomic::AtomicU16>,
}

impl Recorder {
    async fn start(status: u16, delay: Duration) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let answer = Arc::new(std::sync::atomic::AtomicU16::new(status));
        let answers = Arc::clone(&answer);
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let log = Arc::clone(&log);
                let status = Arc::clone(&answers);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 1024];
                    let (head_end, len) = loop {
                        let n = sock.read(&mut tmp).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&tmp[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let len = tutor_testkit::content_length(&text[..end]);
                            break (end + 4, len);
                        }
                    };
                    while buf.len() < head_end + len {
                        let n = sock.read(&mut tmp).await.unwrap();
                        buf.extend_from_slice(&tmp[..n]);
                    }
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let first = text.lines().next().unwrap().to_owned();
                    log.lock()
                        .unwrap()
                        .push((first, text[head_end..].to_owned()));
                    tokio::time::sleep(delay).await;
                    let status = status.load(Ordering::Relaxed);
                    let resp = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        Recorder {
            base_url,
            seen,
            status: answer,
        }
    }

    /// Answers `status` from now on.
    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

fn config(base_url: &str, mode: AbortMode) -> Arc<UpstreamConfig> {
    let mut config = Config::default().upstream;
    config.base_url = base_url.to_owned();
    config.abort.mode = mode;
    Arc::new(config)
}

fn guard(base_url: &str, mode: AbortMode) -> (AbortGuard, TaskTracker) {
    let tasks = TaskTracker::new();
    let g = AbortGuard::new(
        reqwest::Client::new(),
        config(base_url, mode),
        "req-1".into(),
        tasks.clone(),
    );
    (g, tasks)
}

fn caller(base_url: &str, mode: AbortMode) -> (AbortCaller, TaskTracker) {
    let tasks = TaskTracker::new();
    let c = AbortCaller::new(
        reqwest::Client::new(),
        config(base_url, mode),
        tasks.clone(),
    );
    (c, tasks)
}

/// Waits for the abort tasks to end. The 60 s only fail a hang: a loaded machine can be slow
/// to run them, and one test's call takes `ABORT_TIMEOUT` by design.
async fn drain(tasks: TaskTracker) {
    tasks.close();
    tokio::time::timeout(Duration::from_secs(60), tasks.wait())
        .await
        .unwrap();
}

const CALL: &str = "POST /inference/v1/abort_requests HTTP/1.1";

#[test]
fn the_engine_id_is_the_one_vllm_gives_the_request() {
    use AbortIdFormat::{AsSent, Vllm};
    assert_eq!(
        engine_request_id(Vllm, "r1", Endpoint::ChatCompletions),
        "chatcmpl-r1"
    );
    assert_eq!(
        engine_request_id(Vllm, "r1", Endpoint::Completions),
        "cmpl-r1-0"
    );
    assert_eq!(engine_request_id(AsSent, "r1", Endpoint::Completions), "r1");
}

#[tokio::test]
async fn drop_sends_the_configured_abort_once() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (g, tasks) = guard(&rec.base_url, AbortMode::On);
    let watch = g.watch();
    assert_eq!(watch.state(), AbortState::Armed);
    drop(g);
    drain(tasks).await;
    assert_eq!(
        rec.seen(),
        [(
            CALL.to_owned(),
            r#"{"request_ids":["chatcmpl-req-1"]}"#.to_owned()
        )]
    );
    assert_eq!(watch.state(), AbortState::Sent);
    assert!(watch.state().fired() && watch.state().call_sent());
}

#[tokio::test]
async fn a_completion_is_named_by_its_first_prompts_id() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (c, tasks) = caller(&rec.base_url, AbortMode::On);
    drop(c.arm("req-2".into(), Endpoint::Completions));
    drain(tasks).await;
    assert_eq!(rec.seen()[0].1, r#"{"request_ids":["cmpl-req-2-0"]}"#);
}

#[tokio::test]
async fn abort_now_then_drop_is_still_one_call() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (mut g, tasks) = guard(&rec.base_url, AbortMode::On);
    assert!(g.abort_now());
    assert!(!g.abort_now());
    g.disarm(); // too late: no effect
    assert!(g.state().call_sent());
    drop(g);
    drain(tasks).await;
    assert_eq!(rec.seen().len(), 1);
}

#[tokio::test]
async fn disarmed_guard_sends_nothing() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (mut g, tasks) = guard(&rec.base_url, AbortMode::On);
    g.disarm();
    assert!(!g.abort_now());
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert!(rec.seen().is_empty());
    assert_eq!(watch.state(), AbortState::Disarmed);
    assert!(!watch.state().fired());
}

#[tokio::test]
async fn mode_off_or_disabled_only_marks_the_connection_drop() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (g, tasks) = guard(&rec.base_url, AbortMode::Off);
    let watch = g.watch();
    drop(g);
    // The older switch: `enabled = false` wins over any mode.
    let mut disabled = (*config(&rec.base_url, AbortMode::On)).clone();
    disabled.abort.enabled = false;
    let (c, more) = (
        AbortCaller::new(reqwest::Client::new(), Arc::new(disabled), tasks.clone()),
        tasks.clone(),
    );
    assert!(!c.probe(), "nothing to probe");
    let second = c.arm("req-2".into(), Endpoint::ChatCompletions);
    let second_watch = second.watch();
    drop(second);
    drain(more).await;
    assert!(rec.seen().is_empty());
    for w in [watch, second_watch] {
        assert_eq!(w.state(), AbortState::ConnectionOnly);
        assert!(w.state().fired() && !w.state().call_sent());
    }
}

#[tokio::test]
async fn auto_probes_once_and_calls_an_endpoint_that_answered() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (c, tasks) = caller(&rec.base_url, AbortMode::Auto);
    assert_eq!(c.endpoint(), AbortEndpoint::Unknown);
    assert!(c.probe());
    assert!(!c.probe(), "one probe at a time");
    drain(tasks.clone()).await;
    assert_eq!(c.endpoint(), AbortEndpoint::Offered);
    assert!(!c.probe(), "settled: no second probe");
    let g = c.arm("req-1".into(), Endpoint::ChatCompletions);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert_eq!(watch.state(), AbortState::Sent);
    let seen = rec.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    // The probe names an id no request has.
    let probe: serde_json::Value = serde_json::from_str(&seen[0].1).unwrap();
    let id = probe["request_ids"][0].as_str().unwrap();
    assert!(
        id.starts_with(&format!("chatcmpl-{PROBE_ID_PREFIX}")),
        "{id}"
    );
    assert_eq!(seen[1].1, r#"{"request_ids":["chatcmpl-req-1"]}"#);
}

#[tokio::test]
async fn auto_against_an_engine_without_the_endpoint_stops_calling_after_the_probe() {
    // 404: no such route; 403: vLLM's stand-in while --enable-scale-out is off; 405, 501.
    for status in [404, 403, 405, 501] {
        let rec = Recorder::start(status, Duration::ZERO).await;
        let (c, tasks) = caller(&rec.base_url, AbortMode::Auto);
        assert!(c.probe());
        drain(tasks.clone()).await;
        assert_eq!(c.endpoint(), AbortEndpoint::Absent, "{status}");
        let watches: Vec<AbortWatch> = (0..3)
            .map(|i| {
                let g = c.arm(format!("req-{i}"), Endpoint::ChatCompletions);
                let w = g.watch();
                drop(g);
                w
            })
            .collect();
        drain(tasks).await;
        assert_eq!(rec.seen().len(), 1, "the probe only: {status}");
        for w in watches {
            assert_eq!(w.state(), AbortState::ConnectionOnly);
        }
    }
}

/// "No endpoint" is asked again once `ABSENT_RECHECK` has gone by, by a probe or, without
/// one, by the next abort's own call: an engine restarted with the endpoint gets abort calls
/// without a gateway restart. (A clone with a zero re-check shares what was found.)
#[tokio::test]
async fn auto_asks_again_after_a_while_whether_an_absent_endpoint_is_there_now() {
    let rec = Recorder::start(404, Duration::ZERO).await;
    let (c, tasks) = caller(&rec.base_url, AbortMode::Auto);
    assert!(c.probe());
    drain(tasks.clone()).await;
    assert_eq!(c.endpoint(), AbortEndpoint::Absent);
    assert!(!c.probe(), "not asked again within ABSENT_RECHECK");
    let due = c.clone().with_absent_recheck(Duration::ZERO);

    // Still none: asked, and calls stay off.
    assert!(due.probe());
    drain(tasks.clone()).await;
    assert_eq!(c.endpoint(), AbortEndpoint::Absent);
    let w = {
        let g = c.arm("req-1".into(), Endpoint::ChatCompletions);
        g.watch()
    };
    drain(tasks.clone()).await;
    assert_eq!(w.state(), AbortState::ConnectionOnly);
    assert_eq!(rec.seen().len(), 2, "two probes, no call");

    // The engine has it now: the next abort's own call finds it, and calls are made.
    rec.answer(200);
    let w = {
        let g = due.arm("req-2".into(), Endpoint::ChatCompletions);
        g.watch()
    };
    drain(tasks.clone()).await;
    assert_eq!(w.state(), AbortState::Sent);
    assert_eq!(c.endpoint(), AbortEndpoint::Offered);
    let w = {
        let g = c.arm("req-3".into(), Endpoint::ChatCompletions);
        g.watch()
    };
    drain(tasks).await;
    assert_eq!(w.state(), AbortState::Sent);
    let seen = rec.seen();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[3].1, r#"{"request_ids":["chatcmpl-req-3"]}"#);
}

#[tokio::test]
async fn auto_with_the_endpoint_unknown_lets_the_first_abort_call_ask() {
    // A standalone guard has nothing probed: its own call settles the question.
    let absent = Recorder::start(404, Duration::ZERO).await;
    let (g, tasks) = guard(&absent.base_url, AbortMode::Auto);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert_eq!(watch.state(), AbortState::NotOffered);
    assert!(watch.state().fired() && watch.state().call_sent());

    // No verdict (a 500): the endpoint stays unknown, so the next abort asks again; while
    // one call asks, another abort only closes its connection.
    let failing = Recorder::start(500, Duration::from_millis(200)).await;
    let (c, tasks) = caller(&failing.base_url, AbortMode::Auto);
    let first = c.arm("req-1".into(), Endpoint::ChatCompletions);
    let (w1, w2) = (first.watch(), {
        drop(first);
        let second = c.arm("req-2".into(), Endpoint::ChatCompletions);
        let w = second.watch();
        drop(second);
        w
    });
    assert_eq!(c.endpoint(), AbortEndpoint::Probing);
    assert_eq!(w2.state(), AbortState::ConnectionOnly);
    drain(tasks.clone()).await;
    assert_eq!(w1.state(), AbortState::Failed);
    assert_eq!(c.endpoint(), AbortEndpoint::Unknown);
    assert!(c.probe(), "asks again");
    drain(tasks).await;
    assert_eq!(failing.seen().len(), 2);
}

#[tokio::test]
async fn auto_against_a_refusing_endpoint_makes_no_more_calls() {
    // 401 (a wrong API key) or 400 (a body it refuses): no calls, a warning once.
    for status in [401, 400] {
        let rec = Recorder::start(status, Duration::ZERO).await;
        let (c, tasks) = caller(&rec.base_url, AbortMode::Auto);
        c.probe();
        drain(tasks.clone()).await;
        assert_eq!(c.endpoint(), AbortEndpoint::Absent);
        drop(c.arm("req-1".into(), Endpoint::ChatCompletions));
        drain(tasks).await;
        assert_eq!(rec.seen().len(), 1);
    }
    // 429 and 408 say nothing about the endpoint: ask again later.
    let rec = Recorder::start(429, Duration::ZERO).await;
    let (c, tasks) = caller(&rec.base_url, AbortMode::Auto);
    c.probe();
    drain(tasks).await;
    assert_eq!(c.endpoint(), AbortEndpoint::Unknown);
}

#[tokio::test]
async fn templates_method_and_escaping_are_honoured() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let mut config = Config::default().upstream;
    config.base_url = rec.base_url.clone();
    config.abort.mode = AbortMode::On;
    config.abort.id_format = AbortIdFormat::AsSent;
    config.abort.url_template = "{base_url}/v1/requests/{id}/cancel".into();
    config.abort.method = AbortMethod::Put;
    config.abort.body_template = r#"{"rid":"{id}"}"#.into();
    let tasks = TaskTracker::new();
    drop(AbortGuard::new(
        reqwest::Client::new(),
        Arc::new(config),
        "a\"b".into(),
        tasks.clone(),
    ));
    drain(tasks).await;
    let seen = rec.seen();
    assert_eq!(seen[0].0, "PUT /v1/requests/a%22b/cancel HTTP/1.1");
    assert_eq!(seen[0].1, r#"{"rid":"a\"b"}"#);
}

#[tokio::test]
async fn refused_and_slow_aborts_are_failures_not_panics() {
    let rec = Recorder::start(500, Duration::ZERO).await;
    let (g, tasks) = guard(&rec.base_url, AbortMode::On);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert_eq!(watch.state(), AbortState::Failed);

    // An abort endpoint that would answer in an hour: only the abort call's own timeout can
    // end it. The 60 s guard fails a hang; it measures nothing.
    let slow = Recorder::start(200, Duration::from_secs(3600)).await;
    let (g, tasks) = guard(&slow.base_url, AbortMode::On);
    let watch = g.watch();
    drop(g);
    tokio::time::timeout(Duration::from_secs(60).max(ABORT_TIMEOUT * 4), drain(tasks))
        .await
        .expect("the abort call gives up after ABORT_TIMEOUT");
    assert_eq!(watch.state(), AbortState::Failed);
}

#[tokio::test]
async fn unreachable_abort_endpoint_is_a_failure_and_leaves_auto_unknown() {
    let refused = tutor_testkit::RefusedPort::new();
    let url = refused.url();
    let (g, tasks) = guard(&url, AbortMode::On);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert_eq!(watch.state(), AbortState::Failed);

    let (c, tasks) = caller(&url, AbortMode::Auto);
    assert!(c.probe());
    drain(tasks.clone()).await;
    assert_eq!(c.endpoint(), AbortEndpoint::Unknown, "no verdict");
    assert!(!c.probe(), "not again within PROBE_RETRY");
    // An abort meanwhile still asks with its own call.
    let g = c.arm("req-1".into(), Endpoint::ChatCompletions);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert_eq!(watch.state(), AbortState::Failed);
}

#[test]
fn dropped_outside_a_runtime_is_skipped_without_panicking() {
    let (g, _tasks) = guard("http://127.0.0.1:9", AbortMode::On);
    let watch = g.watch();
    drop(g);
    assert_eq!(watch.state(), AbortState::Skipped);

    // Nothing to run a probe on either; the endpoint stays unknown for a later one.
    let (c, _tasks) = caller("http://127.0.0.1:9", AbortMode::Auto);
    assert!(!c.probe());
    drop(c.arm("req-1".into(), Endpoint::ChatCompletions));
    assert_eq!(c.endpoint(), AbortEndpoint::Unknown);
}
