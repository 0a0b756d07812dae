//! The prefill budget (local backend): what a long prompt waits for, what it holds while it
//! waits, and that the prefill reservation comes back at the first token or on every end.
//! Time is paused: no wall-clock assertions.

use std::time::Duration;

use super::*;
use crate::config::Config;
use crate::lane::Lane::{Large, Medium, Small};

/// Admission from the shipped defaults, a 12288-token prefill budget (long prompts: above 2048
/// tokens) and `extra` TOML (an `[admission]` in `extra` replaces this one).
fn admission(extra: &str) -> Admission {
    let admission = if extra.contains("[admission]") {
        String::new()
    } else {
        "[admission]\nprefill_budget_tokens = 12288\n".to_owned()
    };
    let toml = format!("[classify]\ntokenizer = \"heuristic\"\n{admission}{extra}");
    Admission::from_config(&Config::from_toml_str(&toml).expect("test config is valid"))
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn prefill(a: &Admission) -> u64 {
    a.snapshot().prefill_tokens
}

/// Spawns a waiter for `lane` with `work` tokens and a prompt of `prompt` tokens.
fn spawn(
    a: &Admission,
    lane: Lane,
    work: u32,
    prompt: u32,
) -> tokio::task::JoinHandle<Result<LaneGuard, AdmissionError>> {
    let a = a.clone();
    tokio::spawn(async move { a.acquire(Ask::new(lane, work).with_prefill(prompt)).await })
}

#[tokio::test(start_paused = true)]
async fn prefill_comes_back_at_the_first_token_and_the_seat_stays() {
    let a = admission("");
    let mut g = a
        .acquire(Ask::new(Large, 10_000).with_prefill(8_000))
        .await
        .unwrap();
    assert_eq!(g.prefill(), 8_000);
    assert_eq!(prefill(&a), 8_000);
    g.prefill_done();
    let s = a.snapshot();
    assert_eq!(s.prefill_tokens, 0);
    assert_eq!(
        (s.lane(Large).in_flight, s.lane(Large).reserved_tokens),
        (1, 10_000)
    );
    // Idempotent: a second first token gives nothing back twice.
    g.prefill_done();
    assert_eq!(prefill(&a), 0);
    drop(g);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn prefill_comes_back_when_the_request_ends_before_its_first_token() {
    // Error, engine error, disconnect during prefill: the guard drops without a first token.
    let a = admission("");
    let g = a
        .acquire(Ask::new(Large, 12_000).with_prefill(10_000))
        .await
        .unwrap();
    let waiter = spawn(&a, Medium, 6_000, 5_000);
    settle().await;
    assert_eq!(a.snapshot().lane(Medium).queue_depth, 1);
    drop(g);
    let w = waiter.await.unwrap().unwrap();
    assert_eq!(prefill(&a), 5_000);
    drop(w);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn long_prompts_wait_for_prefill_room_in_fifo_order_holding_no_seat() {
    let a = admission("");
    let mut first = a
        .acquire(Ask::new(Large, 10_000).with_prefill(8_000))
        .await
        .unwrap();
    let before = a.snapshot();
    // 8000 + 6000 > 12288: waits. 8000 + 3000 would fit, but it is behind the first long one.
    let b = spawn(&a, Medium, 7_000, 6_000);
    settle().await;
    let c = spawn(&a, Medium, 4_000, 3_000);
    settle().await;
    let s = a.snapshot();
    assert_eq!(s.lane(Medium).queue_depth, 2);
    // Waiting for prefill room holds no seat and no tokens, of any lane.
    for lane in Lane::ALL {
        assert_eq!(s.lane(lane).in_flight, before.lane(lane).in_flight);
        assert_eq!(
            s.lane(lane).reserved_tokens,
            before.lane(lane).reserved_tokens
        );
    }
    assert_eq!(s.prefill_tokens, 8_000);
    first.prefill_done();
    let (b, c) = (b.await.unwrap().unwrap(), c.await.unwrap().unwrap());
    assert_eq!(prefill(&a), 9_000);
    assert!(b.prefill_wait().is_some() && c.prefill_wait().is_some());
    drop((first, b, c));
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn short_prompts_never_wait_for_the_prefill_budget() {
    let a = admission("");
    let _long = a
        .acquire(Ask::new(Large, 13_000).with_prefill(12_000))
        .await
        .unwrap();
    // A long medium prompt waits for prefill room...
    let held = spawn(&a, Medium, 8_000, 6_000);
    settle().await;
    assert_eq!(a.snapshot().lane(Medium).queue_depth, 1);
    // ...a short one of the same lane goes past it, and a short small one goes at once; both
    // are counted (the budget is exceeded by short prompts only).
    let short_medium = a
        .acquire(Ask::new(Medium, 4_000).with_prefill(2_048))
        .await
        .unwrap();
    let short_small = a
        .acquire(Ask::new(Small, 600).with_prefill(500))
        .await
        .unwrap();
    assert_eq!(short_medium.queue_wait(), Duration::ZERO);
    assert_eq!(short_medium.prefill_wait(), None);
    assert_eq!(short_small.prefill_wait(), None);
    assert_eq!(prefill(&a), 12_000 + 2_048 + 500);
    assert_eq!(a.snapshot().lane(Medium).queue_depth, 1);
    held.abort();
    settle().await;
    drop((short_medium, short_small));
    assert_eq!(prefill(&a), 12_000);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_short_of_seats_still_holds_back_short_prompts_behind_it() {
    // Strict FIFO per queue is unchanged for seats: only a wait for prefill room is passed.
    let a = admission("[admission]\nprefill_budget_tokens = 12288\n[lanes.large]\nmax_concurrency = 1\nceiling = 1\n");
    let _running = a
        .acquire(Ask::new(Large, 9_000).with_prefill(1_000))
        .await
        .unwrap();
    let long = spawn(&a, Large, 9_000, 8_000);
    settle().await;
    let short = spawn(&a, Large, 9_000, 500);
    settle().await;
    assert_eq!(a.snapshot().lane(Large).queue_depth, 2);
    // Each waits in its own line: the long prompt in the line of long prompts (its wait is
    // predicted from that line's rate), the short one in the other.
    let large = *a.snapshot().lane(Large);
    assert_eq!((large.line_depth(true), large.line_depth(false)), (1, 1));
    assert!(a.waits_for_prefill(8_000) && !a.waits_for_prefill(500));
    long.abort();
    settle().await;
    let large = *a.snapshot().lane(Large);
    assert_eq!((large.line_depth(true), large.line_depth(false)), (0, 1));
    short.abort();
}

#[tokio::test(start_paused = true)]
async fn a_prompt_larger_than_the_budget_runs_alone() {
    let a = admission("[admission]\nprefill_budget_tokens = 4096\n");
    let mut short = a
        .acquire(Ask::new(Small, 600).with_prefill(500))
        .await
        .unwrap();
    let big = spawn(&a, Large, 12_000, 10_000);
    settle().await;
    assert_eq!(a.snapshot().lane(Large).queue_depth, 1);
    // Nothing else prefilling: the oversized prompt goes (never a deadlock).
    short.prefill_done();
    let mut big = big.await.unwrap().unwrap();
    assert_eq!(prefill(&a), 10_000);
    // While it prefills, another long prompt waits.
    let next = spawn(&a, Medium, 4_000, 3_000);
    settle().await;
    assert_eq!(a.snapshot().lane(Medium).queue_depth, 1);
    big.prefill_done();
    let next = next.await.unwrap().unwrap();
    assert_eq!(prefill(&a), 3_000);
    drop((short, big, next));
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn the_prefill_wait_is_measured_from_when_only_prefill_room_was_missing() {
    let a = admission("");
    let mut first = a
        .acquire(Ask::new(Large, 10_000).with_prefill(8_000))
        .await
        .unwrap();
    assert_eq!(
        first.prefill_wait(),
        Some(Duration::ZERO),
        "long, admitted at once"
    );
    let waiter = spawn(&a, Medium, 7_000, 6_000);
    settle().await;
    tokio::time::advance(Duration::from_secs(3)).await;
    first.prefill_done();
    let w = waiter.await.unwrap().unwrap();
    assert_eq!(w.prefill_wait(), Some(Duration::from_secs(3)));
    assert_eq!(w.queue_wait(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn a_long_prompt_that_times_out_waiting_for_prefill_leaves_nothing_behind() {
    let a = admission(
        "[admission]\nprefill_budget_tokens = 12288\n[lanes.medium]\nqueue_timeout_ms = 1000\n",
    );
    let first = a
        .acquire(Ask::new(Large, 12_000).with_prefill(10_000))
        .await
        .unwrap();
    let err = a
        .acquire(Ask::new(Medium, 7_000).with_prefill(6_000))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AdmissionError::Timeout { lane: Medium, .. }),
        "{err}"
    );
    drop(first);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn long_prefill_in_flight_never_exceeds_the_budget_or_goes_negative() {
    // Many long prompts of mixed sizes (some larger than the budget); first tokens come in a
    // scrambled order. After every step: the long prompts prefilling sum to at most the budget,
    // or one prompt larger than the budget prefills alone.
    let budget = 8_192u64;
    let a = admission(&format!(
        "[admission]\nprefill_budget_tokens = {budget}\n[lanes.medium]\nqueue_len = 64\nceiling = 40\n"
    ));
    let sizes = [
        3_000u32, 5_000, 2_500, 9_000, 4_000, 2_100, 7_000, 3_300, 12_000, 2_600,
    ];
    let waiters: Vec<_> = sizes
        .iter()
        .map(|&p| spawn(&a, Medium, p + 100, p))
        .collect();
    settle().await;
    let mut running: Vec<LaneGuard> = Vec::new();
    let mut pending = waiters;
    let mut step = 0usize;
    while !pending.is_empty() || running.iter().any(|g| g.prefill() > 0) {
        let mut still = Vec::new();
        for w in pending {
            if w.is_finished() {
                running.push(w.await.unwrap().unwrap());
            } else {
                still.push(w);
            }
        }
        pending = still;
        let prefilling: Vec<u32> = running
            .iter()
            .map(LaneGuard::prefill)
            .filter(|&p| p > 0)
            .collect();
        let sum: u64 = prefilling.iter().map(|&p| u64::from(p)).sum();
        assert_eq!(sum, prefill(&a), "the counter is the sum of the guards");
        assert!(
            sum <= budget || prefilling.len() == 1,
            "step {step}: {prefilling:?} prefilling over {budget}"
        );
        // A first token for one prefilling request, picked by a scrambled order.
        let live: Vec<usize> = (0..running.len())
            .filter(|&i| running[i].prefill() > 0)
            .collect();
        if let Some(&i) = live.get(step * 7 % live.len().max(1)) {
            running[i].prefill_done();
        }
        settle().await;
        step += 1;
        assert!(step < 100, "no progress");
    }
    assert_eq!(running.len(), sizes.len(), "every prompt ran");
    drop(running);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn fifo_ignores_the_prefill_budget_but_counts_it() {
    let a = admission("[admission]\npolicy = \"fifo\"\nprefill_budget_tokens = 12288\n");
    let g1 = a
        .acquire(Ask::new(Large, 12_000).with_prefill(10_000))
        .await
        .unwrap();
    let g2 = a
        .acquire(Ask::new(Large, 12_000).with_prefill(10_000))
        .await
        .unwrap();
    assert_eq!(prefill(&a), 20_000);
    assert_eq!(g2.prefill_wait(), None);
    drop((g1, g2));
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn budget_off_counts_prefill_and_nobody_waits() {
    let a = admission("[admission]\nprefill_budget_tokens = 0\n");
    let g1 = a
        .acquire(Ask::new(Large, 12_000).with_prefill(10_000))
        .await
        .unwrap();
    let g2 = a
        .acquire(Ask::new(Medium, 12_000).with_prefill(10_000))
        .await
        .unwrap();
    assert_eq!(prefill(&a), 20_000);
    assert_eq!((g1.prefill_wait(), g2.prefill_wait()), (None, None));
}
