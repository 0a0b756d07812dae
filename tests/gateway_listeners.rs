//! The admin listener (issue 17, item 5): with `server.admin_listen` set, `/metrics` and
//! `/readyz` are served there and not on the public listener, which keeps `/healthz`, `/health`
//! and `/v1/models`; `/readyz` probes vLLM at most once per `upstream.health_cache_ms`.

mod common;

use std::time::Duration;

use common::*;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

async fn status(url: String) -> u16 {
    send(client().get(url)).await.status().as_u16()
}

#[tokio::test]
async fn operators_routes_move_to_the_admin_listener() {
    let h = harness(FAST, |c| {
        c.server.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let admin = format!("http://{}", h.gw.admin_addr.expect("an admin listener"));
    assert_ne!(h.gw.admin_addr, Some(h.gw.addr));
    for path in ["/metrics", "/readyz"] {
        assert_eq!(
            status(h.url(path)).await,
            404,
            "{path} is gone from the public listener"
        );
        assert_eq!(
            status(format!("{admin}{path}")).await,
            200,
            "{path} on the admin one"
        );
    }
    for path in ["/healthz", "/health", "/v1/models"] {
        assert_eq!(status(h.url(path)).await, 200, "{path} stays public");
    }
    // The admin listener serves nothing else: no way to spend GPU time through it.
    let answer = send(
        client()
            .get(format!("{admin}/answer"))
            .query(&[("prompt", "hi")]),
    )
    .await;
    assert_eq!(answer.status(), 404);
    // In the gateway's error shape, as on the public listener (it was an empty body).
    let err: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(err["error"]["code"], "not_found", "{err}");
    let wrong = send(client().get(format!("{admin}/admin/reload"))).await;
    assert_eq!(wrong.status(), 405);
    let err: serde_json::Value = wrong.json().await.unwrap();
    assert_eq!(err["error"]["code"], "method_not_allowed", "{err}");
    let metrics = send_text(client().get(format!("{admin}/metrics"))).await;
    assert!(metrics.contains("tutor_gateway_lane_in_flight"));
    h.shutdown().await;
}

#[tokio::test]
async fn readyz_answers_from_one_probe_per_interval() {
    let mut h = harness(FAST, |c| {
        c.upstream.health_cache = Duration::from_secs(3_600)
    })
    .await;
    assert_eq!(status(h.url("/readyz")).await, 200);
    // The engine goes away: within the interval /readyz still answers from the last probe,
    // so a flood of /readyz calls never reaches vLLM.
    let sim = std::mem::replace(
        &mut h.sim,
        vllm_sim::start(&vllm_sim::SimArgs::for_test(FAST))
            .await
            .unwrap(),
    );
    sim.shutdown().await;
    for _ in 0..20 {
        assert_eq!(status(h.url("/readyz")).await, 200);
    }
    h.shutdown().await;
    // With no interval every call probes, and sees the engine gone.
    let refused = tutor_testkit::RefusedPort::new();
    let h = harness(FAST, |c| {
        c.upstream.health_cache = Duration::ZERO;
        c.upstream.base_url = refused.url();
    })
    .await;
    assert_eq!(status(h.url("/readyz")).await, 503);
    h.shutdown().await;
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// A client that trusts the test CA (and nothing else).
fn trusting_client() -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(fixture("ca.pem")).unwrap()).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .no_proxy()
        .build()
        .unwrap()
}

#[tokio::test]
async fn tls_on_the_public_listener_and_a_renewed_certificate_is_served_without_a_restart() {
    // Start with a certificate for another name: a client checking 127.0.0.1 refuses it.
    let dir = std::env::temp_dir().join(format!("tutor-gateway-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::copy(fixture("other-name.pem"), &cert).unwrap();
    std::fs::copy(fixture("other-name.key"), &key).unwrap();
    let h = harness(FAST, |c| c.server.tls = Some((cert.clone(), key.clone()))).await;
    let https = format!("https://127.0.0.1:{}", h.gw.addr.port());
    let http = trusting_client();
    assert!(
        http.get(format!("{https}/healthz")).send().await.is_err(),
        "the certificate does not name 127.0.0.1"
    );
    // Plain HTTP to a TLS listener gets a plain answer saying to use https, and nothing else.
    for _ in 0..2 {
        let plain = send(client().post(h.url("/v1/chat/completions")).json(
            &serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ))
        .await;
        let err = assert_error(plain, 400, "tls_required").await;
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("https://"),
            "{err}"
        );
    }
    assert!(h.sim_requests().await.is_empty(), "the engine saw nothing");
    // Renew: the right certificate replaces the files; the gateway picks it up by itself.
    std::fs::copy(fixture("server.pem"), &cert).unwrap();
    std::fs::copy(fixture("server.key"), &key).unwrap();
    let mut ok = false;
    for _ in 0..150 {
        if http.get(format!("{https}/healthz")).send().await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the renewed certificate was never served");
    // A whole answer over TLS.
    let body = send_text(
        http.post(format!("{https}/answer"))
            .json(&serde_json::json!({"prompt": "what is a closure?", "max_output_tokens": 3})),
    )
    .await;
    assert_eq!(sse(&body).last().unwrap().0, "done");
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over `server.max_connections` a TLS listener closes the connection without an answer: a
/// plain-text 503 would reach a TLS client as a broken handshake. Counted all the same.
#[tokio::test]
async fn a_tls_connection_over_the_limit_is_closed_without_plain_text() {
    use tokio::io::AsyncReadExt;
    let h = harness(FAST, |c| {
        c.server.tls = Some((fixture("server.pem"), fixture("server.key")));
        c.server.max_connections = 1;
    })
    .await;
    let addr = h.gw.addr;
    // The only seat, held by a connection that has not finished its handshake.
    let held = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut refused = 0.0;
    for _ in 0..100 {
        let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), second.read_to_end(&mut got))
            .await
            .expect("closed, not left open");
        assert!(
            read.is_err() || got.is_empty(),
            "nothing in plain text: {}",
            String::from_utf8_lossy(&got)
        );
        refused = tutor_testkit::metric(
            &h.gw
                .state
                .metrics()
                .render(&h.gw.state.admission().snapshot()),
            r#"tutor_gateway_refused_total{limit="connections"}"#,
        );
        if refused >= 1.0 {
            break;
        }
    }
    assert!(refused >= 1.0, "the refusal is counted");
    drop(held);
    h.shutdown().await;
}
