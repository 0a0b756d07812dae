//! The in-process job backend (`quota.backend = "local"`): [`LocalJobs`] (`backend.rs`), its
//! queue (`queue.rs`: fair order, bounds) and its event streams (`events.rs`).

mod backend;
mod events;
mod queue;

pub use backend::LocalJobs;
