//! Admission errors. The HTTP layer maps them: `QueueFull` and `TenantQueueFull` -> 429 with
//! `Retry-After`,
//! `Timeout` -> 503, `QuotaUnavailable` -> 503, `TooLarge` -> 400, `WouldMissDeadline` -> 503
//! (429 when the tenant is over its share) with `Retry-After`.

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
    /// The lane's queue is full and the request's tenant already holds its places in it (its
    /// share of the queue among the tenants waiting), or this waiter was the newest of a
    /// tenant above its places when another tenant's request needed one. HTTP 429; names only
    /// the tenant's own numbers.
    #[error(
        "tenant {tenant} holds {held} of the {lane} lane's queue places, its share while other \
         tenants wait is {places}; retry after {}s",
        retry_after.as_secs()
    )]
    TenantQueueFull {
        /// The request's lane.
        lane: Lane,
        /// The request's tenant.
        tenant: String,
        /// Waiters the tenant held.
        held: u32,
        /// Places the tenant may hold.
        places: u32,
        /// Hint for `Retry-After`, as for [`AdmissionError::QueueFull`].
        retry_after: Duration,
    },
    /// Waited the queue's full timeout without getting a slot and tokens. HTTP 503.
    #[error(
        "no capacity in the {lane} lane after waiting {} ms; retry shortly",
        waited.as_millis()
    )]
    Timeout {
        /// The request's lane.
        lane: Lane,
        /// How long it waited.
        waited: Duration,
    },
    /// The shared quota (Redis) cannot be reached and `quota.on_redis_down = "fail_closed"`.
    /// HTTP 503.
    #[error(
        "the gateway cannot reach its shared capacity record for the {lane} lane; retry shortly"
    )]
    QuotaUnavailable {
        /// The request's lane.
        lane: Lane,
    },
    /// The request's predicted wait already misses its deadline (`x-tutor-deadline-ms`) by
    /// more than the margin: refused at once instead of queued. HTTP 503, or 429 when its
    /// tenant holds more than its share of the lane's waiting requests (its wait is its own
    /// backlog); `Retry-After` the predicted wait.
    #[error(
        "the {lane} lane's predicted wait of {}ms misses this request's deadline of {}ms{}; \
         retry after {}s",
        predicted.as_millis(),
        deadline.as_millis(),
        if *over_share {
            " (this tenant holds more than its share of the lane's waiting requests)"
        } else {
            ""
        },
        retry_secs(*predicted)
    )]
    WouldMissDeadline {
        /// The request's lane.
        lane: Lane,
        /// The wait predicted from the requests ahead and the lane's recent admissions.
        predicted: Duration,
        /// What was left of the request's deadline.
        deadline: Duration,
        /// Whether its tenant holds more than its share of the lane's waiting requests.
        over_share: bool,
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

/// Whole seconds to wait before retrying after `predicted`: rounded up, at least 1.
pub fn retry_secs(predicted: Duration) -> u64 {
    u64::try_from(predicted.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}
