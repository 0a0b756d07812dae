//! Tenants (`[auth]` keys) cannot crowd each other out of what the gateway holds for them: a
//! lane's queue places are shared by the tenants waiting, in proportion to their shares
//! (`admission::fair::room_for`; both quota backends, Redis against a real `redis-server`),
//! and a session id is the tenant's. Asserted on states (who waits, who was refused and why),
//! never on times: the simulator stalls every stream after one token, so seats stay taken
//! until a test lets them go.

mod common;
mod redis_common;

use std::time::Duration;

use common::*;
use redis_common::RedisServer;
use serde_json::{json, Value};
use tutor_gateway::config::{QuotaBackend, RedisUrl};
use tutor_gateway::lane::Lane;

const STALLING: &str = "--speed 50 --profile tiny-test --stall-after-tokens 1";

const A: &str = "key-of-school-a";
const B: &str = "key-of-school-b";

/// Sends `ask(i)` for i = 0, 1, ... until one is refused with 429: the prompt + output tokens
/// served before (each answer's `usage.total_tokens`), and the refusal with its index.
async fn ask_until_refused(
    ask: impl Fn(u32) -> reqwest::RequestBuilder,
) -> (u64, reqwest::Response, u32) {
    let mut served = 0u64;
    for i in 0..100 {
        let resp = send(ask(i)).await;
        if resp.status() == 429 {
            return (served, resp, i);
        }
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        served += v["usage"]["total_tokens"].as_u64().unwrap();
    }
    panic!("the budget refused none of 100 requests");
}

/// The quota in Redis at `redis`, and keys for schools A and B.
fn two_schools_sharing(c: &mut tutor_gateway::config::Config, redis: &RedisServer) {
    c.quota.backend = QuotaBackend::Redis;
    c.quota.redis_url = RedisUrl::new(redis.url());
    with_keys(c, &[(A, "school-a"), (B, "school-b")]);
}

/// One small seat, and a queue of 10 whose requests (and streams) wait up to two minutes.
fn one_patient_small_seat(c: &mut tutor_gateway::config::Config) {
    set_lane(c, Lane::Small, 1);
    c.lanes.small.queue.len = 10;
    c.lanes.small.queue.timeout = Duration::from_secs(120);
    c.upstream.idle_timeout = Duration::from_secs(120);
}

/// A second replica in front of `h`'s simulator, configured by `setup` (on Redis), once it
/// has its first connection to Redis.
async fn second_replica(
    h: &Harness,
    setup: impl Fn(&mut tutor_gateway::config::Config),
) -> tutor_gateway::server::Gateway {
    let mut config = tutor_gateway::config::Config::default();
    config.upstream.base_url = h.sim.url();
    setup(&mut config);
    let gw = gateway(config).await.0;
    redis_ready(&gw).await;
    gw
}

fn question(salt: &str) -> Value {
    json!({"messages": [{"role": "user", "content": format!("why? {salt}")}],
           "max_tokens": 5, "stream": true})
}

#[tokio::test]
async fn a_tenant_that_filled_the_queue_makes_room_for_another_tenants_request() {
    room_for_another_tenant(None).await;
}

#[tokio::test]
async fn with_redis_a_tenant_that_filled_the_line_makes_room_for_another_tenants_request() {
    let redis = RedisServer::start();
    room_for_another_tenant(Some(&redis)).await;
}

async fn room_for_another_tenant(redis: Option<&RedisServer>) {
    let h = harness(&flags(STALLING), |c| {
        if let Some(redis) = redis {
            c.quota.backend = QuotaBackend::Redis;
            c.quota.redis_url = RedisUrl::new(redis.url());
        }
        set_lane(c, Lane::Small, 2);
        c.lanes.small.queue.len = 3;
        c.lanes.small.queue.timeout = Duration::from_secs(120);
        c.upstream.idle_timeout = Duration::from_secs(120);
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
        c.auth.tenant_shares = [("school-b".to_owned(), 10)].into_iter().collect();
    })
    .await;
    if redis.is_some() {
        // Its first connection to Redis: a request waits only 2 s for it, then falls back.
        redis_ready(&h.gw).await;
    }
    let post = |key: &'static str, salt: &str| {
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&question(salt))
    };
    // School A's two streams hold both seats (stalled after their first token)...
    let mut seats = vec![];
    for i in 0..2 {
        let resp = send(post(A, &format!("seat {i}"))).await;
        assert_eq!(resp.status(), 200);
        seats.push(resp);
    }
    // ...and three more of A's fill the queue of 3.
    let queued_a: Vec<_> = (0..3)
        .map(|i| tokio::spawn(post(A, &format!("queued {i}")).send()))
        .collect();
    eventually("A fills the queue", || h.queued(Lane::Small) == 3).await;
    // School B's question is not refused: it takes a place, and A's newest waiter leaves.
    let b = tokio::spawn(post(B, "b").send());
    // The first of A's waiters to end is the one pushed out (the others wait for seats).
    let (out, _, waiting_a) = tokio::time::timeout(
        Duration::from_secs(60),
        futures::future::select_all(queued_a),
    )
    .await
    .expect("one of A's waiters was pushed out");
    let out = out.unwrap().unwrap();
    assert_eq!(out.status(), 429);
    assert!(out.headers().contains_key("retry-after"));
    let err: Value = out.json().await.unwrap();
    assert_eq!(err["error"]["code"], "tenant_queue_full", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("school-a"), "{message}");
    assert!(
        !message.contains("school-b"),
        "names only A's limit: {message}"
    );
    assert_eq!(h.queued(Lane::Small), 3, "B waits in A's place");
    // A, now above its places while B waits, is refused at once; B's next is refused only
    // once B holds its own places.
    let again = send(post(A, "again")).await;
    assert_eq!(again.status(), 429);
    let err: Value = again.json().await.unwrap();
    assert_eq!(err["error"]["code"], "tenant_queue_full");
    // The seats come back: B's question, first in the fair order, is served.
    drop(seats);
    let b = b.await.unwrap().unwrap();
    assert_eq!(b.status(), 200);
    drop(b);
    for q in waiting_a {
        q.abort();
    }
    eventually("every seat and place back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_session_id_is_the_tenants_own_another_tenants_output_never_moves_it() {
    let h = harness(
        &flags("--speed 50 --profile tiny-test --mean-output-tokens 1000000"),
        |c| with_keys(c, &[(A, "school-a"), (B, "school-b")]),
    )
    .await;
    let ask = |key: &'static str, tokens: u32| {
        let h = &h;
        async move {
            let body = json!({"prompt": "continue", "max_output_tokens": tokens,
                              "session_id": "student-42"});
            let resp = send(client().post(h.url("/answer")).bearer_auth(key).json(&body)).await;
            assert_eq!(resp.status(), 200);
            let events = sse(&resp.text().await.unwrap());
            json(&events[0].1)["lane"].as_str().unwrap().to_owned()
        }
    };
    // School A's student-42 writes 1,000 tokens: its next request is medium work.
    let _ = ask(A, 1000).await;
    assert_eq!(ask(A, 10).await, "medium");
    // School B's student-42 is another student: a short question stays small.
    assert_eq!(ask(B, 10).await, "small");
    eventually("every seat and token back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_tenant_holds_at_most_its_requests_in_flight_and_others_are_served() {
    let h = harness(&flags(STALLING), |c| {
        c.server.max_requests_in_flight_per_tenant = 2;
        c.upstream.idle_timeout = Duration::from_secs(120);
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
    })
    .await;
    let post = |key: &'static str, salt: &str| {
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&question(salt))
    };
    // A's two streams stall after their first token: both of its requests in flight.
    let mut open = vec![];
    for i in 0..2 {
        let resp = send(post(A, &format!("open {i}"))).await;
        assert_eq!(resp.status(), 200);
        open.push(resp);
    }
    let resp = send(post(A, "third")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "tenant_overloaded", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("school-a") && !message.contains("school-b"));
    // B is served meanwhile.
    let b = send(post(B, "b")).await;
    assert_eq!(b.status(), 200);
    drop(b);
    // A stream that ends gives its slot back.
    open.pop();
    tutor_testkit::eventually("A's slot back", || async {
        let resp = post(A, "again").send().await.unwrap();
        resp.status() == 200
    })
    .await;
    drop(open);
    eventually("every seat back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_tenants_tokens_per_minute_bound_what_it_is_admitted_and_not_other_tenants() {
    let h = harness(&flags("--speed 50 --profile tiny-test"), |c| {
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
        c.auth.tenants.insert(
            "school-a".into(),
            tutor_gateway::config::TenantBudget {
                tokens_per_minute: Some(2_000),
                ..Default::default()
            },
        );
    })
    .await;
    let ask = |key: &'static str, i: u32| {
        let body = json!({"messages": [{"role": "user", "content": format!("why? {i}")}],
                          "max_tokens": 150});
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body)
    };
    // School A asks until its budget refuses: what it was served stays within the budget plus
    // one request's reservation (at most 150 out and a short prompt).
    let (served, refusal, _) = ask_until_refused(|i| ask(A, i)).await;
    assert!((2_000..=2_000 + 150 + 64).contains(&served), "{served}");
    let retry: u64 = refusal.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let err: Value = refusal.json().await.unwrap();
    assert_eq!(err["error"]["code"], "tenant_budget", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("school-a") && message.contains("tokens_per_minute"));
    // Counted as the tenant's own limit, not as a full lane queue (the queue alert's).
    tutor_testkit::eventually("the refusal counted", || async {
        let m = h.metrics_text().await;
        metric(&m, "tutor_gateway_requests_total{lane=\"none\",outcome=\"tenant_limited\",route=\"chat_completions\"}") == 1.0
    })
    .await;
    let m = h.metrics_text().await;
    assert!(
        !m.contains("outcome=\"queue_full\""),
        "no queue_full counted"
    );
    // School B has no budget and is served.
    let resp = send(ask(B, 0)).await;
    assert_eq!(resp.status(), 200);
    // Each tenant sees its own usage, and only its own.
    let usage = |key: &'static str| {
        let url = h.url("/v1/usage");
        async move {
            let resp = send(client().get(url).bearer_auth(key)).await;
            assert_eq!(resp.status(), 200);
            resp.json::<Value>().await.unwrap()
        }
    };
    let a = usage(A).await;
    assert_eq!(a["tenant"], "school-a", "{a}");
    let tpm = &a["budgets"]["tokens_per_minute"];
    assert_eq!(tpm["limit"], 2_000, "{a}");
    assert!(tpm["used"].as_u64().unwrap() >= 2_000, "{a}");
    assert_eq!(tpm["remaining"], 0, "{a}");
    let b = usage(B).await;
    assert_eq!(b["tenant"], "school-b", "{b}");
    assert_eq!(b["budgets"], json!({}), "{b}");
    assert!(!b.to_string().contains("school-a"));
    assert_eq!(
        send(client().get(h.url("/v1/usage"))).await.status(),
        401,
        "a key is needed"
    );
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_tenant_refused_total{limit=\"tokens_per_minute\",tenant=\"school-a\"}"
        ),
        1.0
    );
    eventually("every seat back", || h.idle()).await;
    h.shutdown().await;
}

/// Two replicas, one Redis: a tenant's `tokens_per_minute` holds for the fleet, not per
/// replica. School A asks through both replicas in turn until refused: what the fleet served it
/// stays within the budget plus one request's reservation (a per-replica ledger would serve it
/// about twice that), the other replica refuses it too, both report the fleet's use, and
/// School B is served. The tenant's name never appears in a Redis key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_redis_a_tenants_budget_holds_for_the_fleet_not_per_replica() {
    let redis = RedisServer::start();
    let setup = |c: &mut tutor_gateway::config::Config| {
        two_schools_sharing(c, &redis);
        c.auth.tenants.insert(
            "school-a".into(),
            tutor_gateway::config::TenantBudget {
                tokens_per_minute: Some(2_000),
                ..Default::default()
            },
        );
    };
    let h = harness(&flags("--speed 50 --profile tiny-test"), setup).await;
    // Its first connection to Redis: a request waits only 2 s for it, then falls back.
    redis_ready(&h.gw).await;
    let other = second_replica(&h, setup).await;
    let urls = [
        h.url("/v1/chat/completions"),
        other.url() + "/v1/chat/completions",
    ];
    let ask = |replica: usize, key: &'static str, i: u32| {
        let body = json!({"messages": [{"role": "user", "content": format!("why? {i}")}],
                          "max_tokens": 150});
        client().post(&urls[replica]).bearer_auth(key).json(&body)
    };
    let (served, refusal, i) = ask_until_refused(|i| ask((i % 2) as usize, A, i)).await;
    let refused_at = (i % 2) as usize;
    let err: Value = refusal.json().await.unwrap();
    assert_eq!(err["error"]["code"], "tenant_budget", "{err}");
    assert!((2_000..=2_000 + 150 + 64).contains(&served), "{served}");
    // The other replica counts the same ledger: refused there too.
    let resp = send(ask(1 - refused_at, A, 1_000)).await;
    assert_eq!(
        resp.status(),
        429,
        "the other replica admitted over the fleet's budget"
    );
    // B has no budget: served through either.
    for replica in 0..2 {
        assert_eq!(send(ask(replica, B, 0)).await.status(), 200);
    }
    // Both replicas report the fleet's use (settled to what the engine counted).
    for base in [h.url(""), other.url()] {
        let resp = send(client().get(format!("{base}/v1/usage")).bearer_auth(A)).await;
        let a: Value = resp.json().await.unwrap();
        let used = a["budgets"]["tokens_per_minute"]["used"].as_u64().unwrap();
        assert!(used >= 2_000, "{a}");
    }
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.iter().any(|k| k.contains(":tenant:")), "{keys:?}");
    assert!(!keys.iter().any(|k| k.contains("school")), "{keys:?}");
    eventually("every seat back", || h.idle()).await;
    other.shutdown().await;
    h.shutdown().await;
}

/// The bytes of request bodies waiting for admission are shared too: one tenant's waiting
/// requests hold at most `server.max_queued_bytes_per_tenant`; its next one is refused with
/// 429 `tenant_queue_full` naming its own use and limit, while another tenant's request still
/// waits for a seat. When the waiters leave, every byte comes back.
#[tokio::test]
async fn a_tenants_waiting_bodies_hold_at_most_its_bytes_and_others_still_wait() {
    // What a body holds while queued: its bytes and its parsed form's.
    let body = |salt: &str| {
        let text = question(salt).to_string();
        let config = tutor_gateway::config::Config::default();
        tutor_gateway::pipeline::parse::held_bytes(text.as_bytes(), &config).unwrap() as u64
    };
    let per_tenant = 2 * body("queued 0") + body("queued 0") / 2;
    let h = harness(&flags(STALLING), |c| {
        set_lane(c, Lane::Small, 1);
        c.lanes.small.queue.len = 20;
        c.lanes.small.queue.timeout = Duration::from_secs(120);
        c.upstream.idle_timeout = Duration::from_secs(120);
        c.server.max_queued_bytes_per_tenant = per_tenant;
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
    })
    .await;
    let post = |key: &'static str, salt: &str| {
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&question(salt))
    };
    // B's stream holds the one seat (stalled after its first token).
    let seat = send(post(B, "seat")).await;
    assert_eq!(seat.status(), 200);
    // Two of A's wait: as many bodies as its bytes allow.
    let waiting_a: Vec<_> = (0..2)
        .map(|i| tokio::spawn(post(A, &format!("queued {i}")).send()))
        .collect();
    eventually("A's two wait", || h.queued(Lane::Small) == 2).await;
    assert_eq!(
        h.gw.state.queued_bytes().held_by("school-a"),
        2 * body("queued 0")
    );
    let third = send(post(A, "queued 2")).await;
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["retry-after"], "1");
    let err: Value = third.json().await.unwrap();
    assert_eq!(err["error"]["code"], "tenant_queue_full", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("school-a") && message.contains("max_queued_bytes_per_tenant"),
        "{message}"
    );
    assert!(!message.contains("school-b"), "{message}");
    // B's next request still waits (its own bytes).
    let waiting_b = tokio::spawn(post(B, "queued b").send());
    eventually("B waits too", || h.queued(Lane::Small) == 3).await;
    for w in waiting_a {
        w.abort();
    }
    waiting_b.abort();
    drop(seat);
    eventually("every seat and byte back", || {
        h.idle() && h.gw.state.queued_bytes().held() == 0
    })
    .await;
    h.shutdown().await;
}

/// `tenant`'s fleet service counter as `gw` sees it.
fn fleet_service(gw: &tutor_gateway::server::Gateway, tenant: &str) -> f64 {
    match gw.state.admission() {
        tutor_gateway::admission::Admission::Redis(r) => r.fleet_service(tenant),
        tutor_gateway::admission::Admission::Local(_) => panic!("the Redis backend"),
    }
}

/// Fairness across the fleet (`auth.fleet_fairness`): two replicas, one Redis, one shared
/// seat. School A was served six times on replica 2; on replica 1 its next request arrives first, then
/// School B's. Replica 1 never served A, so its own turns alone would admit A first (arrival
/// order); counted fleet-wide, A has had more service, so B goes first. Asserted on states (the
/// stalled engine holds each admitted stream's seat), never on times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_redis_the_tenant_served_less_fleet_wide_goes_first_on_any_replica() {
    let redis = RedisServer::start();
    let setup = |c: &mut tutor_gateway::config::Config| {
        two_schools_sharing(c, &redis);
        one_patient_small_seat(c);
    };
    let h = harness(&flags(STALLING), setup).await;
    // Its first connection to Redis: a request waits only 2 s for it, then falls back.
    redis_ready(&h.gw).await;
    let other = second_replica(&h, setup).await;
    let post = |base: &str, key: &'static str, salt: &str| {
        client()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&question(salt))
    };
    let (one, two) = (h.url(""), other.url());
    // A is served six times on replica 2 (each stream ends when dropped).
    for i in 0..6 {
        let resp = send(post(&two, A, &format!("on two {i}"))).await;
        assert_eq!(resp.status(), 200);
        drop(resp);
        eventually("the seat back", || h.idle()).await;
    }
    // Replica 1 reads A's fleet service (it never served A itself).
    eventually("replica 1 sees A's service", || {
        fleet_service(&h.gw, "school-a") > fleet_service(&h.gw, "school-b") + 60.0
    })
    .await;
    // B holds the seat through replica 1; A's request waits there, then B's.
    let seat = send(post(&one, B, "seat")).await;
    assert_eq!(seat.status(), 200);
    let a = tokio::spawn(post(&one, A, "a waits").send());
    eventually("A waits", || h.queued(Lane::Small) == 1).await;
    let b = tokio::spawn(post(&one, B, "b waits").send());
    eventually("B waits", || h.queued(Lane::Small) == 2).await;
    // The seat comes back: B, served less fleet-wide, is admitted; A still waits.
    drop(seat);
    let b = tokio::time::timeout(Duration::from_secs(60), b)
        .await
        .expect("B admitted first")
        .unwrap()
        .unwrap();
    assert_eq!(b.status(), 200);
    assert_eq!(h.queued(Lane::Small), 1, "A still waits");
    assert!(!a.is_finished(), "A still waits");
    drop(b);
    let a = a.await.unwrap().unwrap();
    assert_eq!(a.status(), 200);
    drop(a);
    eventually("every seat back", || h.idle()).await;
    other.shutdown().await;
    h.shutdown().await;
}

/// Fairness across the fleet when a replica sees one tenant only: two replicas, one Redis,
/// one shared small seat. B holds the seat through replica 1 and its next question waits on
/// replica 2; A holds a medium seat (so A has had more service while B waited), and A's
/// question waits on replica 1, where no other tenant waits. Replica 1's own line would give A
/// the seat B frees there, every time (its release reaches its own line first); counted
/// fleet-wide, A is ahead of a tenant waiting elsewhere, so A's head yields and the seat goes
/// to B on replica 2. Asserted on states (the stalled engine holds each admitted stream's
/// seat), never on times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_redis_a_replica_that_sees_one_tenant_yields_the_seat_to_one_behind_elsewhere() {
    let redis = RedisServer::start();
    let setup = |c: &mut tutor_gateway::config::Config| {
        two_schools_sharing(c, &redis);
        one_patient_small_seat(c);
        set_lane(c, Lane::Medium, 1);
    };
    let h = harness(&flags(STALLING), setup).await;
    // Its first connection to Redis: a request waits only 2 s for it, then falls back.
    redis_ready(&h.gw).await;
    let other = second_replica(&h, setup).await;
    let post = |base: &str, key: &'static str, body: Value| {
        client()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body)
    };
    let (one, two) = (h.url(""), other.url());
    let queued_on_two = || {
        other
            .state
            .admission()
            .snapshot()
            .lane(Lane::Small)
            .queue_depth
    };
    // B holds the small seat through replica 1; B's next question waits on replica 2.
    let seat = send(post(&one, B, question("seat"))).await;
    assert_eq!(seat.status(), 200);
    let b = tokio::spawn(post(&two, B, question("b waits")).send());
    eventually("B waits on replica 2", || queued_on_two() == 1).await;
    // A is served a review-sized answer meanwhile (its reservation is counted at once).
    let long = json!({"messages": [{"role": "user", "content": "explain at length"}],
                      "max_tokens": 1500, "stream": true});
    let a_medium = send(post(&two, A, long)).await;
    assert_eq!(a_medium.status(), 200);
    eventually("replica 1 sees A ahead", || {
        fleet_service(&h.gw, "school-a") > fleet_service(&h.gw, "school-b") + 1_000.0
    })
    .await;
    // A's question waits on replica 1, alone in its line there, and yields.
    let a = tokio::spawn(post(&one, A, question("a waits")).send());
    eventually("A waits on replica 1", || h.queued(Lane::Small) == 1).await;
    let yields = r#"tutor_gateway_tenant_fleet_yields_total{lane="small"}"#;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metric_or_zero(&h.metrics_text().await, yields) < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A's head never yielded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The seat comes back on replica 1: B, behind in service and waiting on replica 2, gets it.
    drop(seat);
    let b = tokio::time::timeout(Duration::from_secs(60), b)
        .await
        .expect("B admitted first")
        .unwrap()
        .unwrap();
    assert_eq!(b.status(), 200);
    assert_eq!(h.queued(Lane::Small), 1, "A still waits");
    assert!(!a.is_finished(), "A still waits");
    // B leaves; nobody waits elsewhere any more: A is admitted.
    drop(b);
    let a = a.await.unwrap().unwrap();
    assert_eq!(a.status(), 200);
    drop((a, a_medium));
    eventually("every seat back", || {
        h.idle() && other.state.admission().snapshot().is_idle()
    })
    .await;
    other.shutdown().await;
    h.shutdown().await;
}

/// The fleet counter counts what the engine served: a request that ran to its end (its seat
/// freed at the finish reason, before the usage chunk) leaves its tenant's counter at its
/// prompt + output tokens, not at its reservation and not at nothing; and one tenant's requests
/// never move another's counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_redis_a_tenants_fleet_service_is_what_the_engine_served_it() {
    let redis = RedisServer::start();
    let setup = |c: &mut tutor_gateway::config::Config| {
        two_schools_sharing(c, &redis);
    };
    let h = harness(&flags("--speed 50 --profile tiny-test"), setup).await;
    // Its first connection to Redis: a request waits only 2 s for it, then falls back.
    redis_ready(&h.gw).await;
    let mut served = 0u64;
    for (i, stream) in [false, true, false].into_iter().enumerate() {
        let body = json!({"messages": [{"role": "user", "content": format!("why {i}?")}],
                          "max_tokens": 20, "stream": stream,
                          "stream_options": {"include_usage": true}});
        let resp = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .bearer_auth(A)
                .json(&body),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        let usage = if stream {
            text.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find_map(|v| v["usage"]["total_tokens"].as_u64())
                .expect("a usage chunk")
        } else {
            serde_json::from_str::<Value>(&text).unwrap()["usage"]["total_tokens"]
                .as_u64()
                .unwrap()
        };
        served += usage;
        eventually("the seat back", || h.idle()).await;
    }
    #[allow(clippy::cast_precision_loss)]
    let want = served as f64;
    eventually("A's counter is what it was served", || {
        (fleet_service(&h.gw, "school-a") - want).abs() < 0.5
    })
    .await;
    assert_eq!(fleet_service(&h.gw, "school-b"), 0.0);
    h.shutdown().await;
}

/// A tenant's request bodies still arriving count against its
/// `server.max_requests_in_flight_per_tenant`: its uploads that never finish (each held up to
/// the body timeout, and re-opened as they are cut) took every permit of
/// `server.max_requests_in_flight`, and every other tenant got 503 until they timed out. Now
/// its uploads beyond its limit are refused with 429 `tenant_overloaded`, and another tenant
/// is served.
#[tokio::test]
async fn a_tenants_unfinished_uploads_hold_at_most_its_share_of_the_permits() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |c| {
        c.server.max_requests_in_flight = 4;
        c.server.max_requests_in_flight_per_tenant = 2;
        c.server.body_read_timeout = Duration::from_secs(120);
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
    })
    .await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {A}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"messages\":"
    );
    let mut uploads = Vec::new();
    let mut refused = Vec::new();
    let in_flight = || h.gw.state.metrics().requests_in_flight().get();
    for _ in 0..4 {
        let before = in_flight();
        let mut tcp = tokio::net::TcpStream::connect(h.gw.addr).await.unwrap();
        tcp.write_all(head.as_bytes()).await.unwrap();
        // Either it is refused at once (an answer before its body is whole), or it holds a
        // permit while its body arrives (no timing: whichever is seen).
        let mut first = [0u8; 12];
        let holds = async {
            while in_flight() == before {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            n = tcp.read(&mut first) => {
                refused.push(String::from_utf8_lossy(&first[..n.unwrap()]).into_owned());
            }
            () = holds => uploads.push(tcp),
        }
    }
    assert_eq!(
        uploads.len(),
        2,
        "A's uploads within its limit; refused: {refused:?}"
    );
    assert!(
        refused.iter().all(|r| r.starts_with("HTTP/1.1 429")),
        "{refused:?}"
    );
    // Refused before any route: counted where an operator looks for refusals.
    assert_eq!(
        h.gw.state
            .metrics()
            .refused_count("tenant_requests_in_flight"),
        refused.len() as u64
    );
    assert_eq!(in_flight(), 2, "A holds two permits of four");
    // B is served meanwhile.
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(B)
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    drop(uploads);
    eventually("no request in flight", || {
        h.gw.state.metrics().requests_in_flight().get() == 0
    })
    .await;
    h.shutdown().await;
}

/// A course that lists its tenants is theirs alone: another school naming it gets the same 400
/// as for an unknown id (its instructions and rubric never reach that school's prompts), and a
/// course without a list stays open to every tenant.
#[tokio::test]
async fn a_schools_own_course_is_refused_to_other_schools() {
    use tutor_gateway::config::CourseConfig;
    let h = harness(&flags("--speed 50 --profile tiny-test"), |c| {
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
        let own = CourseConfig::new("cs-b", "1", "School B's private rubric.", "", "", None)
            .for_tenants(Some(vec!["school-b".into()]));
        c.courses.insert("cs-b".into(), own);
        let open = CourseConfig::new("shared", "1", "Be kind.", "", "", None);
        c.courses.insert("shared".into(), open);
    })
    .await;
    let ask = |key: &'static str, course: &str| {
        client().post(h.url("/answer")).bearer_auth(key).json(
            &json!({"prompt": "what is a closure?", "course_id": course, "max_output_tokens": 2}),
        )
    };
    let refused = send(ask(A, "cs-b")).await;
    assert_eq!(refused.status(), 400);
    let err: Value = refused.json().await.unwrap();
    let unknown = send(ask(A, "no-such-course")).await;
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(
        err["error"], unknown["error"],
        "indistinguishable from an unknown id"
    );
    assert_eq!(err["error"]["param"], "course_id");
    assert_eq!(send(ask(B, "cs-b")).await.status(), 200);
    for key in [A, B] {
        assert_eq!(send(ask(key, "shared")).await.status(), 200);
    }
    h.shutdown().await;
}

/// The per-fingerprint metrics' labels are shared by tenants: one school sending many made-up
/// system prompts takes at most its share (`prefix_cache.fingerprint_labels_per_tenant`), and
/// another school's prompt seen afterwards still gets a label of its own.
#[tokio::test]
async fn one_school_cannot_take_every_fingerprint_label() {
    let h = harness(&flags("--speed 50 --profile tiny-test"), |c| {
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
        c.prefix_cache.fingerprint_labels = 4;
        c.prefix_cache.fingerprint_labels_per_tenant = 1;
        c.prefix_cache.label_after_requests = 1;
    })
    .await;
    let ask = |key: &'static str, system: String| {
        let body = json!({"messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": "why?"}],
                          "max_tokens": 2});
        send(
            client()
                .post(h.url("/v1/chat/completions"))
                .bearer_auth(key)
                .json(&body),
        )
    };
    for i in 0..4 {
        let resp = ask(A, format!("You are tutor number {i} of school A.")).await;
        assert_eq!(resp.status(), 200);
    }
    let resp = ask(B, "You are the tutor of school B.".to_owned()).await;
    assert_eq!(resp.status(), 200);
    let m = h.metrics_text().await;
    let labels: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("tutor_gateway_prefix_cache_fingerprint_queries_total{"))
        .filter(|l| !l.contains("fingerprint=\"other\""))
        .collect();
    assert_eq!(
        labels.len(),
        2,
        "school A's one label and school B's: {labels:#?}"
    );
    h.shutdown().await;
}

/// A school's jobs count toward its budget as its requests do, and a school over budget cannot
/// submit more: `/jobs` was neither checked nor charged, so a school past its daily budget
/// (429 on every request) kept generating through it, and `/v1/usage` never showed it.
#[tokio::test]
async fn a_tenants_jobs_are_charged_to_its_budget_and_refused_over_it() {
    let h = harness(&flags("--speed 50 --profile tiny-test"), |c| {
        with_keys(c, &[(A, "school-a"), (B, "school-b")]);
        c.auth.tenants.insert(
            "school-a".into(),
            tutor_gateway::config::TenantBudget {
                tokens_per_day: Some(300),
                ..Default::default()
            },
        );
    })
    .await;
    let day_used = || async {
        let resp = send(client().get(h.url("/v1/usage")).bearer_auth(A)).await;
        let v: Value = resp.json().await.unwrap();
        v["budgets"]["tokens_per_day"]["used"].as_u64().unwrap()
    };
    let job = json!({"prompt": "review my whole project please", "max_output_tokens": 400});
    let mut served = 0;
    let mut refused = None;
    for _ in 0..20 {
        let resp = send(client().post(h.url("/jobs")).bearer_auth(A).json(&job)).await;
        if resp.status() == 429 {
            refused = Some(resp.json::<Value>().await.unwrap());
            break;
        }
        assert_eq!(resp.status(), 202);
        let id = resp.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        // Polled for up to 60 s: a bound for a hang on a loaded machine, not a speed limit.
        let mut done = Value::Null;
        for _ in 0..6000 {
            let resp = send(client().get(h.url(&format!("/jobs/{id}"))).bearer_auth(A)).await;
            done = resp.json().await.unwrap();
            if done["status"] != "queued" && done["status"] != "running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(done["status"], "done", "{done}");
        let usage = &done["answer"]["usage"];
        served +=
            usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap();
        // Settled to what the engine counted, as a request is.
        tutor_testkit::eventually("the run is charged what it used", || async {
            day_used().await == served
        })
        .await;
    }
    let refused = refused.expect("the budget refused a job");
    assert_eq!(refused["error"]["code"], "tenant_budget", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens_per_day"),
        "{refused}"
    );
    assert!(served >= 300, "{served}");
    // Requests are refused too, and the other school is served.
    let ask = |key| {
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&question("after the jobs"))
    };
    assert_eq!(send(ask(A)).await.status(), 429);
    assert_eq!(send(ask(B)).await.status(), 200);
    eventually("every seat back", || h.idle()).await;
    h.shutdown().await;
}
