//! The autopilot (`[autopilot]`, `[lanes.<lane>] ttft_slo_ms`): a missed objective tightens the
//! large lane's seats and the prefill budget down to their floors, never below, and reviews
//! still complete there; objectives met with headroom loosen them back to the configured
//! values; off, nothing changes; questions that wait for seats raise the small lane's
//! reservation up to what the other lanes' reservations leave, and a met objective gives it
//! back. Each rule is asserted as a state reached (within a generous
//! bound), never as a time: the objectives used are either impossible (1 ms for a simulated
//! engine whose every step takes milliseconds) or unmissable (an hour).

mod common;
mod redis_common;

use std::time::Duration;

use common::*;
use redis_common::RedisServer;
use serde_json::json;
use tutor_gateway::admission::Admission;
use tutor_gateway::autopilot::leader::Lease;
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl, TtftObjective};
use tutor_gateway::lane::Lane;
use tutor_gateway::server::Gateway;

/// Reads a series from the gateway's metrics.
async fn series(h: &Harness, name: &str) -> f64 {
    metric(&h.metrics_text().await, name)
}

/// Sends short questions until `done` holds on the metrics (at most 60 s: a loaded machine).
async fn until(h: &Harness, what: &str, done: impl Fn(&str) -> bool) {
    until_on(&h.gw, what, |m| std::future::ready(done(m))).await;
}

/// Sends short questions to `gw` until `done` holds on its metrics (at most 60 s).
async fn until_on<F: std::future::Future<Output = bool>>(
    gw: &Gateway,
    what: &str,
    done: impl Fn(&str) -> F,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 2});
        let url = format!("{}/v1/chat/completions", gw.url());
        let resp = send(client().post(url).json(&body)).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        let _ = resp.text().await;
        if done(&tutor_testkit::metrics_text(&gw.url()).await).await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reached: {what}"
        );
    }
}

fn objective(ms: u64) -> Option<TtftObjective> {
    Some(TtftObjective {
        target: Duration::from_millis(ms),
        quantile_permille: 500,
    })
}

/// Autopilot on, looking every 20 ms over 2 s, judging from 3 first tokens, no hold.
fn piloted(c: &mut Config, small_ms: u64) {
    c.autopilot.enabled = true;
    c.autopilot.interval = Duration::from_millis(20);
    c.autopilot.window = Duration::from_secs(2);
    c.autopilot.min_samples = 3;
    c.autopilot.hold = Duration::ZERO;
    c.lanes.small.ttft_slo = objective(small_ms);
    c.lanes.medium.ttft_slo = None;
    // The pieces have their own test below.
    c.autopilot.pieces = false;
}

const AT_FLOOR_SEATS: &str = "tutor_gateway_autopilot_large_seats";
const BUDGET: &str = "tutor_gateway_autopilot_prefill_budget_tokens";

#[tokio::test]
async fn a_missed_objective_tightens_to_the_floors_and_reviews_still_complete() {
    // Real-time engine steps (speed 1): no first token comes within 1 ms.
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |c| {
        piloted(c, 1)
    })
    .await;
    until(&h, "large seats at the floor", |m| {
        metric(m, AT_FLOOR_SEATS) == 1.0 && metric(m, BUDGET) == 2048.0
    })
    .await;
    let m = h.metrics_text().await;
    assert!(
        metric(
            &m,
            "tutor_gateway_autopilot_adjustments_total{reason=\"tighten\"}"
        ) >= 1.0
    );
    assert!(
        metric(
            &m,
            "tutor_gateway_autopilot_objective_ratio{lane=\"small\"}"
        ) > 1.0
    );
    assert_eq!(metric(&m, "tutor_gateway_autopilot_enabled"), 1.0);
    // Still missed, the knobs stay at their floors (never below): one large seat...
    until(&h, "a decision at the floor", |m| {
        metric(
            m,
            "tutor_gateway_autopilot_adjustments_total{reason=\"at_floor\"}",
        ) >= 1.0
    })
    .await;
    assert_eq!(series(&h, AT_FLOOR_SEATS).await, 1.0);
    // ...on which a review runs to its end.
    // 5,000 prompt tokens and 10 out: large (over medium_max_work's 5,000).
    let review = json!({"messages": [{"role": "user", "content": words(5000, "review")}],
                        "max_tokens": 10});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&review)).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let _ = resp.text().await;
    let log = h.log.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|e| e["lane"] == "large" && e["outcome"] == "ok"),
        "the review completed in the large lane"
    );
    h.shutdown().await;
}

/// A reload while the autopilot paces keeps the pace in force over the new file's limits.
/// Before, any reload (even one that changed nothing: a course edit, a ConfigMap touch) put the
/// configured values in force until the next look, and the reviews waiting for the paced
/// lane's one seat all went in at once, to run for minutes.
#[tokio::test]
async fn a_reload_keeps_the_pace_and_lets_no_waiter_past_it() {
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |c| {
        piloted(c, 1);
        // Reviews never starve here (that rule would rightly give them seats back).
        c.autopilot.max_large_wait = Duration::from_secs(3600);
    })
    .await;
    until(&h, "large seats at the floor", |m| {
        metric(m, AT_FLOOR_SEATS) == 1.0
    })
    .await;
    // Reviews that decode for half a minute each: one on the paced seat, the others waiting.
    let review = json!({"messages": [{"role": "user", "content": "review it all"}],
                        "max_tokens": 6000});
    let reviews: Vec<_> = (0..4)
        .map(|_| {
            let req = client().post(h.url("/v1/chat/completions")).json(&review);
            tokio::spawn(async move { req.send().await.map(|r| r.status()) })
        })
        .collect();
    eventually("one review runs, three wait", || {
        h.in_flight(Lane::Large) == 1 && h.queued(Lane::Large) == 3
    })
    .await;
    let same = h.gw.state.config().as_ref().clone();
    tutor_gateway::pipeline::reload::apply(&h.gw.state, same).unwrap();
    assert_eq!(h.in_flight(Lane::Large), 1, "a waiter went past the pace");
    assert_eq!(h.queued(Lane::Large), 3);
    // A reload that lowers the large lane's seats to four keeps the pace (one) inside them.
    let mut lower = h.gw.state.config().as_ref().clone();
    lower.lanes.large.ceiling = std::num::NonZeroU32::new(4).unwrap();
    lower.lanes.large.max_concurrency = std::num::NonZeroU32::new(4).unwrap();
    tutor_gateway::pipeline::reload::apply(&h.gw.state, lower).unwrap();
    assert_eq!(h.in_flight(Lane::Large), 1, "a waiter went past the pace");
    // Turned off by a reload: the configured values again (four seats).
    let mut off = h.gw.state.config().as_ref().clone();
    off.autopilot.enabled = false;
    tutor_gateway::pipeline::reload::apply(&h.gw.state, off).unwrap();
    eventually("the configured seats back", || {
        h.in_flight(Lane::Large) == 4
    })
    .await;
    for r in reviews {
        r.abort();
    }
    eventually("every seat back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn objectives_met_with_headroom_loosen_back_to_the_configured_values() {
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |c| {
        piloted(c, 1)
    })
    .await;
    until(&h, "tightened", |m| {
        metric(
            m,
            "tutor_gateway_autopilot_adjustments_total{reason=\"tighten\"}",
        ) >= 1.0
    })
    .await;
    assert!(series(&h, AT_FLOOR_SEATS).await < 10.0);
    // A reload makes the objective an hour: met with headroom on every look.
    let mut relaxed = h.gw.state.config().as_ref().clone();
    relaxed.lanes.small.ttft_slo = objective(3_600_000);
    tutor_gateway::pipeline::reload::apply(&h.gw.state, relaxed).unwrap();
    until(&h, "back to the configured values", |m| {
        metric(m, AT_FLOOR_SEATS) == 10.0 && metric(m, BUDGET) == 12_288.0
    })
    .await;
    assert!(
        series(
            &h,
            "tutor_gateway_autopilot_adjustments_total{reason=\"loosen\"}"
        )
        .await
            >= 1.0
    );
    h.shutdown().await;
}

#[tokio::test]
async fn off_the_configured_values_hold_exactly() {
    // The same impossible objective, autopilot off (the default).
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |c| {
        piloted(c, 1);
        c.autopilot.enabled = false;
    })
    .await;
    for _ in 0..20 {
        let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 2});
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        let _ = resp.text().await;
    }
    // Once it has looked: the configured values, nothing moved.
    until(&h, "a look", |m| metric(m, AT_FLOOR_SEATS) == 10.0).await;
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, "tutor_gateway_autopilot_enabled"), 0.0);
    assert_eq!(metric(&m, BUDGET), 12_288.0);
    assert_eq!(
        family_total(&m, "tutor_gateway_autopilot_adjustments_total"),
        0.0
    );
    h.shutdown().await;
}

/// `autopilot.reserve_small_seats = false`: the configured reservation holds, and no reserve
/// decision is counted (each look with questions waiting counted one `reserve_at_ceiling`
/// and logged it) while the pacing knobs still move. Once the refusals leave the window, the
/// measured quantile reads 0 (no sample), not their infinite miss for good.
#[tokio::test]
async fn with_the_reservation_fixed_no_reserve_decision_is_made() {
    // First tokens at once, then nothing for ten minutes: a question of 500 tokens holds its
    // seat; questions of 1 token end at their first.
    let held = flags("--profile fixed --fixed-ttft-ms 1 --fixed-itl-ms 600000");
    let h = harness(&held, |c| {
        piloted(c, 1);
        c.autopilot.reserve_small_seats = false;
        set_lane(c, Lane::Small, 1);
        c.lanes.small.ceiling = std::num::NonZeroU32::MIN;
        // Waiters give up soon: refused for their wait, each a missed objective.
        c.lanes.small.queue.timeout = Duration::from_millis(200);
    })
    .await;
    let holder = {
        let body = json!({"messages": [{"role": "user", "content": "hold"}], "max_tokens": 500,
                          "stream": true});
        let req = client().post(h.url("/v1/chat/completions")).json(&body);
        tokio::spawn(async move {
            let mut resp = send(req).await;
            while let Ok(Some(_)) = resp.chunk().await {}
        })
    };
    eventually("the seat is held", || h.in_flight(Lane::Small) == 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while series(
        &h,
        "tutor_gateway_autopilot_adjustments_total{reason=\"tighten\"}",
    )
    .await
        < 1.0
    {
        assert!(tokio::time::Instant::now() < deadline, "never tightened");
        questions_at_once(&h, 4).await;
    }
    let m = h.metrics_text().await;
    for reason in ["reserve_up", "reserve_at_ceiling", "reserve_down"] {
        let series = format!("tutor_gateway_autopilot_adjustments_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&m, &series), 0.0, "{reason}");
    }
    assert_eq!(metric(&m, "tutor_gateway_autopilot_small_seats"), 1.0);
    holder.abort();
    eventually("every seat back", || h.idle()).await;
    // The refusals leave the window (2 s) with no first token after them: the measured
    // quantile reads 0 again (it stayed at the refusals' infinite miss).
    let objective_ratio = "tutor_gateway_autopilot_objective_ratio{lane=\"small\"}";
    tutor_testkit::eventually("the window empties", || async {
        series(&h, objective_ratio).await == 0.0
    })
    .await;
    h.shutdown().await;
}

#[tokio::test]
async fn before_its_first_look_the_gauges_show_the_configured_values() {
    // A look an hour away: what a scrape sees before any (it used to see zeros, which a
    // dashboard draws as a gateway with no seats and no prefill budget).
    let h = harness(&["--profile", "tiny-test"], |c| {
        c.autopilot.interval = Duration::from_secs(3_600);
    })
    .await;
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, AT_FLOOR_SEATS), 10.0);
    assert_eq!(metric(&m, BUDGET), 12_288.0);
    let small = h.gw.state.config().lanes.small.max_concurrency;
    assert_eq!(
        metric(&m, "tutor_gateway_autopilot_small_seats"),
        f64::from(small.get())
    );
    h.shutdown().await;
}

const PIECE_TOKENS: &str = "tutor_gateway_autopilot_piece_tokens";

/// A stream of `max_tokens` tokens asked of `h`, read to its end.
async fn streamed(h: &Harness, content: String, max_tokens: u32) {
    let body = json!({"messages": [{"role": "user", "content": content}],
                      "max_tokens": max_tokens, "stream": true});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
}

#[tokio::test]
async fn long_engine_steps_turn_pieces_on_and_the_next_long_prompt_is_pieced() {
    // An engine without --long-prefill-token-threshold, at real speed: a review's 5,000-token
    // prompt fills one step of about 250 ms, decode steps take about 5 ms.
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |c| {
        piloted(c, 3_600_000);
        c.autopilot.pieces = true;
        c.autopilot.min_piece_tokens = 256;
        c.autopilot.max_piece_tokens = 1024;
    })
    .await;
    assert_eq!(series(&h, PIECE_TOKENS).await, 0.0);
    // Questions decoding while reviews prefill: their streams see the long steps.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut round = 0;
    while series(&h, PIECE_TOKENS).await == 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pieces never went on"
        );
        round += 1;
        let questions: Vec<_> = (0..4)
            .map(|i| streamed(&h, format!("question {round} {i}"), 40))
            .collect();
        let review = async {
            tokio::time::sleep(Duration::from_millis(40)).await;
            streamed(&h, words(5000, &format!("review {round}")), 2).await;
        };
        tokio::join!(futures::future::join_all(questions), review);
    }
    let size = series(&h, PIECE_TOKENS).await as u32;
    assert!(
        (256..=1024).contains(&size) && size.is_multiple_of(16),
        "{size}"
    );
    assert!(
        series(
            &h,
            "tutor_gateway_autopilot_adjustments_total{reason=\"pieces_on\"}"
        )
        .await
            >= 1.0
    );
    // The next long prompt goes in pieces of the autopilot's size (unless it turned them off
    // again meanwhile: then once more).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        streamed(&h, words(5000, "after"), 2).await;
        let pieced = series(
            &h,
            "tutor_gateway_prefill_pieced_requests_total{outcome=\"pieced\"}",
        )
        .await;
        if pieced >= 1.0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never pieced");
    }
    assert!(series(&h, "tutor_gateway_prefill_pieces_total").await >= 1.0);
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

const SMALL_SEATS: &str = "tutor_gateway_autopilot_small_seats";

/// `n` one-token questions sent at once: each one's status and body.
async fn questions_at_once(h: &Harness, n: usize) -> Vec<(u16, String)> {
    let url = h.url("/v1/chat/completions");
    let burst = (0..n).map(|i| {
        let body = json!({"messages": [{"role": "user", "content": format!("why {i}?")}],
                          "max_tokens": 1});
        let req = client().post(&url).json(&body);
        async move {
            let resp = send(req).await;
            (
                resp.status().as_u16(),
                resp.text().await.unwrap_or_default(),
            )
        }
    });
    futures::future::join_all(burst).await
}

/// Streams held in decode (the engine's second token comes in ten minutes), of lane
/// medium (1,500 prompt words and 500 tokens out: over small's 1,200 of work); aborting a
/// handle leaves, queued or admitted.
fn held_mediums(h: &Harness, n: usize, salt: &str) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let body = json!({"messages": [{"role": "user",
                                             "content": words(1500, &format!("{salt} {i}"))}],
                              "max_tokens": 500, "stream": true});
            let req = client().post(h.url("/v1/chat/completions")).json(&body);
            tokio::spawn(async move {
                let mut resp = send(req).await;
                while let Ok(Some(_)) = resp.chunk().await {}
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_that_wait_for_seats_raise_the_small_reservation_and_a_met_objective_lowers_it() {
    // First tokens at once, then nothing for ten minutes: admitted streams hold their seats.
    let held = flags("--profile fixed --fixed-ttft-ms 1 --fixed-itl-ms 600000");
    let h = harness(&held, |c| {
        piloted(c, 1);
        // Eight seats: small reserves 1, medium 1 and may borrow up to 7, large 1. The
        // reservation may grow to 8 - 1 - 1 = 6.
        c.admission.seats = std::num::NonZeroU32::new(8).unwrap();
        set_lane(c, Lane::Small, 1);
        c.lanes.small.ceiling = std::num::NonZeroU32::new(8).unwrap();
        set_lane(c, Lane::Medium, 1);
        c.lanes.medium.ceiling = std::num::NonZeroU32::new(7).unwrap();
        set_lane(c, Lane::Large, 1);
    })
    .await;
    // Medium borrows every seat nobody reserved.
    let mediums = held_mediums(&h, 7, "first");
    eventually("seven mediums in", || h.in_flight(Lane::Medium) == 7).await;
    // Bursts of 16 questions: as many as small's seats admit, the rest wait (max_tokens 1: each
    // ends at its first token). The 1 ms objective is missed by every one of them, and more
    // than half waited for a seat while the reservation is under 8.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while series(&h, SMALL_SEATS).await < 6.0 {
        if tokio::time::Instant::now() >= deadline {
            let m = h.metrics_text().await;
            let lines: Vec<&str> = m
                .lines()
                .filter(|l| {
                    !l.starts_with('#')
                        && (l.contains("autopilot") || l.contains("queue_wait_seconds_sum"))
                })
                .collect();
            panic!("never at the ceiling: {lines:#?}");
        }
        for (status, body) in questions_at_once(&h, 16).await {
            assert_eq!(status, 200, "{body}");
        }
        assert!(series(&h, SMALL_SEATS).await <= 6.0, "above the ceiling");
    }
    let m = h.metrics_text().await;
    let decided = |reason: &str| {
        metric(
            &m,
            &format!("tutor_gateway_autopilot_adjustments_total{{reason=\"{reason}\"}}"),
        )
    };
    assert!(decided("reserve_up") >= 1.0);
    assert_eq!(decided("reserve_down"), 0.0);
    // In force: with the questions gone, medium borrows only what the reservation leaves.
    for m in mediums {
        m.abort();
    }
    eventually("the mediums gone", || h.idle()).await;
    let mediums = held_mediums(&h, 7, "second");
    eventually("two mediums in, five waiting", || {
        h.in_flight(Lane::Medium) == 2 && h.queued(Lane::Medium) == 5
    })
    .await;
    assert_eq!(series(&h, SMALL_SEATS).await, 6.0);
    assert_eq!(
        h.in_flight(Lane::Medium),
        2,
        "8 seats - 6 reserved for questions"
    );
    for m in mediums {
        m.abort();
    }
    eventually("the mediums gone", || h.idle()).await;
    // An objective of an hour, met with headroom: the reservation comes back down a seat at
    // a time, to the configured one and never below.
    let mut relaxed = h.gw.state.config().as_ref().clone();
    relaxed.lanes.small.ttft_slo = objective(3_600_000);
    tutor_gateway::pipeline::reload::apply(&h.gw.state, relaxed).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while series(&h, SMALL_SEATS).await > 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never back to the configured reservation"
        );
        // One question at a time, each ending at its first token: no waits, far within an hour.
        let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 1});
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    }
    assert_eq!(
        series(&h, SMALL_SEATS).await,
        1.0,
        "never below the configured one"
    );
    assert!(
        series(
            &h,
            "tutor_gateway_autopilot_adjustments_total{reason=\"reserve_down\"}"
        )
        .await
            >= 5.0
    );
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

const LEADER: &str = "tutor_gateway_autopilot_leader";

/// The shared limits record's prefill budget and large ceiling, read from Redis.
async fn shared_knobs(redis: &RedisServer) -> (u64, u32) {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("HMGET")
        .arg("tg:v2:{quota}:limits")
        .arg("prefill_budget")
        .arg("large:ceiling")
        .query_async::<(u64, u32)>(&mut conn)
        .await
        .unwrap()
}

/// [`piloted`] on the Redis quota at `redis`, in front of `sim_url`.
fn shared(sim_url: &str, redis: &RedisServer, enabled: bool) -> Config {
    let mut c = Config::default();
    c.upstream.base_url = sim_url.to_owned();
    piloted(&mut c, 1);
    c.autopilot.enabled = enabled;
    c.quota.backend = QuotaBackend::Redis;
    c.quota.redis_url = RedisUrl::new(redis.url());
    c.quota.heartbeat = Duration::from_millis(100);
    c
}

async fn gauge(gw: &Gateway, name: &str) -> f64 {
    metric(&tutor_testkit::metrics_text(&gw.url()).await, name)
}

#[tokio::test]
async fn with_redis_one_replica_leads_and_hands_the_configured_values_back_when_it_stops() {
    let redis = RedisServer::start();
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&[
        "--speed",
        "1",
        "--profile",
        "tiny-test",
    ]))
    .await
    .unwrap();
    // A paces; B has the autopilot off and enforces whatever the shared record says.
    let (a, _) = gateway(shared(&sim.url(), &redis, true)).await;
    redis_ready(&a).await;
    let (b, _) = gateway(shared(&sim.url(), &redis, false)).await;
    redis_ready(&b).await;
    // The impossible objective drives A's values to the floors, published for the fleet.
    until_on(&a, "the shared record at the floors", |m| {
        let leads = metric(m, LEADER) == 1.0;
        let redis = &redis;
        async move { leads && shared_knobs(redis).await == (2048, 1) }
    })
    .await;
    assert_eq!(gauge(&b, LEADER).await, 0.0, "B does not lead");
    // A stops: it puts the configured values back and gives up the lead.
    a.shutdown().await;
    assert_eq!(shared_knobs(&redis).await, (12_288, 10));
    // C, with the autopilot on, takes the lead and paces the fleet again.
    let (c, _) = gateway(shared(&sim.url(), &redis, true)).await;
    redis_ready(&c).await;
    until_on(&c, "C leads and tightens", |m| {
        let leads = metric(m, LEADER) == 1.0;
        let redis = &redis;
        async move { leads && shared_knobs(redis).await.1 < 10 }
    })
    .await;
    // B follows: its gauges show the record in force.
    assert_eq!(gauge(&b, LEADER).await, 0.0);
    c.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn with_redis_the_lead_passes_on_when_its_holder_stops_renewing() {
    let redis = RedisServer::start();
    let mut config = Config::default();
    config.quota.backend = QuotaBackend::Redis;
    config.quota.redis_url = RedisUrl::new(redis.url());
    let replica = || {
        let metrics = tutor_gateway::telemetry::Metrics::new();
        match Admission::build(&config, metrics.quota().clone()).unwrap() {
            Admission::Redis(r) => r,
            Admission::Local(_) => panic!("the Redis backend"),
        }
    };
    let (a, b) = (replica(), replica());
    let look = Duration::from_millis(1);
    let (mut lease_a, mut lease_b) = (Lease::default(), Lease::default());
    claim_until(&mut lease_a, &a, "A leads").await;
    assert_eq!(
        lease_b.claim(&b, look).await,
        Some(false),
        "one leader at a time"
    );
    assert_eq!(
        lease_a.claim(&a, look).await,
        Some(true),
        "the leader renews"
    );
    // A stops renewing (a crash): once its lease expires, B takes the lead.
    claim_until(&mut lease_b, &b, "B leads").await;
    assert_eq!(lease_a.claim(&a, look).await, Some(false), "A follows now");
    // B gives it up: A leads at once.
    lease_b.resign(&b).await;
    assert_eq!(lease_a.claim(&a, look).await, Some(true));
    // A claim Redis answers with an error (here the lease key of the wrong type) tells
    // nothing: not "another replica leads", which made a leader drop its pace.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let lease_key = "tg:v2:{quota}:autopilot";
    let _: () = redis::pipe()
        .del(lease_key)
        .hset(lease_key, "x", 1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(lease_a.claim(&a, look).await, None);
    let _: () = redis::cmd("DEL")
        .arg(lease_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(lease_a.claim(&a, look).await, Some(true));
}

/// A leader that dies leaves its paced record in force. Replicas with the autopilot on take the
/// lease and pace from there; when none has it on (turned off by a rolling update whose last
/// pod, the leader, was killed first), a replica writes its configured values back once the
/// lease expired. Before, the floors stayed in force for the fleet until someone pushed limits.
#[tokio::test]
async fn with_redis_a_dead_leaders_paced_record_goes_when_no_replica_paces() {
    let redis = RedisServer::start();
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&[
        "--speed",
        "50",
        "--profile",
        "tiny-test",
    ]))
    .await
    .unwrap();
    let (b, _) = gateway(shared(&sim.url(), &redis, false)).await;
    redis_ready(&b).await;
    // The leader: paces to the floors, publishes them, and dies (never hands back, never
    // resigns: its lease runs out).
    let config = shared(&sim.url(), &redis, true);
    let metrics = tutor_gateway::telemetry::Metrics::new();
    let leader = match Admission::build(&config, metrics.quota().clone()).unwrap() {
        Admission::Redis(r) => r,
        Admission::Local(_) => panic!("the Redis backend"),
    };
    let mut lease = Lease::default();
    claim_until(&mut lease, &leader, "the leader leads").await;
    let mut floors = config.clone();
    floors.admission.prefill_budget_tokens = 2048;
    floors.lanes.large.ceiling = std::num::NonZeroU32::MIN;
    floors.lanes.large.max_concurrency = std::num::NonZeroU32::MIN;
    assert_eq!(leader.publish_paced(&floors).await, Some(true));
    assert_eq!(shared_knobs(&redis).await, (2048, 1));
    drop(leader);
    // B, its autopilot off, puts the configured values back once the lease has expired.
    tutor_testkit::eventually("the configured values back", || {
        let redis = &redis;
        async move { shared_knobs(redis).await == (12_288, 10) }
    })
    .await;
    b.shutdown().await;
}

/// Claims `lease` for `redis` until it holds (at most 60 s).
async fn claim_until(
    lease: &mut Lease,
    redis: &tutor_gateway::admission::redis::RedisAdmission,
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while lease.claim(redis, Duration::from_millis(1)).await != Some(true) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reached: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
