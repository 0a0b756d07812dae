//! Several vLLM replicas behind one gateway (issue 19), each a simulator of its own:
//!
//! - a replica killed mid-run: the stream on it ends with a clear error event, the next
//!   requests are all answered by the others (connection refused before the first byte is
//!   retried elsewhere; then the replica is ejected), and once it is back on the same port the
//!   health checks bring it back into routing;
//! - the engine abort goes to the replica that served the request;
//! - prefix affinity: 30 courses whose prefixes do not all fit one simulator's KV, sent in the
//!   same order once with round robin and once with affinity; the cached-token ratio, read
//!   from the simulators' own counters, is at least twice round robin's with affinity;
//! - a reload that changes `[upstream]`: an ejected replica stays out of routing, and a
//!   stream still running counts on its replica until it ends;
//! - a replica serving another model is ejected and kept out until it serves the gateway's.

mod common;

use std::time::Duration;

use common::{client, family_total, flags, json, send, send_text, sse};
use serde_json::{json, Value};
use tutor_gateway::config::{Config, ReplicaConfig, RoutingPolicy};
use tutor_gateway::pipeline::reload;
use tutor_gateway::server::Gateway;
use tutor_testkit::eventually;
use vllm_sim::{SimArgs, SimServer};

async fn sim(flags: &[&str]) -> SimServer {
    vllm_sim::start(&SimArgs::for_test(flags)).await.unwrap()
}

/// A gateway in front of `sims`, health-checked every 50 ms (ejected after 2 failures, back
/// after 1 healthy check), `tweak`ed.
async fn gateway(sims: &[&SimServer], tweak: impl FnOnce(&mut Config)) -> Gateway {
    let mut config = Config::default();
    config.upstream.replicas = sims
        .iter()
        .enumerate()
        .map(|(i, s)| ReplicaConfig {
            name: format!("sim-{i}"),
            ..ReplicaConfig::single(&s.url())
        })
        .collect();
    config.upstream.base_url = sims[0].url();
    config.upstream.routing.health_interval = Duration::from_millis(50);
    config.upstream.routing.unhealthy_after = 2;
    config.upstream.routing.healthy_after = 1;
    tweak(&mut config);
    common::gateway(config).await.0
}

/// A simulator started with `flags` on `port` again, where one was stopped. The port may not
/// be free again at once on a loaded machine: the bind is retried for 30 s.
async fn restart(flags: &[&str], port: u16) -> SimServer {
    let mut args = SimArgs::for_test(flags);
    args.port = port;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match vllm_sim::start(&args).await {
            Ok(back) => return back,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the simulator could not listen on port {port} again: {e:#}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Without background checks (`health_interval_ms = 0`), `/readyz` asks every replica: ready
/// while one answers (it probed only the first: 503 with the other up, which took the gateway
/// out of service), 503 when none does.
#[tokio::test]
async fn without_health_checks_readyz_is_ready_while_any_replica_answers() {
    let (first, second) = (sim(&[]).await, sim(&[]).await);
    let gw = gateway(&[&first, &second], |c| {
        c.upstream.routing.health_interval = Duration::ZERO;
        c.upstream.health_cache = Duration::ZERO;
    })
    .await;
    let readyz = || send(client().get(format!("{}/readyz", gw.url())));
    assert_eq!(readyz().await.status(), 200);
    first.shutdown().await;
    assert_eq!(readyz().await.status(), 200, "the second replica answers");
    second.shutdown().await;
    let down = readyz().await;
    assert_eq!(down.status(), 503);
    let body = down.text().await.unwrap();
    assert!(body.contains("sim-0") && body.contains("sim-1"), "{body}");
    gw.shutdown().await;
}

async fn text(url: String) -> String {
    send_text(client().get(url)).await
}

/// Opens a streaming `/answer` for `prompt` (URL-encoded) and reads it up to its first token:
/// the open response and the body read so far.
async fn first_token(gw: &Gateway, prompt: &str, max_tokens: u32) -> (reqwest::Response, String) {
    let mut stream = send(client().get(format!(
        "{}/answer?prompt={prompt}&max_output_tokens={max_tokens}",
        gw.url()
    )))
    .await;
    assert_eq!(stream.status(), 200);
    let mut body = String::new();
    while !body.contains("event: token") {
        let chunk = stream.chunk().await.unwrap().expect("a first token");
        body.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    (stream, body)
}

/// A short `/answer` to its end: its last event's name and data.
async fn short_answer(gw: &Gateway) -> (String, Value) {
    let body = send_text(client().get(format!(
        "{}/answer?prompt=what+is+a+loop&max_output_tokens=3",
        gw.url()
    )))
    .await;
    let (name, data) = sse(&body).pop().expect("an event");
    (name, json(&data))
}

/// Requests each simulator has finished, by any reason.
async fn finished(s: &SimServer) -> f64 {
    family_total(
        &text(format!("{}/metrics", s.url())).await,
        "vllm:request_success_total",
    )
}

#[tokio::test]
async fn a_replica_killed_mid_stream_cuts_that_stream_clearly_others_serve_and_it_rejoins() {
    // Real time for the long stream (about 5 ms a token), every answer to its max.
    let flags = flags("--speed 1 --profile tiny-test --mean-output-tokens 1000000");
    let mut sims = vec![sim(&flags).await, sim(&flags).await, sim(&flags).await];
    let gw = {
        let refs: Vec<&SimServer> = sims.iter().collect();
        gateway(&refs, |c| {
            c.upstream.routing.policy = RoutingPolicy::RoundRobin
        })
        .await
    };
    let (mut stream, mut body) = first_token(&gw, "review+my+repository", 4000).await;
    let victim = sims
        .iter()
        .position(|s| s.engine.snapshot().running == 1)
        .expect("one simulator runs the stream");
    let port = sims[victim].addr.port();
    let dead = sims.remove(victim);
    dead.shutdown().await;

    // The stream on it ends with an error event, not a silent cut.
    let rest = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = stream.chunk().await.unwrap_or(None) {
            body.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        body
    })
    .await
    .expect("the cut stream ends");
    let (last, data) = sse(&rest).pop().unwrap();
    assert_eq!(last, "error", "{rest}");
    assert!(json(&data)["code"].is_string(), "{data}");

    // Every new request is answered, by the two left.
    let before: f64 = finished(&sims[0]).await + finished(&sims[1]).await;
    for _ in 0..12 {
        let (name, data) = short_answer(&gw).await;
        assert_eq!(name, "done", "{data}");
    }
    let after: f64 = finished(&sims[0]).await + finished(&sims[1]).await;
    assert_eq!(after - before, 12.0);
    let name = format!("sim-{victim}");
    let healthy = format!("tutor_gateway_replica_healthy{{replica=\"{name}\"}}");
    eventually("the dead replica is ejected", || async {
        text(format!("{}/metrics", gw.url()))
            .await
            .contains(&format!("{healthy} 0"))
    })
    .await;
    let readyz = send(client().get(format!("{}/readyz", gw.url()))).await;
    assert_eq!(readyz.status(), 200, "two replicas are still healthy");

    // Back on the same port: the checks bring it back, and round robin sends to it again.
    let back = restart(&flags, port).await;
    eventually("the replica is back in routing", || async {
        text(format!("{}/metrics", gw.url()))
            .await
            .contains(&format!("{healthy} 1"))
    })
    .await;
    for _ in 0..6 {
        let (name, data) = short_answer(&gw).await;
        assert_eq!(name, "done", "{data}");
    }
    assert!(
        finished(&back).await >= 1.0,
        "the rejoined replica serves again"
    );
    gw.shutdown().await;
    back.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

/// A replica redeployed with another model answers 404 to `upstream.model`: that is its fault,
/// not the client's. Each such request is answered by another replica, the replica is ejected
/// and stays out while its `/v1/models` does not list the model (its `/health` is fine, which
/// alone brought it back after one check, to 404 again), and comes back once it serves the
/// model.
#[tokio::test]
async fn a_replica_serving_another_model_is_kept_out_until_it_serves_the_gateways() {
    let right = sim(&[]).await;
    let wrong = sim(&["--served-model-name", "someone/else"]).await;
    let port = wrong.addr.port();
    // Checks every 300 ms: each check of the replica without the model reads two pages, and
    // one that ran past a shorter interval would eject it for being slow instead.
    let gw = gateway(&[&right, &wrong], |c| {
        c.upstream.routing.policy = RoutingPolicy::RoundRobin;
        c.upstream.routing.health_interval = Duration::from_millis(300);
    })
    .await;
    let status = |gw: &Gateway| {
        gw.state
            .upstream()
            .replicas()
            .status()
            .into_iter()
            .find(|r| r.name == "sim-1")
            .unwrap()
    };
    for _ in 0..12 {
        let (name, data) = short_answer(&gw).await;
        assert_eq!(name, "done", "{data}");
    }
    eventually("the replica without the model is ejected", || async {
        !status(&gw).healthy
    })
    .await;
    let error = status(&gw).error.unwrap_or_default();
    assert!(error.contains("upstream.model"), "{error}");
    // Five health intervals: its `/health` answers 200 at each.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!status(&gw).healthy, "kept out while it lacks the model");
    for _ in 0..6 {
        let (name, data) = short_answer(&gw).await;
        assert_eq!(name, "done", "{data}");
    }

    // Redeployed with the gateway's model on the same port: back in routing, and it serves.
    wrong.shutdown().await;
    let back = restart(&[], port).await;
    eventually("the redeployed replica is back in routing", || async {
        status(&gw).healthy
    })
    .await;
    for _ in 0..6 {
        let (name, data) = short_answer(&gw).await;
        assert_eq!(name, "done", "{data}");
    }
    assert!(finished(&back).await >= 1.0, "it serves again");
    gw.shutdown().await;
    right.shutdown().await;
    back.shutdown().await;
}

/// A reload that changes `[upstream]` (here only its idle timeout) builds a new set of replicas.
/// A replica at the same URL goes on with what the gateway knew of it: a dead one stays
/// ejected (it was back in routing, taking requests that had to be retried elsewhere, until
/// the checks ejected it again), and the stream running on the other one still counts there
/// (its count read 0, so a `max_num_seqs` cap let that many more in) until it ends.
#[tokio::test]
async fn a_reload_of_the_upstream_keeps_each_replicas_health_and_streams_in_flight() {
    // Real time for the long stream (about 5 ms a token), every answer to its max.
    let flags = flags("--speed 1 --profile tiny-test --mean-output-tokens 1000000");
    let mut sims = vec![sim(&flags).await, sim(&flags).await];
    let gw = {
        let refs: Vec<&SimServer> = sims.iter().collect();
        gateway(&refs, |c| {
            c.upstream.routing.policy = RoutingPolicy::RoundRobin
        })
        .await
    };
    let (stream, _) = first_token(&gw, "review+my+repository", 4000).await;
    let busy = sims
        .iter()
        .position(|s| s.engine.snapshot().running == 1)
        .expect("one simulator runs the stream");
    let idle = 1 - busy;
    sims.remove(idle).shutdown().await;
    let dead = format!("sim-{idle}");
    let status = |gw: &Gateway, name: &str| {
        gw.state
            .upstream()
            .replicas()
            .status()
            .into_iter()
            .find(|r| r.name == name)
            .unwrap()
    };
    eventually("the dead replica is ejected", || async {
        !status(&gw, &dead).healthy
    })
    .await;
    let ejections = || async {
        family_total(
            &text(format!("{}/metrics", gw.url())).await,
            "tutor_gateway_replica_ejections_total",
        )
    };
    let ejected_before = ejections().await;

    let mut changed = (*gw.state.config()).clone();
    changed.upstream.idle_timeout += Duration::from_secs(1);
    let r = reload::apply(&gw.state, changed).unwrap();
    assert!(r.changed.contains(&"upstream"), "{:?}", r.changed);
    assert!(
        !status(&gw, &dead).healthy,
        "the dead replica stays ejected"
    );
    let running = format!("sim-{busy}");
    assert_eq!(
        status(&gw, &running).in_flight,
        1,
        "the stream still counts"
    );

    // Every request goes to the live replica at once; the dead one is never tried again.
    for _ in 0..6 {
        let (name, data) = short_answer(&gw).await;
        assert_eq!(name, "done", "{data}");
    }
    assert_eq!(
        ejections().await,
        ejected_before,
        "nothing was sent to the dead replica"
    );
    drop(stream);
    eventually("the stream's end is counted on its replica", || async {
        status(&gw, &running).in_flight == 0
    })
    .await;
    gw.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test]
async fn the_engine_abort_goes_to_the_replica_that_served_the_request() {
    let flags =
        flags("--speed 1 --profile tiny-test --mean-output-tokens 1000000 --enable-scale-out");
    let sims = vec![sim(&flags).await, sim(&flags).await, sim(&flags).await];
    let gw = gateway(&sims.iter().collect::<Vec<_>>(), |c| {
        c.upstream.abort.mode = tutor_gateway::config::AbortMode::On;
    })
    .await;
    for round in 0..3 {
        let prompt = format!("review+my+repository+{round}");
        let (stream, _) = first_token(&gw, &prompt, 4000).await;
        let id = stream.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let serving = sims
            .iter()
            .position(|s| s.engine.snapshot().running == 1)
            .expect("one simulator runs it");
        drop(stream);
        let named = |calls: Vec<Value>| {
            calls
                .iter()
                .filter(|c| {
                    c["request_ids"].as_array().is_some_and(|ids| {
                        ids.iter().any(|i| i.as_str().unwrap_or("").contains(&id))
                    })
                })
                .count()
        };
        let serving_sim = &sims[serving];
        eventually("the serving replica gets the abort call", || async {
            named(abort_calls(serving_sim).await) == 1
        })
        .await;
        for (i, s) in sims.iter().enumerate() {
            if i != serving {
                assert_eq!(named(abort_calls(s).await), 0, "abort sent to sim-{i}");
            }
        }
        eventually("nothing runs", || async {
            sims.iter().all(|s| s.engine.snapshot().running == 0)
        })
        .await;
    }
    gw.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

async fn abort_calls(s: &SimServer) -> Vec<Value> {
    serde_json::from_str(&text(format!("{}/debug/aborts", s.url())).await).unwrap()
}

/// The system prompt of course `c`: about 640 tokens (40 blocks of 16), distinct from its
/// first block on.
fn course_prefix(c: usize) -> String {
    let words = [
        "loop", "index", "closure", "borrow", "list", "tuple", "trait", "async",
    ];
    let mut s = format!("You tutor course number {c}. ");
    let mut k = c as u64;
    while s.len() < 1400 {
        k = k
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(words[(k >> 33) as usize % words.len()]);
        s.push_str(&format!(" {} ", (k >> 40) % 1000));
    }
    s
}

/// Sends 4 rounds of one request per course (30 courses, a fixed shuffled order per round)
/// through a gateway with `policy` in front of 3 fresh simulators that each hold about 10
/// course prefixes; returns the simulators' cached share of prompt tokens.
async fn cached_ratio(policy: RoutingPolicy) -> f64 {
    // 40 blocks a prefix: 10 prefixes + room for the running request ~ 440 blocks.
    let flags = flags("--speed 1000 --num-gpu-blocks 440 --max-model-len 2048");
    let sims = vec![sim(&flags).await, sim(&flags).await, sim(&flags).await];
    let gw = gateway(&sims.iter().collect::<Vec<_>>(), |c| {
        c.upstream.routing.policy = policy;
    })
    .await;
    let mut order: Vec<usize> = (0..30).collect();
    let mut k: u64 = 7;
    for round in 0..4 {
        // Fisher-Yates with a fixed LCG: the same order for both policies.
        for i in (1..order.len()).rev() {
            k = k.wrapping_mul(6364136223846793005).wrapping_add(1);
            order.swap(i, (k >> 33) as usize % (i + 1));
        }
        for &c in &order {
            let resp = send(
                client()
                    .post(format!("{}/v1/chat/completions", gw.url()))
                    .json(&json!({
                        "messages": [
                            {"role": "system", "content": course_prefix(c)},
                            {"role": "user", "content": format!("student question {round}")},
                        ],
                        "max_tokens": 2,
                    })),
            )
            .await;
            assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        }
    }
    let (mut hits, mut queries) = (0.0, 0.0);
    for s in &sims {
        let m = text(format!("{}/metrics", s.url())).await;
        hits += family_total(&m, "vllm:prefix_cache_hits_total");
        queries += family_total(&m, "vllm:prefix_cache_queries_total");
    }
    gw.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
    assert!(queries > 0.0);
    hits / queries
}

#[tokio::test]
async fn prefix_affinity_at_least_doubles_the_cached_token_ratio_of_round_robin() {
    let round_robin = cached_ratio(RoutingPolicy::RoundRobin).await;
    let affinity = cached_ratio(RoutingPolicy::Affinity).await;
    eprintln!("cached-token ratio: round robin {round_robin:.3}, affinity {affinity:.3}");
    assert!(
        affinity >= 2.0 * round_robin && affinity > 0.3,
        "affinity {affinity:.3} vs round robin {round_robin:.3}"
    );
}

#[tokio::test]
async fn seats_are_spread_by_each_replicas_kv_share() {
    // KV blocks 2000 / 2000 / 1000: shares 0.4 / 0.4 / 0.2 of the fleet's 10 seats.
    let blocks = ["2000", "2000", "1000"];
    let mut sims = Vec::new();
    for b in blocks {
        let line = format!(
            "--speed 1 --profile tiny-test --mean-output-tokens 1000000 \
             --num-gpu-blocks {b} --max-model-len 4096"
        );
        sims.push(sim(&flags(&line)).await);
    }
    let gw = gateway(&sims.iter().collect::<Vec<_>>(), |c| {
        c.upstream.max_model_len = std::num::NonZeroU32::new(4096).unwrap();
        c.admission.seats = std::num::NonZeroU32::new(10).unwrap();
        common::set_lane(c, tutor_gateway::lane::Lane::Small, 10);
    })
    .await;
    eventually("the gateway read every replica's KV cache", || async {
        let status = gw.state.upstream().replicas().status();
        status.iter().map(|r| r.kv_tokens).collect::<Vec<_>>() == [32000, 32000, 16000]
    })
    .await;
    let mut streams = Vec::new();
    for i in 0..10 {
        let (s, _) = first_token(&gw, &format!("explain+closures+{i}"), 3000).await;
        streams.push(s);
    }
    let running: Vec<usize> = sims.iter().map(|s| s.engine.snapshot().running).collect();
    assert_eq!(running.iter().sum::<usize>(), 10, "{running:?}");
    for (n, share) in running.iter().zip([4.0, 4.0, 2.0]) {
        assert!(
            (*n as f64 - share).abs() <= 1.0,
            "seats {running:?} against KV shares 4 / 4 / 2"
        );
    }
    let in_flight: Vec<u32> = gw
        .state
        .upstream()
        .replicas()
        .status()
        .iter()
        .map(|r| r.in_flight)
        .collect();
    assert_eq!(
        in_flight,
        running.iter().map(|&n| n as u32).collect::<Vec<_>>(),
        "the gateway's count per replica is the engines' own"
    );
    drop(streams);
    eventually("every replica is back to zero in flight", || async {
        gw.state
            .upstream()
            .replicas()
            .status()
            .iter()
            .all(|r| r.in_flight == 0)
            && sims.iter().all(|s| s.engine.snapshot().running == 0)
    })
    .await;
    gw.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}
