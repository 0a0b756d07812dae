//! What a run produced: one record per request. Written by [`crate::runner`], read by
//! [`crate::stats`] (so neither of those imports the other's types both ways).

use crate::client::Outcome;

/// One request as sent and seen.
#[derive(Debug, Clone)]
pub struct Record {
    /// Index of its class in the scenario.
    pub class: usize,
    /// Send time, seconds from the run's start.
    pub start_s: f64,
    /// Open loop: how late it was sent against its arrival time, seconds (`None`: closed loop,
    /// where a request goes when its client is ready).
    pub lag_s: Option<f64>,
    /// What the client saw.
    pub outcome: Outcome,
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunData {
    /// Every request, in completion order.
    pub records: Vec<Record>,
    /// Open-loop arrivals not sent because `MAX_OPEN_IN_FLIGHT` were in flight.
    pub skipped: u64,
    /// Seconds from start to the last request's end.
    pub wall_s: f64,
}
