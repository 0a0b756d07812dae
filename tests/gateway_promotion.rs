//! M14 end to end: a request that outgrows its lane moves to the next lane mid-stream (or is cut
//! when that lane is full, and the engine aborts it); "continue" chains in one session are
//! classified by their total output. Local quota and Redis quota (two replicas).

mod common;
mod redis_common;

use std::time::Duration;

use common::*;
use redis_common::RedisServer;
use serde_json::{json, Value};
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl, RequestLogSink};
use tutor_gateway::lane::Lane;

/// The engine stops a request without `max_tokens` at its context limit: 2,000 tokens, about
/// 10 s at a token each 5 ms. Long enough that a request promoted to medium (its limit 2,048:
/// it stays there) still holds medium while a loaded machine's test reads 300 tokens of it, or
/// cuts three other requests one after another at 257 tokens each (at twice the speed and
/// 1,100 tokens, the three cuts had 0.1 s to spare on a quiet machine).
const SIM: &str = "--speed 1 --profile tiny-test --max-model-len 2000";

fn short_context(c: &mut Config) {
    c.upstream.max_model_len = 2000.try_into().unwrap();
}

/// A short question with no `max_tokens` that the engine answers up to its context limit.
fn endless() -> Value {
    json!({"messages": [{"role": "user", "content": "explain every detail of ownership"}],
           "ignore_eos": true, "stream": true})
}

fn words_in(events: &[(String, String)]) -> usize {
    events
        .iter()
        .filter(|(_, d)| d.starts_with('{'))
        .map(|(_, d)| delta_words(d))
        .sum()
}

#[tokio::test]
async fn a_small_request_that_keeps_going_moves_to_medium_at_256_and_completes() {
    let h = harness(&flags(SIM), short_context).await;
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&endless()),
    )
    .await;
    let mut body = Streamed::new(resp);
    // Read until well past 256 tokens: by then the request holds a medium slot, not a small one.
    body.until(|text| words_in(&sse(text.rsplit_once("\n\n").map_or("", |(a, _)| a))) >= 300)
        .await;
    assert_eq!(h.in_flight(Lane::Small), 0, "the small slot is free again");
    assert_eq!(
        h.in_flight(Lane::Medium),
        1,
        "the request is counted in medium"
    );
    let text = body.rest().await;
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let generated = words_in(&events);
    assert!(
        generated > 1000,
        "the stream went on without a cut: {generated} tokens"
    );
    let last = json(&events[events.len() - 2].1);
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(last.get("tutor_gateway").is_none());
    eventually("every counter back to zero", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, SMALL_TO_MEDIUM), 1.0);
    assert_eq!(metric(&m, "tutor_gateway_requests_total{lane=\"medium\",outcome=\"ok\",route=\"chat_completions\"}"), 1.0);
    // Its wait and first token were the small lane's (what the small lane's objective and
    // panels judge); its decode, the lane it ended in.
    for (series, want) in [
        (
            "tutor_gateway_time_to_first_token_seconds_count{lane=\"small\"}",
            1.0,
        ),
        (
            "tutor_gateway_time_to_first_token_seconds_count{lane=\"medium\"}",
            0.0,
        ),
        (
            "tutor_gateway_queue_wait_seconds_count{lane=\"small\"}",
            1.0,
        ),
        (
            "tutor_gateway_queue_wait_seconds_count{lane=\"medium\"}",
            0.0,
        ),
        ("tutor_gateway_output_tokens_count{lane=\"medium\"}", 1.0),
        ("tutor_gateway_output_tokens_count{lane=\"small\"}", 0.0),
    ] {
        assert_eq!(metric(&m, series), want, "{series}");
    }
    let log = h.log.lock().unwrap().clone();
    let line = log.last().expect("a request log line");
    assert_eq!(line["lane"], "medium");
    assert_eq!(line["promoted_from"], "small");

    // A request that stays within its size is not touched.
    let small = post_text(h.url("/v1/chat/completions"), &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "ignore_eos": true, "stream": true})).await;
    assert_eq!(words_in(&sse(&small)), 200);
    let m = h.metrics_text().await;
    assert_eq!(metric(&m, SMALL_TO_MEDIUM), 1.0);
    assert_eq!(metric(&m, "tutor_gateway_requests_total{lane=\"small\",outcome=\"ok\",route=\"chat_completions\"}"), 1.0);
    h.shutdown().await;
}

/// A request with tools and no `max_tokens` is sent with its reservation as its limit: vLLM's
/// tool parser may stream nothing while the model writes (a forced call whose name has not
/// parsed yet), and a request the gateway cannot see grow must not grow past what it reserved
/// (here it is seen: promoted past small's mid-stream limit, yet ended at its reservation).
/// With `tool_choice: "none"` it goes on to the engine's limit as any other.
#[tokio::test]
async fn a_request_with_tools_and_no_limit_ends_at_its_reservation() {
    let h = harness(&flags(SIM), short_context).await;
    let tools = json!([{"type": "function", "function": {"name": "run_tests",
        "description": "Runs the course's tests", "parameters": {"type": "object"}}}]);
    let mut logged = 0;
    let mut ask = |choice: &'static str| {
        let mut body = endless();
        body["tools"] = tools.clone();
        body["tool_choice"] = json!(choice);
        logged += 1;
        let (url, log, n) = (h.url("/v1/chat/completions"), h.log.clone(), logged);
        async move {
            let text = post_text(url, &body).await;
            let events = sse(&text);
            assert_eq!(events.last().unwrap().1, "[DONE]", "{choice}: {text}");
            eventually("the request is logged", || log.lock().unwrap().len() == n).await;
            let line = log.lock().unwrap().last().unwrap().clone();
            assert_eq!(line["finish_reason"], "length", "{choice}: {line}");
            line["output_tokens"].as_u64().unwrap()
        }
    };
    // What it reserved at admission: its prompt and `classify.default_output_tokens`.
    let budget = u64::from(Config::default().classify.default_output_tokens.get());
    for choice in ["required", "auto"] {
        assert_eq!(ask(choice).await, budget, "{choice}");
    }
    let output = ask("none").await;
    assert!(output > 1000, "{output}");
    eventually("every counter back to zero", || h.idle()).await;
    h.shutdown().await;
}

/// A medium request whose client sent no max tokens is reserved its prompt and
/// `default_output_tokens` (512), yet may produce up to medium's limit (2,048) there: once its
/// output passes what it reserved, its reservation grows in medium to its prompt plus the
/// limit, so the lane's budget counts what the engine holds for it. It used to stay at the
/// admitted reservation until the limit (1,536 tokens a request uncounted).
#[tokio::test]
async fn a_medium_answer_past_its_reserved_output_grows_its_reservation_in_medium() {
    // The engine stops sending after 1,000 tokens (the stream stays open): the request stays
    // in medium, past its reserved output, however far the reader lags.
    let h = harness(
        &flags("--speed 2 --profile tiny-test --stall-after-tokens 1000"),
        |_| {},
    )
    .await;
    let body = json!({"messages": [{"role": "user", "content": words(1_800, "review")}],
                      "ignore_eos": true, "stream": true});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
    let mut stream = Streamed::new(resp);
    let read = |n: usize| {
        move |text: &str| words_in(&sse(text.rsplit_once("\n\n").map_or("", |(a, _)| a))) >= n
    };
    stream.until(read(1)).await;
    assert_eq!(h.in_flight(Lane::Medium), 1, "a medium request");
    let reserved = || {
        h.gw.state
            .admission()
            .snapshot()
            .lane(Lane::Medium)
            .reserved_tokens
    };
    let admitted = reserved();
    stream.until(read(1_000)).await;
    eventually(
        "its reservation covers the output past its 512 reserved",
        || reserved() >= admitted - 512 + 1_000,
    )
    .await;
    assert_eq!(h.in_flight(Lane::Medium), 1, "still in medium");
    let held = reserved();
    drop(stream);
    eventually("every counter back to zero", || h.idle()).await;
    // Its log line says what it held in the end, not what admission reserved.
    eventually("its log line", || h.log.lock().unwrap().len() == 1).await;
    let line = h.log.lock().unwrap()[0].clone();
    assert!(
        line["tokens_reserved"].as_u64().unwrap() >= held,
        "{held} held: {line}"
    );
    h.shutdown().await;
}

/// A small question that declared 400 output tokens and passes small's 256 moves to medium
/// reserving what it can still hold there (its prompt and 400), not medium's whole work bound
/// of 5,000: with a review holding most of medium's 6,000 tokens it was cut at 257 although
/// its 430 fit.
#[tokio::test]
async fn a_declared_limit_promotes_with_what_the_request_can_hold() {
    let h = harness(&flags("--speed 1 --profile tiny-test"), |c| {
        c.lanes.medium.max_tokens_in_flight = 6_000.try_into().unwrap();
    })
    .await;
    // A review in medium (about 2,500 prompt tokens and 2,000 out, under medium's mid-stream
    // limit: it stays there, about 10 s).
    let holder = {
        let url = h.url("/v1/chat/completions");
        let body = json!({"messages": [{"role": "user", "content": words(2_400, "holder")}],
                          "max_tokens": 2_000, "ignore_eos": true, "stream": true});
        tokio::spawn(async move { post_text(url, &body).await })
    };
    eventually("the review holds medium", || h.in_flight(Lane::Medium) == 1).await;
    let body = json!({"messages": [{"role": "user", "content": "explain ownership"}],
                      "max_tokens": 400, "ignore_eos": true, "stream": true});
    let events = sse(&post_text(h.url("/v1/chat/completions"), &body).await);
    let last = json(&events[events.len() - 2].1);
    assert!(last.get("tutor_gateway").is_none(), "cut: {last}");
    assert_eq!(words_in(&events), 400);
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_lane_promotions_total{from=\"small\",to=\"medium\"}"
        ),
        1.0
    );
    holder.abort();
    eventually("every counter back to zero", || h.idle()).await;
    h.shutdown().await;
}

/// A request promoted to medium that holds the only medium slot for a while (drained in the
/// background so it keeps flowing).
async fn fill_medium(h: &Harness) -> tokio::task::JoinHandle<String> {
    let url = h.url("/v1/chat/completions");
    let blocker = tokio::spawn(async move { post_text(url, &endless()).await });
    eventually("the blocker was promoted to medium", || {
        h.in_flight(Lane::Medium) == 1
    })
    .await;
    blocker
}

#[tokio::test]
async fn with_medium_full_the_stream_is_cut_with_the_documented_message_and_aborted() {
    // Answers without a limit run to the context's end (the /answer request cannot ask for
    // `ignore_eos`): the engine's drawn lengths average 100,000 tokens.
    let h = harness(&flags(&format!("{SIM} --mean-output-tokens 100000")), |c| {
        short_context(c);
        set_lane(c, Lane::Medium, 1);
    })
    .await;
    let blocker = fill_medium(&h).await;
    let text = post_text(h.url("/v1/chat/completions"), &endless()).await;
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let last = json(&events[events.len() - 2].1);
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["tutor_gateway"]["cut"], "lane_limit");
    assert_eq!(last["tutor_gateway"]["lane"], "small");
    assert!(last["tutor_gateway"]["message"]
        .as_str()
        .unwrap()
        .contains("follow-up"));
    assert!(
        last["id"].as_str().unwrap().starts_with("chatcmpl-"),
        "shaped like vLLM's chunks"
    );
    let sent = words_in(&events);
    assert!(
        (257..=300).contains(&sent),
        "cut right after the limit: {sent}"
    );
    assert_eq!(
        last["tutor_gateway"]["after_tokens"].as_u64().unwrap() as usize,
        sent
    );
    eventually("the engine aborted the cut request", || {
        h.sim_aborted() == 1
    })
    .await;

    // A client that asked for usage gets it after the cut chunk, as vLLM's last chunk: the
    // tokens it was sent, and the prompt.
    let mut asking = endless();
    asking["stream_options"] = json!({"include_usage": true});
    let events = sse(&post_text(h.url("/v1/chat/completions"), &asking).await);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let (cut, usage) = (
        json(&events[events.len() - 3].1),
        json(&events[events.len() - 2].1),
    );
    assert_eq!(cut["tutor_gateway"]["cut"], "lane_limit", "{events:?}");
    assert_eq!(usage["choices"], json!([]), "{usage}");
    assert_eq!(usage["id"], cut["id"]);
    let u = &usage["usage"];
    assert_eq!(u["completion_tokens"], cut["tutor_gateway"]["after_tokens"]);
    assert_eq!(
        u["completion_tokens"].as_u64().unwrap() as usize,
        words_in(&events)
    );
    assert!(u["prompt_tokens"].as_u64().unwrap() > 0, "{u}");
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );

    // /answer gets a `cut` event the frontend can show, then `done`.
    let answer = post_text(
        h.url("/answer"),
        &json!({"prompt": "explain every detail of borrowing"}),
    )
    .await;
    let events = sse(&answer);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[names.len() - 2..], ["cut", "done"]);
    let cut = json(&events[events.len() - 2].1);
    assert_eq!(cut["code"], "lane_limit");
    assert_eq!(json(&events.last().unwrap().1)["finish_reason"], "length");

    let blocked = sse(&blocker.await.unwrap());
    assert!(
        words_in(&blocked) > 1000,
        "the promoted blocker itself completed"
    );
    eventually("every counter back to zero", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(&m, "tutor_gateway_stream_cuts_total{lane=\"small\"}"),
        3.0
    );
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_requests_total{lane=\"small\",outcome=\"cut\",route=\"answer\"}"
        ),
        1.0
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_chain_of_continue_requests_moves_to_medium_by_the_fourth() {
    // The engine always answers up to max_tokens here (a huge mean output length).
    let h = harness(
        &flags("--speed 50 --profile tiny-test --mean-output-tokens 1000000"),
        |_| {},
    )
    .await;
    let mut lanes = Vec::new();
    for i in 0..10 {
        let text = post_text(h.url("/answer"), &json!({"prompt": format!("continue {i}"), "max_output_tokens": 100, "session_id": "student-7"})).await;
        let events = sse(&text);
        lanes.push(json(&events[0].1)["lane"].as_str().unwrap().to_owned());
        assert_eq!(
            json(&events.last().unwrap().1)["usage"]["output_tokens"],
            100
        );
    }
    // Rule: a session's earlier output picks the first lane whose mid_stream_limit (256 for
    // small) is above it; after three answers (300 tokens) the chain is medium work.
    assert_eq!(lanes[..3], ["small", "small", "small"]);
    assert!(lanes[3..].iter().all(|l| l == "medium"), "{lanes:?}");
    // Other sessions and requests without a session are unaffected.
    let other = post_text(
        h.url("/answer"),
        &json!({"prompt": "continue", "max_output_tokens": 100, "session_id": "student-8"}),
    )
    .await;
    assert_eq!(json(&sse(&other)[0].1)["lane"], "small");
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_continuations_reclassified_total{from=\"small\",to=\"medium\"}"
        ),
        7.0
    );
    h.shutdown().await;
}

#[tokio::test]
async fn promotion_and_cuts_hold_with_two_replicas_on_one_redis() {
    let redis = RedisServer::start();
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(SIM)))
        .await
        .unwrap();
    let config = |medium: u32| {
        let mut c = Config::default();
        c.upstream.base_url = sim.url();
        short_context(&mut c);
        set_lane(&mut c, Lane::Medium, medium);
        c.telemetry.request_log = RequestLogSink::Off;
        c.quota.backend = QuotaBackend::Redis;
        c.quota.redis_url = RedisUrl::new(redis.url());
        c
    };
    // Each replica once it has its first connection to Redis (a request waits only 2 s for it,
    // which a loaded machine can exceed).
    let start = |c: Config| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gw = tutor_gateway::server::start(c, listener).unwrap();
        redis_ready(&gw).await;
        gw
    };
    let a = start(config(1)).await;
    let b = start(config(1)).await;
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let usage = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let v: std::collections::HashMap<String, i64> = redis::cmd("HGETALL")
                .arg("tg:v2:{quota}:usage")
                .query_async(&mut conn)
                .await
                .unwrap();
            v
        }
    };
    // Replica A: the request outgrows small and moves to medium in the shared quota.
    let resp = send(
        client()
            .post(format!("{}/v1/chat/completions", a.url()))
            .json(&endless()),
    )
    .await;
    let mut body = Streamed::new(resp);
    body.until(|text| words_in(&sse(text.rsplit_once("\n\n").map_or("", |(x, _)| x))) >= 300)
        .await;
    let u = usage(&mut conn).await;
    assert_eq!(u.get("small:n").copied().unwrap_or(0), 0, "{u:?}");
    assert_eq!(u.get("medium:n").copied().unwrap_or(0), 1, "{u:?}");
    assert_eq!(
        u.get("medium:tokens").copied().unwrap_or(0),
        2000,
        "grown to the medium bound"
    );

    // Replica B: the only medium slot (fleet-wide) is taken, so B's request is cut at 256.
    let cut = post_text(format!("{}/v1/chat/completions", b.url()), &endless()).await;
    let events = sse(&cut);
    assert_eq!(
        json(&events[events.len() - 2].1)["tutor_gateway"]["cut"],
        "lane_limit"
    );

    let text = body.rest().await;
    assert!(words_in(&sse(&text)) > 1000, "A's stream completed");
    eventually("both replicas idle", || {
        a.state.admission().snapshot().is_idle() && b.state.admission().snapshot().is_idle()
    })
    .await;
    // 30 s: only a guard against a leak.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !usage(&mut conn).await.values().all(|v| *v == 0) && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let u = usage(&mut conn).await;
    assert!(
        u.values().all(|v| *v == 0),
        "nothing leaked in Redis: {u:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_continue_chain_spread_over_two_replicas_counts_as_one_session_in_redis() {
    let redis = RedisServer::start();
    let flags = flags("--speed 50 --profile tiny-test --mean-output-tokens 1000000");
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags))
        .await
        .unwrap();
    let mut gateways = Vec::new();
    for _ in 0..2 {
        let mut c = Config::default();
        c.upstream.base_url = sim.url();
        c.telemetry.request_log = RequestLogSink::Off;
        c.quota.backend = QuotaBackend::Redis;
        c.quota.redis_url = RedisUrl::new(redis.url());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gw = tutor_gateway::server::start(c, listener).unwrap();
        // Its first connection to Redis: a request waits only 2 s for it.
        redis_ready(&gw).await;
        gateways.push(gw);
    }
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // The session's output counter in Redis (one session in this test: one key).
    let counted = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("tg:v2:{quota}:session:*")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(keys.len() <= 1, "one session: {keys:?}");
            let mut total = 0;
            for k in keys {
                let v: Option<i64> = redis::cmd("GET")
                    .arg(&k)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                total += v.unwrap_or(0);
            }
            total
        }
    };
    let mut lanes = Vec::new();
    for i in 0..6 {
        let before = counted(&mut conn).await;
        // Alternate replicas: only a shared count can see the whole chain.
        let url = format!("{}/answer", gateways[i % 2].url());
        let text = post_text(url, &json!({"prompt": format!("continue {i}"), "max_output_tokens": 100, "session_id": "shared-student"})).await;
        let events = sse(&text);
        lanes.push(json(&events[0].1)["lane"].as_str().unwrap().to_owned());
        // The count is added in the background when a request ends: wait for it (30 s: only
        // a guard), so the next request is classified with it whatever the timing.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while counted(&mut conn).await <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "request {i}'s output was never counted in Redis"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(
        lanes,
        ["small", "small", "small", "medium", "medium", "medium"]
    );
    for g in gateways {
        g.shutdown().await;
    }
    sim.shutdown().await;
}

/// `promotion.when_full = "wait"`: a stream paused for room in a lane that another replica
/// fills (nothing this replica ends frees it) stops waiting when the grace period ends, and its
/// client reads an `error` event `shutdown` instead of a stream held open for `wait_ms` (here
/// a minute) until the connection is closed under it. Every seat comes back.
#[tokio::test]
async fn a_stream_waiting_for_room_ends_with_the_grace() {
    let redis = RedisServer::start();
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(&format!(
        "{SIM} --mean-output-tokens 100000"
    ))))
    .await
    .unwrap();
    let mut c = Config::default();
    c.upstream.base_url = sim.url();
    short_context(&mut c);
    set_lane(&mut c, Lane::Medium, 1);
    c.telemetry.request_log = RequestLogSink::Off;
    c.quota.backend = QuotaBackend::Redis;
    c.quota.redis_url = RedisUrl::new(redis.url());
    c.promotion.when_full = tutor_gateway::config::WhenFull::Wait;
    c.promotion.wait = Duration::from_secs(60);
    c.server.shutdown_grace = Duration::ZERO;
    let start = |c: Config| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gw = tutor_gateway::server::start(c, listener).unwrap();
        redis_ready(&gw).await;
        gw
    };
    let (a, b) = (start(c.clone()).await, start(c).await);
    // Replica B holds the fleet's only medium seat for as long as the test needs it (a request
    // of B's promoted there ended by itself before A's answer reached its limit when the
    // machine was loaded).
    let blocker = b
        .state
        .admission()
        .acquire(tutor_gateway::admission::Ask::new(Lane::Medium, 500))
        .await
        .unwrap();
    // A's answer reaches small's limit (256 tokens) and pauses for a medium seat.
    let resp = send(
        client()
            .post(format!("{}/answer", a.url()))
            .json(&json!({"prompt": "explain every detail of borrowing"})),
    )
    .await;
    let body = Streamed::new(resp);
    // Into the pause: the stream waits for a medium seat (the chunk that crossed the limit is
    // held until the wait ends, so its client cannot see it; the gauge can). Its 256 tokens
    // before the pause fit in the connection's buffers unread (a token event may carry several
    // tokens, so their count says nothing of where the stream is).
    let waiting = r#"tutor_gateway_promotions_waiting{to="medium"}"#;
    tutor_testkit::eventually("A's stream waits for room in medium", || async {
        tutor_testkit::metric(&tutor_testkit::metrics_text(&a.url()).await, waiting) == 1.0
    })
    .await;
    a.shutdown().await;
    let events = ended_by_shutdown(&body.rest().await);
    assert!(
        !events.iter().any(|(e, _)| e == "cut"),
        "ended by the shutdown, not cut: {events:?}"
    );
    drop(blocker);
    b.shutdown().await;
    redis_common::quota_drains(&redis).await;
    sim.shutdown().await;
}
