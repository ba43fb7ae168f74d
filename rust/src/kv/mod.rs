//! The KV-event index: which replica's KV cache holds which prompt prefix.
//!
//! Engines publish what their prefix cache stores and evicts (vLLM's and
//! `SGLang`'s KV events, see `decode`). The index keeps, per replica and
//! data-parallel rank, the blocks it holds under llmgw's own chained keys
//! (`hash`), so a prompt is scored by hashing its tokens the same way and
//! finding, per replica, the longest run of leading blocks it holds.
//!
//! Engine hashes are kept only to chain a stored run onto its parent and to
//! apply removals. A stored run whose parent the index does not know cannot be
//! keyed (it is counted as `unkeyable`): its tokens alone do not say what
//! precedes them.

pub mod decode;
pub mod hash;
mod msgpack;
mod search;
mod seq;
mod shard;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

pub use decode::{Batch, DecodeError, Event};
pub use seq::Applied;
use seq::{Rank, Replica};

/// Answers "how much of this prompt does each replica already hold".
pub trait PrefixOracle: Send + Sync {
    /// Matched prefix tokens per replica id for a prompt's tokens: replaces the
    /// contents of `out` with one `(replica, tokens)` pair per replica that holds
    /// at least the first block, in no particular order.
    fn matches(&self, tokens: &[u32], lora_id: Option<i64>, out: &mut Vec<(Arc<str>, u32)>);
}

/// The index shared between the event subscribers (writers) and the router.
pub type SharedKvIndex = Arc<parking_lot::RwLock<KvIndex>>;

/// How an index is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvConfig {
    /// Tokens per block; must equal the engines' block size.
    pub block_size: u32,
    /// Bound on blocks kept per replica and rank; the oldest go first.
    pub max_blocks_per_replica: u32,
    /// Seed of the root key (all gateways of one deployment must agree).
    pub seed: u64,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_blocks_per_replica: 4_000_000,
            seed: 0,
        }
    }
}

/// Largest bound accepted: a node's child count shares a u32 with a flag.
pub const MAX_BLOCKS_LIMIT: u32 = 1 << 30;

/// Counters since the index was made (blocks and replicas: current values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Blocks held, over all replicas and ranks.
    pub blocks: u64,
    /// Removed blocks kept only because their children are still held.
    pub tombstones: u64,
    /// Replicas known.
    pub replicas: u64,
    /// Batches applied (in order, replayed, or after a restart).
    pub batches: u64,
    /// Batches ignored because their seq was already applied.
    pub duplicates: u64,
    /// Batches refused because one or more before them were missed.
    pub gaps: u64,
    /// Publishers seen starting again at seq 0.
    pub restarts: u64,
    /// Payloads that did not decode.
    pub malformed: u64,
    /// `BlockStored` events.
    pub stored_events: u64,
    /// `BlockRemoved` events.
    pub removed_events: u64,
    /// `AllBlocksCleared` events.
    pub cleared_events: u64,
    /// Events of a type this version does not know.
    pub unknown_events: u64,
    /// Events of a KV-cache group that is not full attention (ignored).
    pub other_group_events: u64,
    /// `BlockStored` events skipped: unknown parent, or a block size or token
    /// count that does not match.
    pub unkeyable: u64,
    /// Blocks newly held.
    pub stored_blocks: u64,
    /// Blocks removed by the engine.
    pub removed_blocks: u64,
    /// Removals of engine hashes the index did not hold.
    pub removed_unknown: u64,
    /// Blocks the index dropped to stay within its bound.
    pub evicted: u64,
    /// Heap bytes of the block tables.
    pub heap_bytes: u64,
}

impl KvStats {
    /// Heap bytes per held block (0 when empty).
    #[must_use]
    pub fn bytes_per_block(&self) -> u64 {
        self.heap_bytes.checked_div(self.blocks).unwrap_or(0)
    }
}

/// The index of every replica's cached blocks.
#[derive(Debug)]
pub struct KvIndex {
    cfg: KvConfig,
    ids: HashMap<Arc<str>, usize>,
    replicas: Vec<Option<Replica>>,
    stats: KvStats,
    batch: Batch,
    keys: Vec<u64>,
}

impl KvIndex {
    /// An empty index. A zero block size is taken as 1 and the bound is
    /// clamped to `1..=MAX_BLOCKS_LIMIT`.
    #[must_use]
    pub fn new(cfg: KvConfig) -> Self {
        let cfg = KvConfig {
            block_size: cfg.block_size.max(1),
            max_blocks_per_replica: cfg.max_blocks_per_replica.clamp(1, MAX_BLOCKS_LIMIT),
            seed: cfg.seed,
        };
        Self {
            cfg,
            ids: HashMap::new(),
            replicas: Vec::new(),
            stats: KvStats::default(),
            batch: Batch::default(),
            keys: Vec::new(),
        }
    }

    /// The configuration in force (after clamping).
    #[must_use]
    pub fn config(&self) -> KvConfig {
        self.cfg
    }

    /// Applies one published batch (`seq` from the ZMQ frame, `payload` the
    /// msgpack frame) from `replica`, or says why not; see `Applied`.
    ///
    /// # Errors
    /// When the payload does not decode; nothing is applied and the sequence
    /// does not advance (a replay will bring the same bytes: the caller should
    /// then `drop_replica`).
    pub fn apply(
        &mut self,
        replica: &str,
        seq: u64,
        payload: &[u8],
    ) -> Result<Applied, DecodeError> {
        let mut batch = std::mem::take(&mut self.batch);
        let out = match batch.decode(payload) {
            Ok(()) => Ok(self.apply_batch(replica, seq, &batch)),
            Err(e) => {
                self.stats.malformed += 1;
                Err(e)
            }
        };
        self.batch = batch;
        out
    }

    /// Applies an already decoded batch; see `apply`.
    pub fn apply_batch(&mut self, replica: &str, seq: u64, batch: &Batch) -> Applied {
        let cfg = self.cfg;
        let slot = self.intern(replica);
        let Some(rep) = self.replicas.get_mut(slot).and_then(Option::as_mut) else {
            return Applied::Applied;
        };
        let rank = rep.rank(batch.dp_rank.unwrap_or(0));
        let verdict = rank.admit(seq);
        match verdict {
            Applied::Duplicate => self.stats.duplicates += 1,
            Applied::Gap { .. } => self.stats.gaps += 1,
            Applied::Restarted => self.stats.restarts += 1,
            Applied::Applied => {}
        }
        if matches!(verdict, Applied::Applied | Applied::Restarted) {
            self.stats.batches += 1;
            rank.apply(&cfg, batch, &mut self.keys, &mut self.stats);
        }
        verdict
    }

    fn intern(&mut self, name: &str) -> usize {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        let name: Arc<str> = Arc::from(name);
        let rep = Some(Replica::new(name.clone()));
        let i = if let Some(i) = self.replicas.iter().position(Option::is_none) {
            self.replicas[i] = rep;
            i
        } else {
            self.replicas.push(rep);
            self.replicas.len() - 1
        };
        self.ids.insert(name, i);
        i
    }

    /// Forgets a replica: its blocks and its sequence state (replay failed, or
    /// the replica went away). Unknown ids are ignored.
    pub fn drop_replica(&mut self, replica: &str) {
        if let Some(i) = self.ids.remove(replica) {
            if let Some(slot) = self.replicas.get_mut(i) {
                *slot = None;
            }
        }
    }

    /// Replica ids known to the index.
    pub fn replicas(&self) -> impl Iterator<Item = &Arc<str>> {
        self.replicas.iter().flatten().map(|r| &r.name)
    }

    /// Our keys of a prompt's full blocks.
    #[must_use]
    pub fn block_keys(&self, tokens: &[u32], lora_id: Option<i64>) -> Vec<u64> {
        let mut chain = Chain::new(self.cfg, tokens, lora_id);
        if let Some(last) = chain.blocks().checked_sub(1) {
            chain.key(last);
        }
        chain.keys
    }

    /// Matched prefix length in tokens per replica holding at least one
    /// leading block (the best of its ranks); see `PrefixOracle::matches`.
    pub fn score_into(&self, tokens: &[u32], lora_id: Option<i64>, out: &mut Vec<(Arc<str>, u32)>) {
        out.clear();
        let mut chain = Chain::new(self.cfg, tokens, lora_id);
        let n = chain.blocks();
        let shards = self
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.as_ref()?)))
            .flat_map(|(i, r)| r.ranks.iter().map(move |k| (i, &k.shard)));
        search::longest_all(
            shards,
            n,
            |i| chain.key(i),
            |slot, blocks| {
                let Some(rep) = self.replicas.get(slot).and_then(Option::as_ref) else {
                    return;
                };
                let tokens = u32::try_from(blocks)
                    .unwrap_or(u32::MAX)
                    .saturating_mul(self.cfg.block_size);
                // A replica appears once, with the best of its ranks; ranks
                // beyond the first are rare, so a scan finds the earlier one.
                if rep.ranks.len() > 1 {
                    if let Some(e) = out.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &rep.name)) {
                        e.1 = e.1.max(tokens);
                        return;
                    }
                }
                out.push((rep.name.clone(), tokens));
            },
        );
    }

    /// `score_into` into a new vector.
    #[must_use]
    pub fn score(&self, tokens: &[u32], lora_id: Option<i64>) -> Vec<(Arc<str>, u32)> {
        let mut out = Vec::new();
        self.score_into(tokens, lora_id, &mut out);
        out
    }

    /// Counters, with current block, replica and memory figures.
    #[must_use]
    pub fn stats(&self) -> KvStats {
        let mut s = self.stats;
        let shards = || {
            self.replicas
                .iter()
                .flatten()
                .flat_map(|r| r.ranks.iter().map(|k| &k.shard))
        };
        s.blocks = shards().map(|x| u64::from(x.held())).sum();
        s.tombstones = shards().map(|x| u64::from(x.tombstones())).sum();
        s.heap_bytes = shards().map(|x| x.heap_bytes() as u64).sum();
        s.replicas = self.ids.len() as u64;
        s
    }
}

impl PrefixOracle for KvIndex {
    fn matches(&self, tokens: &[u32], lora_id: Option<i64>, out: &mut Vec<(Arc<str>, u32)>) {
        self.score_into(tokens, lora_id, out);
    }
}

impl PrefixOracle for parking_lot::RwLock<KvIndex> {
    fn matches(&self, tokens: &[u32], lora_id: Option<i64>, out: &mut Vec<(Arc<str>, u32)>) {
        self.read().score_into(tokens, lora_id, out);
    }
}

/// A prompt's block keys, computed only as far as a lookup asks: most
/// replicas miss on the first block, and galloping rarely needs them all.
struct Chain<'a> {
    tokens: &'a [u32],
    bs: usize,
    keys: Vec<u64>,
    last: u64,
}

impl<'a> Chain<'a> {
    fn new(cfg: KvConfig, tokens: &'a [u32], lora_id: Option<i64>) -> Self {
        Self {
            tokens,
            bs: cfg.block_size as usize,
            keys: Vec::new(),
            last: hash::root(cfg.seed, lora_id, None),
        }
    }

    fn blocks(&self) -> usize {
        self.tokens.len() / self.bs
    }

    fn key(&mut self, i: usize) -> u64 {
        if let Some(&k) = self.keys.get(i) {
            return k;
        }
        if self.keys.capacity() == 0 {
            self.keys.reserve_exact(self.blocks());
        }
        let from = self.keys.len() * self.bs;
        let to = ((i + 1) * self.bs).min(self.tokens.len());
        let tokens = self.tokens.get(from..to).unwrap_or_default();
        let k = hash::extend_keys(self.last, tokens, self.bs, &mut self.keys);
        self.last = k;
        self.keys.get(i).copied().unwrap_or(k)
    }
}

/// Our keys of one stored run, chained from `start`, into `out`.
fn run_keys(start: u64, tokens: &[u32], bs: usize, out: &mut Vec<u64>) {
    out.clear();
    hash::extend_keys(start, tokens, bs, out);
}

impl Rank {
    /// Applies a batch's events to this rank's blocks.
    fn apply(&mut self, cfg: &KvConfig, batch: &Batch, keys: &mut Vec<u64>, st: &mut KvStats) {
        let bs = cfg.block_size as usize;
        for ev in &batch.events {
            match *ev {
                Event::Stored {
                    hashes,
                    parent,
                    tokens,
                    block_size,
                    lora_id,
                    salt,
                    group,
                    full_attention,
                } => {
                    st.stored_events += 1;
                    if !full_attention {
                        self.other_group(group);
                        st.other_group_events += 1;
                        continue;
                    }
                    let hashes = hashes.of(&batch.hashes);
                    let tokens = tokens.of(&batch.tokens);
                    let root = hash::root(cfg.seed, lora_id, salt);
                    let parent = self.shard.parent(parent, root);
                    let (Some(parent), true) = (
                        parent,
                        block_size == cfg.block_size && tokens.len() == hashes.len() * bs,
                    ) else {
                        st.unkeyable += 1;
                        continue;
                    };
                    run_keys(parent.key, tokens, bs, keys);
                    let s = self
                        .shard
                        .store(parent, keys, hashes, cfg.max_blocks_per_replica);
                    st.stored_blocks += s.added;
                    st.evicted += s.evicted;
                }
                Event::Removed { hashes, group } => {
                    st.removed_events += 1;
                    if self.is_other_group(group) {
                        st.other_group_events += 1;
                        continue;
                    }
                    for &h in hashes.of(&batch.hashes) {
                        if self.shard.remove(h) {
                            st.removed_blocks += 1;
                        } else {
                            st.removed_unknown += 1;
                        }
                    }
                }
                Event::Cleared => {
                    st.cleared_events += 1;
                    self.shard.clear();
                }
                Event::Unknown => st.unknown_events += 1,
            }
        }
    }
}
