//! A client that opens streams and never reads them: the engine's work, the seats and the
//! token reservations follow the engine, never the client's reading. The clients here are raw
//! TCP connections with a 2 KB receive buffer that send their request and never read a byte.
//!
//! The simulator serves a model with a 4,000-character name, so every chunk is some 4 KB (as
//! with logprobs, which the simulator does not produce): the sockets between the gateway and a
//! silent client (a few MB on loopback) are full within a second or two.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tutor_gateway::config::Config;
use tutor_gateway::lane::Lane;

use crate::common::*;

/// Sends `body` to `path` on a connection with a 2 KB receive buffer and never reads; the
/// connection stays open as long as the returned stream lives.
async fn silent_client(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let mut tcp = socket.connect(addr).await.unwrap();
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    tcp
}

/// Polls `cond` every 50 ms for up to `secs` seconds (generous: the suite runs with every core
/// busy).
async fn within(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {secs} s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn no_lane_in_flight(h: &Harness) -> bool {
    [Lane::Small, Lane::Medium, Lane::Large]
        .iter()
        .all(|&l| h.in_flight(l) == 0)
}

/// A stream of `max_tokens` tokens, classified large (its declared output alone passes the
/// medium lane's work bound).
fn review(max_tokens: u32) -> Value {
    json!({"messages": [{"role": "user", "content": "review this repository"}],
           "max_tokens": max_tokens, "ignore_eos": true, "stream": true})
}

/// The served model's name, repeated in every chunk.
fn model() -> String {
    "m".repeat(4000)
}

/// A simulator answering a token every `itl_ms` with about 4 KB chunks, and a gateway in front
/// of it with `tweak` applied.
async fn large_chunks(itl_ms: &str, tweak: impl FnOnce(&mut Config)) -> Harness {
    let model = model();
    let sim = [
        "--profile",
        "fixed",
        "--fixed-ttft-ms",
        "5",
        "--fixed-itl-ms",
        itl_ms,
        "--max-model-len",
        "1000000",
        "--served-model-name",
        model.as_str(),
    ];
    harness(&sim, |c: &mut Config| {
        c.upstream.model = model.clone();
        c.upstream.max_model_len = 1_000_000.try_into().unwrap();
        tweak(c);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_silent_readers_cannot_keep_a_review_out_once_the_engine_is_done() {
    // The shipped client buffer; a short write timeout; as many requests at once as there are
    // silent clients, so the review gets in only once their connections are closed.
    let h = large_chunks("2", |c| {
        set_lane(c, Lane::Large, 10);
        c.server.max_requests_in_flight = 10;
        c.lanes.large.queue.timeout = Duration::from_secs(20);
        c.server.client_write_timeout = Duration::from_secs(2);
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(silent_client(h.gw.addr, "/v1/chat/completions", &review(15_000)).await);
    }
    // All ten are over (each client was cut as too slow) and the engine is done with them.
    within(120, "the ten streams are over", || {
        h.log.lock().unwrap().len() == 10
    })
    .await;
    within(60, "the engine is done with them", || h.sim_running() == 0).await;
    // Every seat and token is back, while the ten clients still hold their connections open.
    within(60, "every lane gauge is back to zero", || {
        no_lane_in_flight(&h)
    })
    .await;
    within(60, "every reservation is back", || h.idle()).await;
    // Each one is logged as cut for not reading (the stream's own cut comes before the
    // connection's backstop, at twice the write timeout).
    let lines: Vec<_> = h
        .log
        .lock()
        .unwrap()
        .iter()
        .map(|l| (l["outcome"].clone(), l["error_code"].clone()))
        .collect();
    assert!(
        lines
            .iter()
            .all(|(outcome, code)| outcome == "cancelled" && code == "client_too_slow"),
        "each one is logged as cut: {lines:?}"
    );
    // Their connections are closed after the write timeout: a real review is admitted and
    // answered in full.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let resp = loop {
        let resp = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .json(&review(6_000)),
        )
        .await;
        if resp.status() == 200 {
            break resp;
        }
        assert_eq!(
            resp.status(),
            503,
            "only overloaded while the silent clients hold on"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the silent connections stay open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let text = resp.text().await.unwrap();
    let events = sse(&text);
    assert_eq!(
        events.last().map(|e| e.1.as_str()),
        Some("[DONE]"),
        "{:?}",
        events.last()
    );
    within(60, "the review's seat is back too", || h.idle()).await;
    let m = h.metrics_text().await;
    let cut = metric(
        &m,
        "tutor_gateway_client_too_slow_total{reason=\"buffer_full\"}",
    ) + metric(
        &m,
        "tutor_gateway_client_too_slow_total{reason=\"write_timeout\"}",
    );
    assert_eq!(cut, 10.0);
    // Cut by the gateway, not clients that gave up on their answers.
    assert_eq!(family_total(&m, "tutor_gateway_cancellations_total"), 0.0);
    drop(silent);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_engine_finishes_the_seat_is_back_whatever_the_client_has_read() {
    // A buffer and a write timeout that never cut: only the engine's end frees the seat.
    let h = large_chunks("1", |c| {
        c.server.client_buffer_bytes = 256 * 1024 * 1024;
        c.server.client_write_timeout = Duration::from_secs(3600);
    })
    .await;
    let client = silent_client(h.gw.addr, "/v1/chat/completions", &review(6_000)).await;
    within(60, "the stream was admitted", || {
        h.in_flight(Lane::Large) == 1
    })
    .await;
    within(120, "the engine finished it and its seat is back", || {
        h.sim_running() == 0 && h.idle()
    })
    .await;
    within(30, "it is logged as served", || {
        let log = h.log.lock().unwrap();
        log.iter()
            .any(|l| l["outcome"] == "ok" && l["output_tokens"] == 6_000)
    })
    .await;
    assert_eq!(h.sim_aborted(), 0);
    drop(client);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_total_timeout_fires_for_a_client_that_never_reads() {
    // Only the total timeout can end this stream: the client's buffer and write timeout are
    // far beyond it, and the engine would go on for many minutes.
    let h = large_chunks("1", |c| {
        c.upstream.first_token_timeout = Duration::from_secs(5);
        c.upstream.idle_timeout = Duration::from_secs(5);
        c.upstream.total_timeout = Duration::from_secs(5);
        c.admission.max_tokens_in_flight = 10_000_000.try_into().unwrap();
        c.lanes.large.max_tokens_in_flight = 10_000_000.try_into().unwrap();
        c.server.client_buffer_bytes = 256 * 1024 * 1024;
        c.server.client_write_timeout = Duration::from_secs(3600);
    })
    .await;
    let client = silent_client(h.gw.addr, "/v1/chat/completions", &review(900_000)).await;
    within(60, "the stream was admitted", || {
        h.in_flight(Lane::Large) == 1
    })
    .await;
    within(
        60,
        "the total timeout ended the stream and freed its seat",
        || h.idle(),
    )
    .await;
    within(30, "the engine's work was aborted", || h.sim_aborted() == 1).await;
    // Not the first-token timeout (tokens came at once), not the idle one (they never stopped).
    within(30, "the request is logged as timed out upstream", || {
        let log = h.log.lock().unwrap();
        log.iter()
            .any(|l| l["error_code"] == "upstream_timeout" && l["outcome"] == "upstream_timeout")
    })
    .await;
    drop(client);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_stream_with_large_chunks_and_a_silent_client_is_counted_and_moved_on_while_the_engine_generates(
) {
    // A short question the engine answers at length: its output passes the small lane's limit
    // long after the sockets to the silent client are full.
    let h = large_chunks("1", |c| {
        c.lanes.small.mid_stream_limit = 10_000.try_into().ok();
        c.lanes.medium.mid_stream_limit = 500_000.try_into().ok();
        c.server.client_buffer_bytes = 256 * 1024 * 1024;
        c.server.client_write_timeout = Duration::from_secs(3600);
    })
    .await;
    let question = json!({"messages": [{"role": "user", "content": "explain ownership"}],
                          "ignore_eos": true, "stream": true});
    let client = silent_client(h.gw.addr, "/v1/chat/completions", &question).await;
    within(60, "the question was admitted to the small lane", || {
        h.in_flight(Lane::Small) == 1
    })
    .await;
    // Counted at the engine's pace: past 10,000 tokens it leaves the small lane while the
    // engine still generates.
    within(120, "the stream moved to medium", || {
        h.in_flight(Lane::Small) == 0 && h.in_flight(Lane::Medium) == 1
    })
    .await;
    assert_eq!(h.sim_running(), 1, "the engine is still generating");
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, SMALL_TO_MEDIUM), 1.0);
    drop(client);
    within(60, "the client's going away ends it", || h.idle()).await;
    within(30, "and aborts the engine's work", || h.sim_aborted() == 1).await;
    h.shutdown().await;
}

/// An HTTP/2 stream of `review(max_tokens)` opened with a 300-byte window that is never
/// reopened: the connection's task (settings and pings answered; the stream's data never
/// released, so its window stays shut) and the unread body.
async fn shut_window_stream(
    h: &Harness,
    max_tokens: u32,
) -> (
    tokio::task::JoinHandle<Result<(), h2::Error>>,
    h2::RecvStream,
) {
    let tcp = TcpStream::connect(h.gw.addr).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(300)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", h.gw.addr))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(bytes::Bytes::from(review(max_tokens).to_string()), true)
        .unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    (conn, resp.into_body())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_whose_window_stays_shut_gives_back_its_request_permit() {
    // An HTTP/2 client that never reads its stream, so never reopens its flow-control window,
    // while its connection answers pings: the server never writes to that stream again, so it
    // never takes the cut stream's body down. The connection is closed instead, and with it
    // the request's permit of server.max_requests_in_flight.
    let h = large_chunks("2", |c| {
        c.server.client_write_timeout = Duration::from_millis(500);
    })
    .await;
    let (conn, unread) = shut_window_stream(&h, 15_000).await;
    within(60, "the stream is cut for not reading", || {
        let log = h.log.lock().unwrap();
        log.iter().any(|l| l["error_code"] == "client_too_slow")
    })
    .await;
    within(60, "its seat and tokens are back", || h.idle()).await;
    within(60, "the connection is closed", || conn.is_finished()).await;
    within(60, "the request's permit is back", || {
        h.gw.state.metrics().requests_in_flight().get() == 0
    })
    .await;
    drop(unread);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_whose_window_stays_shut_after_the_engine_finished_gives_back_its_permit() {
    // As above, but the answer is short: the engine finishes before the write timeout, so the
    // stream is never cut while it generates. Its bytes wait in the buffer for a client that
    // never takes them; it used to hold its permit (and up to server.client_buffer_bytes) as
    // long as the client kept the connection open. Past the write timeout it is cut too.
    let h = large_chunks("2", |c| {
        c.server.client_write_timeout = Duration::from_millis(1_000);
    })
    .await;
    let (conn, unread) = shut_window_stream(&h, 20).await;
    within(60, "its seat and tokens are back", || h.idle()).await;
    within(60, "the connection is closed", || conn.is_finished()).await;
    within(60, "the request's permit is back", || {
        h.gw.state.metrics().requests_in_flight().get() == 0
    })
    .await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_client_too_slow_total{reason=\"write_timeout\"}"
        ),
        1.0
    );
    drop(unread);
    h.shutdown().await;
}

/// An HTTP/2 connection with flow-control window 0 (`SETTINGS_INITIAL_WINDOW_SIZE`), which
/// answers pings: `requests` (path, body) sent on it, each answered (headers) and none read.
async fn shut_window_connection(
    h: &Harness,
    requests: &[(&str, Option<Value>)],
) -> (
    tokio::task::JoinHandle<Result<(), h2::Error>>,
    Vec<h2::RecvStream>,
) {
    let (conn, statuses, unread) = unread_answers(h, None, requests).await;
    for ((path, _), status) in requests.iter().zip(statuses) {
        assert_eq!(status, 200, "{path}");
    }
    (conn, unread)
}

/// `requests` (path, body: POST when given, else GET) sent on one HTTP/2 connection with
/// flow-control window 0 (which answers pings), with `key` as the bearer key when given: each
/// answer's status, none of their bodies read.
async fn unread_answers(
    h: &Harness,
    key: Option<&str>,
    requests: &[(&str, Option<Value>)],
) -> (
    tokio::task::JoinHandle<Result<(), h2::Error>>,
    Vec<u16>,
    Vec<h2::RecvStream>,
) {
    let tcp = TcpStream::connect(h.gw.addr).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let (mut statuses, mut unread) = (Vec::new(), Vec::new());
    for (path, body) in requests {
        let mut client = client.clone().ready().await.unwrap();
        let method = if body.is_some() { "POST" } else { "GET" };
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", h.gw.addr))
            .header("content-type", "application/json");
        if let Some(key) = key {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        let (resp, mut send) = client
            .send_request(req.body(()).unwrap(), body.is_none())
            .unwrap();
        if let Some(body) = body {
            send.send_data(bytes::Bytes::from(body.to_string()), true)
                .unwrap();
        }
        let resp = resp.await.unwrap();
        statuses.push(resp.status().as_u16());
        unread.push(resp.into_body());
    }
    (conn, statuses, unread)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_answers_on_a_shut_http2_window_do_not_hold_the_connection() {
    // Not streams, so no stream's cut: the server holds each whole answer for a client that
    // never opens its window (and answers pings), and never writes to the socket, so no write
    // ever blocks. Each answer keeps its permit of server.max_requests_in_flight while it waits
    // (whole answers gave theirs back at once, so any number of them could wait in memory,
    // counted by no limit). The connection (one of server.max_connections, and the answers'
    // bytes) is closed once an answer waited twice the write timeout for its client.
    let h = harness(&flags("--speed 50 --profile tiny-test"), |c| {
        c.server.client_write_timeout = Duration::from_millis(5_000);
    })
    .await;
    let chat = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 5});
    // The chat first: once the first answer is held, the connection has twice the write timeout
    // to live, and the chat's answer (an engine round trip) must come within it.
    let (conn, unread) = shut_window_connection(
        &h,
        &[("/v1/chat/completions", Some(chat)), ("/v1/models", None)],
    )
    .await;
    // Read first, then checked to be from before the connection's end (10 s after the first
    // answer was held): never skipped, never raced.
    let held = h.gw.state.metrics().requests_in_flight().get();
    assert!(
        !conn.is_finished(),
        "the connection ended before the permits could be read"
    );
    assert_eq!(held, 2, "the unread answers hold their permits");
    within(60, "the connection is closed", || conn.is_finished()).await;
    within(60, "nothing held", || {
        h.idle() && h.gw.state.metrics().requests_in_flight().get() == 0
    })
    .await;
    drop(unread);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_waiting_for_a_slow_engine_is_not_closed() {
    // Waiting for the engine is not a client that takes nothing: a first token three seconds
    // away (six times the write timeout) still reaches a client that reads, over HTTP/2.
    let h = harness(
        &flags("--profile fixed --fixed-ttft-ms 3000 --fixed-itl-ms 5"),
        |c| {
            c.server.client_write_timeout = Duration::from_millis(500);
            c.upstream.first_token_timeout = Duration::from_secs(60);
        },
    )
    .await;
    let tcp = TcpStream::connect(h.gw.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", h.gw.addr))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 3,
                      "stream": true});
    send.send_data(bytes::Bytes::from(body.to_string()), true)
        .unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.expect("the stream ends cleanly, not with the connection");
        let _ = stream.flow_control().release_capacity(chunk.len());
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(text).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!conn.is_finished(), "the connection is still open");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_whole_answers_hold_at_most_their_tenants_share_of_the_permits() {
    // Whole answers keep their permit until sent. With [auth] on, one tenant's answers that
    // its client never reads must not take every permit of all: they hold at most its
    // max_requests_in_flight_per_tenant, its next request is refused, and another tenant still
    // gets through. An open route's answer asked without a key holds no permit (no client
    // without a key may take permits, nor make /readyz answer 503, by not reading).
    const A: &str = "key-of-school-a-0123456789";
    const B: &str = "key-of-school-b-0123456789";
    let h = harness(&flags("--speed 50 --profile tiny-test"), |c| {
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
        c.server.max_requests_in_flight = 8;
        c.server.max_requests_in_flight_per_tenant = 2;
        c.server.client_write_timeout = Duration::from_millis(5_000);
    })
    .await;
    let (conn_a, statuses, unread_a) = unread_answers(
        &h,
        Some(A),
        &[
            ("/v1/usage", None),
            ("/v1/usage", None),
            ("/v1/usage", None),
        ],
    )
    .await;
    assert_eq!(
        statuses,
        [200, 200, 429],
        "school-a's third while two wait unread"
    );
    let (conn_open, statuses, unread_open) = unread_answers(
        &h,
        None,
        &[
            ("/v1/models", None),
            ("/v1/models", None),
            ("/v1/models", None),
        ],
    )
    .await;
    assert_eq!(statuses, [200, 200, 200], "without a key: nothing held");
    let usage = reqwest::Client::new()
        .get(h.url("/v1/usage"))
        .bearer_auth(B)
        .send()
        .await
        .unwrap();
    assert_eq!(usage.status(), 200, "school-b still gets a permit");
    usage.text().await.unwrap();
    if !conn_a.is_finished() && !conn_open.is_finished() {
        within(60, "school-a's two unread answers hold two permits", || {
            h.gw.state.metrics().requests_in_flight().get() == 2
        })
        .await;
    }
    drop((unread_a, unread_open));
    within(60, "the connections are closed", || {
        conn_a.is_finished() && conn_open.is_finished()
    })
    .await;
    within(60, "every permit is back", || {
        h.gw.state.metrics().requests_in_flight().get() == 0
    })
    .await;
    h.shutdown().await;
}
