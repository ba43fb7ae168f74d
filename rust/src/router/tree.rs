//! The approximate prefix cache of one model: a radix tree of the prompts this
//! gateway routed, recording on each node which replicas were sent a prompt
//! through it and when.
//!
//! Keys are the prompt's UTF-8 bytes, not chars: a match that ends inside a
//! multi-byte char is off by at most three bytes, and byte edges split and
//! compare without decoding.
//!
//! Invariant the matcher and the pruners rely on: a tenant on a node is on its
//! parent too, with a time at least as recent (an insert touches every node of
//! its path). So an expired claim on a node is expired on all nodes below it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A node's index in the arena; the root is 0.
type NodeId = u32;

const ROOT: NodeId = 0;
/// The parent of a node on the free list.
const FREE: NodeId = NodeId::MAX;

#[derive(Clone, Debug, Default)]
struct Node {
    /// The bytes on the edge from the parent to here; empty only for the root.
    edge: Vec<u8>,
    parent: NodeId,
    /// Sorted by first byte: a lookup is a binary search, and text rarely fans
    /// out beyond a few dozen distinct next bytes.
    children: Vec<(u8, NodeId)>,
    /// (tenant, last time a prompt through here went to it), in milliseconds.
    tenants: Vec<(u32, u64)>,
}

impl Node {
    fn last(&self) -> u64 {
        self.tenants.iter().map(|&(_, t)| t).max().unwrap_or(0)
    }

    fn child(&self, b: u8) -> Option<NodeId> {
        self.children
            .binary_search_by_key(&b, |&(k, _)| k)
            .ok()
            .and_then(|i| self.children.get(i))
            .map(|&(_, c)| c)
    }

    fn touch(&mut self, tenant: u32, now: u64) {
        match self.tenants.iter_mut().find(|(t, _)| *t == tenant) {
            Some(entry) => entry.1 = entry.1.max(now),
            None => self.tenants.push((tenant, now)),
        }
    }
}

/// Bounds of one tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes on all edges together.
    pub max_bytes: usize,
    /// Most nodes, the root not counted.
    pub max_nodes: usize,
    /// A claim older than this many milliseconds is ignored and then removed.
    pub ttl_ms: u64,
}

/// A bounded radix tree of routed prompts, per replica ("tenant").
#[derive(Clone, Debug)]
pub struct PrefixTree {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    bytes: usize,
    live: usize,
    limits: Limits,
    last_sweep: u64,
}

/// Length of the common prefix. Whole 32-byte blocks compare as slices first
/// (a memcmp), since prompts share prefixes of thousands of bytes and a
/// byte-at-a-time loop was most of a route's time.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 32;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + BLOCK <= n && a.get(i..i + BLOCK) == b.get(i..i + BLOCK) {
        i += BLOCK;
    }
    let (a, b) = (
        a.get(i..n).unwrap_or_default(),
        b.get(i..n).unwrap_or_default(),
    );
    i + a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixTree {
    /// An empty tree.
    #[must_use]
    pub fn new(limits: Limits) -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
            bytes: 0,
            live: 0,
            limits,
            last_sweep: 0,
        }
    }

    /// Changes the bounds; the next insert enforces them.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Bytes held on edges.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Nodes held, the root not counted.
    #[must_use]
    pub fn nodes(&self) -> usize {
        self.live
    }

    fn node(&self, id: NodeId) -> &Node {
        // Ids come only from the tree's own links; a miss would be a bug, and an
        // empty node makes it a cache miss rather than a crash.
        static EMPTY: Node = Node {
            edge: Vec::new(),
            parent: FREE,
            children: Vec::new(),
            tenants: Vec::new(),
        };
        self.nodes.get(id as usize).unwrap_or(&EMPTY)
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        self.live += 1;
        self.bytes += node.edge.len();
        if let Some(id) = self.free.pop() {
            if let Some(slot) = self.nodes.get_mut(id as usize) {
                *slot = node;
                return id;
            }
        }
        self.nodes.push(node);
        NodeId::try_from(self.nodes.len() - 1).unwrap_or(FREE)
    }

    /// Records that `key` was routed to `tenant` at `now` (milliseconds), then
    /// enforces the bounds: expired claims first, then least recently used leaves.
    pub fn insert(&mut self, key: &[u8], tenant: u32, now: u64) {
        let key = key.get(..self.limits.max_bytes).unwrap_or(key);
        let (mut node, mut pos) = (ROOT, 0);
        while let Some(&b) = key.get(pos) {
            let rest = key.get(pos..).unwrap_or_default();
            let Some(c) = self.node(node).child(b) else {
                let leaf = self.alloc(Node {
                    edge: rest.to_vec(),
                    parent: node,
                    children: Vec::new(),
                    tenants: vec![(tenant, now)],
                });
                self.link(node, b, leaf);
                break;
            };
            let common = common_prefix(&self.node(c).edge, rest);
            let c = if common < self.node(c).edge.len() {
                self.split(c, common)
            } else {
                c
            };
            if let Some(n) = self.nodes.get_mut(c as usize) {
                n.touch(tenant, now);
            }
            pos += common;
            node = c;
        }
        if now >= self.last_sweep.saturating_add(self.limits.ttl_ms / 4) {
            // A sweep walks the whole tree, so it runs a few times per ttl, not
            // per insert; matching ignores expired claims in between anyway.
            self.last_sweep = now;
            self.expire(now);
        }
        if self.bytes > self.limits.max_bytes || self.live > self.limits.max_nodes {
            self.evict();
        }
    }

    fn link(&mut self, parent: NodeId, b: u8, child: NodeId) {
        if let Some(p) = self.nodes.get_mut(parent as usize) {
            match p.children.binary_search_by_key(&b, |&(k, _)| k) {
                Ok(i) => {
                    if let Some(slot) = p.children.get_mut(i) {
                        slot.1 = child;
                    }
                }
                Err(i) => p.children.insert(i, (b, child)),
            }
        }
    }

    /// Splits `c`'s edge after `at` bytes (0 < at < len); returns the new upper node.
    fn split(&mut self, c: NodeId, at: usize) -> NodeId {
        let old = self.node(c);
        let (head, tail) = old.edge.split_at(at.min(old.edge.len()));
        let (head, tail) = (head.to_vec(), tail.to_vec());
        let (parent, tenants) = (old.parent, old.tenants.clone());
        let (first, tail_first) = (head.first().copied(), tail.first().copied());
        // `alloc` counts the head's bytes; the tail's shrink below keeps the total.
        self.bytes -= head.len();
        let mid = self.alloc(Node {
            edge: head,
            parent,
            children: tail_first.map(|b| (b, c)).into_iter().collect(),
            tenants,
        });
        if let Some(n) = self.nodes.get_mut(c as usize) {
            n.edge = tail;
            n.parent = mid;
        }
        if let Some(b) = first {
            self.link(parent, b, mid);
        }
        mid
    }

    /// For each tenant with a live claim on a prefix of `key`, the length of its
    /// longest matched prefix, into `out` (cleared first, unordered).
    pub fn matches(&self, key: &[u8], now: u64, out: &mut Vec<(u32, usize)>) {
        out.clear();
        let cutoff = now.saturating_sub(self.limits.ttl_ms);
        let (mut node, mut pos) = (ROOT, 0);
        while let Some(&b) = key.get(pos) {
            let Some(c) = self.node(node).child(b) else {
                break;
            };
            let n = self.node(c);
            let common = common_prefix(&n.edge, key.get(pos..).unwrap_or_default());
            for &(t, time) in &n.tenants {
                if time < cutoff {
                    continue;
                }
                // Deeper nodes come later, so a later depth always wins.
                match out.iter_mut().find(|(x, _)| *x == t) {
                    Some(e) => e.1 = pos + common,
                    None => out.push((t, pos + common)),
                }
            }
            if common < n.edge.len() {
                break;
            }
            pos += common;
            node = c;
        }
    }

    /// Removes claims older than the ttl, and the nodes left without one.
    pub fn expire(&mut self, now: u64) {
        let cutoff = now.saturating_sub(self.limits.ttl_ms);
        self.prune(|_, time| time >= cutoff);
    }

    /// Removes every claim of `tenant` (a replica that went away).
    pub fn remove_tenant(&mut self, tenant: u32) {
        self.prune(|t, _| t != tenant);
    }

    /// Keeps the claims `keep` accepts; drops each node left with none, and so
    /// (by the invariant) its whole subtree.
    fn prune(&mut self, keep: impl Fn(u32, u64) -> bool) {
        let mut stack = vec![ROOT];
        while let Some(id) = stack.pop() {
            let children = self.node(id).children.clone();
            for (b, c) in children {
                let Some(n) = self.nodes.get_mut(c as usize) else {
                    continue;
                };
                n.tenants.retain(|&(t, time)| keep(t, time));
                if n.tenants.is_empty() {
                    self.unlink(id, b);
                    self.free_subtree(c);
                } else {
                    stack.push(c);
                }
            }
        }
    }

    fn unlink(&mut self, parent: NodeId, b: u8) {
        if let Some(p) = self.nodes.get_mut(parent as usize) {
            p.children.retain(|&(k, _)| k != b);
        }
    }

    fn free_subtree(&mut self, root: NodeId) {
        let mut stack = vec![root];
        while let Some(id) = stack.pop() {
            let Some(n) = self.nodes.get_mut(id as usize) else {
                continue;
            };
            let n = std::mem::take(n);
            stack.extend(n.children.iter().map(|&(_, c)| c));
            self.bytes -= n.edge.len();
            self.live -= 1;
            if let Some(slot) = self.nodes.get_mut(id as usize) {
                slot.parent = FREE;
            }
            self.free.push(id);
        }
    }

    /// Drops least recently used leaves until both bounds have a tenth to spare,
    /// so that the scan for leaves is paid once per many inserts.
    fn evict(&mut self) {
        let target_bytes = self.limits.max_bytes - self.limits.max_bytes / 10;
        let target_nodes = self.limits.max_nodes - self.limits.max_nodes / 10;
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, n)| n.parent != FREE && n.children.is_empty())
            .filter_map(|(i, n)| Some(Reverse((n.last(), NodeId::try_from(i).ok()?))))
            .collect();
        while self.bytes > target_bytes || self.live > target_nodes {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let n = self.node(id);
            let (parent, first) = (n.parent, n.edge.first().copied());
            if let Some(b) = first {
                self.unlink(parent, b);
            }
            self.free_subtree(id);
            let p = self.node(parent);
            // A parent's claims are at least as recent as its children's, so it
            // joins the heap in order.
            if parent != ROOT && p.children.is_empty() {
                heap.push(Reverse((p.last(), parent)));
            }
        }
    }
}
