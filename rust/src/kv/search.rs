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
//!
//! Replicas that share a prompt mostly hold the same prefix of it (a system
//! prompt), so one shard is searched first and its match is tried on every
//! other shard before anything else: two probes settle a shard that matches
//! as far, where its own gallop and bisect took about fifteen. That cut an
//! 8-replica lookup from about 116 probes to about 40.

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
    /// Another shard's match, tried first: block `hint - 1` held and block
    /// `hint` not held settle it.
    hint: Option<usize>,
}

impl Probe<'_> {
    /// The block this round probes (`lo <= block < hi`).
    fn block(&self) -> usize {
        match self.hint {
            Some(h) if self.lo < h => h - 1,
            Some(h) => h,
            // Past the prompt: try its last block, which settles at once the
            // common case of a replica holding the whole prompt.
            None if self.galloping => self.next.max(self.lo).min(self.hi - 1),
            None => self.lo + (self.hi - self.lo) / 2,
        }
    }

    fn learn(&mut self, block: usize, held: bool) {
        if held {
            self.lo = block + 1;
            self.next = 2 * block.max(1);
        } else {
            // Below a failed hint the match may be anywhere: bisect, which
            // beats galloping up again from the first block.
            self.hi = block;
            self.galloping = false;
        }
        // A hint stays on only to probe its second block.
        self.hint = self.hint.filter(|&h| held && block + 1 == h);
    }
}

/// Most probes one round of `wide` makes: the misses a core keeps in flight.
const WIDE: usize = 8;

/// Settles one shard's search with several probes per round: first every
/// power of two and the last block, then up to `WIDE` blocks spread evenly
/// over what is left. Its probes do not wait on each other, so a 512-block
/// prompt takes three or four rounds of misses rather than the fifteen in a
/// row of a gallop and bisect.
fn wide(p: &mut Probe<'_>, key: &mut impl FnMut(usize) -> u64) {
    let mut blocks = [0usize; 2 * usize::BITS as usize];
    let mut held = [false; 2 * usize::BITS as usize];
    let mut first = true;
    while p.lo < p.hi {
        let (lo, hi) = (p.lo, p.hi);
        let mut m = 0;
        if first {
            let mut b = lo.max(1);
            while b < hi - 1 && m + 1 < blocks.len() {
                blocks[m] = b;
                m += 1;
                b *= 2;
            }
            blocks[m] = hi - 1;
            m += 1;
        } else {
            let parts = (hi - lo).min(WIDE);
            for j in 0..parts {
                blocks[m] = lo + (hi - lo) * j / parts;
                m += 1;
            }
        }
        first = false;
        key(blocks[m - 1]);
        for (b, h) in blocks.iter().zip(held.iter_mut()).take(m) {
            *h = p.shard.holds(key(*b));
        }
        // Held blocks are a prefix: the last held probe and the first one
        // not held bound the match.
        for (&b, &h) in blocks.iter().zip(&held).take(m) {
            if h {
                p.lo = p.lo.max(b + 1);
            } else {
                p.hi = p.hi.min(b);
            }
        }
    }
}

/// Runs the searches of `live` in rounds until every one is settled.
fn run(live: &mut [Probe<'_>], key: &mut impl FnMut(usize) -> u64) {
    loop {
        // Keys first (pure arithmetic), then the probes in a loop of their
        // own so that nothing but the loads stands between one probe and the
        // next.
        let Some(far) = live.iter().filter(|p| p.lo < p.hi).map(Probe::block).max() else {
            return;
        };
        key(far);
        for p in live.iter_mut() {
            if p.lo < p.hi {
                let b = p.block();
                let held = p.shard.holds(key(b));
                p.learn(b, held);
            }
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
                hint: None,
            });
        }
    }
    if let Some((first, rest)) = live.split_first_mut() {
        wide(first, &mut key);
        for p in rest.iter_mut() {
            p.hint = Some(first.lo);
        }
        run(rest, &mut key);
    }
    for p in &live {
        found(p.owner, p.lo);
    }
}
