//! The admin listener (issue 17, item 5): with `server.admin_listen` set, `/metrics` and
//! `/readyz` are served there and not on the public listener, which keeps `/healthz`, `/health`
//! and `/v1/models`; `/readyz` probes vLLM at most once per `upstream.health_cache_ms`.

mod common;

use std::time::Duration;

use common::*;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

async fn status(url: String) -> u16 {
    client().get(url).send().await.unwrap().status().as_u16()
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
    let answer = client()
        .get(format!("{admin}/answer"))
        .query(&[("prompt", "hi")])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404);
    let metrics = client()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let h = harness(FAST, |c| {
        c.upstream.health_cache = Duration::ZERO;
        c.upstream.base_url = format!("http://127.0.0.1:{port}");
    })
    .await;
    assert_eq!(status(h.url("/readyz")).await, 503);
    h.shutdown().await;
}
