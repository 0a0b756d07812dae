//! Shared quota round trip: acquire + release of one lease against a local `redis-server` the
//! bench starts itself, through the gateway's `RedisAdmission` (Lua scripts, `EVALSHA`).
//! Reports p50/p99 of one acquire + release (release awaited through the admission's
//! background task, measured until the lane is free again) and operations per second for one
//! caller and for 32 concurrent callers; then a fleet of 4 replicas on the one Redis (issue
//! 36's headroom), closed loop and open loop at several rates, with Redis's own count of script
//! calls and of its time in them (see `fleet`).
//!
//! `cargo bench -p tutor-gateway --bench quota`

use std::time::{Duration, Instant};

use tutor_gateway::admission::{Admission, Ask, RedisAdmission};
use tutor_gateway::config::{Config, QuotaBackend, RedisUrl};
use tutor_gateway::lane::Lane;
use tutor_gateway::telemetry::Metrics;
use tutor_wire::stats::nearest_rank;

#[path = "../tests/redis_common/mod.rs"]
mod redis_common;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    nearest_rank(sorted, p).expect("samples")
}

async fn round_trip(admission: &RedisAdmission) -> Duration {
    let started = Instant::now();
    let guard = admission
        .acquire(Ask::new(Lane::Small, 100))
        .await
        .expect("admitted");
    drop(guard);
    started.elapsed()
}

fn main() {
    let server = redis_common::RedisServer::start();
    let mut config = Config::default();
    config.quota.backend = QuotaBackend::Redis;
    config.quota.redis_url = RedisUrl::new(server.url());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let metrics = Metrics::new();
        let Admission::Redis(admission) = Admission::build(&config, metrics.quota().clone()).unwrap()
        else {
            unreachable!()
        };
        for _ in 0..500 {
            round_trip(&admission).await;
        }
        // Sequential: acquire (one EVALSHA) then release; wait until the lease is gone so each
        // sample includes the release's own round trip.
        let n = 5_000;
        let mut samples = Vec::with_capacity(n);
        let started = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            let guard = admission.acquire(Ask::new(Lane::Small, 100)).await.expect("admitted");
            drop(guard);
            while quota_in_use(&server.url()).await != 0 {}
            samples.push(t.elapsed());
        }
        let sequential = n as f64 / started.elapsed().as_secs_f64();
        samples.sort();
        println!(
            "quota acquire+release round trip (sequential, {n} ops): p50 {:?}  p99 {:?}  {:.0} ops/s",
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
            sequential
        );
        // Concurrent: 32 callers (the small lane's 32 slots), acquire + drop in a loop.
        let per = 1_000;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let a = admission.clone();
            tasks.push(tokio::spawn(async move {
                let mut s = Vec::with_capacity(per);
                for _ in 0..per {
                    s.push(round_trip(&a).await);
                }
                s
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let elapsed = started.elapsed();
        all.sort();
        println!(
            "quota acquire (+async release), 32 callers, {} ops: p50 {:?}  p99 {:?}  {:.0} ops/s",
            all.len(),
            percentile(&all, 0.5),
            percentile(&all, 0.99),
            all.len() as f64 / elapsed.as_secs_f64()
        );
        admission.shutdown().await;
        // Side by side on the same Redis: one lease a script call, then a line's head taking
        // the waiters behind it and the releaser sending what piled up (the default).
        for batch_max in [1, 32] {
            fleet(&server.url(), batch_max).await;
            bound(&server.url(), batch_max).await;
        }
    });
}

/// Replicas sharing the Redis in the fleet phases, and closed-loop callers on each.
const REPLICAS: usize = 4;
const CALLERS: usize = 8;
/// Offered admissions per second in the open-loop phase (each is two quota operations, a lease
/// taken and given back).
const RATES: [f64; 4] = [2_500.0, 5_000.0, 10_000.0, 12_500.0];

/// Redis headroom (issue 36): REPLICAS admissions (each its own connection and heartbeat, as
/// replicas have) in a lane wide enough that nobody waits for a seat, so what is measured is
/// the quota's Redis round trips and not a full lane's queue. A quota operation is a lease
/// taken or given back (two per admission); with `quota.batch_max` above 1 a script call may
/// carry several (a line's head takes the waiters behind it; the releaser sends what piled up),
/// so Redis's own count of script calls and of the time it spent in them (INFO commandstats)
/// is reported beside the operations.
///
/// First closed loop (CALLERS callers a replica, as fast as they can: the most this machine
/// does, the latency being the callers' own convoy), then open loop at each of RATES (arrivals
/// on a schedule, each sent by its own task; latency from the send to the grant).
async fn fleet(url: &str, batch_max: u32) {
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [admission]\nseats = 1026\nmax_tokens_in_flight = 100000000\n\
         [lanes.small]\nmax_concurrency = 1024\nceiling = 1024\n\
         max_tokens_in_flight = 100000000\nqueue_len = 1024\n\
         [lanes.medium]\nmax_concurrency = 1\nceiling = 1\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{url}\"\nkey_prefix = \"tg:b{batch_max}\"\n\
         batch_max = {batch_max}\n"
    ))
    .expect("the fleet phase's config");
    let replicas = replicas(&config, 100).await;
    closed_loop(
        &format!(
            "batch_max {batch_max:>2}: fleet closed loop, {REPLICAS} replicas x {CALLERS} callers"
        ),
        &replicas,
        CALLERS,
        url,
    )
    .await;
    let window = Duration::from_secs(5);
    for rate in RATES {
        let before = script_calls(url);
        let started = Instant::now();
        let arrivals = open_loop(&replicas, rate, window).await;
        let all: Vec<Duration> = arrivals.iter().flatten().copied().collect();
        let refused = arrivals.len() - all.len();
        report(
            &format!(
                "batch_max {batch_max:>2}: fleet open loop, {REPLICAS} replicas, {rate:.0} \
                 admissions/s offered, {refused} refused (line full)"
            ),
            all,
            started.elapsed(),
            before,
            url,
        )
        .await;
    }
    for rate in RATES {
        let before = script_calls(url);
        let started = Instant::now();
        let arrivals = poisson(&replicas, rate, window).await;
        let from_due: Vec<Duration> = arrivals.iter().flatten().map(|a| a.1).collect();
        let all: Vec<Duration> = arrivals.iter().flatten().map(|a| a.0).collect();
        let refused = arrivals.len() - all.len();
        let mut late = from_due;
        late.sort();
        report(
            &format!(
                "batch_max {batch_max:>2}: fleet Poisson arrivals, {REPLICAS} replicas, {rate:.0} \
                 admissions/s offered, {refused} refused (line full), from the due time p99 {:?}",
                percentile(&late, 0.99)
            ),
            all,
            started.elapsed(),
            before,
            url,
        )
        .await;
    }
    for a in replicas {
        a.shutdown().await;
    }
}

/// Seats that bind: BOUND_SEATS seats shared by REPLICAS x BOUND_CALLERS closed-loop callers,
/// so every replica's line is long and each freed seat goes to a waiter (each caller drops its
/// lease at once): how fast the fleet turns seats over, the lines' heads taking the waiters
/// behind them (`quota.batch_max`) or not.
async fn bound(url: &str, batch_max: u32) {
    let config = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n\
         [admission]\nseats = {}\nmax_tokens_in_flight = 100000000\n\
         [lanes.small]\nmax_concurrency = {BOUND_SEATS}\nceiling = {BOUND_SEATS}\n\
         max_tokens_in_flight = 100000000\nqueue_len = 1024\nqueue_timeout_ms = 60000\n\
         [lanes.medium]\nmax_concurrency = 1\nceiling = 1\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\n\
         [quota]\nbackend = \"redis\"\nredis_url = \"{url}\"\nkey_prefix = \"tg:s{batch_max}\"\n\
         batch_max = {batch_max}\n",
        BOUND_SEATS + 2
    ))
    .expect("the bound phase's config");
    let replicas = replicas(&config, 0).await;
    closed_loop(
        &format!(
            "batch_max {batch_max:>2}: seats binding, {BOUND_SEATS} seats, {REPLICAS} replicas x \
             {BOUND_CALLERS} callers"
        ),
        &replicas,
        BOUND_CALLERS,
        url,
    )
    .await;
    for a in replicas {
        a.shutdown().await;
    }
}

/// The bound phase's seats and callers a replica.
const BOUND_SEATS: u32 = 64;
const BOUND_CALLERS: usize = 32;

/// REPLICAS admissions for `config` (each its own connection and heartbeat, as replicas have),
/// each warmed by `warm` round trips.
async fn replicas(config: &Config, warm: usize) -> Vec<RedisAdmission> {
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        let Admission::Redis(a) = Admission::build(config, Metrics::new().quota().clone()).unwrap()
        else {
            unreachable!()
        };
        for _ in 0..warm {
            round_trip(&a).await;
        }
        replicas.push(a);
    }
    replicas
}

/// `callers` closed-loop callers on each of `replicas` for 5 s, acquiring and dropping a lease
/// as fast as they can; reported as `phase`.
async fn closed_loop(phase: &str, replicas: &[RedisAdmission], callers: usize, url: &str) {
    let window = Duration::from_secs(5);
    let before = script_calls(url);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for a in replicas {
        for _ in 0..callers {
            let a = a.clone();
            tasks.push(tokio::spawn(async move {
                let mut s = Vec::new();
                while started.elapsed() < window {
                    s.push(round_trip(&a).await);
                }
                s
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    report(phase, all, started.elapsed(), before, url).await;
}

/// Admissions arriving at `rate` a second, spread over the replicas, for `window`; each one's
/// time from its send to its grant, `None` when refused.
async fn open_loop(
    replicas: &[RedisAdmission],
    rate: f64,
    window: Duration,
) -> Vec<Option<Duration>> {
    let per = rate / replicas.len() as f64;
    let started = Instant::now();
    let mut pacers = Vec::new();
    for a in replicas {
        let a = a.clone();
        pacers.push(tokio::spawn(async move {
            let mut arrivals = Vec::new();
            let mut sent = 0u64;
            loop {
                let now = started.elapsed();
                if now >= window {
                    break;
                }
                while (sent as f64) < now.as_secs_f64() * per {
                    // From the send: tokio's timer wakes the pacer to the millisecond, which
                    // is not the quota's latency.
                    let at = Instant::now();
                    let a = a.clone();
                    arrivals.push(tokio::spawn(async move {
                        // Refused (the replica's line full): counted apart.
                        let guard = a.acquire(Ask::new(Lane::Small, 100)).await.ok()?;
                        drop(guard);
                        Some(at.elapsed())
                    }));
                    sent += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mut out = Vec::with_capacity(arrivals.len());
            for arrival in arrivals {
                out.push(arrival.await.unwrap());
            }
            out
        }));
    }
    let mut all = Vec::new();
    for p in pacers {
        all.extend(p.await.unwrap());
    }
    all
}

/// Admissions arriving as a Poisson process at `rate` a second for `window`, each to a replica
/// drawn at random: the arrivals of many independent clients. A thread of its own sends each at
/// its due time (tokio's timer ticks in milliseconds, so `open_loop`'s pacers send a
/// millisecond's arrivals together, every replica's in the same tick: bursts that independent
/// clients do not make). Each one's time from its send to its grant and from its due time (the
/// thread's own lateness included), `None` when refused.
async fn poisson(
    replicas: &[RedisAdmission],
    rate: f64,
    window: Duration,
) -> Vec<Option<(Duration, Duration)>> {
    use rand::{Rng, SeedableRng};
    let replicas = replicas.to_vec();
    let handle = tokio::runtime::Handle::current();
    let sent = tokio::task::spawn_blocking(move || {
        let mut rng = rand::rngs::StdRng::seed_from_u64(36);
        let started = Instant::now();
        let mut due = Duration::ZERO;
        let mut arrivals = Vec::new();
        while due < window {
            let now = started.elapsed();
            if due > now {
                std::thread::sleep(due - now);
            }
            let (at, due_at) = (Instant::now(), started + due);
            let a = replicas[rng.random_range(0..replicas.len())].clone();
            arrivals.push(handle.spawn(async move {
                // Refused (the replica's line full): counted apart.
                let guard = a.acquire(Ask::new(Lane::Small, 100)).await.ok()?;
                drop(guard);
                Some((at.elapsed(), due_at.elapsed()))
            }));
            // Exponential gaps: -ln(U) / rate.
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            due += Duration::from_secs_f64(-u.ln() / rate);
        }
        arrivals
    })
    .await
    .unwrap();
    let mut out = Vec::with_capacity(sent.len());
    for arrival in sent {
        out.push(arrival.await.unwrap());
    }
    out
}

/// One phase's line: admissions, their latency, and Redis's count of script calls and of its
/// time in them since `before`.
async fn report(
    phase: &str,
    mut all: Vec<Duration>,
    elapsed: Duration,
    before: (u64, f64),
    url: &str,
) {
    // Let the last releases land before Redis's count is read.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = script_calls(url);
    let (calls, usec) = (after.0 - before.0, after.1 - before.1);
    all.sort();
    let secs = elapsed.as_secs_f64();
    println!(
        "{phase}: {} admissions in {secs:.1} s, {:.0}/s = {:.0} quota operations/s; acquire \
         p50 {:?} p99 {:?}; {:.0} Redis script calls/s, {:.1} us each in Redis, {:.0}% of its core",
        all.len(),
        all.len() as f64 / secs,
        2.0 * all.len() as f64 / secs,
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        calls as f64 / secs,
        usec / calls.max(1) as f64,
        usec / secs / 1e4
    );
}

/// Script calls Redis has run (EVALSHA and EVAL) and the microseconds it spent in them, from
/// INFO commandstats.
fn script_calls(url: &str) -> (u64, f64) {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    let field = |l: &str, name: &str| -> f64 {
        l.split(&format!("{name}="))
            .nth(1)
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .fold((0, 0.0), |(n, us), l| {
            (n + field(l, "calls") as u64, us + field(l, "usec"))
        })
}

async fn quota_in_use(url: &str) -> i64 {
    thread_local! {
        static CONN: std::cell::RefCell<Option<redis::Connection>> = const { std::cell::RefCell::new(None) };
    }
    CONN.with(|c| {
        let mut c = c.borrow_mut();
        let conn =
            c.get_or_insert_with(|| redis::Client::open(url).unwrap().get_connection().unwrap());
        let n: Option<i64> = redis::cmd("HGET")
            .arg("tg:v2:{quota}:usage")
            .arg("small:n")
            .query(conn)
            .unwrap();
        n.unwrap_or(0)
    })
}
