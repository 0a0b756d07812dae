use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::Config;
use crate::lane::Lane::{Large, Medium, Small};

/// Admission built from the shipped defaults plus `extra` TOML sections.
fn admission(extra: &str) -> Admission {
    let config = Config::from_toml_str(&format!("[classify]\ntokenizer = \"heuristic\"\n{extra}"))
        .expect("test config is valid");
    Admission::from_config(&config)
}

/// Lets spawned tasks run until they block (time is paused, so nothing times out meanwhile).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn slot_and_tokens_come_back_on_drop() {
    let a = admission("");
    let guard = a.acquire(Ask::new(Medium, 3000)).await.unwrap();
    let s = a.snapshot();
    assert_eq!(
        (s.lane(Medium).in_flight, s.lane(Medium).reserved_tokens),
        (1, 3000)
    );
    assert_eq!(guard.queue_wait(), Duration::ZERO);
    drop(guard);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn token_budget_blocks_a_request_even_when_slots_are_free() {
    let a = admission("[lanes.small]\nmax_tokens_in_flight = 2000\nqueue_timeout_ms = 1000\n");
    let first = a.acquire(Ask::new(Small, 1200)).await.unwrap();
    // 31 small slots are free, but 1200 + 1000 > 2000 tokens.
    let err = a.acquire(Ask::new(Small, 1000)).await.unwrap_err();
    assert!(
        matches!(err, AdmissionError::Timeout { lane: Small, .. }),
        "{err}"
    );
    let fits = a.acquire(Ask::new(Small, 800)).await.unwrap();
    assert_eq!(a.snapshot().lane(Small).reserved_tokens, 2000);
    drop((first, fits));
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn global_token_budget_spans_lanes() {
    let a = admission(
        "[upstream]\nmax_model_len = 8000\n[admission]\nmax_tokens_in_flight = 10000\n\
         [lanes.medium]\nqueue_timeout_ms = 1000\n",
    );
    let _large = a.acquire(Ask::new(Large, 8000)).await.unwrap();
    // The medium lane is empty and has budget, but the global budget has only 2000 left.
    let err = a.acquire(Ask::new(Medium, 4000)).await.unwrap_err();
    assert!(
        matches!(err, AdmissionError::Timeout { lane: Medium, .. }),
        "{err}"
    );
    assert!(a.acquire(Ask::new(Medium, 2000)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn queue_full_answers_queue_full_with_retry_after() {
    let a =
        admission("[lanes.large]\nmax_concurrency = 1\nqueue_len = 1\nqueue_timeout_ms = 2500\n");
    let _running = a.acquire(Ask::new(Large, 8000)).await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.acquire(Ask::new(Large, 8000)).await.map(|g| g.lane()) }
    });
    settle().await;
    assert_eq!(a.snapshot().lane(Large).queue_depth, 1);
    let err = a.acquire(Ask::new(Large, 8000)).await.unwrap_err();
    assert_eq!(
        err,
        AdmissionError::QueueFull {
            lane: Large,
            retry_after: Duration::from_secs(2)
        }
    );
    // Other lanes' queues are separate.
    assert!(a.acquire(Ask::new(Medium, 100)).await.is_ok());
    waiter.abort();
}

#[tokio::test(start_paused = true)]
async fn zero_length_queue_rejects_at_once() {
    let a = admission("[lanes.large]\nmax_concurrency = 1\nqueue_len = 0\n");
    let _running = a.acquire(Ask::new(Large, 100)).await.unwrap();
    let err = a.acquire(Ask::new(Large, 100)).await.unwrap_err();
    assert!(
        matches!(err, AdmissionError::QueueFull { retry_after, .. } if retry_after >= Duration::from_secs(1))
    );
}

#[tokio::test(start_paused = true)]
async fn waiting_past_the_queue_timeout_gives_timeout_and_leaves_the_queue() {
    let a = admission(
        "[admission]\npolicy = \"strict\"\n[lanes.small]\nmax_concurrency = 1\nqueue_timeout_ms = 5000\n",
    );
    let running = a.acquire(Ask::new(Small, 100)).await.unwrap();
    let started = tokio::time::Instant::now();
    let err = a.acquire(Ask::new(Small, 100)).await.unwrap_err();
    assert_eq!(
        err,
        AdmissionError::Timeout {
            lane: Small,
            waited: Duration::from_millis(5000)
        }
    );
    assert_eq!(started.elapsed(), Duration::from_millis(5000));
    assert_eq!(a.snapshot().lane(Small).queue_depth, 0);
    drop(running);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_is_admitted_when_a_slot_frees_and_records_its_wait() {
    let a = admission("[lanes.large]\nmax_concurrency = 1\n");
    let running = a.acquire(Ask::new(Large, 100)).await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.acquire(Ask::new(Large, 200)).await }
    });
    settle().await;
    tokio::time::advance(Duration::from_secs(3)).await;
    drop(running);
    let guard = waiter.await.unwrap().unwrap();
    assert_eq!(guard.queue_wait(), Duration::from_secs(3));
    assert_eq!(a.snapshot().lane(Large).reserved_tokens, 200);
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiter_leaves_the_queue_and_leaks_nothing() {
    let a = admission("[lanes.large]\nmax_concurrency = 1\n");
    let running = a.acquire(Ask::new(Large, 100)).await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.acquire(Ask::new(Large, 100)).await }
    });
    settle().await;
    assert_eq!(a.snapshot().lane(Large).queue_depth, 1);
    waiter.abort(); // the client went away while queued
    settle().await;
    assert_eq!(a.snapshot().lane(Large).queue_depth, 0);
    drop(running);
    assert!(a.snapshot().is_idle());
    // The freed slot is usable: nobody phantom holds it.
    assert!(a.acquire(Ask::new(Large, 100)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn waiter_cancelled_right_after_its_grant_gives_the_grant_back() {
    let a = admission("[lanes.large]\nmax_concurrency = 1\n");
    let running = a.acquire(Ask::new(Large, 100)).await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.acquire(Ask::new(Large, 100)).await }
    });
    settle().await;
    drop(running); // grants the slot to the waiter, whose task has not run since
    assert_eq!(a.snapshot().lane(Large).in_flight, 1);
    waiter.abort();
    settle().await;
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_blocking_head_lets_the_next_waiter_in() {
    let a = admission("[lanes.medium]\nmax_tokens_in_flight = 10000\n");
    let _held = a.acquire(Ask::new(Medium, 6000)).await.unwrap();
    let big = tokio::spawn({
        let a = a.clone();
        async move { a.acquire(Ask::new(Medium, 5000)).await }
    });
    settle().await;
    let small = tokio::spawn({
        let a = a.clone();
        async move { a.acquire(Ask::new(Medium, 1000)).await }
    });
    settle().await;
    // Strict FIFO: 1000 would fit, but waits behind the head that does not.
    assert_eq!(a.snapshot().lane(Medium).queue_depth, 2);
    big.abort();
    let guard = small.await.unwrap().unwrap();
    assert_eq!(guard.tokens(), 1000);
}

#[tokio::test(start_paused = true)]
async fn panic_while_holding_a_guard_gives_everything_back() {
    let a = admission("");
    let task = tokio::spawn({
        let a = a.clone();
        async move {
            let _guard = a.acquire(Ask::new(Large, 9000)).await.unwrap();
            panic!("handler bug while streaming");
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn small_requests_are_admitted_while_large_ones_queue() {
    // The seed's large lane: 4 seats.
    let a = admission(
        "[lanes.large]\nmax_concurrency = 4\nceiling = 4\nmax_tokens_in_flight = 65536\n",
    );
    let mut large = Vec::new();
    for _ in 0..4 {
        large.push(a.acquire(Ask::new(Large, 8000)).await.unwrap());
    }
    let mut queued = Vec::new();
    for _ in 0..6 {
        let a = a.clone();
        queued.push(tokio::spawn(async move {
            a.acquire(Ask::new(Large, 8000)).await
        }));
    }
    settle().await;
    assert_eq!(a.snapshot().lane(Large).queue_depth, 6);
    let mut small = Vec::new();
    for _ in 0..32 {
        let guard = a.acquire(Ask::new(Small, 420)).await.unwrap();
        assert_eq!(guard.queue_wait(), Duration::ZERO);
        small.push(guard);
    }
    assert_eq!(a.snapshot().lane(Small).in_flight, 32);
    assert_eq!(a.snapshot().lane(Large).queue_depth, 6);
}

#[tokio::test(start_paused = true)]
async fn large_never_exceeds_its_max_concurrency() {
    let a = admission("[lanes.large]\nqueue_len = 100\n");
    let cap = Config::default().lanes.large.max_concurrency.get();
    let now = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let (a, now, peak) = (a.clone(), now.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let _guard = a.acquire(Ask::new(Large, 9000)).await.unwrap();
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(n, Ordering::SeqCst);
            assert!(a.snapshot().lane(Large).in_flight <= cap);
            tokio::time::sleep(Duration::from_millis(100 + (i * 37) % 500)).await;
            now.fetch_sub(1, Ordering::SeqCst);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), cap);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn reservations_that_can_never_fit_are_refused_at_once() {
    let a = admission("");
    let err = a.acquire(Ask::new(Small, 150_000)).await.unwrap_err();
    assert_eq!(
        err,
        AdmissionError::TooLarge {
            lane: Small,
            tokens: 150_000,
            limit: 115_200
        }
    );
}

#[tokio::test(start_paused = true)]
async fn fifo_is_one_queue_in_arrival_order_across_lanes() {
    let a = admission("[admission]\npolicy = \"fifo\"\n[admission.fifo]\nmax_concurrency = 1\n");
    assert_eq!(a.policy(), crate::config::Policy::Fifo);
    let running = a.acquire(Ask::new(Large, 16_000)).await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for lane in [Large, Small, Medium] {
        let (a, order) = (a.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = a.acquire(Ask::new(lane, 10)).await.unwrap();
            order.lock().unwrap().push(lane);
            drop(guard);
        }));
        settle().await;
    }
    // Under fifo a small request waits behind large ones: the baseline's head-of-line blocking.
    let s = a.snapshot();
    assert_eq!((s.queue_depth(), s.lane(Small).queue_depth), (3, 1));
    drop(running);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [Large, Small, Medium]);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn unlimited_fifo_admits_everything_at_once_and_counts_per_lane() {
    let a = admission("[admission]\npolicy = \"fifo\"\n");
    let mut guards = Vec::new();
    for i in 0..300 {
        let lane = Lane::ALL[i % 3];
        guards.push(a.acquire(Ask::new(lane, 16_000)).await.unwrap());
    }
    let s = a.snapshot();
    assert_eq!(s.lane(Large).in_flight, 100);
    assert_eq!(s.reserved_tokens(), 300 * 16_000);
    guards.clear();
    assert!(a.snapshot().is_idle());
}

/// A reload that lowers a lane's token budget below a waiting request's reservation refuses
/// that request at once, as it would refuse it on arrival, and the requests behind it go on.
/// It used to stay at the head of its queue, blocking everyone behind it until its timeout.
#[tokio::test(start_paused = true)]
async fn a_waiter_a_reload_makes_too_large_is_refused_and_the_queue_goes_on() {
    let small = |budget: u32| {
        format!(
            "[classify]\ntokenizer = \"heuristic\"\nsmall_max_work = {}\n\
             [lanes.small]\nmax_concurrency = 1\nceiling = 1\nborrow = false\n\
             max_tokens_in_flight = {budget}\nqueue_timeout_ms = 60000\n",
            budget.min(1200)
        )
    };
    let config = |toml: String| Config::from_toml_str(&toml).expect("valid");
    let a = Admission::from_config(&config(small(4000)));
    let seat = a.acquire(Ask::new(Small, 500)).await.unwrap();
    let wait = |tokens: u32| {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, tokens)).await.map(|g| g.tokens()) })
    };
    let too_large = wait(1000);
    settle().await;
    let behind = wait(300);
    settle().await;
    assert_eq!(a.snapshot().lane(Small).queue_depth, 2);

    a.set_limits(&config(small(600)), false);
    let refused = too_large.await.unwrap().unwrap_err();
    assert!(
        matches!(
            refused,
            AdmissionError::TooLarge {
                lane: Small,
                tokens: 1000,
                limit: 600
            }
        ),
        "{refused}"
    );
    drop(seat);
    assert_eq!(
        behind.await.unwrap().unwrap(),
        300,
        "the one behind is admitted"
    );
    assert!(a.snapshot().is_idle());
}
