//! The token budget and seat check: the limits a policy enforces, taken from config, what "fits"
//! means (a seat free and the tokens within the lane and global budgets) and which queue a lane waits in.

use std::time::Duration;

use super::error::AdmissionError;
use crate::config::{Config, Policy, QueueConfig};
use crate::lane::Lane;

/// A bounded wait queue's limits.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueueLimit {
    pub len: usize,
    pub timeout: Duration,
}

impl From<QueueConfig> for QueueLimit {
    fn from(q: QueueConfig) -> Self {
        Self {
            len: q.len as usize,
            timeout: q.timeout,
        }
    }
}

/// One lane's limits under policy `lanes` or `strict`.
#[derive(Debug, Clone, Copy)]
pub(super) struct LaneLimit {
    /// Reserved seats (`lanes`) or the hard cap (`strict`).
    pub max_concurrency: u32,
    pub max_tokens: u64,
    /// Most seats, borrowed ones included (`lanes`).
    pub ceiling: u32,
    pub lend: bool,
    pub borrow: bool,
}

/// What a policy allows.
#[derive(Debug, Clone)]
pub(super) enum Limits {
    /// Per-lane slots and token budgets, a global token budget, one queue per lane.
    Lanes {
        lanes: [LaneLimit; 3],
        queues: [QueueLimit; 3],
        global_tokens: u64,
        /// `Some(seats)`: work-conserving (policy `lanes`); `None`: strict caps.
        seats: Option<u32>,
    },
    /// One concurrency limit (or none) over all lanes, one queue, no token budget.
    Fifo {
        max_concurrency: Option<u32>,
        queue: QueueLimit,
    },
}

/// Current usage, as [`Limits::fits`] needs it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Usage {
    pub in_flight: u32,
    pub tokens: u64,
}

impl Limits {
    pub fn from_config(config: &Config) -> Self {
        match config.admission.policy {
            Policy::Lanes | Policy::Strict => Limits::Lanes {
                lanes: Lane::ALL.map(|lane| {
                    let c = config.lanes.get(lane);
                    LaneLimit {
                        max_concurrency: c.max_concurrency.get(),
                        max_tokens: c.max_tokens_in_flight.get(),
                        ceiling: c.ceiling.get().max(c.max_concurrency.get()),
                        lend: c.lend,
                        borrow: c.borrow,
                    }
                }),
                queues: Lane::ALL.map(|lane| config.lanes.get(lane).queue.into()),
                global_tokens: config.admission.max_tokens_in_flight.get(),
                seats: (config.admission.policy == Policy::Lanes)
                    .then(|| config.admission.seats.get()),
            },
            Policy::Fifo => Limits::Fifo {
                max_concurrency: config.admission.fifo.max_concurrency.map(|n| n.get()),
                queue: config.admission.fifo.queue.into(),
            },
        }
    }

    /// The policy these limits implement.
    pub fn policy(&self) -> Policy {
        match self {
            Limits::Lanes { seats: Some(_), .. } => Policy::Lanes,
            Limits::Lanes { seats: None, .. } => Policy::Strict,
            Limits::Fifo { .. } => Policy::Fifo,
        }
    }

    /// Number of wait queues: one per lane, or one.
    pub fn queue_count(&self) -> usize {
        match self {
            Limits::Lanes { .. } => 3,
            Limits::Fifo { .. } => 1,
        }
    }

    /// The queue `lane` waits in.
    pub fn queue_of(&self, lane: Lane) -> usize {
        match self {
            Limits::Lanes { .. } => lane.index(),
            Limits::Fifo { .. } => 0,
        }
    }

    /// Limits of queue `index`.
    pub fn queue(&self, index: usize) -> QueueLimit {
        match self {
            Limits::Lanes { queues, .. } => queues[index],
            Limits::Fifo { queue, .. } => *queue,
        }
    }

    /// The largest reservation `lane` can ever hold, if bounded.
    pub fn max_reservation(&self, lane: Lane) -> Option<u64> {
        match self {
            Limits::Lanes {
                lanes,
                global_tokens,
                ..
            } => Some(lanes[lane.index()].max_tokens.min(*global_tokens)),
            Limits::Fifo { .. } => None,
        }
    }

    /// `Err(TooLarge)` when a reservation of `tokens` could never fit `lane` (more than its
    /// budget or the global one), so waiting would be pointless.
    pub fn admissible(&self, lane: Lane, tokens: u32) -> Result<(), AdmissionError> {
        match self.max_reservation(lane) {
            Some(limit) if u64::from(tokens) > limit => Err(AdmissionError::TooLarge {
                lane,
                tokens,
                limit,
            }),
            _ => Ok(()),
        }
    }

    /// Whether one more request of `lane` with `tokens` fits in `lane`'s own seats: the tokens
    /// fit (lane and global budgets) and the lane is below its reserved `max_concurrency`, so
    /// nothing is borrowed. Background work (jobs) takes only such seats. Under `fifo` it is
    /// [`Limits::fits`] (there are no lanes' own seats).
    pub fn fits_own(&self, usage: &[Usage; 3], lane: Lane, tokens: u32) -> bool {
        match self {
            Limits::Lanes { lanes, .. } => {
                usage[lane.index()].in_flight < lanes[lane.index()].max_concurrency
                    && self.fits(usage, lane, tokens)
            }
            Limits::Fifo { .. } => self.fits(usage, lane, tokens),
        }
    }

    /// Whether background work with `tokens` counted in `lane` fits in one of `seat`'s own
    /// seats (a pre-emptible borrower, see `preempt.rs`): `seat` is below its reserved
    /// `max_concurrency` and the tokens fit `lane`'s and the global budgets. Under `fifo`:
    /// [`Limits::fits`] for `lane`.
    pub fn fits_borrowed(&self, usage: &[Usage; 3], seat: Lane, lane: Lane, tokens: u32) -> bool {
        match self {
            Limits::Lanes { lanes, .. } => {
                usage[seat.index()].in_flight < lanes[seat.index()].max_concurrency
                    && self.fits_tokens(usage, lane, tokens)
            }
            Limits::Fifo { .. } => self.fits(usage, lane, tokens),
        }
    }

    /// Whether `tokens` more fit `lane`'s and the global token budgets, whatever the seats: a
    /// request growing its reservation where it is keeps the seat it holds (`fifo` has no token
    /// budgets).
    pub fn fits_tokens(&self, usage: &[Usage; 3], lane: Lane, tokens: u32) -> bool {
        match self {
            Limits::Lanes {
                lanes,
                global_tokens,
                ..
            } => {
                let global: u64 = usage.iter().map(|u| u.tokens).sum();
                usage[lane.index()].tokens + u64::from(tokens) <= lanes[lane.index()].max_tokens
                    && global + u64::from(tokens) <= *global_tokens
            }
            Limits::Fifo { .. } => true,
        }
    }

    /// Whether one more request of `lane` with `tokens` fits, given per-lane usage: a seat AND
    /// the tokens (lane and global budgets), checked together.
    ///
    /// Seats under `lanes` (work-conserving, in the style of Kubernetes APF): a lane below its
    /// reservation always gets a seat (a lent seat comes back to its owner at once; nothing is
    /// pre-empted, so the total may briefly exceed `seats` by the seats still on loan). Above
    /// its reservation a lane that may borrow gets a seat while it is under its ceiling and
    /// fewer than `seats` are taken, not counting the idle reservations of lanes that do not
    /// lend (the small lane's reservation is never used by other work). Under `strict`,
    /// `max_concurrency` is a hard cap.
    pub fn fits(&self, usage: &[Usage; 3], lane: Lane, tokens: u32) -> bool {
        match self {
            Limits::Lanes {
                lanes,
                global_tokens,
                seats,
                ..
            } => {
                let mine = usage[lane.index()];
                let limit = lanes[lane.index()];
                let global: u64 = usage.iter().map(|u| u.tokens).sum();
                let tokens_fit = mine.tokens + u64::from(tokens) <= limit.max_tokens
                    && global + u64::from(tokens) <= *global_tokens;
                if !tokens_fit {
                    return false;
                }
                if mine.in_flight < limit.max_concurrency {
                    return true;
                }
                let Some(seats) = seats else {
                    return false;
                };
                if !limit.borrow || mine.in_flight >= limit.ceiling {
                    return false;
                }
                let taken: u32 = usage.iter().map(|u| u.in_flight).sum();
                let held_back: u32 = Lane::ALL
                    .iter()
                    .filter(|l| **l != lane && !lanes[l.index()].lend)
                    .map(|l| {
                        lanes[l.index()]
                            .max_concurrency
                            .saturating_sub(usage[l.index()].in_flight)
                    })
                    .sum();
                taken + held_back < *seats
            }
            Limits::Fifo {
                max_concurrency, ..
            } => {
                let total: u32 = usage.iter().map(|u| u.in_flight).sum();
                max_concurrency.is_none_or(|max| total < max)
            }
        }
    }
}

/// The prefill budget (policies `lanes` and `strict`): estimated prompt tokens of all requests
/// between dispatch and their first token. Every admitted prompt is counted; only prompts above
/// `long_prompt` wait for room. Both backends check it: the local counters and the Redis acquire
/// script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillLimit {
    /// Tokens; 0 = off (counted, nobody waits).
    pub budget: u64,
    /// Prompts above this many estimated tokens wait for room.
    pub long_prompt: u32,
}

impl PrefillLimit {
    pub fn from_config(config: &Config) -> Self {
        let budget = match config.admission.policy {
            Policy::Lanes | Policy::Strict => config.admission.prefill_budget_tokens,
            // The baseline stays what vLLM users run today.
            Policy::Fifo => 0,
        };
        Self {
            budget,
            long_prompt: config.admission.long_prompt_tokens.get(),
        }
    }

    /// Whether a prompt of `prompt` tokens must wait for prefill room (a long prompt under a
    /// budget). Short prompts never wait for it.
    pub fn waits(&self, prompt: u32) -> bool {
        self.budget > 0 && prompt > self.long_prompt
    }

    /// Whether a prompt of `prompt` tokens may start its prefill with `in_flight` tokens already
    /// prefilling: it is short, or it fits the budget, or nothing else is prefilling (a prompt
    /// larger than the whole budget runs alone rather than never).
    pub fn fits(&self, in_flight: u64, prompt: u32) -> bool {
        !self.waits(prompt) || in_flight == 0 || in_flight + u64::from(prompt) <= self.budget
    }
}
