//! Property tests: after any sequence of stores, removals, clears, restarts,
//! gaps, duplicates and drops across replicas, the KV index scores every
//! prompt exactly as a naive model of held token prefixes does.
#![expect(
    clippy::unwrap_used,
    clippy::many_single_char_names,
    reason = "a test fails loudly; r, p, s, t, e are the model's replica, prompt, seq, tokens, epoch"
)]

#[path = "kv/msgpack.rs"]
#[expect(dead_code, reason = "the writer is shared by several crates; this one uses a part")]
mod msgpack;

use std::collections::{BTreeMap, HashMap};

use llmgw_core::kv::{Applied, KvConfig, KvIndex};
use msgpack::{batch, ints, stored_arr, stored_map, V};
use proptest::prelude::*;

const BS: u32 = 2;
const REPLICAS: [&str; 3] = ["r0", "r1", "r2"];

#[derive(Clone, Debug)]
enum Op {
    /// Store blocks `from..from+n` of prompt `p` (chained on block `from - 1`).
    Store {
        r: usize,
        p: usize,
        from: usize,
        n: usize,
        array: bool,
    },
    /// Remove block `b` of prompt `p`, plus an unknown hash when `junk`.
    Remove {
        r: usize,
        p: usize,
        b: usize,
        junk: bool,
    },
    Clear {
        r: usize,
    },
    /// The engine restarts: seq 0, new hash seed.
    Restart {
        r: usize,
    },
    /// A batch after a missed one: refused; then the same seq replayed in order.
    GapThenReplay {
        r: usize,
        p: usize,
        n: usize,
    },
    /// An old batch delivered again (must change nothing).
    Duplicate {
        r: usize,
        p: usize,
    },
    Drop {
        r: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..REPLICAS.len();
    prop_oneof![
        8 => (r.clone(), 0..4usize, 0..6usize, 1..5usize, any::<bool>())
            .prop_map(|(r, p, from, n, array)| Op::Store { r, p, from, n, array }),
        4 => (r.clone(), 0..4usize, 0..8usize, any::<bool>()).prop_map(|(r, p, b, junk)| Op::Remove { r, p, b, junk }),
        1 => r.clone().prop_map(|r| Op::Clear { r }),
        1 => r.clone().prop_map(|r| Op::Restart { r }),
        1 => (r.clone(), 0..4usize, 1..4usize).prop_map(|(r, p, n)| Op::GapThenReplay { r, p, n }),
        1 => (r.clone(), 0..4usize).prop_map(|(r, p)| Op::Duplicate { r, p }),
        1 => r.prop_map(|r| Op::Drop { r }),
    ]
}

/// Prompts of up to 8 blocks over a 2-letter block alphabet, so they share prefixes.
fn prompts() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(0..2u32, 0..=8), 4).prop_map(|ps| {
        ps.into_iter()
            .map(|blocks| blocks.iter().flat_map(|&c| [c, 7 + c]).collect())
            .collect()
    })
}

/// The model: per replica, the held token prefixes with their engine hash.
#[derive(Default)]
struct Model {
    held: Vec<HashMap<Vec<u32>, i128>>,
    seq: Vec<Option<u64>>,
    epoch: Vec<i128>,
}

/// Engine hash of a prefix: what vLLM does (a hash of parent + tokens), with a
/// per-restart seed; signed, to exercise negative hashes.
fn engine_hash(epoch: i128, prefix: &[u32]) -> i128 {
    let mut h: i128 = 0x1467_5981_0393_4665 ^ epoch;
    for &t in prefix {
        h = (h ^ i128::from(t)).wrapping_mul(1_099_511_628_211) % (1 << 62);
    }
    h - (1 << 61)
}

impl Model {
    fn score(&self, r: usize, tokens: &[u32]) -> u32 {
        let blocks = tokens.len() / BS as usize;
        (1..=blocks)
            .take_while(|&i| self.held[r].contains_key(&tokens[..i * BS as usize]))
            .count() as u32
            * BS
    }
}

struct World {
    ix: KvIndex,
    m: Model,
    prompts: Vec<Vec<u32>>,
}

impl World {
    fn next_seq(&mut self, r: usize) -> u64 {
        let s = self.m.seq[r].map_or(0, |s| s + 1);
        self.m.seq[r] = Some(s);
        s
    }

    /// The store event for blocks `from..from+n` of prompt `p`, applying it to the model.
    fn store(&mut self, r: usize, p: usize, from: usize, n: usize, array: bool) -> Option<V> {
        let t = &self.prompts[p];
        let blocks = t.len() / BS as usize;
        let end = (from + n).min(blocks);
        if from >= end {
            return None;
        }
        let e = self.m.epoch[r];
        let prefix = |i: usize| &t[..i * BS as usize];
        let parent = (from > 0).then(|| engine_hash(e, prefix(from)));
        let hashes: Vec<i128> = (from + 1..=end)
            .map(|i| engine_hash(e, prefix(i)))
            .collect();
        let tokens = &t[from * BS as usize..end * BS as usize];
        if from == 0 || self.m.held[r].contains_key(prefix(from)) {
            for i in from + 1..=end {
                self.m.held[r].insert(prefix(i).to_vec(), engine_hash(e, prefix(i)));
            }
        }
        Some(if array {
            stored_arr(&hashes, parent, tokens, i128::from(BS))
        } else {
            stored_map(&hashes, parent, tokens, i128::from(BS), None)
        })
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Store {
                r,
                p,
                from,
                n,
                array,
            } => {
                if let Some(ev) = self.store(r, p, from, n, array) {
                    let s = self.next_seq(r);
                    assert_eq!(
                        self.ix
                            .apply(REPLICAS[r], s, &batch(vec![ev], Some(0)))
                            .unwrap(),
                        Applied::Applied
                    );
                }
            }
            Op::Remove { r, p, b, junk } => {
                let t = &self.prompts[p];
                if (b + 1) * BS as usize > t.len() {
                    return;
                }
                let prefix = &t[..(b + 1) * BS as usize];
                let mut hashes = vec![engine_hash(self.m.epoch[r], prefix)];
                self.m.held[r].remove(prefix);
                if junk {
                    hashes.push(-3);
                }
                let ev = V::A(vec![V::S("BlockRemoved"), ints(hashes), V::S("GPU")]);
                let s = self.next_seq(r);
                self.ix
                    .apply(REPLICAS[r], s, &batch(vec![ev], Some(0)))
                    .unwrap();
            }
            Op::Clear { r } => {
                self.m.held[r].clear();
                let s = self.next_seq(r);
                let ev = V::M(vec![("type", V::S("AllBlocksCleared"))]);
                self.ix
                    .apply(REPLICAS[r], s, &batch(vec![ev], Some(0)))
                    .unwrap();
            }
            Op::Restart { r } => {
                let was = self.m.seq[r];
                self.m.held[r].clear();
                self.m.epoch[r] += 1;
                self.m.seq[r] = Some(0);
                let got = self
                    .ix
                    .apply(REPLICAS[r], 0, &batch(vec![], Some(0)))
                    .unwrap();
                // seq 0 twice in a row reads as a duplicate: also drop then.
                if was == Some(0) {
                    assert_eq!(got, Applied::Duplicate);
                    self.ix.drop_replica(REPLICAS[r]);
                    self.m.seq[r] = None;
                } else if was.is_some() {
                    assert_eq!(got, Applied::Restarted);
                }
            }
            Op::GapThenReplay { r, p, n } => {
                let Some(last) = self.m.seq[r] else { return };
                let missed = self
                    .store(r, p, 0, n, false)
                    .unwrap_or(V::A(vec![V::S("Future")]));
                let late = batch(vec![], Some(0));
                assert_eq!(
                    self.ix.apply(REPLICAS[r], last + 2, &late).unwrap(),
                    Applied::Gap { from: last + 1 }
                );
                let replay = [(last + 1, batch(vec![missed], Some(0))), (last + 2, late)];
                for (s, b) in replay {
                    assert_eq!(self.ix.apply(REPLICAS[r], s, &b).unwrap(), Applied::Applied);
                }
                self.m.seq[r] = Some(last + 2);
            }
            Op::Duplicate { r, p } => {
                let Some(last) = self.m.seq[r] else { return };
                let t = self.prompts[p].clone();
                let ev = stored_map(
                    &[1],
                    None,
                    &t[..t.len().min(BS as usize)],
                    i128::from(BS),
                    None,
                );
                assert_eq!(
                    self.ix
                        .apply(REPLICAS[r], last, &batch(vec![ev], Some(0)))
                        .unwrap(),
                    Applied::Duplicate
                );
            }
            Op::Drop { r } => {
                self.ix.drop_replica(REPLICAS[r]);
                self.m.held[r].clear();
                self.m.seq[r] = None;
            }
        }
    }

    fn check(&self, extra: &[Vec<u32>]) {
        for t in self.prompts.iter().chain(extra) {
            let got: BTreeMap<String, u32> = self
                .ix
                .score(t, None)
                .into_iter()
                .map(|(r, n)| (r.to_string(), n))
                .collect();
            let want: BTreeMap<String, u32> = (0..REPLICAS.len())
                .map(|r| (REPLICAS[r].to_string(), self.m.score(r, t)))
                .filter(|&(_, n)| n > 0)
                .collect();
            assert_eq!(got, want, "prompt {t:?}");
        }
        let held: usize = self.m.held.iter().map(HashMap::len).sum();
        assert_eq!(self.ix.stats().blocks, held as u64);
    }
}

fn world(prompts: Vec<Vec<u32>>, max: u32) -> World {
    World {
        ix: KvIndex::new(KvConfig {
            block_size: BS,
            max_blocks_per_replica: max,
            seed: 1,
        }),
        m: Model {
            held: vec![HashMap::new(); REPLICAS.len()],
            seq: vec![None; REPLICAS.len()],
            epoch: vec![0; REPLICAS.len()],
        },
        prompts,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn index_agrees_with_the_model(ps in prompts(), ops in prop::collection::vec(op(), 1..60)) {
        let mut w = world(ps, 1 << 20);
        for op in &ops {
            w.run(op);
            w.check(&[]);
        }
    }

    #[test]
    fn bounded_index_holds_a_subset(ps in prompts(), ops in prop::collection::vec(op(), 1..60), max in 1u32..6) {
        let mut w = world(ps, max);
        for op in &ops {
            w.run(op);
            for t in &w.prompts {
                for (r, n) in w.ix.score(t, None) {
                    let i = REPLICAS.iter().position(|x| **x == *r).unwrap();
                    prop_assert!(n <= w.m.score(i, t), "{r} scored {n} on {t:?}");
                }
            }
            let s = w.ix.stats();
            // One event may overshoot the bound until it is applied whole.
            prop_assert!(s.blocks + s.tombstones <= u64::from(max) * REPLICAS.len() as u64);
        }
    }
}
