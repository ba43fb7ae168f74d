//! Sequence tracking per engine publisher (a replica's data-parallel rank).
//!
//! vLLM numbers each publisher's batches from 0 (`itertools.count()`), delivers
//! them at least once over PUB/SUB, and keeps the last ones for replay. So a
//! repeated seq is a duplicate, a jump is a loss that replay can fill, and a
//! fall back to 0 is a restarted engine whose old blocks are gone.

use std::sync::Arc;

use super::shard::Shard;

/// What `KvIndex::apply` did with a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// In order (or the first from this publisher): applied.
    Applied,
    /// Already applied (seq at or below the last one): ignored.
    Duplicate,
    /// The publisher restarted (seq 0 after a later one): its blocks were
    /// dropped, then the batch applied.
    Restarted,
    /// Batches were missed: nothing applied. Replay from `from` (inclusive)
    /// and feed the replies through `apply` in order; live batches after them
    /// then apply, and the ones replay already brought are duplicates.
    Gap {
        /// The first missing seq.
        from: u64,
    },
}

/// One replica: its id and a state per data-parallel rank.
#[derive(Debug)]
pub(super) struct Replica {
    pub(super) name: Arc<str>,
    pub(super) ranks: Vec<Rank>,
}

impl Replica {
    pub(super) fn new(name: Arc<str>) -> Self {
        Self {
            name,
            ranks: Vec::new(),
        }
    }

    /// The state of rank `dp`, made on first use (ranks are few: a scan).
    pub(super) fn rank(&mut self, dp: i64) -> &mut Rank {
        let i = if let Some(i) = self.ranks.iter().position(|r| r.dp == dp) {
            i
        } else {
            self.ranks.push(Rank {
                dp,
                last: None,
                other_groups: 0,
                shard: Shard::new(),
            });
            self.ranks.len() - 1
        };
        &mut self.ranks[i]
    }
}

/// One publisher: the last seq applied and the blocks it holds.
#[derive(Debug)]
pub(super) struct Rank {
    dp: i64,
    last: Option<u64>,
    /// KV-cache groups (bit per `group_idx` < 64) seen to be other than full
    /// attention: their removals are ignored like their stores.
    other_groups: u64,
    pub(super) shard: Shard,
}

impl Rank {
    /// Decides what to do with batch `seq`, and advances the seq when it applies.
    pub(super) fn admit(&mut self, seq: u64) -> Applied {
        let verdict = match self.last {
            None => Applied::Applied,
            Some(last) if seq == last.wrapping_add(1) => Applied::Applied,
            Some(last) if seq == 0 && last > 0 => {
                self.shard.clear();
                self.other_groups = 0;
                Applied::Restarted
            }
            Some(last) if seq <= last => Applied::Duplicate,
            Some(last) => return Applied::Gap { from: last + 1 },
        };
        if verdict != Applied::Duplicate {
            self.last = Some(seq);
        }
        verdict
    }

    pub(super) fn other_group(&mut self, group: Option<u32>) {
        if let Some(g) = group.filter(|&g| g < 64) {
            self.other_groups |= 1 << g;
        }
    }

    pub(super) fn is_other_group(&self, group: Option<u32>) -> bool {
        group.is_some_and(|g| g < 64 && self.other_groups & (1 << g) != 0)
    }
}
