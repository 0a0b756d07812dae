//! KV-cache blocks with vLLM V1's prefix cache.
//!
//! The GPU's KV cache is `num_blocks` blocks of `block_size` tokens. A full prompt block gets a
//! hash chained from its parent's (`hash(parent, tokens)`), so a block is reused only when the
//! whole prefix up to it is identical. Blocks whose last user leaves go to the tail of a free
//! queue but keep their hash: a later request with the same prefix takes them back (a hit);
//! a new allocation takes the head of the queue and evicts its hash (least recently freed first).

use std::collections::HashMap;

use crate::tokenizer::fnv1a;

/// Index of one KV block.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// The parent hash of a sequence's first block.
pub const ROOT_HASH: u64 = 0x5eed;

/// The parent hash of the first block of a request with `cache_salt` (vLLM V1 puts the salt
/// in the extra keys of a request's first block, `generate_block_hash_extra_keys` in
/// `vllm/v1/core/kv_cache_utils.py`; chained, it makes every block of the request its own):
/// requests with different salts share no cached block. No salt: [`ROOT_HASH`].
pub fn salted_root(cache_salt: Option<&str>) -> u64 {
    match cache_salt {
        Some(salt) => {
            let mut bytes = ROOT_HASH.to_le_bytes().to_vec();
            bytes.extend_from_slice(b"cache_salt\0");
            bytes.extend_from_slice(salt.as_bytes());
            fnv1a(&bytes)
        }
        None => ROOT_HASH,
    }
}

/// Chained hashes of the full blocks of `tokens`.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    block_hashes_from(ROOT_HASH, tokens, block_size)
}

/// Chained hashes of the full blocks of `tokens`, the first block's parent `root`.
pub fn block_hashes_from(root: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = root;
    for block in tokens.chunks_exact(block_size) {
        parent = chain_hash(parent, block);
        hashes.push(parent);
    }
    hashes
}

/// The hash of a full `block` of tokens after the block hashed `parent`.
pub fn chain_hash(parent: u64, block: &[u32]) -> u64 {
    let mut bytes = Vec::with_capacity(8 + block.len() * 4);
    bytes.extend_from_slice(&parent.to_le_bytes());
    for t in block {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    fnv1a(&bytes)
}

/// The block pool: reference counts, the cached-hash index and the free queue.
#[derive(Debug)]
pub struct BlockPool {
    ref_count: Vec<u32>,
    hash_of: Vec<Option<u64>>,
    cached: HashMap<u64, BlockId>,
    // Free queue as an intrusive doubly linked list over block ids.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    free: u32,
    prefix_caching: bool,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks.
    pub fn new(num_blocks: u32, prefix_caching: bool) -> Self {
        let n = num_blocks as usize;
        let mut pool = Self {
            ref_count: vec![0; n],
            hash_of: vec![None; n],
            cached: HashMap::new(),
            prev: vec![NIL; n],
            next: vec![NIL; n],
            head: NIL,
            tail: NIL,
            free: 0,
            prefix_caching,
        };
        for b in 0..num_blocks {
            pool.push_free(b);
        }
        pool
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> u32 {
        self.ref_count.len() as u32
    }

    /// Blocks no running request holds (cached or not).
    pub fn num_free(&self) -> u32 {
        self.free
    }

    /// Fraction of blocks in use, 0..1 (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.ref_count.is_empty() {
            return 0.0;
        }
        1.0 - f64::from(self.free) / self.ref_count.len() as f64
    }

    /// How many leading blocks of `hashes` are cached (without taking them).
    pub fn cached_prefix_len(&self, hashes: &[u64]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Takes the cached blocks of the first `n` hashes (as found by [`Self::cached_prefix_len`]).
    pub fn take_cached(&mut self, hashes: &[u64], n: usize) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(n);
        for h in &hashes[..n] {
            let b = self.cached[h];
            if self.ref_count[b as usize] == 0 {
                self.unlink_free(b);
            }
            self.ref_count[b as usize] += 1;
            out.push(b);
        }
        out
    }

    /// Takes `n` fresh blocks, evicting cached hashes from the head of the free queue, or `None`
    /// (and takes nothing) when fewer than `n` are free.
    pub fn allocate(&mut self, n: u32) -> Option<Vec<BlockId>> {
        if n > self.free {
            return None;
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let b = self.head;
            self.unlink_free(b);
            if let Some(h) = self.hash_of[b as usize].take() {
                if self.cached.get(&h) == Some(&b) {
                    self.cached.remove(&h);
                }
            }
            self.ref_count[b as usize] = 1;
            out.push(b);
        }
        Some(out)
    }

    /// Records that `block` now holds the full prompt block with `hash`.
    pub fn register(&mut self, block: BlockId, hash: u64) {
        if !self.prefix_caching || self.hash_of[block as usize].is_some() {
            return;
        }
        self.hash_of[block as usize] = Some(hash);
        self.cached.entry(hash).or_insert(block);
    }

    /// Gives a request's blocks back. Tail blocks go first into the queue so that they are
    /// evicted before the shared prefix blocks, as in vLLM.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            let rc = &mut self.ref_count[b as usize];
            debug_assert!(*rc > 0, "block {b} released twice");
            *rc = rc.saturating_sub(1);
            if *rc == 0 {
                if self.hash_of[b as usize].is_none() {
                    // Uncached blocks are worthless: evict them before any cached one, as
                    // vLLM's `BlockPool.free_blocks` does with prefix caching on (it prepends
                    // the blocks without a hash and appends the others; releases before that
                    // change appended every block).
                    self.push_free_front(b);
                } else {
                    self.push_free(b);
                }
            }
        }
    }

    fn push_free(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.free += 1;
    }

    fn push_free_front(&mut self, b: u32) {
        self.next[b as usize] = self.head;
        self.prev[b as usize] = NIL;
        if self.head == NIL {
            self.tail = b;
        } else {
            self.prev[self.head as usize] = b;
        }
        self.head = b;
        self.free += 1;
    }

    fn unlink_free(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NIL;
        self.next[b as usize] = NIL;
        self.free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_so_a_changed_first_block_changes_all() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[0] = 999;
        let (ha, hb) = (block_hashes(&a, 16), block_hashes(&b, 16));
        assert_eq!(ha.len(), 4);
        assert!(ha.iter().zip(&hb).all(|(x, y)| x != y));
        assert_eq!(
            block_hashes(&a[..40], 16).len(),
            2,
            "partial blocks are not hashed"
        );
    }

    #[test]
    fn released_prefix_blocks_are_hit_until_evicted() {
        let mut pool = BlockPool::new(4, true);
        let hashes = block_hashes(&(0..32).collect::<Vec<_>>(), 16);
        let blocks = pool.allocate(2).unwrap();
        pool.register(blocks[0], hashes[0]);
        pool.register(blocks[1], hashes[1]);
        pool.release(&blocks);
        assert_eq!(pool.num_free(), 4);
        assert_eq!(pool.cached_prefix_len(&hashes), 2);
        // Two uncached blocks are evicted first; the cached ones survive.
        let other = pool.allocate(2).unwrap();
        assert_eq!(pool.cached_prefix_len(&hashes), 2);
        let hit = pool.take_cached(&hashes, 2);
        assert_eq!(hit, blocks);
        assert_eq!(pool.num_free(), 0);
        assert!(pool.allocate(1).is_none());
        pool.release(&hit);
        pool.release(&other);
        // Now allocating everything evicts the cached blocks too.
        let all = pool.allocate(4).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(pool.cached_prefix_len(&hashes), 0);
    }

    #[test]
    fn without_prefix_caching_nothing_hits() {
        let mut pool = BlockPool::new(2, false);
        let hashes = block_hashes(&(0..16).collect::<Vec<_>>(), 16);
        let b = pool.allocate(1).unwrap();
        pool.register(b[0], hashes[0]);
        pool.release(&b);
        assert_eq!(pool.cached_prefix_len(&hashes), 0);
    }
}
