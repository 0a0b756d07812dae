//! Connections that say nothing are closed. A client that opens `server.max_connections`
//! sockets and sends nothing (or only the HTTP/2 preface) used to hold every seat until it
//! closed them: `/healthz` answered 503 `overloaded` meanwhile. Now a connection without a
//! complete request head within `server.header_read_timeout` of its accept is closed, so
//! `/healthz` is served again soon after; an idle keep-alive connection is closed after
//! `server.keep_alive_idle`, while a stream longer than that is never cut by it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tutor_gateway::config::Config;

use crate::common::*;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

/// How many seats the attacker fills.
const SEATS: usize = 4;

/// HTTP/2's connection preface: the magic string and an empty SETTINGS frame, and nothing
/// after it (no HEADERS: no request).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

fn few_seats_short_header_timeout(c: &mut Config) {
    c.server.max_connections = SEATS;
    c.server.header_read_timeout = Duration::from_millis(300);
}

/// `SEATS` connections to the gateway, each having sent `hello` (maybe nothing).
async fn occupy(h: &Harness, hello: &[u8]) -> Vec<TcpStream> {
    let mut socks = Vec::new();
    for _ in 0..SEATS {
        let mut tcp = TcpStream::connect(h.gw.addr).await.unwrap();
        if !hello.is_empty() {
            tcp.write_all(hello).await.unwrap();
        }
        socks.push(tcp);
    }
    socks
}

/// `/healthz` answers 200 within a generous bound (each try on a fresh connection).
async fn healthz_served(h: &Harness) {
    tutor_testkit::eventually("/healthz is served again", || async {
        tutor_testkit::client()
            .get(h.url("/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
}

/// The gateway closed `tcp`: reading reaches the end (whatever it wrote before, e.g. HTTP/2
/// SETTINGS and GOAWAY frames), within a generous bound.
async fn closed_by_the_gateway(mut tcp: TcpStream) {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut out)).await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "the gateway left an idle connection open (or reset it): {read:?}"
    );
}

#[tokio::test]
async fn silent_sockets_cannot_keep_healthz_out() {
    let h = harness(FAST, few_seats_short_header_timeout).await;
    let socks = occupy(&h, b"").await;
    healthz_served(&h).await;
    for tcp in socks {
        closed_by_the_gateway(tcp).await;
    }
    assert!(h.idle());
    h.shutdown().await;
}

#[tokio::test]
async fn h2c_preface_only_sockets_cannot_keep_healthz_out() {
    let h = harness(FAST, few_seats_short_header_timeout).await;
    let socks = occupy(&h, H2_PREFACE).await;
    healthz_served(&h).await;
    for tcp in socks {
        closed_by_the_gateway(tcp).await;
    }
    h.shutdown().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_longer_stream_is_not_cut() {
    // Tokens every 20 ms (at speed 1): a 60-token stream lasts over a second, several times the
    // idle bound.
    let sim = flags("--profile fixed --fixed-ttft-ms 20 --fixed-itl-ms 20");
    let h = harness(&sim, |c| {
        c.server.keep_alive_idle = Duration::from_millis(300);
    })
    .await;
    let stream = post_text(
        h.url("/v1/chat/completions"),
        &serde_json::json!({"messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 60, "ignore_eos": true, "stream": true}),
    )
    .await;
    let events = sse(&stream);
    assert_eq!(
        events.last().unwrap().1,
        "[DONE]",
        "the stream ran to its end"
    );
    let words: usize = events
        .iter()
        .filter(|(_, d)| d.starts_with('{'))
        .map(|(_, d)| delta_words(d))
        .sum();
    assert_eq!(words, 60, "no token lost to the idle timer");

    // One request on a keep-alive connection, then silence: the gateway closes it.
    let mut tcp = TcpStream::connect(h.gw.addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    tcp.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    closed_by_the_gateway(tcp).await;
    h.shutdown().await;
}
