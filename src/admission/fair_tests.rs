//! Fairness between tenants inside one lane's queue (issue 17, item 2): start-time fair
//! queuing. Asserts on admission order only.

use std::sync::{Arc, Mutex};

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
        let (mine, order) = (a.clone(), order.clone());
        let before = a.snapshot().lane(Small).queue_depth;
        tasks.push(tokio::spawn(async move {
            let guard = mine
                .acquire(Ask::new(Small, 10).for_tenant(Some(tenant)))
                .await
                .unwrap();
            order.lock().unwrap().push(tenant);
            drop(guard);
        }));
        // Wait until it is in the queue, so arrival order is exactly this loop's.
        while a.snapshot().lane(Small).queue_depth == before {
            tokio::task::yield_now().await;
        }
    }
    tasks
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
    let a = Admission::build(&config, metrics.quota().clone()).unwrap();
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
