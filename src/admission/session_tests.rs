use prometheus::Registry;

use super::*;

fn id(s: &str) -> SessionId {
    SessionId::parse(s).unwrap().unwrap()
}

fn ledger(window_ms: u64, capacity: usize) -> (SessionLedger, Registry) {
    let registry = Registry::new();
    let metrics = PromotionMetrics::register(&registry);
    (
        SessionLedger::new(Duration::from_millis(window_ms), capacity, metrics),
        registry,
    )
}

fn metric(registry: &Registry, name: &str) -> f64 {
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    tutor_testkit::metric(&text, name)
}

#[tokio::test(start_paused = true)]
async fn output_accumulates_per_session_and_expires() {
    let (ledger, _) = ledger(50, 100);
    let (a, b) = (id("a"), id("b"));
    ledger.reserve(a, 300).await.1.settle(100);
    ledger.reserve(a, 300).await.1.settle(120);
    ledger.reserve(b, 50).await.1.settle(7);
    assert_eq!(ledger.output(a).await, 220);
    assert_eq!(ledger.output(b).await, 7);
    assert_eq!(ledger.output(id("c")).await, 0);
    tokio::time::advance(Duration::from_millis(60)).await;
    assert_eq!(ledger.output(a).await, 0);
    let (before, hold) = ledger.reserve(a, 5).await;
    assert_eq!(before, 0, "a new window starts from zero");
    hold.settle(5);
    assert_eq!(ledger.output(a).await, 5);
}

#[tokio::test]
async fn parallel_continues_see_each_others_declared_output() {
    let (ledger, _) = ledger(60_000, 100);
    let s = id("student-7");
    let (first, h1) = ledger.reserve(s, 400).await;
    let (second, h2) = ledger.reserve(s, 400).await;
    let (third, h3) = ledger.reserve(s, 400).await;
    assert_eq!((first, second, third), (0, 400, 800));
    h1.settle(380);
    h2.settle(12);
    drop(h3); // never reached vLLM: its reservation comes back whole
    assert_eq!(ledger.output(s).await, 392);
}

#[tokio::test]
async fn a_dropped_hold_gives_its_reservation_back() {
    let (ledger, _) = ledger(60_000, 100);
    let s = id("s");
    let (_, hold) = ledger.reserve(s, 1000).await;
    assert_eq!(ledger.output(s).await, 1000);
    drop(hold);
    assert_eq!(ledger.output(s).await, 0);
}

#[tokio::test]
async fn a_flood_of_distinct_ids_never_grows_the_map_past_its_bound() {
    let (ledger, registry) = ledger(600_000, 1000);
    let mut peak = 0;
    for i in 0..100_000u32 {
        let (_, hold) = ledger.reserve(id(&format!("attacker-{i}")), 10).await;
        hold.settle(3);
        peak = peak.max(ledger.tracked());
    }
    assert_eq!(peak, 1000);
    assert_eq!(metric(&registry, "tutor_gateway_sessions_tracked"), 1000.0);
    assert_eq!(
        metric(&registry, "tutor_gateway_sessions_evicted_total"),
        99_000.0
    );
    // The most recent sessions are kept, the oldest forgotten.
    assert_eq!(ledger.output(id("attacker-99999")).await, 3);
    assert_eq!(ledger.output(id("attacker-0")).await, 0);
}

#[tokio::test]
async fn one_busy_session_keeps_the_touch_order_bounded() {
    let (ledger, _) = ledger(600_000, 10);
    let quiet = id("quiet");
    ledger.reserve(quiet, 1).await.1.settle(1);
    let busy = id("busy");
    for _ in 0..10_000 {
        ledger.reserve(busy, 2).await.1.settle(1);
    }
    let queued = ledger.lock().order.len();
    assert!(queued <= 2 * 10 + 16 + 2, "{queued}");
    assert_eq!(
        ledger.output(quiet).await,
        1,
        "the quiet session is still known"
    );
    assert_eq!(ledger.output(busy).await, 10_000);
}

#[tokio::test(start_paused = true)]
async fn expired_sessions_leave_the_map() {
    let (ledger, registry) = ledger(50, 1000);
    for i in 0..500 {
        ledger.reserve(id(&format!("s{i}")), 1).await.1.settle(1);
    }
    assert_eq!(ledger.tracked(), 500);
    tokio::time::advance(Duration::from_millis(60)).await;
    ledger.reserve(id("late"), 1).await.1.settle(1);
    assert_eq!(ledger.tracked(), 1);
    assert_eq!(
        metric(&registry, "tutor_gateway_sessions_evicted_total"),
        0.0,
        "expiry is not eviction"
    );
}

#[test]
fn session_ids_are_checked_and_never_kept_raw() {
    assert_eq!(SessionId::parse(""), Ok(None));
    assert!(SessionId::parse(&"a".repeat(SESSION_ID_MAX_BYTES)).is_ok());
    let too_long = "a".repeat(1 << 20);
    let err = SessionId::parse(&too_long).unwrap_err();
    assert!(err.contains("at most 128"), "{err}");
    for bad in ["a b", "é", "a\nb", "x;drop", "<script>"] {
        assert!(SessionId::parse(bad).is_err(), "{bad:?}");
    }
    for good in [
        "3f2b9c1e-6d7a-4b8e-9f00-1a2b3c4d5e6f",
        "user:42/tab.1",
        "aGVsbG8+Lw==",
    ] {
        assert!(SessionId::parse(good).unwrap().is_some(), "{good:?}");
    }
    assert_eq!(id("same"), id("same"));
    assert_ne!(id("same"), id("Same"));
    let secret = "sk-live-do-not-log";
    assert!(!format!("{:?}", id(secret)).contains(secret));
}

/// A request whose client went away while its reservation's call to Redis was out (Redis
/// paused here, so the call waits): its local reservation is given back. It used to stay in
/// the replica's count for the window, moving the session's continuations to larger lanes.
#[tokio::test]
async fn a_reservation_dropped_while_redis_is_out_gives_the_local_count_back() {
    use crate::admission::redis::tests::redis_common::{pause_writes, RedisServer};
    let server = RedisServer::start();
    let redis = crate::admission::redis::tests::admission_on(&server);
    // Connected (an acquire waits for the first connection).
    drop(
        redis
            .acquire(crate::admission::Ask::new(crate::lane::Lane::Small, 10))
            .await
            .unwrap(),
    );
    let registry = Registry::new();
    let ledger = SessionLedger::shared(
        Duration::from_secs(60),
        100,
        PromotionMetrics::register(&registry),
        redis.clone(),
    );
    let s = id("s");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    pause_writes(&mut conn).await;
    let mut reserving = Box::pin(ledger.reserve(s, 1_000));
    assert!(futures::poll!(reserving.as_mut()).is_pending());
    drop(reserving);
    assert_eq!(ledger.lock().tokens(s, Instant::now()), 0);
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();
    redis.shutdown().await;
}
