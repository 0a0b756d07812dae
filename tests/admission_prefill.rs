//! The prefill budget, one suite for both backends: the in-process counters (one replica) and
//! the shared quota in Redis (two replicas on one real `redis-server`, the fleet's usage read
//! from Redis itself, as an operator would). Real time, and no timed assertions: every wait is
//! for a state, every check is an invariant.

mod redis_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;
use redis_common::RedisServer;
use tutor_gateway::admission::{Admission, Ask, LaneGuard};
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl};
use tutor_gateway::lane::Lane::{self, Large, Medium, Small};
use tutor_gateway::telemetry::Metrics;
use tutor_testkit::eventually;

/// Replicas in front of one engine, and where their prefill budget lives.
struct Fleet {
    replicas: Vec<Admission>,
    /// The shared quota (Redis backend): the server and a connection to read it.
    redis: Option<(RedisServer, MultiplexedConnection)>,
    budget: u64,
}

/// The shipped config with a prefill budget of `budget` tokens (long prompts: above 2048) and
/// `extra` applied.
fn config(budget: u64, extra: impl Fn(&mut Config)) -> Config {
    let mut c = Config::default();
    c.admission.prefill_budget_tokens = budget;
    for lane in [&mut c.lanes.small, &mut c.lanes.medium, &mut c.lanes.large] {
        lane.queue.len = 64;
        lane.queue.timeout = Duration::from_secs(60);
    }
    extra(&mut c);
    c
}

impl Fleet {
    fn local(budget: u64, extra: impl Fn(&mut Config)) -> Self {
        let a = Admission::from_config(&config(budget, extra));
        Self {
            replicas: vec![a.clone(), a],
            redis: None,
            budget,
        }
    }

    async fn redis(budget: u64, extra: impl Fn(&mut Config)) -> Self {
        let server = RedisServer::start();
        let mut c = config(budget, extra);
        c.quota.backend = QuotaBackend::Redis;
        c.quota.redis_url = RedisUrl::new(server.url());
        let replicas: Vec<Admission> = (0..2)
            .map(|_| Admission::build(&c, Metrics::new().quota().clone()).unwrap())
            .collect();
        // Each replica's first connection (a request waits only 2 s for it, which a loaded
        // machine can exceed, and then falls back).
        for r in &replicas {
            eventually("the replica reaches Redis", || {
                std::future::ready(r.shared().is_some_and(|s| s.connection().is_some()))
            })
            .await;
        }
        let conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Self {
            replicas,
            redis: Some((server, conn)),
            budget,
        }
    }

    /// Replica `i` (the local backend has one, shared).
    fn at(&self, i: usize) -> Admission {
        self.replicas[i % self.replicas.len()].clone()
    }

    /// The fleet's usage: counters by name (`prefill:tokens`, `<lane>:n`, ...) and the prefill
    /// reservations of the requests holding one, read where the budget lives.
    async fn usage(&self) -> (HashMap<String, i64>, Vec<u64>) {
        match &self.redis {
            Some((_, conn)) => {
                let mut conn = conn.clone();
                let (usage, leases): (HashMap<String, i64>, HashMap<String, String>) =
                    redis::pipe()
                        .atomic()
                        .hgetall("tg:v2:{quota}:usage")
                        .hgetall("tg:v2:{quota}:leases")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                let prefilling = leases
                    .values()
                    .map(|v| v.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                    .filter(|&p| p > 0)
                    .collect();
                (usage, prefilling)
            }
            None => {
                let s = self.replicas[0].snapshot();
                let mut usage = HashMap::new();
                usage.insert("prefill:tokens".to_owned(), s.prefill_tokens as i64);
                usage.insert("global:tokens".to_owned(), s.reserved_tokens() as i64);
                for lane in Lane::ALL {
                    let l = s.lane(lane);
                    usage.insert(format!("{}:n", lane.as_str()), i64::from(l.in_flight));
                    usage.insert(
                        format!("{}:tokens", lane.as_str()),
                        l.reserved_tokens as i64,
                    );
                }
                (usage, vec![])
            }
        }
    }

    async fn get(&self, field: &str) -> i64 {
        self.usage().await.0.get(field).copied().unwrap_or(0)
    }

    /// Requests holding a seat, in all lanes.
    async fn seats(&self) -> i64 {
        let (usage, _) = self.usage().await;
        Lane::ALL
            .iter()
            .map(|l| {
                usage
                    .get(&format!("{}:n", l.as_str()))
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    }

    async fn until_prefill(&self, tokens: i64) {
        eventually(&format!("{tokens} prefill tokens in flight"), || async {
            self.get("prefill:tokens").await == tokens
        })
        .await;
    }

    /// Waits until every counter is back to zero.
    async fn until_idle(&self) {
        eventually("everything given back", || async {
            let (usage, prefilling) = self.usage().await;
            usage.values().all(|v| *v == 0) && prefilling.is_empty()
        })
        .await;
        for a in &self.replicas {
            eventually("no waiter left", || async { a.snapshot().is_idle() }).await;
        }
    }

    fn waiting(&self, i: usize) -> u32 {
        self.at(i).snapshot().queue_depth()
    }
}

fn spawn(a: Admission, lane: Lane, work: u32, prompt: u32) -> tokio::task::JoinHandle<LaneGuard> {
    tokio::spawn(async move {
        a.acquire(Ask::new(lane, work).with_prefill(prompt))
            .await
            .unwrap()
    })
}

/// A multi-threaded runtime for one test.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `$body(fleet)` against the local backend and against two replicas on Redis.
macro_rules! both_backends {
    ($name:ident, $budget:expr, $extra:expr, $body:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn local() {
                runtime().block_on(async { $body(Fleet::local($budget, $extra)).await });
            }

            #[test]
            fn redis() {
                runtime().block_on(async { $body(Fleet::redis($budget, $extra).await).await });
            }
        }
    };
}

both_backends!(
    prefill_room_comes_back_at_the_first_token_and_the_seat_stays,
    12_288,
    |_: &mut Config| {},
    |f: Fleet| async move {
        let mut g = f
            .at(0)
            .acquire(Ask::new(Large, 10_000).with_prefill(8_000))
            .await
            .unwrap();
        assert_eq!(g.prefill(), 8_000);
        f.until_prefill(8_000).await;
        g.prefill_done();
        f.until_prefill(0).await;
        assert_eq!(
            (f.get("large:n").await, f.get("large:tokens").await),
            (1, 10_000)
        );
        // Idempotent: a second first token gives nothing back twice.
        g.prefill_done();
        drop(g);
        f.until_idle().await;
    }
);

both_backends!(
    prefill_room_comes_back_when_a_request_ends_before_its_first_token,
    12_288,
    |_: &mut Config| {},
    |f: Fleet| async move {
        // Error, engine error, disconnect during prefill: the guard drops in prefill.
        let g = f
            .at(0)
            .acquire(Ask::new(Large, 12_000).with_prefill(10_000))
            .await
            .unwrap();
        let waiter = spawn(f.at(1), Medium, 6_000, 5_000);
        eventually("the long prompt waits", || async { f.waiting(1) == 1 }).await;
        drop(g);
        let w = waiter.await.unwrap();
        f.until_prefill(5_000).await;
        drop(w);
        f.until_idle().await;
    }
);

both_backends!(
    a_long_prompt_waits_for_room_holding_no_seat_and_short_prompts_never_wait,
    12_288,
    |_: &mut Config| {},
    |f: Fleet| async move {
        let mut first = f
            .at(0)
            .acquire(Ask::new(Large, 10_000).with_prefill(8_000))
            .await
            .unwrap();
        // 8000 + 6000 > 12288: a long medium prompt on the other replica waits...
        let long = spawn(f.at(1), Medium, 7_000, 6_000);
        eventually("the long prompt waits", || async { f.waiting(1) == 1 }).await;
        // ...in its lane's line of long prompts (the one its wait is predicted from)...
        let medium = *f.at(1).snapshot().lane(Medium);
        assert_eq!((medium.line_depth(true), medium.line_depth(false)), (1, 0));
        assert!(f.at(1).waits_for_prefill(6_000) && !f.at(1).waits_for_prefill(2_048));
        // ...holding no seat and no tokens, of any lane.
        assert_eq!(f.seats().await, 1);
        assert_eq!(f.get("global:tokens").await, 10_000);
        // Short prompts of its lane and of small go at once, counted.
        let medium = f
            .at(1)
            .acquire(Ask::new(Medium, 4_000).with_prefill(2_048))
            .await
            .unwrap();
        let small = f
            .at(1)
            .acquire(Ask::new(Small, 600).with_prefill(500))
            .await
            .unwrap();
        assert_eq!((medium.prefill_wait(), small.prefill_wait()), (None, None));
        f.until_prefill(8_000 + 2_048 + 500).await;
        assert_eq!(f.waiting(1), 1, "the long prompt still waits");
        first.prefill_done();
        let long = long.await.unwrap();
        assert!(long.prefill_wait().is_some());
        f.until_prefill(6_000 + 2_048 + 500).await;
        drop((first, long, medium, small));
        f.until_idle().await;
    }
);

both_backends!(
    a_prompt_larger_than_the_budget_runs_alone,
    4_096,
    |_: &mut Config| {},
    |f: Fleet| async move {
        let mut short = f
            .at(0)
            .acquire(Ask::new(Small, 600).with_prefill(500))
            .await
            .unwrap();
        let big = spawn(f.at(1), Large, 12_000, 10_000);
        eventually("the big prompt waits", || async { f.waiting(1) == 1 }).await;
        // Nothing else prefilling: the oversized prompt goes (never a deadlock).
        short.prefill_done();
        let mut big = big.await.unwrap();
        f.until_prefill(10_000).await;
        let next = spawn(f.at(0), Medium, 4_000, 3_000);
        eventually("the next long prompt waits", || async { f.waiting(0) == 1 }).await;
        big.prefill_done();
        let next = next.await.unwrap();
        f.until_prefill(3_000).await;
        drop((short, big, next));
        f.until_idle().await;
    }
);

both_backends!(
    long_prefill_never_exceeds_the_budget_and_comes_back_to_zero,
    8_192,
    |c: &mut Config| c.lanes.medium.queue.len = 256,
    |f: Fleet| async move {
        // Long prompts of mixed sizes (one larger than the budget) through every replica, each
        // request holding its prefill and then its decode for a few random milliseconds. A
        // watcher reads the fleet's usage all along: the prompts prefilling sum to at most the
        // budget, or one prompt prefills alone; nothing goes negative.
        let sizes = [3_000u32, 5_000, 2_500, 9_000, 4_000, 2_100, 7_000, 3_300];
        let done = Arc::new(AtomicBool::new(false));
        let f = Arc::new(f);
        let watcher = {
            let (f, done) = (f.clone(), done.clone());
            tokio::spawn(async move {
                let mut readings = 0u32;
                while !done.load(Ordering::Acquire) {
                    let (usage, prefilling) = f.usage().await;
                    assert!(usage.values().all(|v| *v >= 0), "{usage:?}");
                    let total = usage.get("prefill:tokens").copied().unwrap_or(0) as u64;
                    if f.redis.is_some() {
                        assert_eq!(prefilling.iter().sum::<u64>(), total, "{usage:?}");
                        assert!(
                            total <= f.budget || prefilling.len() == 1,
                            "{prefilling:?} prefilling over {}",
                            f.budget
                        );
                    } else {
                        assert!(total <= f.budget.max(9_000), "{total} prefilling");
                    }
                    readings += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                readings
            })
        };
        let clients: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &prompt)| {
                let a = f.at(i);
                tokio::spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
                    for _ in 0..4 {
                        let mut g = a
                            .acquire(Ask::new(Medium, prompt + 100).with_prefill(prompt))
                            .await
                            .unwrap();
                        let ms = rng.random_range(1..8);
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        g.prefill_done();
                        let ms = rng.random_range(0..4);
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        done.store(true, Ordering::Release);
        assert!(watcher.await.unwrap() > 0);
        f.until_idle().await;
    }
);
