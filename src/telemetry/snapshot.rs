//! Point-in-time admission counters as plain values: admission fills them, the metrics render
//! them (`tutor_gateway_lane_*` gauges), tests read them. Defined here so that telemetry needs
//! nothing from admission.

use crate::lane::Lane;

/// One lane's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneSnapshot {
    /// The lane.
    pub lane: Lane,
    /// Requests of this lane holding a slot.
    pub in_flight: u32,
    /// Tokens (input + output budget) reserved by them.
    pub reserved_tokens: u64,
    /// Requests of this lane waiting in a queue (under `fifo`, its share of the one queue).
    pub queue_depth: u32,
    /// Of those, the long prompts that wait for prefill room as well as a seat (their own line,
    /// served at its own rate: `crate::telemetry::admission_rate::Line`).
    pub long_queue_depth: u32,
}

impl LaneSnapshot {
    /// Requests waiting in `lane`'s line of long prompts (`long`) or in its other line.
    pub fn line_depth(&self, long: bool) -> u32 {
        if long {
            self.long_queue_depth
        } else {
            self.queue_depth.saturating_sub(self.long_queue_depth)
        }
    }
}

/// All lanes' counters, taken under one lock so they are consistent with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionSnapshot {
    /// Per lane, indexed by [`Lane::index`].
    pub lanes: [LaneSnapshot; 3],
    /// Estimated prompt tokens of admitted requests without a first token yet (the prefill
    /// budget's usage; the local backend only).
    pub prefill_tokens: u64,
}

impl AdmissionSnapshot {
    /// The counters of `lane`.
    pub fn lane(&self, lane: Lane) -> &LaneSnapshot {
        &self.lanes[lane.index()]
    }

    /// Requests in flight across lanes.
    pub fn in_flight(&self) -> u32 {
        self.lanes.iter().map(|l| l.in_flight).sum()
    }

    /// Tokens reserved across lanes (what the global budget is checked against).
    pub fn reserved_tokens(&self) -> u64 {
        self.lanes.iter().map(|l| l.reserved_tokens).sum()
    }

    /// Requests waiting across lanes.
    pub fn queue_depth(&self) -> u32 {
        self.lanes.iter().map(|l| l.queue_depth).sum()
    }

    /// True when nothing is in flight, reserved, prefilling or queued: what every test ends by
    /// checking.
    pub fn is_idle(&self) -> bool {
        self.in_flight() == 0
            && self.reserved_tokens() == 0
            && self.queue_depth() == 0
            && self.prefill_tokens == 0
    }
}
