//! Background jobs (M16, M23): a repository review submitted with `POST /jobs` runs out of the
//! capacity interactive traffic leaves idle, and its client polls, attaches to its events, or
//! gets a webhook, instead of holding a connection and a queue place.
//!
//! - `POST /jobs`: the `/answer` body plus an optional `notify` webhook URL (allowed only when
//!   it matches `jobs.webhook_allow`). Checked and classified at once (the same 400s as
//!   `/answer`); 202 with `{"id","status","status_url","events_url"}`.
//! - `GET /jobs/{id}`: status, queue position, and when done the answer with usage and timings.
//! - `GET /jobs/{id}/events`: SSE (`status`, `token` with ids, then `done` or `error`); a late
//!   client gets the text so far first; `Last-Event-ID` resumes after that piece (`events.rs`).
//! - `DELETE /jobs/{id}`: cancels; a running job's stream is dropped, which aborts the engine's
//!   work and gives its seat and tokens back. Of a job that ended: drops its result at once, as
//!   its expiry would, freeing its room in the store's and its tenant's bounds.
//!
//! Scheduling (`runner.rs`, one loop for both backends): oldest first, in the large lane only,
//! and only when that lane has one of its own seats free, nobody waits in its queue, and the
//! tokens and prefill fit ([`crate::admission::Admission::try_acquire_idle`]); it wakes whenever
//! capacity comes back. A job never borrows a seat and never queues ahead of an interactive
//! request. With `jobs.preempt` it may take any lane's idle seat instead
//! ([`crate::admission::preempt`]; in Redis, the take script's pre-emptible lease) and gives it
//! back the moment an interactive request needs it: the runner drops its stream, keeps its
//! text, and resumes it as a continuation when a seat is idle again, ahead of the queue
//! (`runner.rs`; in Redis the job goes back to the shared queue with its text and any replica
//! continues it); readers see one answer with `preempted: n`.
//!
//! Storage, behind one trait ([`backend::JobBackend`], `backend.rs`), chosen once when the
//! service starts: with `quota.backend = "local"`, in this process (`local/`), bounded by
//! `jobs.max_jobs` and `jobs.max_bytes`, lost on restart; with `"redis"`, in the quota's Redis
//! (`redis/`): any replica answers for any job, the fleet's large lane is the idle capacity,
//! and a job whose gateway dies runs again on another one (up to `jobs.max_attempts` runs). A
//! finished job's result expires after `jobs.result_ttl` (status `expired`); the id is forgotten
//! as long again after that. Webhooks (`webhook.rs`): HMAC-SHA256 signed, retried with backoff
//! and jitter, every attempt listed in the status.
//!
//! Files: `service.rs` ([`Jobs`]: the routes' side, over the backend), `backend.rs` (the
//! trait), `runner.rs` (the scheduler and one job's run), `local/` and `redis/` (the two
//! backends), and the leaves they share: `context.rs` (state, config, shutdown, wake-up),
//! `entry.rs` (a job's status, answer and record), `events.rs` (the SSE renderer and
//! `Last-Event-ID`), `webhook.rs`. This file
//! declares and re-exports only.

// Numbers from clients reach these modules (ids, offsets, lengths): no cast may wrap or drop a
// sign; checked or saturating arithmetic instead.
#![deny(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

mod backend;
mod context;
mod entry;
pub(crate) mod events;
mod local;
mod redis;
mod runner;
mod service;
pub(crate) mod webhook;

pub use entry::Status;
pub use service::Jobs;
