//! One lookup over every shard at once: how many leading blocks of a prompt
//! each engine publisher holds.
//!
//! A probe of a block the shard has not seen costs a cache miss (the table's
//! control bytes), a held one three (control bytes, slot, node), and the
//! prompts that matter have their tail in no cache. Searching shard after
//! shard puts every one of those misses in a row: 8 replicas sharing a 2k
//! system prompt cost about 90 of them per 8k-token lookup (7.5 µs of 10).
//! Here the shards advance in rounds instead: each round probes one block per
//! shard that is still searching, in one loop whose iterations do not depend
//! on each other, so the CPU has all of that round's misses in flight at
//! once and a lookup costs about as many miss latencies as the longest single
//! search has probes.
//!
//! Each shard's search is the one `Shard::longest` does (gallop, then bisect),
//! exact while the shard is closed under parents; a shard with tombstones is
//! scanned block by block by `Shard::longest` itself, as before.

use super::shard::Shard;

/// One shard's search: blocks `..lo` are held, blocks `hi..` are not (or are
/// past the prompt), so its match is in `lo..=hi`; done when they meet.
struct Probe<'a> {
    shard: &'a Shard,
    /// The replica slot the shard belongs to.
    owner: usize,
    lo: usize,
    hi: usize,
    /// Galloping: the next block to probe while the match may still be long.
    next: usize,
    galloping: bool,
}

impl Probe<'_> {
    /// The block this round probes.
    fn block(&self) -> usize {
        if self.galloping {
            // Past the prompt: try its last block, which settles at once the
            // common case of a replica holding the whole prompt.
            self.next.min(self.hi - 1)
        } else {
            self.lo + (self.hi - self.lo) / 2
        }
    }

    fn learn(&mut self, block: usize, held: bool) {
        if held {
            self.lo = block + 1;
            self.next = 2 * block.max(1);
        } else {
            self.hi = block;
            self.galloping = false;
        }
    }
}

/// Matched blocks per shard: calls `found(owner, blocks)` once per shard of
/// `shards` (given with their owner) that holds at least the first block.
/// `key(i)` returns the key of block `i < n`, computed on demand.
pub fn longest_all<'a>(
    shards: impl Iterator<Item = (usize, &'a Shard)>,
    n: usize,
    mut key: impl FnMut(usize) -> u64,
    mut found: impl FnMut(usize, usize),
) {
    if n == 0 {
        return;
    }
    let k0 = key(0);
    let mut live: Vec<Probe<'a>> = Vec::new();
    for (owner, shard) in shards {
        if shard.tombstones() > 0 {
            let m = shard.longest(n, &mut key);
            if m > 0 {
                found(owner, m);
            }
        } else if shard.holds(k0) {
            live.push(Probe {
                shard,
                owner,
                lo: 1,
                hi: n,
                next: 1,
                galloping: true,
            });
        }
    }
    while !live.is_empty() {
        // Keys first (pure arithmetic), then the probes in a loop of their own
        // so that nothing but the loads stands between one probe and the next.
        let far = live.iter().filter(|p| p.lo < p.hi).map(Probe::block).max();
        if let Some(far) = far {
            key(far);
        }
        for p in &mut live {
            if p.lo < p.hi {
                let b = p.block();
                let held = p.shard.holds(key(b));
                p.learn(b, held);
            }
        }
        live.retain(|p| {
            if p.lo < p.hi {
                return true;
            }
            found(p.owner, p.lo);
            false
        });
    }
}
