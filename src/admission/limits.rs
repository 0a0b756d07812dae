//! The limits a policy enforces, taken from config: what "fits" means and which queue a lane
//! waits in.

use std::time::Duration;

use crate::classify::Lane;
use crate::config::{Config, Policy, QueueConfig};

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

/// One lane's limits under policy `lanes`.
#[derive(Debug, Clone, Copy)]
pub(super) struct LaneLimit {
    pub max_concurrency: u32,
    pub max_tokens: u64,
}

/// What a policy allows.
#[derive(Debug, Clone)]
pub(super) enum Limits {
    /// Per-lane slots and token budgets, a global token budget, one queue per lane.
    Lanes {
        lanes: [LaneLimit; 3],
        queues: [QueueLimit; 3],
        global_tokens: u64,
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
            Policy::Lanes => Limits::Lanes {
                lanes: Lane::ALL.map(|lane| {
                    let c = config.lanes.get(lane);
                    LaneLimit {
                        max_concurrency: c.max_concurrency.get(),
                        max_tokens: c.max_tokens_in_flight.get(),
                    }
                }),
                queues: Lane::ALL.map(|lane| config.lanes.get(lane).queue.into()),
                global_tokens: config.admission.max_tokens_in_flight.get(),
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
            Limits::Lanes { .. } => Policy::Lanes,
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

    /// Whether one more request of `lane` with `tokens` fits, given per-lane usage `lanes`:
    /// a slot AND the tokens, checked together.
    pub fn fits(&self, usage: &[Usage; 3], lane: Lane, tokens: u32) -> bool {
        match self {
            Limits::Lanes {
                lanes,
                global_tokens,
                ..
            } => {
                let mine = usage[lane.index()];
                let limit = lanes[lane.index()];
                let global: u64 = usage.iter().map(|u| u.tokens).sum();
                mine.in_flight < limit.max_concurrency
                    && mine.tokens + u64::from(tokens) <= limit.max_tokens
                    && global + u64::from(tokens) <= *global_tokens
            }
            Limits::Fifo {
                max_concurrency, ..
            } => {
                let total: u32 = usage.iter().map(|u| u.in_flight).sum();
                max_concurrency.map_or(true, |max| total < max)
            }
        }
    }
}
