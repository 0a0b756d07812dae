//! Pre-emptible seats in process (`jobs.preempt`, issue 35): background work takes any lane's
//! idle seats and is asked to leave, the one that loses least first, when an interactive request
//! finds no seat; never beyond `jobs.max_preemptions`, never in the last tokens of its prefill;
//! every counter back to zero after a storm.

use std::sync::Arc;
use std::time::Duration;

use super::preempt::Preemptible;
use super::*;
use crate::config::Config;
use crate::lane::Lane::{Large, Medium, Small};

/// Small reserves 2 seats, medium 2, large 1; nothing borrows; `extra` TOML is appended.
fn admission(extra: &str) -> Admission {
    let toml = format!(
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\nseats = 5\n\
         [lanes.small]\nmax_concurrency = 2\nceiling = 2\nlend = false\nborrow = false\n\
         queue_timeout_ms = 60000\n\
         [lanes.medium]\nmax_concurrency = 2\nceiling = 2\nlend = false\nborrow = false\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\nlend = false\nborrow = false\n{extra}"
    );
    Admission::from_config(&Config::from_toml_str(&toml).expect("test config is valid"))
}

/// A job's seat: its guard and its handle.
fn job(a: &Admission, prompt: u32, eligible: bool) -> Option<(LaneGuard, Arc<Preemptible>)> {
    let handle = Preemptible::new(eligible);
    let guard = a.try_acquire_preemptible(Large, 1_000, prompt, &handle)?;
    Some((guard, handle))
}

/// Seat counts of every lane.
fn seats(a: &Admission) -> [u32; 3] {
    Lane::ALL.map(|l| a.snapshot().lane(l).in_flight)
}

/// Lets spawned waiters run until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never: {what}");
}

#[tokio::test(start_paused = true)]
async fn jobs_take_every_lanes_idle_seats_largest_lane_first() {
    let a = admission("");
    let jobs: Vec<_> = (0..5).map_while(|_| job(&a, 0, true)).collect();
    assert_eq!(
        jobs.len(),
        5,
        "large's seat, then medium's two, then small's two"
    );
    assert_eq!(seats(&a), [2, 2, 1]);
    // Their tokens all count in the large lane.
    assert_eq!(a.snapshot().lane(Large).reserved_tokens, 5_000);
    assert_eq!(a.snapshot().lane(Small).reserved_tokens, 0);
    assert!(job(&a, 0, true).is_none(), "no idle seat left");
    drop(jobs);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn an_arrival_without_a_seat_makes_the_borrower_that_loses_least_leave() {
    let a = admission("");
    let jobs: Vec<_> = (0..5).map_while(|_| job(&a, 0, true)).collect();
    // Small's two seats: jobs 3 and 4. Job 4 generated more; job 3 loses least.
    jobs[3].1.generated(10);
    jobs[4].1.generated(500);
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, 100)).await })
    };
    until("a borrower is asked to leave", || {
        jobs.iter().any(|(_, h)| h.is_preempted())
    })
    .await;
    let asked: Vec<usize> = (0..5).filter(|&i| jobs[i].1.is_preempted()).collect();
    assert_eq!(
        asked,
        vec![3],
        "only the one in small's seat with the fewest tokens"
    );
    let cause = jobs[3].1.cause().unwrap();
    assert_eq!((cause.lane, cause.reason), (Small, "seat"));
    // The job leaves (its runner drops the guard): the arrival takes its seat.
    let mut jobs = jobs;
    drop(jobs.remove(3));
    let guard = waiter.await.unwrap().expect("admitted on the freed seat");
    assert!(guard.made_room(), "admitted thanks to a pre-emption");
    assert_eq!(seats(&a), [2, 2, 1]);
    // A second arrival asks the other small borrower, not one holding another lane's seat.
    let second = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, 100)).await })
    };
    until("the other small borrower is asked", || {
        jobs[3].1.is_preempted()
    })
    .await;
    assert!(jobs[..3].iter().all(|(_, h)| !h.is_preempted()));
    drop(jobs.remove(3));
    let second = second.await.unwrap().unwrap();
    drop((guard, second, jobs));
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn a_job_that_may_no_longer_be_preempted_takes_only_its_own_lanes_seats() {
    let a = admission("");
    let own = job(&a, 0, false).expect("large's own seat");
    assert!(
        job(&a, 0, false).is_none(),
        "it would hold a borrowed seat against its owners"
    );
    assert_eq!(seats(&a), [0, 0, 1]);
    let borrower = job(&a, 0, true).expect("an eligible job borrows");
    assert_eq!(seats(&a), [0, 1, 1]);
    drop((own, borrower));
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn a_job_that_used_up_its_preemptions_keeps_its_seat() {
    let a = admission("");
    // Large's seat: used up its pre-emptions; medium's and small's: pre-emptible.
    let mut jobs: Vec<_> = job(&a, 0, false).into_iter().collect();
    jobs.extend((0..4).map_while(|_| job(&a, 0, true)));
    assert_eq!(seats(&a), [2, 2, 1]);
    for (i, n) in [(1, 30), (2, 20), (3, 5), (4, 10)] {
        jobs[i].1.generated(n);
    }
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move {
            let ask = Ask::new(Large, 100);
            tokio::time::timeout(Duration::from_secs(5), a.acquire(ask)).await
        })
    };
    assert!(waiter.await.unwrap().is_err(), "nobody could leave for it");
    assert!(!jobs[0].1.is_preempted(), "the large seat's job keeps it");
    // The others' seats would not let it in, but their work takes the engine's time it waits
    // for: the one of them that loses least leaves, for `pressure`.
    let asked: Vec<usize> = (0..5).filter(|&i| jobs[i].1.is_preempted()).collect();
    assert_eq!(asked, vec![3]);
    assert_eq!(jobs[3].1.cause().unwrap().reason, "pressure");
    drop(jobs);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn a_prefill_within_the_grace_is_preempted_only_after_its_first_token() {
    let a = admission("[jobs]\npreempt_prefill_grace_tokens = 500\n");
    // Large's seat and medium's are busy with interactive work; then jobs take small's.
    let busy: Vec<LaneGuard> = [Large, Medium, Medium]
        .into_iter()
        .map(|l| {
            futures::FutureExt::now_or_never(a.acquire(Ask::new(l, 100)))
                .unwrap()
                .unwrap()
        })
        .collect();
    // A short prompt (within the grace: the rate is not known yet, its whole prompt is left)
    // and a long one.
    let (mut short, short_h) = job(&a, 400, true).unwrap();
    let (long, long_h) = job(&a, 4_000, true).unwrap();
    long_h.generated(0);
    short_h.generated(0);
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, 100)).await })
    };
    until("the long prefill is asked", || long_h.is_preempted()).await;
    assert!(!short_h.is_preempted(), "the short prefill is nearly done");
    drop(long);
    let first = waiter.await.unwrap().unwrap();
    // Another arrival: the only borrower left is in its grace, until its first token.
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, 100)).await })
    };
    until("the arrival waits", || {
        a.snapshot().lane(Small).queue_depth == 1
    })
    .await;
    assert!(!short_h.is_preempted());
    short.prefill_done();
    assert!(short_h.is_preempted(), "asked at its first token");
    drop(short);
    let second = waiter.await.unwrap().unwrap();
    drop((first, second, busy));
    assert!(a.snapshot().is_idle());
}

/// A waiter whose seat a job in its prefill grace holds waits for that job's first token: it
/// asks no other job to leave ("pressure") meanwhile, though they are past their grace.
#[tokio::test(start_paused = true)]
async fn a_borrower_in_its_grace_is_waited_for_and_no_other_is_asked_for_nothing() {
    let a = admission("[jobs]\npreempt_prefill_grace_tokens = 500\n");
    // Large's seat and medium's two are jobs past their prefill; small's are jobs in their grace.
    let mut past: Vec<_> = (0..3).map_while(|_| job(&a, 0, true)).collect();
    let mut spared: Vec<_> = (0..2).map_while(|_| job(&a, 400, true)).collect();
    assert_eq!(seats(&a), [2, 2, 1]);
    for (g, _) in &mut past {
        g.prefill_done();
    }
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, 100)).await })
    };
    until("the arrival waits", || {
        a.snapshot().lane(Small).queue_depth == 1
    })
    .await;
    // A job that would not let it in ends (admission dispatches again): still nobody asked.
    drop(past.pop());
    assert!(
        past.iter().chain(&spared).all(|(_, h)| !h.is_preempted()),
        "nobody is asked while a job in its grace holds the seat"
    );
    spared[0].0.prefill_done();
    assert!(spared[0].1.is_preempted(), "asked at its first token");
    assert_eq!(spared[0].1.cause().unwrap().reason, "seat");
    drop(spared.remove(0));
    let guard = waiter.await.unwrap().unwrap();
    assert!(past.iter().all(|(_, h)| !h.is_preempted()));
    drop((guard, past, spared));
    assert!(a.snapshot().is_idle());
}

/// The grace's prefill rate comes from first tokens only: a prefill cut short (its guard dropped
/// before its first token) says nothing of it.
#[tokio::test(start_paused = true)]
async fn a_cut_prefill_does_not_teach_the_grace_a_rate() {
    let a = admission("[jobs]\npreempt_prefill_grace_tokens = 500\n");
    let busy: Vec<LaneGuard> = [Large, Medium, Medium, Small]
        .into_iter()
        .map(|l| {
            futures::FutureExt::now_or_never(a.acquire(Ask::new(l, 100)))
                .unwrap()
                .unwrap()
        })
        .collect();
    // Cut after 1 s: read as a first token, it would teach a rate of 4,000 tokens/s.
    let (cut, _) = job(&a, 4_000, true).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(cut);
    let (_job, h) = job(&a, 4_000, true).unwrap();
    tokio::time::advance(Duration::from_millis(900)).await;
    // At 4,000 tokens/s it would be 400 tokens from done, inside the grace; with no rate known
    // its whole prompt is left, so it is asked.
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, 100)).await })
    };
    until("the job is asked", || h.is_preempted()).await;
    drop((_job, busy));
    drop(waiter.await.unwrap());
    assert!(a.snapshot().is_idle());
}

/// Many arrivals and jobs coming and going in every order: seats never above the lanes'
/// reservations, and every counter back to zero.
#[tokio::test(start_paused = true)]
async fn every_counter_is_back_to_zero_after_a_preemption_storm() {
    let a = admission("");
    let mut rng = 7u64;
    let mut next = move |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    let mut jobs = Vec::new();
    let mut waiters = Vec::new();
    let mut held = Vec::new();
    for _ in 0..400 {
        match next(4) {
            0 => jobs.extend(job(&a, next(2_000) as u32, next(4) > 0)),
            1 => {
                let lane = Lane::ALL[next(3) as usize];
                let a = a.clone();
                waiters.push(tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_secs(1), a.acquire(Ask::new(lane, 100)))
                        .await
                }));
            }
            2 => {
                // The runners of jobs asked to leave drop their guards; others finish too.
                jobs.retain(|(_, h): &(LaneGuard, Arc<Preemptible>)| !h.is_preempted());
                if !jobs.is_empty() && next(3) == 0 {
                    let (mut g, _) = jobs.remove(next(jobs.len() as u64) as usize);
                    g.prefill_done();
                }
            }
            _ => {
                if !held.is_empty() {
                    drop(held.swap_remove(next(held.len() as u64) as usize));
                }
                for w in std::mem::take(&mut waiters) {
                    if w.is_finished() {
                        if let Ok(Ok(g)) = w.await.unwrap() {
                            held.push(g);
                        }
                    } else {
                        waiters.push(w);
                    }
                }
            }
        }
        tokio::task::yield_now().await;
        let [s, m, l] = seats(&a);
        assert!(s <= 2 && m <= 2 && l <= 1, "{:?}", seats(&a));
    }
    drop(jobs);
    for w in waiters {
        drop(w.await.unwrap());
    }
    drop(held);
    assert!(a.snapshot().is_idle(), "{:?}", a.snapshot());
}

/// Small's two seats taken by questions.
fn fill_small(a: &Admission) -> Vec<LaneGuard> {
    (0..2)
        .map(|_| {
            futures::FutureExt::now_or_never(a.acquire(Ask::new(Small, 100)))
                .expect("a free seat")
                .expect("admitted")
        })
        .collect()
}

/// A third question queues for small, then gets a seat when `questions` end; its guard.
async fn one_question_waits(a: &Admission, questions: Vec<LaneGuard>) -> LaneGuard {
    one_question_waits_for(a, questions, Duration::ZERO).await
}

/// [`one_question_waits`], the questions ending `wait` after it queued (paused time).
async fn one_question_waits_for(
    a: &Admission,
    questions: Vec<LaneGuard>,
    wait: Duration,
) -> LaneGuard {
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Small, 100)).await })
    };
    until("the question queues", || {
        a.snapshot().lane(Small).queue_depth == 1
    })
    .await;
    assert!(job(a, 0, true).is_none(), "no job borrows while it waits");
    tokio::time::advance(wait).await;
    drop(questions);
    waiter.await.unwrap().expect("admitted")
}

#[tokio::test(start_paused = true)]
async fn no_job_borrows_within_the_cooldown_after_a_request_waited_and_one_is_woken_at_its_end() {
    let a = admission("[jobs]\npreempt = true\npreempt_cooldown_ms = 5000\n");
    let mut freed = a.freed().expect("in process");
    // No request waited yet: a job borrows at once.
    drop(job(&a, 0, true).expect("nobody waited yet"));
    let third = one_question_waits(&a, fill_small(&a)).await;
    // It waited just now: no job borrows, nor 4.9 s later.
    assert!(job(&a, 0, true).is_none(), "within the cool-down");
    tokio::time::advance(Duration::from_millis(4_900)).await;
    freed.borrow_and_update();
    assert!(job(&a, 0, true).is_none(), "still within the cool-down");
    // At its end the background work refused meanwhile is woken, and borrows.
    tokio::time::advance(Duration::from_millis(200)).await;
    until("the wake at the cool-down's end", || {
        freed.has_changed().unwrap_or(false)
    })
    .await;
    let after = job(&a, 0, true).expect("the cool-down is over");
    drop((third, after));
    assert!(a.snapshot().is_idle());
}

/// A question that waited longer than the cool-down: the cool-down counts from its admission,
/// so a job does not borrow the moment it got its seat (it counted from the queueing, and was
/// over by then).
#[tokio::test(start_paused = true)]
async fn the_cooldown_counts_from_a_long_waits_admission() {
    let a = admission("[jobs]\npreempt = true\npreempt_cooldown_ms = 5000\n");
    let third = one_question_waits_for(&a, fill_small(&a), Duration::from_secs(6)).await;
    assert!(
        job(&a, 0, true).is_none(),
        "within the cool-down after its admission"
    );
    drop(third);
    assert!(a.snapshot().is_idle());
}

/// A lane that never waits (`queue_len = 0`): a request refused there asks the borrowed seats
/// it could have had back (none waits to ask for them: they stayed lent, and every question
/// got a 429 while the jobs ran), and starts the cool-down.
#[tokio::test(start_paused = true)]
async fn a_request_refused_where_it_may_not_wait_asks_borrowed_seats_back() {
    let toml =
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\nseats = 5\n\
         [lanes.small]\nmax_concurrency = 2\nceiling = 2\nlend = false\nborrow = false\n\
         queue_len = 0\n\
         [lanes.medium]\nmax_concurrency = 2\nceiling = 2\nlend = false\nborrow = false\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\nlend = false\nborrow = false\n\
         [jobs]\npreempt = true\npreempt_cooldown_ms = 5000\n";
    let a = Admission::from_config(&Config::from_toml_str(toml).expect("test config is valid"));
    let jobs: Vec<_> = std::iter::from_fn(|| job(&a, 0, true)).take(10).collect();
    assert_eq!(seats(&a), [2, 2, 1], "jobs hold every seat");
    let refused =
        futures::FutureExt::now_or_never(a.acquire(Ask::new(Small, 100))).expect("never waits");
    assert!(matches!(refused, Err(AdmissionError::QueueFull { .. })));
    let asked = jobs.iter().filter(|(_, h)| h.is_preempted()).count();
    assert_eq!(asked, 1, "one small seat asked back");
    assert!(job(&a, 0, true).is_none(), "within the cool-down");
    drop(jobs);
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn without_a_cooldown_a_job_borrows_as_soon_as_nobody_waits() {
    let a = admission("[jobs]\npreempt = true\npreempt_cooldown_ms = 0\n");
    let third = one_question_waits(&a, fill_small(&a)).await;
    let after = job(&a, 0, true).expect("nobody waits and the cool-down is off");
    drop((third, after));
    assert!(a.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn a_continuation_waits_at_the_head_of_its_lane_even_when_the_queue_is_full() {
    // The helper's TOML ends in `[lanes.large]`.
    let a = admission("queue_len = 2\n");
    let seat = job(&a, 0, false).expect("large's seat");
    let queued = |a: &Admission| a.snapshot().lane(Large).queue_depth;
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { a.acquire(Ask::new(Large, 100)).await })
        })
        .collect();
    until("two large requests queue", || queued(&a) == 2).await;
    let full = futures::FutureExt::now_or_never(a.acquire(Ask::new(Large, 100)));
    assert!(
        matches!(full, Some(Err(AdmissionError::QueueFull { .. }))),
        "the queue is full for a new request"
    );
    let continuation = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Large, 100).continuing()).await })
    };
    until("the continuation queues", || queued(&a) == 3).await;
    drop(seat);
    let guard = continuation.await.unwrap().expect("admitted first");
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "the requests that never ran wait behind it"
    );
    drop(guard);
    for w in waiters {
        drop(w.await.unwrap().expect("admitted in turn"));
    }
    assert!(a.snapshot().is_idle());
}

/// A running request moving to a lane whose seats jobs hold asks one of them to leave, once,
/// and waits for that room ([`Move::Asked`]); a move no job's leaving can let in (the lane
/// held by interactive work) asks none: tried again every few milliseconds while a stream
/// waits, it asked one more job each time.
#[tokio::test(start_paused = true)]
async fn a_move_asks_a_job_only_where_its_leaving_lets_it_in_and_once() {
    let a = admission("");
    let large = a.acquire(Ask::new(Large, 1_000)).await.unwrap();
    let jobs: Vec<_> = (0..2).map_while(|_| job(&a, 0, true)).collect();
    assert_eq!(seats(&a), [0, 2, 1], "the jobs hold medium's seats");
    let mut question = a.acquire(Ask::new(Small, 100)).await.unwrap();
    let asked = || jobs.iter().filter(|(_, h)| h.is_preempted()).count();
    assert_eq!(question.promote(Medium, 2_000).await, Move::Asked);
    assert_eq!(asked(), 1);
    // Tried again while that one leaves: nobody else is asked.
    for _ in 0..10 {
        assert_eq!(question.promote(Medium, 2_000).await, Move::Asked);
    }
    assert_eq!(asked(), 1);
    // Large is held by a question: no job's leaving lets it in, so none is asked.
    for _ in 0..10 {
        assert_eq!(question.promote(Large, 5_000).await, Move::Full);
    }
    assert_eq!(asked(), 1);
    // The job leaves: the move is made.
    let (leaving, rest): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|(_, h)| h.is_preempted());
    drop(leaving);
    assert_eq!(question.promote(Medium, 2_000).await, Move::Done);
    assert_eq!(question.lane(), Medium);
    drop((question, rest, large));
    assert!(a.snapshot().is_idle(), "nothing leaks");
}

/// An answer that may no longer be pre-empted (`jobs.max_preemptions = 0`, or a continuation
/// past it) borrows nothing, as with the Redis backend: it queues for a seat of its own lane,
/// which can grow mid-stream, where a borrowed seat's growth is cut.
#[tokio::test]
async fn an_answer_that_may_not_be_preempted_borrows_nothing() {
    let a = admission("");
    assert!(a
        .borrow(Large, 1_000, 0, &Preemptible::new(false))
        .await
        .is_none());
    assert_eq!(seats(&a), [0, 0, 0]);
    let guard = a.borrow(Large, 1_000, 0, &Preemptible::new(true)).await;
    assert!(guard.is_some());
    drop(guard);
    assert_eq!(seats(&a), [0, 0, 0]);
}
