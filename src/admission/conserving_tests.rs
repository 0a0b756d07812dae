//! Work-conserving lanes (policy `lanes`, issue 9): reservations, lending, borrowing, ceilings.

use super::*;
use crate::config::Config;
use crate::lane::Lane::{Large, Medium, Small};

/// 14 seats: small reserves 8 and never lends, medium reserves 4 and lends, large reserves 2,
/// lends, never borrows; `extra` TOML is appended.
fn admission(extra: &str) -> Admission {
    let toml = format!(
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\nseats = 14\n\
         [lanes.small]\nmax_concurrency = 8\nceiling = 14\nlend = false\nborrow = true\n\
         [lanes.medium]\nmax_concurrency = 4\nceiling = 12\nlend = true\nborrow = true\n\
         [lanes.large]\nmax_concurrency = 2\nceiling = 2\nlend = true\nborrow = false\n{extra}"
    );
    Admission::from_config(&Config::from_toml_str(&toml).expect("test config is valid"))
}

/// Takes seats in `lane` until one does not fit at once.
fn fill(a: &Admission, lane: crate::lane::Lane) -> Vec<LaneGuard> {
    let mut held = Vec::new();
    while let Some(g) = futures::FutureExt::now_or_never(a.acquire(Ask::new(lane, 100))) {
        match g {
            Ok(g) => held.push(g),
            Err(_) => break,
        }
        if held.len() > 100 {
            break;
        }
    }
    held
}

#[tokio::test(start_paused = true)]
async fn small_borrows_idle_seats_but_never_more_than_the_free_ones() {
    let a = admission("");
    // Medium and large idle and lending: small may use every seat (its ceiling is 14).
    let small = fill(&a, Small);
    assert_eq!(small.len(), 14);
    assert_eq!(a.snapshot().lane(Small).in_flight, 14);
}

#[tokio::test(start_paused = true)]
async fn borrowing_happens_only_while_the_lender_is_idle() {
    let a = admission("");
    let medium = fill(&a, Medium);
    // Medium took its 4 and borrowed what small does not protect: 14 - 8 (small's idle
    // reservation) = 6 seats in all, its own 4 and large's 2.
    assert_eq!(medium.len(), 6, "small's reservation is never lent");
    // Small still has all 8 of its reservation, and nothing to borrow: medium is busy.
    let small = fill(&a, Small);
    assert_eq!(small.len(), 8);
    drop(medium);
    // Medium idle again: small may borrow the seats it held.
    let more = fill(&a, Small);
    assert_eq!(more.len(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_lender_gets_its_seat_back_for_its_next_request() {
    let a = admission("");
    let small = fill(&a, Small);
    assert_eq!(
        small.len(),
        14,
        "small borrowed medium's and large's idle seats"
    );
    // Medium's next request gets its reserved seat at once, though every seat is taken: the
    // borrowed seats are not pre-empted, the total briefly exceeds 14.
    let m = a
        .acquire(Ask::new(Medium, 100))
        .await
        .expect("the owner's seat comes back");
    let l = a
        .acquire(Ask::new(Large, 100))
        .await
        .expect("the owner's seat comes back");
    assert_eq!(a.snapshot().in_flight(), 16);
    // While over, nobody borrows.
    assert!(
        futures::FutureExt::now_or_never(a.acquire(Ask::new(Small, 100))).is_none(),
        "small waits"
    );
    drop((m, l, small));
    assert!(a.snapshot().is_idle(), "nothing leaks");
}

#[tokio::test(start_paused = true)]
async fn ceilings_and_token_budgets_always_hold() {
    // Large never borrows: its ceiling is its reservation.
    let a = admission("");
    let large = fill(&a, Large);
    assert_eq!(large.len(), 2);
    // A token budget binds before the seats do.
    let toml_budget = admission_with_small_tokens(1000);
    let mut held = Vec::new();
    while let Some(Ok(g)) =
        futures::FutureExt::now_or_never(toml_budget.acquire(Ask::new(Small, 300)))
    {
        held.push(g);
    }
    assert_eq!(
        held.len(),
        3,
        "3 x 300 <= 1000 < 4 x 300, although seats are free"
    );
    drop(held);
    assert!(toml_budget.snapshot().is_idle());
}

fn admission_with_small_tokens(tokens: u64) -> Admission {
    let mut config = Config::from_toml_str(
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\n",
    )
    .unwrap();
    config.lanes.small.max_tokens_in_flight = std::num::NonZeroU64::new(tokens).unwrap();
    Admission::from_config(&config)
}

#[tokio::test(start_paused = true)]
async fn strict_keeps_the_seed_caps() {
    let strict = Admission::from_config(
        &Config::from_toml_str(
            "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"strict\"\n",
        )
        .unwrap(),
    );
    assert_eq!(strict.policy(), crate::config::Policy::Strict);
    let small = fill(&strict, Small);
    assert_eq!(small.len(), 32, "the seed's literal cap");
}

/// Background work (jobs) takes only the large lane's own idle seats, never while an
/// interactive large request waits, and hears about every seat that comes back.
#[tokio::test(start_paused = true)]
async fn background_work_takes_only_idle_seats_of_its_own_lane() {
    let a = admission("");
    let Admission::Local(local) = &a else {
        unreachable!("in-process admission")
    };
    let mut freed = a.freed().expect("the local backend runs background work");
    freed.borrow_and_update();
    let one = a.try_acquire_idle(Large, 100, 0).expect("an idle own seat");
    let two = a
        .try_acquire_idle(Large, 100, 0)
        .expect("the second own seat");
    // Medium lends and seats are free, but background work never borrows.
    assert!(a.try_acquire_idle(Large, 100, 0).is_none());
    assert_eq!(a.snapshot().lane(Large).in_flight, 2);
    drop(one);
    assert!(
        freed.has_changed().unwrap(),
        "a seat came back: the scheduler wakes"
    );
    // An interactive large request waits for tokens (`big` holds nearly all of the lane's
    // budget): background work may not pass it, though a seat is free.
    let budget = local_large_budget();
    let big = a
        .try_acquire_idle(Large, (budget - 200) as u32, 0)
        .expect("fits");
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(Ask::new(Large, 300)).await })
    };
    while a.snapshot().lane(Large).queue_depth == 0 {
        tokio::task::yield_now().await;
    }
    drop(two);
    assert_eq!(
        a.snapshot().lane(Large).queue_depth,
        1,
        "still short of tokens"
    );
    assert!(
        local.try_acquire_idle(Large, 1, 0).is_none(),
        "an interactive request is waiting in the large lane"
    );
    drop(big);
    let interactive = waiter.await.unwrap().expect("the waiter goes first");
    assert!(a.try_acquire_idle(Large, 100, 0).is_some());
    drop(interactive);
    assert!(a.snapshot().is_idle());
}

/// The large lane's token budget in [`admission`]'s config.
fn local_large_budget() -> u64 {
    Config::default().lanes.large.max_tokens_in_flight.get()
}

/// A request growing its reservation where it is (its output past what it reserved) keeps its
/// seat and needs only tokens: with lent seats taken back (more seats in use than `seats`), a
/// medium request on a borrowed seat was refused its growth, and cut.
#[tokio::test(start_paused = true)]
async fn growing_where_it_is_needs_tokens_not_a_fresh_seat() {
    let a = admission("");
    let mut medium = fill(&a, Medium);
    assert_eq!(medium.len(), 6, "its own 4 and large's 2");
    let large = [
        a.acquire(Ask::new(Large, 100)).await.unwrap(),
        a.acquire(Ask::new(Large, 100)).await.unwrap(),
    ];
    // Large took its seats back: 8 taken and small's idle 8 held back, 16 of 14 seats.
    assert_eq!(a.snapshot().in_flight(), 8);
    for g in &mut medium {
        let grown = g.tokens() + 100;
        assert_eq!(g.promote(Medium, grown).await, Move::Done);
        assert_eq!(g.tokens(), grown);
    }
    assert_eq!(a.snapshot().lane(Medium).reserved_tokens, 6 * 200);
    // A move to another lane still needs a seat there: large is at its ceiling.
    assert_eq!(medium[0].promote(Large, 1_000).await, Move::Full);
    drop((medium, large));
    assert!(a.snapshot().is_idle(), "nothing leaks");
}
