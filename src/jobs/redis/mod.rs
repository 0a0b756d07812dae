//! The Redis job backend (`quota.backend = "redis"`): every replica reads, follows and cancels
//! any job, and any replica runs one; a job whose gateway dies runs again elsewhere.
//!
//! [`RedisJobs`] (`backend.rs`) answers the service and the scheduler over [`RedisStore`]
//! (`store.rs`: keys, scripts, reads, cancel, webhooks); `run.rs` takes the queue's head and
//! runs it; `tasks.rs` holds the beat and the listener; `events.rs` the event streams.
//!
//! # Data layout (under the quota's `<prefix>:{quota}`, so one hash slot)
//! - `:jobs:queue` ZSET job id -> start tag (the same start-time fair queuing as in process:
//!   oldest first within a tenant, tenants in turns by `auth.tenant_shares`).
//! - `:jobs:running` ZSET job id -> until when its runner's lease holds (Redis server ms).
//! - `:jobs:ended` ZSET job id -> when it ended (then when it expired).
//! - `:jobs:meta` HASH the queue's virtual time, each tenant's last tag, the bytes kept, the
//!   jobs per status (`n:<status>`), and when a replica's beat last ran (`beat`: a beat that
//!   finds none for a whole runner lease takes Redis's clock to have run ahead, and renews
//!   the runner leases instead of sweeping them).
//! - `:job:<id>` HASH one job: `status`, `tenant`, `request` (the classified request as
//!   [`crate::pipeline::Ready::stored`] keeps it), `work`, `prefill`, `lane`, `input`,
//!   `output_budget`, `notify`, `traceparent`, `submitted_ms`, `started_ms`, `finished_ms`,
//!   `attempt` (runs so far), `runner` (the running lease's id), `cancel`, `answer`, `error`,
//!   `webhook`, `bytes` (its request and its kept text, against `jobs.max_bytes`),
//!   `text_bytes` (the text a pre-empted or handed-back run kept: given back if the job starts
//!   over), `tag`. `:job:<id>:text` LIST its streamed pieces.
//! - `:jobs:changed` pub/sub channel: a job id whenever that job changed, `cancel <id>` when a
//!   running job's cancel is asked.
//!
//! Every change is one Lua script (`lua/jobs_*_v2.lua`, after the quota prelude): submit (with
//! the store's bounds), take (the queue's head starts and takes its large-lane seat in the same
//! step, only out of idle capacity: see `run.rs`), push (pieces, only from the run that owns
//! the job), end, cancel, and beat.
//!
//! # Pre-emption (`jobs.preempt`)
//! The take script gives a job that may still be pre-empted a pre-emptible lease (an idle seat
//! of any lane, its tokens in large; see `crate::admission::redis`), and its run a handle that
//! the quota's `leave` channel signals when an acquire on any replica asks the seat back. The
//! run then drops its stream and ends with its progress: the end script puts the job back in
//! the queue at its place with `progress` (times pre-empted, tokens generated, the first run's
//! usage) and `preempted`, keeping its text and its run number; the next take (any replica)
//! answers `resumed`, and that run continues the answer (`crate::jobs::runner`). A run that
//! cannot read the progress back stops as lost: the beat then puts the job back to start over.
//!
//! # Runners and crashes
//! The run that takes a job owns it through its token (the lease id of its seat); it renews a
//! runner lease (`:jobs:running`) every `quota.heartbeat_ms`. When that stops, the next beat of
//! any replica puts the job back at the front of the queue (its text starts over; an event
//! stream says `restarted`, and the new run's piece ids are `<run>.<n>`), up to
//! `jobs.max_attempts` lost runs, then fails it with `runner_lost`. A run that lost its job (it
//! was slow, its lease expired and the job runs elsewhere, or the store stayed away) can no
//! longer write it: pushes and the end are refused, so a job ends once; each run is its own
//! engine request (`<id>`, `<id>-2`, ...), so a lost run's abort never reaches the next. A
//! gateway shutting down hands its running jobs back to the queue instead of cancelling them
//! (not counted as lost). A take whose reply never came (Redis slower than the call's
//! timeout) may have started the job under a run that does not exist: the replica that sent it
//! gives the job back at once, as it was (the end script's `untaken`; not counted as lost). Job keys carry no Redis TTL: the beat's sweep keeps the counters in
//! `:jobs:meta` equal to the jobs kept.
//!
//! # Known limits
//! A webhook is delivered by the gateway that ended the job (its run's, the one whose `DELETE`
//! ended it while queued, or the one whose beat ended it); if that gateway dies during the
//! retries, the remaining attempts are not made. The session reservation of a job with a
//! `session_id` is given back at submission (the run is not counted in the session).

mod backend;
mod events;
#[cfg(test)]
mod lost_run_tests;
#[cfg(test)]
mod retry_tests;
mod run;
mod store;
#[cfg(test)]
mod submit_tests;
mod tasks;
#[cfg(test)]
mod text_bytes_tests;
#[cfg(test)]
mod untake_tests;

pub use backend::RedisJobs;
