//! Shutdown drain (issue 18, item 4), with a real SIGTERM to a gateway process started from the
//! built binary, in front of the simulator run by the test:
//!
//! - a stream still open when the grace period is over gets the `shutdown` error (`/answer`:
//!   an `error` event; `/v1`: `data: {"error": …}` then `data: [DONE]`), its engine work stops
//!   (the abort call arrives, the simulator's sequence ends aborted), its lease is given back in
//!   Redis before the process exits (the usage hash at zeros, no lease left, with a lease TTL
//!   far longer than the test), and its span reaches the OTLP collector at exit (with a batch
//!   delay of 60 s, only the shutdown flush can deliver it);
//! - during the grace period `/readyz` (on the admin listener) answers 503 `draining`, the public
//!   listener accepts no new connection, and the open stream keeps streaming.

mod common;
mod redis_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use common::process::GatewayProcess;
use common::{client, flags, json, read_json, send, sse};
use redis_common::RedisServer;
use serde_json::{json, Value};
use vllm_sim::{SimArgs, SimServer};

/// Real time (about 5 ms a token) and every answer runs to its `max_output_tokens`: a stream
/// of 4000 tokens lasts far longer than any grace period here.
const SLOW: &str = "--speed 1 --profile tiny-test --mean-output-tokens 1000000";
const USAGE: &str = "tg:v2:{quota}:usage";
const LEASES: &str = "tg:v2:{quota}:leases";

/// A small HTTP server on 127.0.0.1 keeping the `(x-request-id header, body)` of every POST
/// to `path`, answering 200.
async fn recorder(path: &'static str) -> (String, Arc<Mutex<Vec<(String, Bytes)>>>) {
    let got: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        path,
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let seen = seen.clone();
            async move {
                let id = headers
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                seen.lock().unwrap().push((id, body));
                ([("content-type", "application/x-protobuf")], "")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

/// `tutor-gateway serve` with the config text `rest`; spans, when `rest` turns tracing on, are
/// batched for 60 s (only the flush at exit can export one in a test this short).
async fn start(rest: &str) -> GatewayProcess {
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "60000"), ("RUST_LOG", "info")];
    GatewayProcess::start("drain", rest, &env).await
}

/// An open streaming response, read piece by piece.
struct Stream {
    resp: reqwest::Response,
    request_id: String,
    body: String,
}

impl Stream {
    /// Sends `req` and reads until the body holds `marker` (a first token).
    async fn open(req: reqwest::RequestBuilder, marker: &str) -> Stream {
        let resp = send(req).await;
        assert_eq!(resp.status(), 200);
        let request_id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        let mut s = Stream {
            resp,
            request_id,
            body: String::new(),
        };
        s.read_until(marker).await;
        s
    }

    /// Reads more until what arrived from now on holds `marker` (30 s at most).
    async fn read_until(&mut self, marker: &str) {
        let from = self.body.len();
        let read = async {
            while !self.body[from..].contains(marker) {
                match self.resp.chunk().await.unwrap() {
                    Some(bytes) => self.body.push_str(std::str::from_utf8(&bytes).unwrap()),
                    None => panic!("the stream ended before {marker:?}: {}", self.body),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .unwrap_or_else(|_| panic!("no {marker:?} within 30 s"));
    }

    /// Reads to the end of the body (30 s at most).
    async fn rest(mut self) -> String {
        let read = async {
            while let Some(bytes) = self.resp.chunk().await.unwrap() {
                self.body.push_str(std::str::from_utf8(&bytes).unwrap());
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the stream ends within 30 s");
        self.body
    }
}

fn answer(base: &str) -> reqwest::RequestBuilder {
    client().get(format!(
        "{base}/answer?prompt=review+my+whole+repository&max_output_tokens=4000"
    ))
}

fn chat(base: &str) -> reqwest::RequestBuilder {
    client().post(format!("{base}/v1/chat/completions")).json(
        &json!({"messages": [{"role": "user", "content": "review my whole repository"}],
                      "max_tokens": 4000, "stream": true}),
    )
}

async fn redis_state(redis: &RedisServer) -> (HashMap<String, i64>, HashMap<String, String>) {
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let usage: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(USAGE)
        .query_async(&mut conn)
        .await
        .unwrap();
    let leases: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(LEASES)
        .query_async(&mut conn)
        .await
        .unwrap();
    (usage, leases)
}

async fn sim() -> SimServer {
    vllm_sim::start(&SimArgs::for_test(&flags(SLOW)))
        .await
        .unwrap()
}

/// Polls `cond` every 20 ms for up to 30 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} did not happen within 30 s");
}

#[tokio::test]
async fn sigterm_mid_stream_ends_it_with_shutdown_aborts_it_releases_its_lease_and_exports_its_span(
) {
    let redis = RedisServer::start();
    let sim = sim().await;
    let (collector, spans) = recorder("/v1/traces").await;
    let (aborts_url, aborts) = recorder("/abort_requests").await;
    let mut gw = start(&format!(
        "[server]\nshutdown_grace_ms = 300\n\
         [telemetry]\nrequest_log = \"off\"\ntracing = true\notlp_protocol = \"http/protobuf\"\n\
         otlp_endpoint = \"{collector}\"\n\
         [classify]\ntokenizer = \"heuristic\"\n\
         [upstream]\nbase_url = \"{}\"\n\
         [upstream.abort]\nenabled = true\nurl = \"{aborts_url}/abort_requests\"\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\n\
         # Far longer than the test: only a release, never an expiry, empties the books.\n\
         lease_ttl_ms = 600000\nheartbeat_ms = 1000\n",
        sim.url(),
        redis.url()
    ))
    .await;

    let streams = [
        Stream::open(answer(&gw.url), "event: token").await,
        Stream::open(chat(&gw.url), "\"content\"").await,
    ];
    let ids: Vec<String> = streams.iter().map(|s| s.request_id.clone()).collect();
    let (usage, leases) = redis_state(&redis).await;
    assert_eq!(leases.len(), 2, "one lease per stream: {leases:?}");
    assert!(usage.values().any(|v| *v > 0), "{usage:?}");
    assert_eq!(sim.engine.snapshot().running, 2);
    let aborted_before = sim.engine.snapshot().aborted;
    assert!(
        spans.lock().unwrap().is_empty(),
        "no span is exported before the flush at exit"
    );

    gw.sigterm();
    let [answer_stream, chat_stream] = streams;
    let answer_body = answer_stream.rest().await;
    let chat_body = chat_stream.rest().await;

    // The client of each stream is told why it ended, in its own format.
    let events = sse(&answer_body);
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "error", "{answer_body}");
    let error = json(data);
    assert_eq!(error["code"], "shutdown", "{error}");
    assert!(error["message"].as_str().unwrap().contains("shutting down"));
    assert!(answer_body.ends_with(&format!("id: end\nevent: error\ndata: {data}\n\n")));
    let chunks = tutor_testkit::sse_events(&chat_body);
    assert_eq!(chunks.last().unwrap(), "[DONE]", "{chat_body}");
    let error = json(&chunks[chunks.len() - 2]);
    assert_eq!(error["error"]["code"], "shutdown", "{error}");
    assert_eq!(error["error"]["type"], "server_error");

    let status = gw.exited().await;
    assert!(status.success(), "exit {status:?}:\n{}", gw.log());

    // No lease is left: the releases reached Redis before the process exited.
    let (usage, leases) = redis_state(&redis).await;
    assert!(leases.is_empty(), "leases left: {leases:?}\n{}", gw.log());
    assert!(
        usage.values().all(|v| *v == 0),
        "usage left: {usage:?}\n{}",
        gw.log()
    );

    // The engine's work stopped: the abort call of each stream arrived, and both sequences
    // ended aborted.
    let called: Vec<String> = aborts
        .lock()
        .unwrap()
        .iter()
        .map(|(_, body)| String::from_utf8_lossy(body).into_owned())
        .collect();
    for id in &ids {
        assert!(
            called.iter().any(|body| body.contains(id.as_str())),
            "no abort call for {id}: {called:?}\n{}",
            gw.log()
        );
    }
    eventually("the engine has nothing running", || {
        sim.engine.snapshot().running == 0
    })
    .await;
    assert!(sim.engine.snapshot().aborted >= aborted_before + 2);

    // The spans of both streams were flushed at exit, each with the error code.
    let exported: Vec<Bytes> = spans
        .lock()
        .unwrap()
        .iter()
        .map(|(_, b)| b.clone())
        .collect();
    let holds = |needle: &str| {
        exported
            .iter()
            .any(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
    };
    for id in &ids {
        assert!(
            holds(id),
            "no span for {id} reached the collector\n{}",
            gw.log()
        );
    }
    assert!(holds("shutdown"), "the spans carry error.type shutdown");
    sim.shutdown().await;
}

#[tokio::test]
async fn readyz_says_draining_during_the_grace_while_a_stream_still_runs() {
    let sim = sim().await;
    let mut gw = start(&format!(
        "[server]\nshutdown_grace_ms = 600000\nadmin_listen = \"127.0.0.1:0\"\n\
         [telemetry]\nrequest_log = \"off\"\n\
         [classify]\ntokenizer = \"heuristic\"\n\
         [upstream]\nbase_url = \"{}\"\n",
        sim.url()
    ))
    .await;
    let readyz = format!("{}/readyz", gw.admin_url().await);
    let get = |url: String| async move {
        let resp = send(client().get(url)).await;
        (resp.status().as_u16(), read_json(resp).await)
    };
    let (status, body) = get(readyz.clone()).await;
    assert_eq!((status, body["status"].clone()), (200, json!("ready")));
    let mut stream = Stream::open(answer(&gw.url), "event: token").await;

    gw.sigterm();
    let mut seen: Option<Value> = None;
    for _ in 0..500 {
        let (status, body) = get(readyz.clone()).await;
        if status == 503 {
            seen = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body = seen.expect("/readyz turns 503 within 10 s of SIGTERM");
    assert_eq!(body["status"], "draining", "{body}");

    // The public listener takes no new connection...
    let public = gw.url.trim_start_matches("http://").to_owned();
    let mut refused = false;
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(&public).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "the public listener still accepts after SIGTERM");
    // ...while the open stream goes on within the grace period (ten minutes: far longer than
    // any of the waits above can take), and /readyz still says so.
    stream.read_until("event: token").await;
    assert_eq!(sim.engine.snapshot().running, 1);
    assert_eq!(get(readyz.clone()).await.0, 503);

    // A second SIGTERM ends the grace: the stream ends with `shutdown`, the process exits.
    gw.sigterm();
    common::ended_by_shutdown(&stream.rest().await);
    let status = gw.exited().await;
    assert!(status.success(), "exit {status:?}:\n{}", gw.log());
    eventually("the engine has nothing running", || {
        sim.engine.snapshot().running == 0
    })
    .await;
    sim.shutdown().await;
}

#[tokio::test]
async fn during_the_drain_announce_readyz_says_draining_and_new_requests_are_still_served() {
    let sim = sim().await;
    let mut gw = start(&format!(
        "[server]\nshutdown_grace_ms = 0\ndrain_announce_ms = 600000\n\
         [telemetry]\nrequest_log = \"off\"\n\
         [classify]\ntokenizer = \"heuristic\"\n\
         [upstream]\nbase_url = \"{}\"\n",
        sim.url()
    ))
    .await;
    gw.sigterm();
    // A load balancer polling /readyz (here on the public listener) sees `draining`...
    let readyz = format!("{}/readyz", gw.url);
    let mut seen = None;
    for _ in 0..500 {
        let resp = send(client().get(&readyz)).await;
        if resp.status() == 503 {
            seen = Some(read_json(resp).await);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body = seen.expect("/readyz turns 503 within 10 s of SIGTERM");
    assert_eq!(body["status"], "draining", "{body}");
    // ...while a request it sent before noticing, on a new connection, is answered whole.
    let fresh = reqwest::Client::new();
    let resp = fresh
        .get(format!(
            "{}/answer?prompt=what+is+a+closure&max_output_tokens=5",
            gw.url
        ))
        .send()
        .await
        .expect("the listener still accepts during the announce");
    assert_eq!(resp.status(), 200);
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("done"),
        "{events:?}"
    );
    // The announce lasts ten minutes (far longer than the waits above can take); a second
    // SIGTERM ends it: the listener closes and the process exits cleanly.
    gw.sigterm();
    let status = gw.exited().await;
    assert!(status.success(), "exit {status:?}:\n{}", gw.log());
    sim.shutdown().await;
}

/// A client following a job's events holds no seat and must not hold the shutdown either. At
/// SIGTERM, with jobs kept in Redis (`redis` given), its stream ends with an `error` event
/// `shutdown` (no `id:`, so an `EventSource` reconnects with its last piece, to a replica still
/// serving the job); with jobs kept in process, the queued jobs are cancelled as the running
/// ones are, and each stream ends with that final status. Either way the process exits without
/// waiting out the grace period for them. A queued job's follower (and, in Redis, a running
/// one's: its job is handed back to the queue) used to hold the whole grace (60 s here), then
/// have its connection cut without a word.
async fn sigterm_ends_job_followers_without_waiting_out_the_grace(redis: Option<&RedisServer>) {
    let sim = sim().await;
    let quota = redis.map_or(String::new(), |r| {
        format!(
            "[quota]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
            r.url()
        )
    });
    let mut gw = start(&format!(
        "[server]\nshutdown_grace_ms = 60000\n\
         [telemetry]\nrequest_log = \"off\"\n\
         [classify]\ntokenizer = \"heuristic\"\n\
         [jobs]\nmax_running = 1\n{quota}\
         [upstream]\nbase_url = \"{}\"\n",
        sim.url()
    ))
    .await;
    let submit = |salt: &str| {
        let body = json!({"prompt": format!("review my repository {salt}"),
                          "max_output_tokens": 4000});
        let url = format!("{}/jobs", gw.url);
        async move {
            let resp = send(client().post(url).json(&body)).await;
            assert_eq!(resp.status(), 202);
            read_json(resp).await["id"].as_str().unwrap().to_owned()
        }
    };
    let running = submit("one").await;
    let queued = submit("two").await;
    let follow = |id: &str| client().get(format!("{}/jobs/{id}/events", gw.url));
    let following_running = Stream::open(follow(&running), "event: token").await;
    let following_queued = Stream::open(follow(&queued), "\"queued\"").await;

    gw.sigterm();
    for stream in [following_running, following_queued] {
        let body = stream.rest().await;
        let tail = &body[body.rfind("event: ").unwrap()..];
        let (name, data) = sse(tail).pop().unwrap();
        if redis.is_some() {
            assert_eq!(name, "error", "{tail}");
            assert_eq!(json(&data)["code"], "shutdown", "{data}");
            assert!(!body.contains("id: end"), "{body}");
        } else {
            assert_eq!(name, "status", "{tail}");
            assert_eq!(json(&data)["status"], "cancelled", "{data}");
            assert!(body.contains("id: end"), "{body}");
        }
    }
    let status = tokio::time::timeout(Duration::from_secs(30), gw.exited())
        .await
        .expect("the process exits without waiting out the 60 s grace for the followers");
    assert!(status.success(), "exit {status:?}:\n{}", gw.log());
    sim.shutdown().await;
}

#[tokio::test]
async fn sigterm_cancels_jobs_kept_in_process_and_their_followers_get_the_final_status() {
    sigterm_ends_job_followers_without_waiting_out_the_grace(None).await;
}

#[tokio::test]
async fn sigterm_ends_followers_of_jobs_kept_in_redis_with_shutdown() {
    let redis = RedisServer::start();
    sigterm_ends_job_followers_without_waiting_out_the_grace(Some(&redis)).await;
}

/// A second SIGTERM during the drain ends every stream now (the operator will not wait out a
/// ten-minute grace): the stream ends with `shutdown` and the process exits. The second signal
/// used to do nothing; only SIGKILL, which skips the aborts and lease releases, cut it short.
#[tokio::test]
async fn a_second_sigterm_ends_the_streams_without_waiting_out_the_grace() {
    let sim = sim().await;
    let mut gw = start(&format!(
        "[server]\nshutdown_grace_ms = 600000\n\
         [telemetry]\nrequest_log = \"off\"\n\
         [classify]\ntokenizer = \"heuristic\"\n\
         [upstream]\nbase_url = \"{}\"\n",
        sim.url()
    ))
    .await;
    let mut stream = Stream::open(answer(&gw.url), "event: token").await;
    gw.sigterm();
    // The drain began (the listener takes no new connection); the stream goes on.
    let public = gw.url.trim_start_matches("http://").to_owned();
    eventually("the listener closes", || {
        std::net::TcpStream::connect(&public).is_err()
    })
    .await;
    stream.read_until("event: token").await;
    gw.sigterm();
    common::ended_by_shutdown(&stream.rest().await);
    let status = gw.exited().await;
    assert!(status.success(), "exit {status:?}:\n{}", gw.log());
    sim.shutdown().await;
}
