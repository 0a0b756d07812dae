//! Admission errors. The HTTP layer maps them: `QueueFull` -> 429 with `Retry-After`,
//! `Timeout` -> 503, `QuotaUnavailable` -> 503, `TooLarge` -> 400.

use std::time::Duration;

use crate::lane::Lane;

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The lane's wait queue (or the FIFO queue) is full. HTTP 429.
    #[error("the {lane} lane's queue is full; retry after {}s", retry_after.as_secs())]
    QueueFull {
        /// The request's lane.
        lane: Lane,
        /// Hint for `Retry-After`: the queue's timeout in whole seconds (at least 1), since by
        /// then every request now waiting has been admitted or has timed out.
        retry_after: Duration,
    },
    /// Waited the queue's full timeout without getting a slot and tokens. HTTP 503.
    #[error("no capacity in the {lane} lane after waiting {}ms", waited.as_millis())]
    Timeout {
        /// The request's lane.
        lane: Lane,
        /// How long it waited.
        waited: Duration,
    },
    /// The shared quota (Redis) cannot be reached and `quota.on_redis_down = "fail_closed"`.
    /// HTTP 503.
    #[error("the shared quota for the {lane} lane is unreachable")]
    QuotaUnavailable {
        /// The request's lane.
        lane: Lane,
    },
    /// The reservation is larger than a budget it must fit in, so it could never be admitted.
    /// Config validation makes this unreachable for classified requests. HTTP 400.
    #[error("a reservation of {tokens} tokens can never fit the {lane} lane's budget of {limit}")]
    TooLarge {
        /// The request's lane.
        lane: Lane,
        /// Tokens asked for.
        tokens: u32,
        /// The smaller of the lane's and the global token budget.
        limit: u64,
    },
}
