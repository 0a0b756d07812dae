//! Tenants' budgets: the sliding minute, settlement and the day in this process; in Redis, a
//! charge whose reply never reached its caller.

use super::*;

const T0: u64 = 1_700_000_000;

fn budget(rpm: u64, tpm: u64, tpd: u64) -> TenantBudget {
    let n = |v: u64| (v > 0).then_some(v);
    TenantBudget {
        requests_per_minute: n(rpm),
        tokens_per_minute: n(tpm),
        tokens_per_day: n(tpd),
    }
}

#[test]
fn a_minute_admits_at_most_the_budget_plus_one_reservation_and_then_frees_up() {
    let b = Arc::new(TenantBudgets::default());
    let limits = budget(0, 1_000, 0);
    let mut held = vec![];
    let mut admitted = 0u64;
    for i in 0..20 {
        match b.charge_at("a", &limits, 300, T0 + i) {
            Ok(h) => {
                admitted += 300;
                held.push(h);
            }
            Err(r) => {
                assert_eq!(r.limit, "tokens_per_minute");
                assert!(r.used >= 1_000 && r.retry_after >= Duration::from_secs(1));
            }
        }
    }
    assert!(admitted <= 1_000 + 300, "{admitted}");
    assert_eq!(admitted, 1_200);
    // Another tenant is not affected.
    assert!(b.charge_at("b", &limits, 300, T0 + 5).is_ok());
    // A minute later the charges have left the window.
    assert!(b.charge_at("a", &limits, 300, T0 + 61).is_ok());
    drop(held);
}

#[test]
fn charges_settle_to_what_was_used_and_an_unsettled_request_costs_nothing() {
    let b = Arc::new(TenantBudgets::default());
    let limits = budget(0, 1_000, 0);
    let h = b.charge_at("a", &limits, 900, T0).unwrap();
    h.settle(100);
    // 100 charged: 900 more fit.
    let h2 = b.charge_at("a", &limits, 900, T0).unwrap();
    // Refused now (1,000 charged).
    assert!(b.charge_at("a", &limits, 1, T0).is_err());
    // A request that never ran gives everything back.
    drop(h2);
    assert!(b.charge_at("a", &limits, 1, T0).is_ok());
}

#[test]
fn requests_per_minute_and_tokens_per_day_refuse_with_their_names_and_waits() {
    let b = Arc::new(TenantBudgets::default());
    let limits = budget(2, 0, 0);
    let _a = b.charge_at("a", &limits, 10, T0).unwrap();
    let _b = b.charge_at("a", &limits, 10, T0 + 10).unwrap();
    let r = b.charge_at("a", &limits, 10, T0 + 20).unwrap_err();
    assert_eq!((r.limit, r.used, r.max), ("requests_per_minute", 2, 2));
    // The first charge leaves the window at T0 + 60: 40 s from T0 + 20.
    assert_eq!(r.retry_after, Duration::from_secs(40));
    let day = budget(0, 0, 500);
    let midnight = (T0 / DAY_S + 1) * DAY_S;
    let h = b.charge_at("d", &day, 600, midnight - 100).unwrap();
    h.settle(600);
    let r = b.charge_at("d", &day, 1, midnight - 50).unwrap_err();
    assert_eq!(r.limit, "tokens_per_day");
    assert_eq!(r.retry_after, Duration::from_secs(50));
    // A new UTC day starts again.
    assert!(b.charge_at("d", &day, 1, midnight).is_ok());
}

#[test]
fn a_clock_set_back_neither_locks_a_tenant_out_for_longer_nor_forgets_its_charges() {
    let b = Arc::new(TenantBudgets::default());
    let limits = budget(0, 1_000, 0);
    let _h = b.charge_at("a", &limits, 1_000, T0).unwrap();
    // The clock goes back an hour: the minute's charges still count...
    let r = b.charge_at("a", &limits, 1, T0 - 3_600).unwrap_err();
    assert_eq!(r.limit, "tokens_per_minute");
    assert!(r.retry_after <= Duration::from_secs(60), "{r:?}");
    // ...for one minute from then, not for the hour as well.
    assert!(b.charge_at("a", &limits, 1, T0 - 3_600 + 60).is_ok());

    // A charge stamped before the step settles where it counts now: when its request used
    // less than it reserved, the minute has room again.
    let b2 = Arc::new(TenantBudgets::default());
    let h = b2.charge_at("a", &limits, 1_000, T0).unwrap();
    assert!(b2.charge_at("a", &limits, 1, T0 - 3_600).is_err());
    h.settle(100);
    assert!(b2.charge_at("a", &limits, 1, T0 - 3_600 + 1).is_ok());

    // A day's count goes on when the clock goes back across midnight.
    let day = budget(0, 0, 500);
    let midnight = (T0 / DAY_S + 1) * DAY_S;
    let h = b.charge_at("d", &day, 500, midnight + 10).unwrap();
    h.settle(500);
    let r = b.charge_at("d", &day, 1, midnight - 10).unwrap_err();
    assert_eq!(r.limit, "tokens_per_day");
    // A clock that was days ahead and came back: its day is not waited for.
    let h = b.charge_at("e", &day, 500, midnight + 3 * DAY_S).unwrap();
    h.settle(500);
    assert!(b.charge_at("e", &day, 1, midnight - 10).is_ok());
}

use crate::admission::redis::tests::redis_common::RedisServer;
use crate::admission::redis::RedisAdmission;

/// Budgets shared in `server`'s Redis, and the quota backend they live in.
fn shared_budgets(server: &RedisServer) -> (RedisAdmission, Arc<TenantBudgets>) {
    let admission = crate::admission::redis::tests::admission_on(server);
    let budgets = Arc::new(TenantBudgets::shared(admission.clone()));
    (admission, budgets)
}

/// A charge whose caller gave up before Redis answered (its client went away), and one whose
/// reply did not come in time (charged in this replica instead), on a real `redis-server`:
/// the script ran once Redis went on, and nothing would ever settle what it charged; the
/// tenant paid a reservation for the minute and the day. Both are given back in Redis.
#[tokio::test]
async fn a_charge_whose_reply_was_lost_is_given_back_in_redis() {
    let server = RedisServer::start();
    let (admission, budgets) = shared_budgets(&server);
    let limits = budget(100, 1_000_000, 0);
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let pause = || {
        let mut conn = conn.clone();
        async move {
            let () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(1_500)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    // The records of charges given back (`cancelled`), polled until there are `n` (bounded:
    // a hang fails, nothing is timed).
    let cancelled = |n: usize| {
        let mut conn = conn.clone();
        async move {
            for _ in 0..3_000 {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("tg:v2:{quota}:tenant:*:charge:*")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let mut marked = 0;
                for k in keys {
                    let v: Option<String> = redis::cmd("GET")
                        .arg(k)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    marked += usize::from(v.as_deref() == Some("cancelled"));
                }
                if marked >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("fewer than {n} charges were cancelled");
        }
    };

    // Answered: charged in Redis, settled to what was used.
    let hold = budgets.charge("school-a", &limits, 500).await.unwrap();
    assert!(hold.shared.is_some(), "charged in Redis");
    assert_eq!(budgets.used("school-a").await, (1, 500, 500));
    hold.settle(300);
    for _ in 0..3_000 {
        if budgets.used("school-a").await == (1, 300, 300) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(budgets.used("school-a").await, (1, 300, 300));

    // Given up while Redis holds every command: the script runs when Redis goes on.
    pause().await;
    let given_up = tokio::time::timeout(
        Duration::from_millis(50),
        budgets.charge("school-a", &limits, 700),
    )
    .await;
    assert!(given_up.is_err(), "the charge was still waiting for Redis");
    cancelled(1).await;
    assert_eq!(
        budgets.used("school-a").await,
        (1, 300, 300),
        "a charge given up is not counted in Redis"
    );

    // Unanswered within the call's timeout: charged in this replica, and not in Redis.
    pause().await;
    let hold = budgets.charge("school-a", &limits, 900).await.unwrap();
    assert!(hold.shared.is_none(), "charged in this replica");
    assert_eq!(budgets.used_here("school-a"), (1, 900, 900));
    cancelled(2).await;
    assert_eq!(
        budgets.used("school-a").await,
        (1, 300, 300),
        "a charge without its reply is counted once, here, not in Redis too"
    );
    drop(hold);
    admission.shutdown().await;
}

/// A settlement that finds Redis unreachable (here: the server killed, then started again) is
/// sent again until Redis answers; it was sent once, and a settlement lost so left the request
/// charged its whole reservation for the minute and the day. Sent again because its reply was
/// lost, a settlement is applied once: the charge's record is marked settled.
#[tokio::test]
async fn a_settlement_is_sent_until_redis_answers_and_applied_once() {
    let mut server = RedisServer::start();
    let (admission, budgets) = shared_budgets(&server);
    let limits = budget(100, 1_000_000, 0);
    let client = server.client();
    let record_of = |record: String| {
        let client = client.clone();
        async move {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let v: Option<String> = redis::cmd("GET")
                .arg(record)
                .query_async(&mut conn)
                .await
                .unwrap();
            v
        }
    };

    // Settled twice with the same record (a settlement sent again): counted once.
    let hold = budgets.charge("school-a", &limits, 500).await.unwrap();
    let record = hold.shared.clone().expect("charged in Redis");
    let settle = [
        "settle".to_owned(),
        hold.second.to_string(),
        hold.day.to_string(),
        "-200".to_owned(),
        "0".to_owned(),
    ];
    let settle: Vec<&str> = settle.iter().map(String::as_str).collect();
    for _ in 0..2 {
        assert!(budgets.until_answered("school-a", &record, &settle).await);
    }
    assert_eq!(budgets.used("school-a").await, (1, 300, 300));
    assert_eq!(record_of(record).await.as_deref(), Some("settled"));
    std::mem::forget(hold);

    // Settled while the server is down: sent again until the new one answers.
    let hold = budgets.charge("school-b", &limits, 500).await.unwrap();
    let record = hold.shared.clone().expect("charged in Redis");
    server.stop();
    hold.settle(300);
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart();
    for _ in 0..600 {
        if record_of(record.clone()).await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        record_of(record).await.as_deref(),
        Some("settled"),
        "the settlement reached the server once it was back"
    );
    admission.shutdown().await;
}

/// Redis's clock set back (or a failover to a server whose clock is behind), on a real
/// `redis-server`: the charges stamped after its now (planted here an hour ahead) count as
/// now's, so they refuse for a minute from now, not for the hour as well; the day's count goes
/// on in the later day.
#[tokio::test]
async fn in_redis_charges_from_a_clock_since_set_back_count_as_now() {
    let server = RedisServer::start();
    let (admission, budgets) = shared_budgets(&server);
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let time: Vec<String> = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now: u64 = time[0].parse().unwrap();
    let (ahead, day_ahead) = (now + 3_600, now / DAY_S + 1);
    let (minute, day) = TenantBudgets::keys(&admission, "school-a");
    let _: () = redis::cmd("HSET")
        .arg(&minute)
        .arg(&[
            (format!("r:{ahead}"), "1".to_owned()),
            (format!("t:{ahead}"), "1000".to_owned()),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&day)
        .arg(&[("d", day_ahead.to_string()), ("t", "1000".to_owned())])
        .query_async(&mut conn)
        .await
        .unwrap();

    let r = budgets
        .charge("school-a", &budget(0, 1_000, 0), 1)
        .await
        .unwrap_err();
    assert_eq!((r.limit, r.used), ("tokens_per_minute", 1_000));
    assert!(r.retry_after <= Duration::from_secs(60), "{r:?}");
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&minute)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        fields.iter().filter(|f| !f.starts_with("m:")).all(|f| f
            .split(':')
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            < ahead),
        "charges an hour ahead are kept: {fields:?}"
    );
    let r = budgets
        .charge("school-a", &budget(0, 0, 1_000), 1)
        .await
        .unwrap_err();
    assert_eq!((r.limit, r.used), ("tokens_per_day", 1_000));

    // The charge stamped an hour ahead settles to 100 tokens (its request ended): the
    // settlement finds it where it counts now, and the minute has room again.
    let _: redis::Value = Script::new(include_str!("../../lua/tenant_budget_v2.lua"))
        .key(&minute)
        .key(&day)
        .arg("settle")
        .arg(ahead)
        .arg(0)
        .arg(-900)
        .arg(0)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    let charged = budgets.charge("school-a", &budget(0, 1_000, 0), 1).await;
    assert!(charged.is_ok(), "{:?}", charged.err());
    admission.shutdown().await;
}
