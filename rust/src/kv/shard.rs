//! The blocks one engine publisher (a replica's data-parallel rank) holds.
//!
//! Nodes live in a slab and are found through two tables of u32 slab indexes:
//! by our key (lookups, chaining) and by engine hash (parents, removals). A
//! node is 32 bytes and each table slot 5 (index + control byte), which is how
//! a held block stays under 64 bytes with the tables' and the slab's slack.
//!
//! Prefix closure. Lookups binary-search a prompt's chain, which is exact only
//! when holding a block implies holding its parent. Engines evict tails first,
//! so that is the normal state, but a `BlockRemoved` may hit a block whose
//! children are still held. Such a node stays as a *tombstone* (no longer held,
//! still counted as its children's parent) until its last child goes, and a
//! shard with tombstones is searched linearly until then. Revival is exact too:
//! a tombstone stored again is simply held again.
//!
//! Eviction (the bound on blocks) takes the front of a list in which every
//! node sits before all of its ancestors: a new block is inserted just before
//! its parent (roots at the back). The front is therefore always a leaf, so
//! our own evictions never make tombstones; the price is that a block inherits
//! its parent's age, i.e. a chain is evicted tail first, oldest chain first,
//! much as the engine itself does.

use hashbrown::HashTable;

use super::hash;

/// "No node" in the u32 links.
const NIL: u32 = u32::MAX;
/// Set in `Node::kids` while the block is held (clear: tombstone or free).
const HELD: u32 = 1 << 31;
/// `Node::kids` of a slot on the free list.
const FREE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    key: u64,
    engine: u64,
    parent: u32,
    /// Child nodes (held or tombstone), plus `HELD`.
    kids: u32,
    /// Eviction list neighbours: `older` is nearer the front. `newer` also
    /// links the free list.
    older: u32,
    newer: u32,
}

impl Node {
    fn held(&self) -> bool {
        self.kids != FREE && self.kids & HELD != 0
    }

    fn kid_count(&self) -> u32 {
        self.kids & !HELD
    }
}

/// The result of storing one event's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// Blocks newly held.
    pub added: u64,
    /// Blocks evicted to stay within the bound.
    pub evicted: u64,
}

/// A resolved parent: its node (or none for the root) and its key.
#[derive(Clone, Copy, Debug)]
pub struct Parent {
    node: u32,
    /// Our key of the parent block (or the root key).
    pub key: u64,
}

/// What one engine publisher's cache holds, by our keys.
#[derive(Debug, Default)]
pub struct Shard {
    nodes: Vec<Node>,
    free: u32,
    by_key: HashTable<u32>,
    by_engine: HashTable<u32>,
    front: u32,
    back: u32,
    held: u32,
    tombstones: u32,
}

impl Shard {
    /// An empty shard.
    #[must_use]
    pub fn new() -> Self {
        Self {
            free: NIL,
            front: NIL,
            back: NIL,
            ..Self::default()
        }
    }

    /// Blocks held.
    #[must_use]
    pub fn held(&self) -> u32 {
        self.held
    }

    /// Removed blocks kept because children are still held.
    #[must_use]
    pub fn tombstones(&self) -> u32 {
        self.tombstones
    }

    /// Heap bytes this shard uses (slab and both tables).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.by_key.allocation_size()
            + self.by_engine.allocation_size()
    }

    fn node(&self, i: u32) -> Option<&Node> {
        self.nodes.get(i as usize)
    }

    fn find_key(&self, key: u64) -> Option<u32> {
        let nodes = &self.nodes;
        self.by_key
            .find(key, |&i| {
                nodes.get(i as usize).is_some_and(|n| n.key == key)
            })
            .copied()
    }

    fn find_engine(&self, engine: u64) -> Option<u32> {
        let nodes = &self.nodes;
        self.by_engine
            .find(hash::spread(engine), |&i| {
                nodes
                    .get(i as usize)
                    .is_some_and(|n| n.engine == engine && n.held())
            })
            .copied()
    }

    /// True when the block with our key `key` is held.
    #[must_use]
    pub fn holds(&self, key: u64) -> bool {
        self.find_key(key)
            .and_then(|i| self.node(i))
            .is_some_and(Node::held)
    }

    /// Where a stored chain attaches: the held block with engine hash `engine`,
    /// or the root (key `root`) for `None`. `None` when that block is unknown.
    #[must_use]
    pub fn parent(&self, engine: Option<u64>, root: u64) -> Option<Parent> {
        match engine {
            None => Some(Parent {
                node: NIL,
                key: root,
            }),
            Some(e) => {
                let node = self.find_engine(e)?;
                Some(Parent {
                    node,
                    key: self.node(node)?.key,
                })
            }
        }
    }

    /// Stores a chain of blocks under `parent`: `keys[j]` (ours) with engine
    /// hash `engines[j]`. Keeps at most `max` nodes afterwards.
    pub fn store(&mut self, parent: Parent, keys: &[u64], engines: &[u64], max: u32) -> Stored {
        let mut parent = parent.node;
        let mut out = Stored::default();
        for (&key, &engine) in keys.iter().zip(engines) {
            let i = if let Some(i) = self.find_key(key) {
                if !self.nodes[i as usize].held() {
                    self.revive(i, engine);
                    out.added += 1;
                } else if self.nodes[i as usize].engine != engine {
                    self.rename(i, engine);
                }
                i
            } else {
                out.added += 1;
                self.insert(key, engine, parent)
            };
            parent = i;
        }
        // Evicting only now keeps the chain's own nodes (our parents) alive
        // while it is built; the bound is overshot by one event at most.
        while self.held + self.tombstones > max && self.front != NIL {
            self.unhold(self.front);
            out.evicted += 1;
        }
        out
    }

    fn insert(&mut self, key: u64, engine: u64, parent: u32) -> u32 {
        // Before the node is in the slab: a rebuild must not see it yet.
        self.make_room();
        let node = Node {
            key,
            engine,
            parent,
            kids: HELD,
            older: NIL,
            newer: NIL,
        };
        let i = if self.free == NIL {
            if self.nodes.len() == self.nodes.capacity() {
                // Grow by an eighth, not double: the slab's slack is what
                // decides bytes per block, and copies are cheap next to hashing.
                self.nodes.reserve_exact(self.nodes.len() / 8 + 64);
            }
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        } else {
            let i = self.free;
            self.free = self.nodes[i as usize].newer;
            self.nodes[i as usize] = node;
            i
        };
        let nodes = &self.nodes;
        self.by_key
            .insert_unique(key, i, |&j| nodes[j as usize].key);
        self.by_engine.insert_unique(hash::spread(engine), i, |&j| {
            hash::spread(nodes[j as usize].engine)
        });
        if let Some(p) = self.nodes.get_mut(parent as usize) {
            p.kids += 1;
        }
        self.link(i, parent);
        self.held += 1;
        i
    }

    /// Grows (or purges) a full table by building it again from the slab.
    ///
    /// hashbrown's own resize asks for each entry's hash in bucket order,
    /// which here means reading the nodes in random order: a cache miss per
    /// block, and table growth was 7% of a bench run. Walking the slab in
    /// order instead reads it at memory speed. The new table is sized as
    /// hashbrown would (double, or the same when deletions filled it).
    fn make_room(&mut self) {
        let nodes = &self.nodes;
        if self.by_key.len() == self.by_key.capacity() {
            let mut t = HashTable::with_capacity(self.by_key.len() + 1);
            for (i, n) in (0u32..).zip(nodes) {
                if n.kids != FREE {
                    t.insert_unique(n.key, i, |&j| nodes[j as usize].key);
                }
            }
            self.by_key = t;
        }
        if self.by_engine.len() == self.by_engine.capacity() {
            let mut t = HashTable::with_capacity(self.by_engine.len() + 1);
            for (i, n) in (0u32..).zip(nodes) {
                if n.held() {
                    t.insert_unique(hash::spread(n.engine), i, |&j| {
                        hash::spread(nodes[j as usize].engine)
                    });
                }
            }
            self.by_engine = t;
        }
    }

    /// The same tokens stored again under another engine hash (blocks whose
    /// extra keys differ: images, salts): the latest hash wins, because the
    /// events that follow chain onto it; a removal of the older one is then
    /// counted as unknown and the block stays until the newer one goes.
    fn rename(&mut self, i: u32, engine: u64) {
        self.make_room();
        let old = self.nodes[i as usize].engine;
        if let Ok(e) = self.by_engine.find_entry(hash::spread(old), |&j| j == i) {
            e.remove();
        }
        self.nodes[i as usize].engine = engine;
        let nodes = &self.nodes;
        self.by_engine.insert_unique(hash::spread(engine), i, |&j| {
            hash::spread(nodes[j as usize].engine)
        });
    }

    /// Holds tombstone `i` again. Its own parent link is kept: the same key
    /// means the same parent key, and that parent is alive (it counts `i`).
    fn revive(&mut self, i: u32, engine: u64) {
        self.make_room();
        let n = &mut self.nodes[i as usize];
        n.engine = engine;
        n.kids |= HELD;
        let parent = n.parent;
        let nodes = &self.nodes;
        self.by_engine.insert_unique(hash::spread(engine), i, |&j| {
            hash::spread(nodes[j as usize].engine)
        });
        self.tombstones -= 1;
        self.held += 1;
        self.link(i, parent);
    }

    /// Puts node `i` just before `parent` in the eviction list (at the back
    /// for a root), so that it goes before every one of its ancestors.
    fn link(&mut self, i: u32, parent: u32) {
        let newer = if parent == NIL { NIL } else { parent };
        let older = if newer == NIL {
            self.back
        } else {
            self.nodes[newer as usize].older
        };
        self.nodes[i as usize].older = older;
        self.nodes[i as usize].newer = newer;
        match self.nodes.get_mut(older as usize) {
            Some(o) => o.newer = i,
            None => self.front = i,
        }
        match self.nodes.get_mut(newer as usize) {
            Some(n) => n.older = i,
            None => self.back = i,
        }
    }

    fn unlink(&mut self, i: u32) {
        let Node { older, newer, .. } = self.nodes[i as usize];
        match self.nodes.get_mut(older as usize) {
            Some(o) => o.newer = newer,
            None => self.front = newer,
        }
        match self.nodes.get_mut(newer as usize) {
            Some(n) => n.older = older,
            None => self.back = older,
        }
    }

    /// Applies a `BlockRemoved` of one engine hash; false when it is unknown.
    pub fn remove(&mut self, engine: u64) -> bool {
        match self.find_engine(engine) {
            Some(i) => {
                self.unhold(i);
                true
            }
            None => false,
        }
    }

    /// Stops holding node `i`: a tombstone while it has children, else freed.
    fn unhold(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        if let Ok(e) = self
            .by_engine
            .find_entry(hash::spread(n.engine), |&j| j == i)
        {
            e.remove();
        }
        self.unlink(i);
        self.held -= 1;
        self.nodes[i as usize].kids &= !HELD;
        if n.kid_count() > 0 {
            self.tombstones += 1;
        } else {
            self.free_chain(i);
        }
    }

    /// Frees childless, unheld node `i`, then its parent if that leaves it a
    /// childless tombstone, and so on up.
    fn free_chain(&mut self, mut i: u32) {
        loop {
            let n = self.nodes[i as usize];
            if let Ok(e) = self.by_key.find_entry(n.key, |&j| j == i) {
                e.remove();
            }
            self.nodes[i as usize] = Node {
                key: 0,
                engine: 0,
                parent: NIL,
                kids: FREE,
                older: NIL,
                newer: self.free,
            };
            self.free = i;
            let Some(p) = self.nodes.get_mut(n.parent as usize) else {
                return;
            };
            p.kids -= 1;
            if p.kids != 0 {
                return;
            }
            // A parent with no children left and not held is a tombstone.
            self.tombstones -= 1;
            i = n.parent;
        }
    }

    /// Drops every block (`AllBlocksCleared`, engine restart).
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// How many leading blocks of a prompt, given by its keys, this shard
    /// holds. `key(i)` returns (computing on demand) the key of block `i < n`.
    pub fn longest(&self, n: usize, mut key: impl FnMut(usize) -> u64) -> usize {
        if n == 0 || self.held == 0 || !self.holds(key(0)) {
            return 0;
        }
        if self.tombstones > 0 {
            return 1 + (1..n).take_while(|&i| self.holds(key(i))).count();
        }
        // Closed under parents: held(i) implies held(i - 1), so the held blocks
        // are a prefix. Gallop (short matches cost few probes, and keys are
        // computed only as far as needed), then bisect.
        let (mut lo, mut step) = (0, 1); // block `lo` is held
        let hi = loop {
            let probe = lo + step;
            if probe >= n {
                break n;
            }
            if !self.holds(key(probe)) {
                break probe;
            }
            lo = probe;
            step *= 2;
        };
        // Invariant: `lo` held, `hi` not held (or n).
        let (mut lo, mut hi) = (lo, hi);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.holds(key(mid)) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo + 1
    }
}
