//! Fairness between tenants inside one lane's queue (issue 17, item 2): start-time fair
//! queuing; and earliest deadline first within a tenant and lane. Asserts on admission order
//! only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::admission::redis::tests::redis_common;
use crate::config::Config;
use crate::lane::Lane::Small;

/// One small seat, a deep queue; `extra` TOML appended.
fn one_seat(extra: &str) -> Admission {
    let toml = format!(
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\nseats = 3\n\
         [lanes.small]\nmax_concurrency = 1\nceiling = 1\nqueue_len = 1000\n\
         [lanes.medium]\nmax_concurrency = 1\nceiling = 1\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\n{extra}"
    );
    Admission::from_config(&Config::from_toml_str(&toml).expect("test config is valid"))
}

/// Queues `n` waiters of `tenant`, each noting its tenant in `order` when admitted and
/// giving its seat back at once.
async fn queue(
    a: &Admission,
    tenant: &'static str,
    n: usize,
    order: &Arc<Mutex<Vec<&'static str>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        tasks.push(queue_due(a, Some(tenant), tenant, None, order).await);
    }
    tasks
}

/// Queues one waiter of `tenant` due at `due`, which notes `label` in `order` when admitted
/// and gives its seat back at once.
async fn queue_due(
    a: &Admission,
    tenant: Option<&'static str>,
    label: &'static str,
    due: Option<Instant>,
    order: &Arc<Mutex<Vec<&'static str>>>,
) -> tokio::task::JoinHandle<()> {
    let (mine, order) = (a.clone(), order.clone());
    let before = a.snapshot().lane(Small).queue_depth;
    let task = tokio::spawn(async move {
        let guard = mine
            .acquire(Ask::new(Small, 10).for_tenant(tenant).due_at(due))
            .await
            .unwrap();
        order.lock().unwrap().push(label);
        drop(guard);
    });
    // Wait until it is in the queue, so arrival order is exactly this caller's.
    while a.snapshot().lane(Small).queue_depth == before {
        tokio::task::yield_now().await;
    }
    task
}

/// Queues, behind a held seat, waiters without a tenant with these dues (`None`: no
/// deadline) and lets them in; then the same with a waiter of tenant A, B, and A again (the
/// last urgent). Returns the admission order.
async fn deadline_order(a: &Admission) -> Vec<&'static str> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let now = Instant::now();
    let at = |s: u64| Some(now + Duration::from_secs(s));
    let one_tenant = [
        (None, "late", at(10)),
        (None, "none", None),
        (None, "soon", at(2)),
        (None, "none2", None),
        (None, "sooner", at(1)),
        (None, "soon2", at(2)),
    ];
    let two_tenants = [
        (Some("A"), "a1", None),
        (Some("B"), "b1", None),
        (Some("A"), "a2", at(1)),
    ];
    for waiters in [&one_tenant[..], &two_tenants[..]] {
        let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
        let mut tasks = Vec::new();
        for &(tenant, label, due) in waiters {
            tasks.push(queue_due(a, tenant, label, due, &order).await);
        }
        drop(seat);
        for t in tasks {
            t.await.unwrap();
        }
        assert!(a.snapshot().is_idle());
    }
    let order = order.lock().unwrap().clone();
    order
}

/// Within a tenant, earliest deadline first (FIFO among equal dues, no deadline last); between
/// tenants, the same turns as without deadlines (A's urgent second request takes A's first
/// turn, not B's).
const DEADLINE_ORDER: [&str; 9] = [
    "sooner", "soon", "soon2", "late", "none", "none2", "a2", "b1", "a1",
];

#[tokio::test(start_paused = true)]
async fn within_a_tenant_the_earliest_deadline_goes_first() {
    let a = one_seat("");
    assert_eq!(deadline_order(&a).await, DEADLINE_ORDER);
}

/// The same through the Redis backend's line.
#[tokio::test]
async fn with_redis_the_earliest_deadline_goes_first_too() {
    let redis = redis_common::RedisServer::start();
    let a = redis_one_seat(&redis);
    assert_eq!(deadline_order(&a).await, DEADLINE_ORDER);
}

/// One small seat, a deep queue, shared through `redis`.
fn redis_one_seat(redis: &redis_common::RedisServer) -> Admission {
    let toml = format!(
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\nseats = 3\n\
         [lanes.small]\nmax_concurrency = 1\nceiling = 1\nqueue_len = 1000\n\
         [lanes.medium]\nmax_concurrency = 1\nceiling = 1\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
        redis.url()
    );
    let config = Config::from_toml_str(&toml).expect("test config is valid");
    let metrics = crate::telemetry::Metrics::new();
    Admission::build(&config, metrics.quota().clone()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_one_tenant_does_not_push_another_to_the_back() {
    let a = one_seat("");
    let order = Arc::new(Mutex::new(Vec::new()));
    let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
    let mut tasks = queue(&a, "A", 200, &order).await;
    tasks.extend(queue(&a, "B", 10, &order).await);
    drop(seat);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    assert_eq!(order.len(), 210);
    let b_positions: Vec<usize> = (0..order.len()).filter(|&i| order[i] == "B").collect();
    assert!(
        b_positions.iter().all(|&i| i < 20),
        "B's 10 are all admitted within the next 20: {b_positions:?}"
    );
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn shares_weight_the_turns_and_one_tenant_alone_is_fifo() {
    let a = one_seat("[auth]\ntenant_shares = { A = 3 }\n");
    let order = Arc::new(Mutex::new(Vec::new()));
    let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
    // B's 30 arrive first: in FIFO order they would all go before A's.
    let mut tasks = queue(&a, "B", 30, &order).await;
    tasks.extend(queue(&a, "A", 30, &order).await);
    drop(seat);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    // While both wait, A (share 3) gets three turns for each of B's.
    let first_40 = &order[..40];
    let a_turns = first_40.iter().filter(|t| **t == "A").count();
    assert_eq!(a_turns, 30, "{first_40:?}");
}

/// The same burst through the Redis backend: one replica's line gives tenants turns too.
#[tokio::test]
async fn with_redis_a_replicas_line_gives_tenants_turns() {
    let redis = redis_common::RedisServer::start();
    let a = redis_one_seat(&redis);
    let order = Arc::new(Mutex::new(Vec::new()));
    let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
    let mut tasks = queue(&a, "A", 200, &order).await;
    tasks.extend(queue(&a, "B", 10, &order).await);
    drop(seat);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    assert_eq!(order.len(), 210);
    let b_positions: Vec<usize> = (0..order.len()).filter(|&i| order[i] == "B").collect();
    assert!(
        b_positions.iter().all(|&i| i < 20),
        "B's 10 are all admitted within the next 20: {b_positions:?}"
    );
}

/// Behind a held seat, five waiters of tenant A give up (their tasks dropped: a client gone,
/// a timeout), then B queues two and A one more: the admission order. The turns A did not
/// use are A's again, so its next waiter goes by its turn (B, A, B), not behind as many of
/// B's turns as A's waiters had left (B, B, A).
async fn after_waiters_gave_up(a: &Admission) -> Vec<&'static str> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
    for gone in queue(a, "A", 5, &order).await {
        gone.abort();
        let _ = gone.await;
    }
    while a.snapshot().lane(Small).queue_depth > 0 {
        tokio::task::yield_now().await;
    }
    let mut tasks = Vec::new();
    for (tenant, label) in [("B", "B"), ("B", "B"), ("A", "A")] {
        tasks.push(queue_due(a, Some(tenant), label, None, &order).await);
    }
    drop(seat);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

#[tokio::test(start_paused = true)]
async fn a_tenant_keeps_the_turns_of_waiters_that_gave_up() {
    assert_eq!(after_waiters_gave_up(&one_seat("")).await, ["B", "A", "B"]);
}

/// A's first waiter gives up while A's second and B's two wait: A's second takes its turn
/// (first, ahead of B's), and A's next arrival takes the turn A's second held. Both of A's
/// still get exactly the turns A had.
#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_passes_its_turn_to_its_tenants_next() {
    let a = one_seat("");
    let order = Arc::new(Mutex::new(Vec::new()));
    let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
    let gone = queue_due(&a, Some("A"), "A gone", None, &order).await;
    let mut tasks = vec![queue_due(&a, Some("A"), "A", None, &order).await];
    tasks.extend(queue(&a, "B", 2, &order).await);
    gone.abort();
    let _ = gone.await;
    while a.snapshot().lane(Small).queue_depth > 3 {
        tokio::task::yield_now().await;
    }
    tasks.push(queue_due(&a, Some("A"), "A next", None, &order).await);
    drop(seat);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["A", "B", "B", "A next"]);
}

#[tokio::test]
async fn with_redis_a_tenant_keeps_the_turns_of_waiters_that_gave_up() {
    let redis = redis_common::RedisServer::start();
    let a = redis_one_seat(&redis);
    assert_eq!(after_waiters_gave_up(&a).await, ["B", "A", "B"]);
}

mod room {
    use std::sync::Arc;

    use crate::admission::fair::{room_for, Room};

    fn queue(tenants: &[&str]) -> Vec<Option<Arc<str>>> {
        tenants.iter().map(|t| Some(Arc::from(*t))).collect()
    }

    fn room(len: usize, waiting: &[Option<Arc<str>>], tenant: Option<&str>) -> Room {
        room_for(len, waiting.iter().map(Option::as_ref), tenant, |t| {
            if t == "b" {
                10.0
            } else {
                1.0
            }
        })
    }

    #[test]
    fn a_tenant_alone_borrows_the_whole_queue() {
        let q = queue(&["a", "a"]);
        assert_eq!(room(3, &q, Some("a")), Room::Enter);
        let full = queue(&["a", "a", "a"]);
        assert_eq!(
            room(3, &full, Some("a")),
            Room::Refuse { held: 3, places: 3 }
        );
    }

    #[test]
    fn a_full_queue_makes_room_for_a_tenant_under_its_places_at_the_expense_of_the_one_over() {
        // Issue 34's crowd-out: A filled the queue of 3; B (share 10) arrives.
        let full = queue(&["a", "a", "a"]);
        assert_eq!(
            room(3, &full, Some("b")),
            Room::PushOut {
                tenant: Arc::from("a"),
                held: 3,
                places: 1
            }
        );
        // Equal shares, 4 places: a holds 3, c 1; d arrives (places 4/3 -> 1 each).
        let q = queue(&["a", "a", "a", "c"]);
        let r = room_for(4, q.iter().map(Option::as_ref), Some("d"), |_| 1.0);
        assert_eq!(
            r,
            Room::PushOut {
                tenant: Arc::from("a"),
                held: 3,
                places: 1
            }
        );
        // c's share with only a waiting beside it is 2 of the 4: a, above its 2, makes room.
        let r = room_for(4, q.iter().map(Option::as_ref), Some("c"), |_| 1.0);
        assert_eq!(
            r,
            Room::PushOut {
                tenant: Arc::from("a"),
                held: 3,
                places: 2
            }
        );
        // Once c holds its 2: refused, naming its own numbers.
        let even = queue(&["a", "a", "c", "c"]);
        let r = room_for(4, even.iter().map(Option::as_ref), Some("c"), |_| 1.0);
        assert_eq!(r, Room::Refuse { held: 2, places: 2 });
    }

    #[test]
    fn a_queue_of_no_places_is_nobodys_share() {
        assert_eq!(room(0, &[], Some("a")), Room::Refuse { held: 0, places: 0 });
    }

    #[test]
    fn without_tenants_a_full_queue_refuses_as_before() {
        let q = vec![None, None];
        assert_eq!(room(2, &q, None), Room::Refuse { held: 2, places: 2 });
        assert_eq!(room(3, &q, None), Room::Enter);
    }
}

mod share {
    use std::sync::Arc;

    use crate::admission::fair::over_share;

    fn over(tenants: &[&str], tenant: &str) -> bool {
        let q: Vec<Option<Arc<str>>> = tenants.iter().map(|t| Some(Arc::from(*t))).collect();
        over_share(q.iter().map(Option::as_ref), tenant, |t| {
            if t == "b" {
                3.0
            } else {
                1.0
            }
        })
    }

    #[test]
    fn a_tenant_is_over_its_share_only_beside_others_and_above_its_weight() {
        assert!(
            !over(&["a", "a", "a"], "a"),
            "alone: its share is all of it"
        );
        assert!(over(&["a", "a", "a", "c"], "a"));
        assert!(!over(&["a", "a", "a", "c"], "c"));
        assert!(!over(&["a", "c"], "a"), "exactly its share");
        // b weighs 3: 3 of 4 is its share.
        assert!(!over(&["b", "b", "b", "a"], "b"));
        assert!(over(&["b", "b", "b", "b", "b", "a"], "b"));
        // An arrival of a tenant with nobody waiting.
        assert!(!over(&["a", "a"], "c"));
    }

    fn ahead(tenants: &[Option<&str>], tenant: Option<&str>) -> u32 {
        let q: Vec<Option<Arc<str>>> = tenants.iter().map(|t| t.map(Arc::from)).collect();
        crate::admission::fair::fair_ahead(q.iter().map(Option::as_ref), tenant, |t| {
            if t == "b" {
                3.0
            } else {
                1.0
            }
        })
    }

    /// The waiters fair queuing admits before an arrival: its own tenant's, and of each other
    /// tenant its share of the turns until the arrival's. A tenant that parked 200 requests
    /// no longer puts another's arrival 200 admissions away.
    #[test]
    fn an_arrival_waits_for_its_own_and_its_share_of_each_others_waiters() {
        let a = Some("a");
        let parked = vec![a; 200];
        assert_eq!(ahead(&parked, Some("c")), 1, "one turn of a's, then c's");
        assert_eq!(ahead(&parked, a), 200, "a waits behind its own");
        // c has 2 waiting: its arrival is its third turn, a gets three meanwhile.
        let mut mixed = parked.clone();
        mixed.extend([Some("c"), Some("c")]);
        assert_eq!(ahead(&mixed, Some("c")), 2 + 3);
        // b weighs 3: a's one-weight tenant gets a third of a turn per b's turn (rounded up).
        assert_eq!(ahead(&parked, Some("b")), 1);
        let heavy = vec![Some("b"); 9];
        assert_eq!(ahead(&heavy, a), 3, "b takes three turns per a's");
        // Without tenants (or all of one), every waiter is ahead, as in time order.
        assert_eq!(ahead(&[None; 5], None), 5);
        assert_eq!(ahead(&[], Some("c")), 0);
    }
}

/// Spawns an acquire of `ask` (continuing when `continuing`) that notes `label` in `order`
/// when admitted (and gives its seat back at once), or `label` and its error code when
/// refused; returns once it waits.
async fn queue_ask(
    a: &Admission,
    tenant: Option<&'static str>,
    continuing: bool,
    label: &'static str,
    order: &Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    let (mine, noted) = (a.clone(), order.clone());
    let before = a.snapshot().lane(Small).queue_depth;
    let told = order.lock().unwrap().len();
    let task = tokio::spawn(async move {
        let order = noted;
        let mut ask = Ask::new(Small, 10).for_tenant(tenant);
        if continuing {
            ask = ask.continuing();
        }
        match mine.acquire(ask).await {
            Ok(guard) => {
                order.lock().unwrap().push(label.to_owned());
                drop(guard);
            }
            Err(e) => {
                let code = match e {
                    AdmissionError::TenantQueueFull { .. } => "tenant_queue_full",
                    _ => "other",
                };
                order.lock().unwrap().push(format!("{label}: {code}"));
            }
        }
    });
    // Until it waits (or, pushing another out, that one is told).
    while a.snapshot().lane(Small).queue_depth == before && order.lock().unwrap().len() == told {
        tokio::task::yield_now().await;
    }
    task
}

/// A continuation (an answer that already streamed, pre-empted) waits at the head: an arrival
/// of its tenant due sooner does not take its place (it used to, and push it to its tenant's
/// newest turn, again at each such arrival).
#[tokio::test(start_paused = true)]
async fn a_continuation_keeps_the_head_before_an_arrival_due_sooner() {
    let a = one_seat("");
    let order = Arc::new(Mutex::new(Vec::new()));
    let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
    let cont = queue_ask(&a, None, true, "cont", &order).await;
    let (mine, order2) = (a.clone(), order.clone());
    let due = tokio::spawn(async move {
        let at = Some(Instant::now() + Duration::from_secs(1));
        let g = mine.acquire(Ask::new(Small, 10).due_at(at)).await.unwrap();
        order2.lock().unwrap().push("due".to_owned());
        drop(g);
    });
    while a.snapshot().lane(Small).queue_depth < 2 {
        tokio::task::yield_now().await;
    }
    drop(seat);
    cont.await.unwrap();
    due.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["cont", "due"]);
    assert!(a.snapshot().is_idle());
}

/// A full queue makes room for another tenant by pushing out the newest waiter of the tenant
/// most above its places, never a continuation: A's waiter goes, A's continuation stays.
#[tokio::test(start_paused = true)]
async fn a_full_queue_never_pushes_out_a_continuation() {
    let toml =
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\nseats = 3\n\
         [lanes.small]\nmax_concurrency = 1\nceiling = 1\nqueue_len = 2\n\
         [lanes.medium]\nmax_concurrency = 1\nceiling = 1\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\n";
    let a = Admission::from_config(&Config::from_toml_str(toml).unwrap());
    let order = Arc::new(Mutex::new(Vec::new()));
    let seat = a.acquire(Ask::new(Small, 10)).await.unwrap();
    let a1 = queue_ask(&a, Some("A"), false, "a1", &order).await;
    let a2 = queue_ask(&a, Some("A"), false, "a2", &order).await;
    let cont = queue_ask(&a, Some("A"), true, "cont", &order).await;
    // B's arrival: the queue is full of A's; A's newest waiter that never ran leaves.
    let b = queue_ask(&a, Some("B"), false, "b", &order).await;
    a2.await.unwrap();
    drop(seat);
    for t in [cont, a1, b] {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order[0], "a2: tenant_queue_full", "{order:?}");
    assert_eq!(order[1], "cont", "{order:?}");
    assert!(order.contains(&"a1".to_owned()) && order.contains(&"b".to_owned()));
    assert!(a.snapshot().is_idle());
}
