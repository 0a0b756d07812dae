use std::sync::Mutex;

use tokio_util::task::TaskTracker;

use super::*;
use crate::config::Config;

fn set(previous: Option<&Replicas>, interval: Duration) -> Arc<Replicas> {
    let configs = ["a", "b"]
        .map(|n| ReplicaConfig {
            name: n.to_owned(),
            url: format!("http://{n}.invalid:8000"),
            weight: 1,
            max_num_seqs: None,
        })
        .to_vec();
    let routing = RoutingConfig {
        health_interval: interval,
        ..RoutingConfig::default()
    };
    let upstream = Arc::new(Config::default().upstream);
    Arc::new(Replicas::new(
        configs,
        routing,
        ReplicaMetrics::default(),
        previous,
        |_| {
            AbortCaller::new(
                reqwest::Client::new(),
                Arc::clone(&upstream),
                TaskTracker::new(),
            )
        },
    ))
}

/// Runs `set`'s health loop, recording under `who` each replica it probes; every probe fails.
fn checks(set: &Arc<Replicas>, who: &'static str, seen: &Arc<Mutex<Vec<(&'static str, String)>>>) {
    let seen = Arc::clone(seen);
    tokio::spawn(health_loop(Arc::downgrade(set), move |r| {
        seen.lock().unwrap().push((who, r.config.name.clone()));
        async { Err("down".to_owned()) }
    }));
}

/// A replica whose `/health` hangs does not slow the others' checks: each is checked every
/// interval (one hanging probe used to hold every replica's cycle for its own 5 s), and the
/// hanging one fails its checks.
#[tokio::test(start_paused = true)]
async fn a_hanging_health_check_does_not_slow_the_others() {
    let second = Duration::from_secs(1);
    let set = set(None, second);
    tokio::spawn(health_loop(Arc::downgrade(&set), move |r| async move {
        if r.config.name == "a" {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        Err("down".to_owned())
    }));
    // Checks at 0, 1 and 2 s: three failures in a row eject both (the default
    // unhealthy_after), well before the 5 s one probe takes.
    tokio::time::sleep(second * 3 + second / 2).await;
    let ejected: Vec<String> = set
        .status()
        .iter()
        .filter(|r| !r.healthy)
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(ejected, ["a", "b"]);
}

/// A reload builds a new set that shares each replica's health while the old set lives on
/// (its requests still run): only the new set's loop checks them, so a replica's failure
/// streak grows once per interval, not twice, and ejection takes the configured checks.
#[tokio::test(start_paused = true)]
async fn only_the_newest_set_checks_a_shared_health() {
    let second = Duration::from_secs(1);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let old = set(None, second);
    checks(&old, "old", &seen);
    tokio::time::sleep(second / 2).await;
    let new = set(Some(&old), second * 2);
    checks(&new, "new", &seen);
    seen.lock().unwrap().clear();
    // (Paused time.) The old loop would tick at 1 s, 2 s...; the new one ticks at once, then
    // at 2.5 s and 4.5 s.
    tokio::time::sleep(second * 5).await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|(who, _)| *who == "new"),
        "the replaced set checked too: {seen:?}"
    );
    assert_eq!(
        seen.len(),
        6,
        "three rounds of the new set's checks: {seen:?}"
    );
    // Three failures in a row eject (the default unhealthy_after).
    let ejected = new.status().iter().filter(|r| !r.healthy).count();
    assert_eq!(ejected, 2, "{:?}", new.status());
    drop(old);
}

/// KV sizes as large as a u64 holds (the engines' word) neither wrap nor divide by zero: both
/// replicas stay routable, with their seat shares.
#[test]
fn huge_kv_sizes_neither_wrap_nor_divide_by_zero() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let set = set(None, Duration::ZERO);
    set.set_capacity("http://a.invalid:8000", u64::MAX / 2 + 1);
    set.set_capacity("http://b.invalid:8000", u64::MAX / 2 + 1);
    set.set_fleet_seats(64);
    let shares = set.shares();
    assert_eq!(shares.len(), 2);
    for (weight, cap) in shares {
        assert!(weight >= 1);
        assert_eq!(cap, Some(32));
    }
}

/// A replica whose KV is not read yet (its metrics unreachable, or a reload just added it)
/// counts as the mean of those read: the others keep their KV shares and seat caps (one such
/// replica used to turn both off for the whole fleet).
#[test]
fn a_replica_whose_kv_is_unread_counts_as_the_mean_of_the_others() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let set = checked_set(
        &[
            ("a", "http://a.invalid:8000"),
            ("b", "http://b.invalid:8000"),
            ("c", "http://c.invalid:8000"),
        ],
        &ReplicaMetrics::default(),
        None,
        Duration::ZERO,
    );
    set.set_fleet_seats(9);
    assert_eq!(
        set.shares(),
        [(1, None), (1, None), (1, None)],
        "nothing read: as configured"
    );
    set.set_capacity("http://a.invalid:8000", 200_000);
    set.set_capacity("http://b.invalid:8000", 100_000);
    // c counts as 150,000: 9 seats over 450,000 tokens.
    assert_eq!(
        set.shares(),
        [(1000, Some(4)), (500, Some(2)), (750, Some(3))]
    );
}

/// The fleet's seats are shared among the healthy replicas: with one of two equal replicas
/// ejected, the other is capped at all of them, so the fleet's seats all go there (each used
/// to keep half: the rest went to the ejected one).
#[test]
fn an_ejected_replicas_seats_go_to_the_healthy_ones() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let set = set(None, Duration::from_secs(1));
    set.set_capacity("http://a.invalid:8000", 100_000);
    set.set_capacity("http://b.invalid:8000", 100_000);
    set.set_fleet_seats(4);
    assert_eq!(
        set.shares().iter().map(|s| s.1).collect::<Vec<_>>(),
        [Some(2), Some(2)]
    );
    let b = Arc::clone(&set.all()[1]);
    for _ in 0..3 {
        set.failed(&b, "down");
    }
    assert!(!b.is_healthy());
    assert_eq!(set.shares()[0].1, Some(4), "a's share is every seat");
    let tickets: Vec<_> = (0..4)
        .map(|_| set.pick(None, None, None).unwrap())
        .collect();
    assert!(
        tickets.iter().all(|t| t.replica().config.name == "a"),
        "{:?}",
        tickets
            .iter()
            .map(|t| t.replica().config.name.clone())
            .collect::<Vec<_>>()
    );
}

/// A set of `replicas` (name, URL) reporting into `metrics`, replacing `previous`; health
/// checks "run" (every second) so failures eject.
fn named_set(
    replicas: &[(&str, &str)],
    metrics: &ReplicaMetrics,
    previous: Option<&Replicas>,
) -> Replicas {
    checked_set(replicas, metrics, previous, Duration::from_secs(1))
}

/// [`named_set`] with health checks every `interval` (zero: off).
fn checked_set(
    replicas: &[(&str, &str)],
    metrics: &ReplicaMetrics,
    previous: Option<&Replicas>,
    interval: Duration,
) -> Replicas {
    let configs = replicas
        .iter()
        .map(|&(name, url)| ReplicaConfig {
            name: name.to_owned(),
            url: url.to_owned(),
            weight: 1,
            max_num_seqs: None,
        })
        .collect();
    let routing = RoutingConfig {
        health_interval: interval,
        ..RoutingConfig::default()
    };
    let upstream = Arc::new(Config::default().upstream);
    Replicas::new(configs, routing, metrics.clone(), previous, |_| {
        AbortCaller::new(
            reqwest::Client::new(),
            Arc::clone(&upstream),
            TaskTracker::new(),
        )
    })
}

/// The `replica` label of each series of the gauge `family`, with its value.
fn gauge(registry: &prometheus::Registry, family: &str) -> std::collections::BTreeMap<String, i64> {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == family)
        .flat_map(|f| f.get_metric().iter())
        .map(|m| {
            let label = m
                .get_label()
                .iter()
                .find(|l| l.name() == "replica")
                .unwrap();
            (label.value().to_owned(), m.get_gauge().get_value() as i64)
        })
        .collect()
}

/// After a reload that renames one replica and removes an ejected one, the gauges show the
/// set in force only: no removed replica left at `healthy 0` (an alert on it would fire
/// forever), no old name frozen at its last in-flight count, and a request still running on
/// the renamed replica counted under its new name until it ends, then given back there.
#[test]
fn a_reload_leaves_gauges_for_the_replicas_in_force_only() {
    let registry = prometheus::Registry::new();
    let metrics = ReplicaMetrics::register(&registry);
    let old = named_set(
        &[
            ("a", "http://a:8000"),
            ("b", "http://b:8000"),
            ("c", "http://c:8000"),
        ],
        &metrics,
        None,
    );
    let running = old.pick_named("a").expect("a takes traffic");
    for _ in 0..10 {
        old.failed(&old.list[1], "down");
    }
    assert_eq!(gauge(&registry, "tutor_gateway_replica_healthy")["b"], 0);
    assert_eq!(gauge(&registry, "tutor_gateway_replica_in_flight")["a"], 1);

    // "a" renamed at the same URL, "b" removed.
    let new = named_set(
        &[("a2", "http://a:8000"), ("c", "http://c:8000")],
        &metrics,
        Some(&old),
    );
    let names = |family| gauge(&registry, family).into_keys().collect::<Vec<_>>();
    for family in [
        "tutor_gateway_replica_healthy",
        "tutor_gateway_replica_in_flight",
    ] {
        assert_eq!(names(family), ["a2", "c"], "{family}");
    }
    assert_eq!(
        gauge(&registry, "tutor_gateway_replica_in_flight")["a2"],
        1,
        "the request still running on the renamed replica"
    );
    // The old set's last reports: its request ends, its removed replica fails again.
    drop(running);
    old.failed(&old.list[1], "down");
    assert_eq!(names("tutor_gateway_replica_in_flight"), ["a2", "c"]);
    assert_eq!(names("tutor_gateway_replica_healthy"), ["a2", "c"]);
    assert_eq!(gauge(&registry, "tutor_gateway_replica_in_flight")["a2"], 0);
    drop(new);
}

/// The health gauge shows the health of the set in force. A reload that keeps the checks on
/// carries each replica's health over, so the replaced set's last failures eject it for both
/// (gauge 0). One that turns the checks off starts every replica healthy (nothing would bring
/// an ejected one back): the replaced set's last failures must then leave the gauge at 1, or it
/// would show a replica taking traffic as ejected until the process restarts.
#[test]
fn the_replaced_sets_failures_move_the_health_gauge_only_for_a_health_in_force() {
    let registry = prometheus::Registry::new();
    let metrics = ReplicaMetrics::register(&registry);
    let replicas = [("a", "http://a:8000"), ("b", "http://b:8000")];
    let healthy = || gauge(&registry, "tutor_gateway_replica_healthy");

    let first = named_set(&replicas, &metrics, None);
    let kept = named_set(&replicas, &metrics, Some(&first));
    for _ in 0..10 {
        first.failed(&first.list[0], "down");
    }
    assert!(!kept.list[0].is_healthy(), "the health was carried over");
    assert_eq!(healthy()["a"], 0);

    let unchecked = checked_set(&replicas, &metrics, Some(&kept), Duration::ZERO);
    assert!(unchecked.list[0].is_healthy());
    assert_eq!(healthy()["a"], 1, "the new set's replica starts healthy");
    for _ in 0..10 {
        kept.failed(&kept.list[1], "down");
    }
    assert!(unchecked.list[1].is_healthy());
    assert_eq!(healthy(), [("a".into(), 1), ("b".into(), 1)].into());
}

/// Requests picked and ended on several threads at once, round after round: when a round's
/// requests have all ended the in-flight gauge reads 0 (each thread used to set the count it
/// made, and an older one could land last: the gauge read 1 on an idle replica).
#[test]
fn the_in_flight_gauge_is_back_at_zero_when_every_request_ended() {
    let registry = prometheus::Registry::new();
    let metrics = ReplicaMetrics::register(&registry);
    let set = named_set(&[("a", "http://a:8000")], &metrics, None);
    let threads = 4;
    let rounds = 2_000;
    let barrier = std::sync::Barrier::new(threads + 1);
    let mut stuck = 0;
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..rounds {
                    let ticket = set.pick_named("a").expect("a takes traffic");
                    barrier.wait();
                    drop(ticket);
                    barrier.wait();
                    // The gauge is read.
                    barrier.wait();
                }
            });
        }
        for _ in 0..rounds {
            barrier.wait();
            barrier.wait();
            if gauge(&registry, "tutor_gateway_replica_in_flight")["a"] != 0 {
                stuck += 1;
            }
            barrier.wait();
        }
    });
    assert_eq!(stuck, 0, "rounds that ended with the gauge above zero");
}
