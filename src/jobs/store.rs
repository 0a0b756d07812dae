//! The in-process job store: every job by id, the queue in submission order, and the bounds
//! (`jobs.max_jobs`, `jobs.max_bytes`). Lost on restart.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::entry::Entry;

/// Jobs by id and the queue, behind the service's mutex.
#[derive(Debug, Default)]
pub struct Store {
    jobs: HashMap<String, Arc<Entry>>,
    queue: VecDeque<Arc<Entry>>,
    /// Bytes counted against `jobs.max_bytes`.
    pub bytes: u64,
    /// Jobs kept only as an `expired` status (no text, no answer): not counted against
    /// `jobs.max_jobs`.
    pub expired: usize,
    /// Jobs running now (for `jobs.max_running`).
    pub running: usize,
}

impl Store {
    /// Jobs counted against `jobs.max_jobs`: every kept job but the expired ones.
    pub fn live(&self) -> usize {
        self.jobs.len() - self.expired
    }

    /// Adds a queued job at the back of the queue.
    pub fn push(&mut self, entry: Arc<Entry>, bytes: u64) {
        self.bytes += bytes;
        self.jobs.insert(entry.id.clone(), entry.clone());
        self.queue.push_back(entry);
    }

    /// The job `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Entry>> {
        self.jobs.get(id).cloned()
    }

    /// How many jobs are ahead of `id` in the queue (`None`: not queued).
    pub fn position(&self, id: &str) -> Option<usize> {
        self.queue.iter().position(|e| e.id == id)
    }

    /// The oldest queued job.
    pub fn head(&self) -> Option<Arc<Entry>> {
        self.queue.front().cloned()
    }

    /// Takes `id` out of the queue; true when it was there.
    pub fn unqueue(&mut self, id: &str) -> bool {
        match self.position(id) {
            Some(p) => {
                self.queue.remove(p);
                true
            }
            None => false,
        }
    }

    /// Forgets `id` (its bytes were given back when it expired).
    pub fn forget(&mut self, id: &str) -> Option<Arc<Entry>> {
        self.unqueue(id);
        self.jobs.remove(id)
    }

    /// Every job that has ended (done, failed, cancelled or expired).
    pub fn ended(&self) -> Vec<Arc<Entry>> {
        self.jobs
            .values()
            .filter(|e| e.lock().status.is_final())
            .cloned()
            .collect()
    }
}
