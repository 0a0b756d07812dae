//! vLLM's native KV offloading to CPU memory (`--kv-offloading-size <GiB>`,
//! `--kv-offloading-backend native`: the `OffloadingConnector` of
//! `vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py` with the LRU CPU
//! manager of `vllm/v1/kv_offload/`).
//!
//! What the simulator keeps of it:
//! - **Store.** Every full block a step computes (prompt or output) is copied to the CPU tier
//!   (`_get_reqs_to_store`: each scheduled request's new full blocks, every step). The copy
//!   runs on its own stream; it costs the step nothing here (an estimate: vLLM's DMA copies
//!   overlap the forward pass).
//! - **Lookup.** A waiting request first takes its GPU prefix-cache hit; the blocks right after
//!   it that the CPU tier holds are loaded (`get_num_new_matched_tokens`: consecutive hits,
//!   at least one block), asynchronously: the request holds GPU blocks for them and waits
//!   outside the running set (`WAITING_FOR_REMOTE_KVS`) for `blocks x` the profile's load time
//!   per block, then is scheduled with those tokens computed. vLLM counts them in
//!   `num_cached_tokens`, so `usage.prompt_tokens_details.cached_tokens` includes them.
//! - **Evict.** The tier holds `num_blocks` blocks; a store into a full tier evicts the least
//!   recently stored or looked-up block (`LRUOffloadingManager`).
//!
//! Offloaded blocks are the GPU's blocks (16 tokens): vLLM's default `block_size` for the CPU
//! spec is the GPU block size.

use std::collections::{BTreeMap, HashMap};

/// The CPU tier's blocks, by hash, least recently used first.
#[derive(Debug, Default)]
pub struct CpuTier {
    capacity: usize,
    /// Hash to its last use.
    used: HashMap<u64, u64>,
    /// Last use to hash (uses are unique).
    order: BTreeMap<u64, u64>,
    clock: u64,
    /// Blocks stored (copied from the GPU) so far.
    pub stored: u64,
    /// Blocks evicted so far.
    pub evicted: u64,
    /// Blocks loaded back into the GPU so far.
    pub loaded: u64,
}

impl CpuTier {
    /// A tier of `capacity` blocks (0: offloading off).
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity as usize,
            ..Self::default()
        }
    }

    /// Whether offloading is on.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.used.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        if let Some(old) = self.used.insert(hash, self.clock) {
            self.order.remove(&old);
        }
        self.order.insert(self.clock, hash);
    }

    /// Copies the block `hash` in (or only marks it used, when it is there already), evicting
    /// the least recently used block when full.
    pub fn store(&mut self, hash: u64) {
        if !self.enabled() {
            return;
        }
        if !self.used.contains_key(&hash) {
            if self.used.len() == self.capacity {
                if let Some((_, old)) = self.order.pop_first() {
                    self.used.remove(&old);
                    self.evicted += 1;
                }
            }
            self.stored += 1;
        }
        self.touch(hash);
    }

    /// How many leading blocks of `hashes` the tier holds; those are marked used.
    pub fn lookup(&mut self, hashes: &[u64]) -> usize {
        if !self.enabled() {
            return 0;
        }
        let n = hashes
            .iter()
            .take_while(|h| self.used.contains_key(h))
            .count();
        for &h in &hashes[..n] {
            self.touch(h);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_tier_evicts_the_least_recently_used_block() {
        let mut tier = CpuTier::new(3);
        for h in [1, 2, 3] {
            tier.store(h);
        }
        // Looking 1 up makes 2 the oldest.
        assert_eq!(tier.lookup(&[1]), 1);
        tier.store(4);
        assert_eq!(tier.len(), 3);
        assert_eq!(tier.lookup(&[2]), 0, "2 was the least recently used");
        assert_eq!(tier.lookup(&[1, 3, 4]), 3);
        assert_eq!((tier.stored, tier.evicted), (4, 1));
    }

    #[test]
    fn a_lookup_counts_only_the_leading_run_of_hits() {
        let mut tier = CpuTier::new(8);
        for h in [10, 11, 13] {
            tier.store(h);
        }
        assert_eq!(tier.lookup(&[10, 11, 12, 13]), 2);
        assert_eq!(tier.lookup(&[12, 13]), 0);
        tier.store(10);
        assert_eq!(tier.stored, 3, "storing a held block copies nothing");
    }

    #[test]
    fn a_tier_of_no_blocks_is_off() {
        let mut tier = CpuTier::new(0);
        tier.store(1);
        assert!(!tier.enabled());
        assert!(tier.is_empty());
        assert_eq!(tier.lookup(&[1]), 0);
    }
}
