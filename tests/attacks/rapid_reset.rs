//! HTTP/2 "rapid reset" (CVE-2023-44487): a client that opens requests on one connection and
//! resets each at once makes the gateway classify, admit (and often start and abort in the
//! engine) every one of them, at the pace of its writes. Past a burst of resets its connection
//! is closed, and every seat, token and engine request comes back.

use std::time::Duration;

use serde_json::json;
use tokio::net::TcpStream;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_resets_request_after_request_is_closed_and_nothing_is_held() {
    // Answers long enough that each is still streaming when its client gives it up.
    let h = harness(
        &flags("--speed 1 --profile tiny-test --mean-output-tokens 1000000"),
        |_| {},
    )
    .await;
    let tcp = TcpStream::connect(h.gw.addr).await.unwrap();
    let (h2c, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 2000,
                      "stream": true})
    .to_string();
    // Sixteen at once, each sending request after request and giving each up as soon as it is
    // answered (the engine has started it; the unread answer dropped resets the stream; a reset
    // sent before the server took the request is h2's own to refuse, its GOAWAY
    // "too_many_resets", not this one). Bounded: 5,000 in all.
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..16 {
        let (h2c, body, sent) = (h2c.clone(), body.clone(), sent.clone());
        let url = format!("http://{}/v1/chat/completions", h.gw.addr);
        clients.push(tokio::spawn(async move {
            while sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 5_000 {
                let Ok(mut ready) = h2c.clone().ready().await else {
                    return;
                };
                let req = http::Request::post(&url)
                    .header("content-type", "application/json")
                    .body(())
                    .unwrap();
                let Ok((resp, mut send)) = ready.send_request(req, false) else {
                    return;
                };
                if send
                    .send_data(bytes::Bytes::from(body.clone()), true)
                    .is_err()
                {
                    return;
                }
                let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(30), resp).await
                else {
                    return;
                };
                assert_eq!(answer.status(), 200);
                drop(answer);
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    let closed = tokio::time::timeout(Duration::from_secs(60), conn).await;
    assert!(
        closed.is_ok(),
        "the connection was closed ({sent} requests reset)"
    );
    // About 100 (more on a slow machine, as the bucket drains meanwhile); the client's own h2
    // library gives up after some 2,000 of its resets otherwise.
    assert!(
        sent <= 1_000,
        "the gateway closed the connection after {sent} resets"
    );
    assert_eq!(
        h.gw.state.metrics().refused_count("stream_resets"),
        1,
        "counted once"
    );
    eventually("every seat and token back", || h.idle()).await;
    eventually("no request in flight", || {
        h.gw.state.metrics().requests_in_flight().get() == 0
    })
    .await;
    eventually("the engine runs nothing", || {
        h.sim.engine.snapshot().running == 0
    })
    .await;
    // Another client is served.
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 3})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    h.shutdown().await;
}
