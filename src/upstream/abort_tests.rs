use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::config::{AbortMethod, Config};

/// A tiny HTTP server that records each request's first line and body and answers `status`
/// after `delay`.
struct Recorder {
    base_url: String,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Recorder {
    async fn start(status: u16, delay: Duration) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let log = Arc::clone(&log);
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
                            let len = text[..end]
                                .lines()
                                .find_map(|l| {
                                    let (k, v) = l.split_once(':')?;
                                    k.eq_ignore_ascii_case("content-length")
                                        .then(|| v.trim().parse::<usize>().unwrap())
                                })
                                .unwrap_or(0);
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
                    let resp = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        Recorder { base_url, seen }
    }

    fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

fn guard(base_url: &str, enabled: bool) -> (AbortGuard, TaskTracker) {
    let mut config = Config::default().upstream;
    config.base_url = base_url.to_owned();
    config.abort.enabled = enabled;
    let tasks = TaskTracker::new();
    let g = AbortGuard::new(
        reqwest::Client::new(),
        Arc::new(config),
        "req-1".into(),
        tasks.clone(),
    );
    (g, tasks)
}

async fn drain(tasks: TaskTracker) {
    tasks.close();
    tokio::time::timeout(Duration::from_secs(5), tasks.wait())
        .await
        .unwrap();
}

#[tokio::test]
async fn drop_sends_the_configured_abort_once() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (g, tasks) = guard(&rec.base_url, true);
    let watch = g.watch();
    assert_eq!(watch.state(), AbortState::Armed);
    drop(g);
    drain(tasks).await;
    assert_eq!(
        rec.seen(),
        [(
            "POST /abort_requests HTTP/1.1".to_owned(),
            r#"{"request_ids":["req-1"]}"#.to_owned()
        )]
    );
    assert_eq!(watch.state(), AbortState::Sent);
    assert!(watch.state().fired() && watch.state().call_sent());
}

#[tokio::test]
async fn abort_now_then_drop_is_still_one_call() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (mut g, tasks) = guard(&rec.base_url, true);
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
    let (mut g, tasks) = guard(&rec.base_url, true);
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
async fn disabled_abort_only_marks_the_connection_drop() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let (g, tasks) = guard(&rec.base_url, false);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert!(rec.seen().is_empty());
    assert_eq!(watch.state(), AbortState::ConnectionOnly);
    assert!(watch.state().fired() && !watch.state().call_sent());
}

#[tokio::test]
async fn templates_method_and_escaping_are_honoured() {
    let rec = Recorder::start(200, Duration::ZERO).await;
    let mut config = Config::default().upstream;
    config.base_url = rec.base_url.clone();
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
    let (g, tasks) = guard(&rec.base_url, true);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert_eq!(watch.state(), AbortState::Failed);

    // An abort endpoint that would answer in an hour: only the abort call's own timeout can
    // end it. The 60 s guard fails a hang; it measures nothing.
    let slow = Recorder::start(200, Duration::from_secs(3600)).await;
    let (g, tasks) = guard(&slow.base_url, true);
    let watch = g.watch();
    drop(g);
    tokio::time::timeout(Duration::from_secs(60).max(ABORT_TIMEOUT * 4), drain(tasks))
        .await
        .expect("the abort call gives up after ABORT_TIMEOUT");
    assert_eq!(watch.state(), AbortState::Failed);
}

#[tokio::test]
async fn unreachable_abort_endpoint_is_a_failure() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (g, tasks) = guard(&format!("http://127.0.0.1:{port}"), true);
    let watch = g.watch();
    drop(g);
    drain(tasks).await;
    assert_eq!(watch.state(), AbortState::Failed);
}

#[test]
fn dropped_outside_a_runtime_is_skipped_without_panicking() {
    let (g, _tasks) = guard("http://127.0.0.1:9", true);
    let watch = g.watch();
    drop(g);
    assert_eq!(watch.state(), AbortState::Skipped);
}
