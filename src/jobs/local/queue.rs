//! The in-process job store: every job by id, the queue in submission order, and the bounds
//! (`jobs.max_jobs`, `jobs.max_bytes`). Lost on restart.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::admission::fair::{pass_down, Fair};
use crate::jobs::entry::Entry;

/// Jobs by id and the queue, behind the backend's mutex.
#[derive(Debug, Default)]
pub struct Store {
    jobs: HashMap<String, Arc<Entry>>,
    /// Queued jobs in start-tag order: oldest first within a tenant, tenants in turns.
    queue: VecDeque<(f64, Arc<Entry>)>,
    fair: Fair,
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

    /// Jobs `tenant` keeps (every kept job but the expired ones) and their bytes.
    pub fn held_by(&self, tenant: &str) -> (usize, u64) {
        self.jobs
            .values()
            .filter(|e| e.tenant.as_deref() == Some(tenant))
            .map(|e| {
                let s = e.lock();
                (s.status, s.bytes)
            })
            .filter(|(status, _)| *status != super::super::entry::Status::Expired)
            .fold((0, 0), |(n, b), (_, bytes)| (n + 1, b + bytes))
    }

    /// Adds a queued job at its fair place: oldest first within its tenant, tenants in turns
    /// weighted by `share` (see [`Fair`]).
    pub fn push(&mut self, entry: Arc<Entry>, bytes: u64, share: f64) {
        self.bytes += bytes;
        self.jobs.insert(entry.id.clone(), entry.clone());
        let tag = self.fair.tag(entry.tenant.as_deref().map(Arc::from), share);
        let pos = self.queue.partition_point(|(t, _)| *t <= tag);
        self.queue.insert(pos, (tag, entry));
    }

    /// The job `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Entry>> {
        self.jobs.get(id).cloned()
    }

    /// How many jobs are ahead of `id` in the queue (`None`: not queued).
    pub fn position(&self, id: &str) -> Option<usize> {
        self.queue.iter().position(|(_, e)| e.id == id)
    }

    /// The oldest queued job.
    pub fn head(&self) -> Option<Arc<Entry>> {
        self.queue.front().map(|(_, e)| e.clone())
    }

    /// Takes `id` out of the queue (it leaves unserved: cancelled); true when it was there.
    /// Its turn passes to its tenant's next queued job, that one's to the next, and so on, and
    /// the tenant's newest turn is free again (a tenant that cancels keeps the turns it did
    /// not use).
    pub fn unqueue(&mut self, id: &str) -> bool {
        let Some(p) = self.position(id) else {
            return false;
        };
        let q = &mut self.queue;
        let tenant = q[p].1.tenant.clone();
        let at = pass_down(q, p, |(_, e)| e.tenant == tenant, |(tag, _)| tag);
        if let Some((tag, _)) = q.remove(at) {
            self.fair.give_back(&tenant.as_deref().map(Arc::from), tag);
        }
        true
    }

    /// Takes the head out of the queue to run it: the fair order's virtual time moves on.
    pub fn start(&mut self, id: &str) {
        if let Some(p) = self.position(id) {
            if let Some((tag, _)) = self.queue.remove(p) {
                self.fair.admitted(tag);
            }
        }
    }

    /// Takes every queued job out of the queue (the gateway stops: they will never run).
    pub fn take_queued(&mut self) -> Vec<Arc<Entry>> {
        self.queue.drain(..).map(|(_, e)| e).collect()
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
