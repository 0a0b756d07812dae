//! Soak: thousands of mixed requests, a third of the clients walking away at random points,
//! upstream failures injected; afterwards every lane is back at zero and the engine is idle.
//! Bounded: 3,000 requests, 64 at a time, at most two minutes.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::json;

/// A tiny seeded generator so the soak replays identically.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

enum Leave {
    Never,
    BeforeHeaders(Duration),
    AfterChunks(usize),
}

async fn one(url: String, body: serde_json::Value, leave: Leave) -> bool {
    let req = client().post(url).json(&body).send();
    let resp = match leave {
        Leave::BeforeHeaders(after) => {
            let _ = tokio::time::timeout(after, req).await;
            return false;
        }
        _ => match req.await {
            Ok(r) => r,
            Err(_) => return false,
        },
    };
    let mut stream = resp.bytes_stream();
    let mut chunks = 0;
    let mut text = Vec::new();
    while let Some(Ok(b)) = stream.next().await {
        chunks += 1;
        text.extend_from_slice(&b);
        if let Leave::AfterChunks(n) = leave {
            if chunks >= n {
                return false;
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    text.ends_with("data: [DONE]\n\n") && !text.contains("\"error\"")
        || text.contains("event: done")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_disconnects_and_failures_leaves_nothing_behind() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --num-gpu-blocks 8192 --fail-rate 0.03 --midstream-error-rate 0.03 --error-after-tokens 3"),
        |c| {
            c.upstream.first_token_timeout = Duration::from_secs(20);
            c.upstream.idle_timeout = Duration::from_secs(5);
        },
    )
    .await;
    let mut rng = Lcg(2026);
    let n = 3000;
    let jobs: Vec<_> = (0..n)
        .map(|i| {
            let (words_n, max) = match rng.below(100) {
                0..70 => (300, 40),
                70..95 => (2000, 60),
                _ => (8000, 80),
            };
            let leave = match rng.below(3) {
                0 => match rng.below(2) {
                    0 => Leave::BeforeHeaders(Duration::from_millis(rng.below(30))),
                    _ => Leave::AfterChunks(1 + rng.below(8) as usize),
                },
                _ => Leave::Never,
            };
            let prompt = words(words_n, &format!("soak {i}"));
            let (url, body) = if rng.below(4) == 0 {
                (
                    h.url("/answer"),
                    json!({"prompt": prompt, "max_output_tokens": max}),
                )
            } else {
                (
                    h.url("/v1/chat/completions"),
                    json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max,
                           "ignore_eos": true, "stream": true}),
                )
            };
            (url, body, leave)
        })
        .collect();
    let run = futures::stream::iter(jobs)
        .map(|(url, body, leave)| one(url, body, leave))
        .buffer_unordered(64)
        .collect::<Vec<bool>>();
    // A guard against a hang, not a speed limit: what is asserted is that nothing leaks.
    let results = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("soak finishes (10 minutes at most)");
    let completed = results.iter().filter(|ok| **ok).count();
    assert!(
        completed > n / 2,
        "most requests complete: {completed} of {n}"
    );

    eventually(
        "every lane back to zero in flight, zero reserved, zero queued",
        || h.idle(),
    )
    .await;
    eventually("the engine has nothing running or waiting", || {
        let s = h.sim.engine.snapshot();
        s.running == 0 && s.waiting == 0 && s.free_blocks == s.num_gpu_blocks
    })
    .await;
    let snap = h.sim.engine.snapshot();
    assert!(snap.aborted > 0, "disconnects reached the engine as aborts");
    let metrics = h.metrics_text().await;
    for series in [
        "tutor_gateway_lane_in_flight",
        "tutor_gateway_lane_reserved_tokens",
        "tutor_gateway_lane_queue_depth",
    ] {
        for lane in ["small", "medium", "large"] {
            assert!(
                metrics.contains(&format!("{series}{{lane=\"{lane}\"}} 0\n")),
                "{series} {lane}"
            );
        }
    }
    let counted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("tutor_gateway_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(
        counted <= n as u64 && counted >= completed as u64,
        "each request counted once: {counted}"
    );
    assert!(metrics.contains("outcome=\"cancelled\""));
    assert!(metrics.contains("outcome=\"upstream_error\""));
    h.shutdown().await;
}
