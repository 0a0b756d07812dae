//! Pre-emptible seats (`jobs.preempt`, in-process admission): background work may take an idle
//! seat of any lane, and gives it back the moment an interactive request needs it.
//!
//! - A job takes a seat with [`crate::admission::LocalAdmission::try_acquire_preemptible`]: the
//!   large lane's own seat first, then medium's, then small's, each only when it is idle (one of
//!   the lane's own seats free, nobody waiting in any lane) and the job's tokens fit
//!   the large lane's and the global budgets (its tokens always count in large: the seat is
//!   borrowed, the reservation is still a review's).
//! - It then holds a [`Preemptible`] handle. Whenever admission dispatches (an arrival queued, a
//!   seat or prefill room back), it looks at its waiters in queue order, counting the seats of
//!   borrowers already asked to leave as free: a waiter that does not fit even so asks the
//!   borrower that loses least to leave ([`victims`]), reason `seat`, `tokens` or `prefill`
//!   (what it lacked). A waiter that no borrower's leaving would let in (its lane is at its own
//!   limits) asks one all the same, reason `pressure`: it waits for the engine's time, which
//!   background work is taking; but not when a borrower still in its prefill grace would let it
//!   in (it waits for that one's first token, where it asks it). So while interactive requests wait, jobs leave, one per waiter
//!   and dispatch, and no job starts or resumes while any request waits.
//! - The borrower that loses least: the one whose leaving alone lets the waiter in, with the
//!   fewest generated tokens (ties: the youngest); when no single one suffices, those in that
//!   order until the waiter fits. A borrower is never asked twice, and never at all when it used
//!   up its pre-emptions (`jobs.max_preemptions`: it keeps its seat, and so takes only seats of
//!   its own lane, large, from then on) or when its prefill is within
//!   `jobs.preempt_prefill_grace_tokens` of done (estimated from the time since it was sent at the
//!   prefill rate measured on the previous borrowers' first tokens; unknown rate: its whole prompt
//!   is left). A borrower spared by the grace is asked at its first token if the waiter still
//!   waits (the first token dispatches again).
//! - After an interactive request last waited in a queue, no pre-emptible work takes a seat for
//!   `jobs.preempt_cooldown_ms` (the work refused meanwhile is woken when it ends).
//! - Asking is a signal ([`Preemptible::preempted`]); the job's runner drops its stream (the
//!   engine aborts it, the seat comes back through the guard, as on any other path) and resumes
//!   the answer as a continuation when a seat is idle again.
//! - With the Redis backend the same rules run fleet-wide in the quota's scripts (see
//!   `crate::admission::redis`, "Pre-emption"), with one difference: the borrower that loses
//!   least is the youngest (the scripts do not see generated tokens). The handle is the same;
//!   the ask reaches it through the quota's `leave` channel.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lane::Lane;

/// Why a borrower was asked to leave: the lane of the request that needed its seat, and what
/// that request lacked (`seat`, `tokens` or `prefill` room).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cause {
    /// The waiting request's lane.
    pub lane: Lane,
    /// `seat`, `tokens` or `prefill`.
    pub reason: &'static str,
}

impl Cause {
    /// Every reason a borrower may be asked to leave for.
    pub const REASONS: [&'static str; 5] = ["seat", "tokens", "prefill", "pressure", "counted"];

    /// The run itself found that the engine counted its prompt well past the estimate it
    /// borrowed its seat with: a borrowed seat cannot grow where it is, so it leaves, and its
    /// continuation reserves the engine's count.
    pub fn counted(lane: Lane) -> Self {
        Self {
            lane,
            reason: "counted",
        }
    }
}

/// A pre-emptible seat's handle, shared by its holder (the job's run) and admission.
#[derive(Debug)]
pub struct Preemptible {
    signal: CancellationToken,
    cause: Mutex<Option<Cause>>,
    /// Whether it may still be pre-empted (`jobs.max_preemptions` not used up).
    eligible: bool,
    /// Output tokens generated so far (what a pre-emption would lose the least of).
    generated: AtomicU32,
    /// Its prefill ended (first token).
    prefilled: AtomicBool,
}

impl Preemptible {
    /// A handle for a run that may (`eligible`) or may no longer be pre-empted.
    pub fn new(eligible: bool) -> Arc<Self> {
        Arc::new(Self {
            signal: CancellationToken::new(),
            cause: Mutex::new(None),
            eligible,
            generated: AtomicU32::new(0),
            prefilled: AtomicBool::new(false),
        })
    }

    /// The run generated `n` output tokens so far.
    pub fn generated(&self, n: u32) {
        self.generated.store(n, Ordering::Relaxed);
    }

    /// Resolves when admission asks the seat back.
    pub fn preempted(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.signal.clone().cancelled_owned()
    }

    /// Whether it may still be pre-empted (then it may also borrow other lanes' seats).
    pub fn is_eligible(&self) -> bool {
        self.eligible
    }

    /// Whether it was asked to leave.
    pub fn is_preempted(&self) -> bool {
        self.signal.is_cancelled()
    }

    /// Why it was asked to leave.
    pub fn cause(&self) -> Option<Cause> {
        *self.cause.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks it to leave (once; a second ask keeps the first cause): admission for a waiter,
    /// or its own run ([`Cause::counted`]).
    pub fn ask(&self, cause: Cause) {
        if !self.signal.is_cancelled() {
            self.preempt(cause);
        }
    }

    /// Asks it to leave (once).
    fn preempt(&self, cause: Cause) {
        *self.cause.lock().unwrap_or_else(PoisonError::into_inner) = Some(cause);
        self.signal.cancel();
    }
}

/// A pre-emptible seat held now (admission's record of it).
#[derive(Debug)]
pub(super) struct Borrower {
    pub id: u64,
    /// The lane whose seat it holds.
    pub seat: Lane,
    /// Its tokens, counted in the large lane.
    pub tokens: u32,
    /// Prefill reservation still held (0 after its first token).
    pub prefill: u32,
    pub since: Instant,
    pub handle: Arc<Preemptible>,
}

impl Borrower {
    /// Its first token came: no prefill left.
    pub fn prefilled(&mut self) {
        self.prefill = 0;
        self.handle.prefilled.store(true, Ordering::Relaxed);
    }

    /// Whether it is spared for now: still prefilling, within `grace` tokens of done at
    /// `rate` tokens/s (`None`: unknown, its whole prompt is left).
    fn in_grace(&self, now: Instant, rate: Option<f64>, grace: u32) -> bool {
        if self.prefill == 0 || self.handle.prefilled.load(Ordering::Relaxed) {
            return false;
        }
        let done = rate.map_or(0.0, |r| r * (now - self.since).as_secs_f64());
        let left = (f64::from(self.prefill) - done).max(0.0);
        left <= f64::from(grace)
    }

    /// What leaving costs it: output tokens generated, then (ties) the older loses more.
    fn loss(&self) -> (u32, std::cmp::Reverse<Instant>) {
        (
            self.handle.generated.load(Ordering::Relaxed),
            std::cmp::Reverse(self.since),
        )
    }

    /// Asks it to leave for a request of `cause`.
    pub fn preempt(&self, cause: Cause) {
        self.handle.preempt(cause);
    }

    /// Whether it was asked to leave already (its seat counts as free).
    pub fn leaving(&self) -> bool {
        self.handle.is_preempted()
    }
}

/// The borrowers (indices into `borrowers`) that may be asked to leave now, least loss first.
pub(super) fn candidates(
    borrowers: &[Borrower],
    now: Instant,
    rate: Option<f64>,
    grace: u32,
) -> Vec<usize> {
    let mut c: Vec<usize> = (0..borrowers.len())
        .filter(|&i| {
            let b = &borrowers[i];
            b.handle.eligible && !b.leaving() && !b.in_grace(now, rate, grace)
        })
        .collect();
    c.sort_by_key(|&i| borrowers[i].loss());
    c
}

/// Which of `candidates` (least loss first) leave for one waiter: the first whose leaving alone
/// lets it in (`fits_without` of that one), else the shortest prefix in that order that does;
/// `None` when even all of them do not.
pub(super) fn victims(
    candidates: &[usize],
    fits_without: impl Fn(&[usize]) -> bool,
) -> Option<Vec<usize>> {
    if let Some(&one) = candidates.iter().find(|&&c| fits_without(&[c])) {
        return Some(vec![one]);
    }
    (2..=candidates.len())
        .map(|n| &candidates[..n])
        .find(|set| fits_without(set))
        .map(<[usize]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn borrower(id: u64, generated: u32, since: Instant, eligible: bool) -> Borrower {
        let handle = Preemptible::new(eligible);
        handle.generated(generated);
        Borrower {
            id,
            seat: Lane::Small,
            tokens: 100,
            prefill: 0,
            since,
            handle,
        }
    }

    #[test]
    fn the_borrower_that_loses_least_goes_first() {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(1);
        let b = vec![
            borrower(0, 50, t0, true),
            borrower(1, 10, t0, true),
            // As few tokens as 1, younger: it loses least.
            borrower(2, 10, t1, true),
            // Used up its pre-emptions: it keeps its seat.
            borrower(3, 0, t1, false),
        ];
        assert_eq!(candidates(&b, t1, None, 0), vec![2, 1, 0]);
        b[2].preempt(Cause {
            lane: Lane::Small,
            reason: "seat",
        });
        // Asked once already: never again.
        assert_eq!(candidates(&b, t1, None, 0), vec![1, 0]);
        assert_eq!(b[2].handle.cause().unwrap().reason, "seat");
    }

    #[test]
    fn one_that_suffices_is_preferred_to_several() {
        // Only borrower 0 alone lets the waiter in (say, it holds the waiter's lane's seat).
        assert_eq!(victims(&[2, 1, 0], |set| set.contains(&0)), Some(vec![0]));
        // Two are needed: the least losses first.
        assert_eq!(victims(&[2, 1, 0], |set| set.len() >= 2), Some(vec![2, 1]));
        assert_eq!(victims(&[2, 1, 0], |_| false), None);
    }

    #[test]
    fn a_prefill_near_its_end_is_spared() {
        let now = Instant::now();
        let mut b = borrower(0, 0, now, true);
        b.prefill = 4_000;
        let later = now + std::time::Duration::from_secs(1);
        // 1,000 tokens/s: 3,000 left after 1 s; spared under a grace of 3,000, not of 2,999.
        assert!(b.in_grace(later, Some(1_000.0), 3_000));
        assert!(!b.in_grace(later, Some(1_000.0), 2_999));
        // Unknown rate: the whole prompt is left.
        assert!(!b.in_grace(later, None, 3_999));
        assert!(b.in_grace(later, None, 4_000));
        // At its first token it has no prefill left to spare.
        b.prefilled();
        assert!(!b.in_grace(later, Some(1_000.0), u32::MAX));
        assert!(candidates(&[b], later, Some(1_000.0), u32::MAX) == vec![0]);
    }
}
