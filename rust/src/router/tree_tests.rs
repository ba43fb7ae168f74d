use super::tree::{Limits, PrefixTree};

fn tree(max_bytes: usize, max_nodes: usize, ttl_ms: u64) -> PrefixTree {
    PrefixTree::new(Limits {
        max_bytes,
        max_nodes,
        ttl_ms,
    })
}

fn matches(t: &PrefixTree, key: &str, now: u64) -> Vec<(u32, usize)> {
    let mut out = Vec::new();
    t.matches(key.as_bytes(), now, &mut out);
    out.sort_unstable();
    out
}

#[test]
fn insert_split_and_match() {
    let mut t = tree(1 << 20, 1000, 10_000);
    t.insert(b"hello world", 0, 0);
    t.insert(b"hello there", 1, 1);
    t.insert(b"help", 2, 2);
    // "hel" + "lo " shared, then "world" / "there"; "p" under "hel".
    assert_eq!(t.nodes(), 5);
    assert_eq!(t.bytes(), "hello world".len() + "there".len() + "p".len());
    assert_eq!(matches(&t, "hello world!", 3), [(0, 11), (1, 6), (2, 3)]);
    assert_eq!(matches(&t, "hello thermos", 3), [(0, 6), (1, 10), (2, 3)]);
    assert_eq!(matches(&t, "help me", 3), [(0, 3), (1, 3), (2, 4)]);
    assert_eq!(matches(&t, "xyz", 3), []);
    assert_eq!(matches(&t, "", 3), []);
    // A prompt that ends inside an edge still counts what it matched.
    assert_eq!(matches(&t, "hello wo", 3), [(0, 8), (1, 6), (2, 3)]);
    // Re-inserting a prefix of an edge splits it without new bytes.
    let bytes = t.bytes();
    t.insert(b"hello wo", 1, 4);
    assert_eq!(t.bytes(), bytes);
    assert_eq!(matches(&t, "hello world", 5), [(0, 11), (1, 8), (2, 3)]);
}

#[test]
fn size_eviction_drops_least_recently_used_leaves() {
    // 3 prompts of 10 distinct bytes; room for 25.
    let mut t = tree(25, 1000, 1_000_000);
    t.insert(b"aaaaaaaaaa", 0, 1);
    t.insert(b"bbbbbbbbbb", 1, 2);
    t.insert(b"aaaaaaaaaa", 0, 3); // "a..." is now fresher than "b..."
    t.insert(b"cccccccccc", 2, 4);
    // Over 25: evict down to 25 - 2 = 23, so the oldest leaf ("b...") goes.
    assert_eq!(t.bytes(), 20);
    assert_eq!(matches(&t, "bbbbbbbbbb", 5), []);
    assert_eq!(matches(&t, "aaaaaaaaaa", 5), [(0, 10)]);
    assert_eq!(matches(&t, "cccccccccc", 5), [(2, 10)]);
}

#[test]
fn node_eviction_removes_leaves_before_their_parents() {
    let mut t = tree(1 << 20, 4, 1_000_000);
    t.insert(b"abc1", 0, 1);
    t.insert(b"abc2", 1, 2);
    t.insert(b"abc3", 2, 3); // nodes: "abc", "1", "2", "3"
    assert_eq!(t.nodes(), 4);
    t.insert(b"xyz", 3, 4); // 5 nodes: evict to 4 - 0 = 4: "1" goes
    assert_eq!(t.nodes(), 4);
    assert_eq!(matches(&t, "abc1", 5), [(0, 3), (1, 3), (2, 3)]);
    assert_eq!(matches(&t, "abc3", 5), [(0, 3), (1, 3), (2, 4)]);
    assert_eq!(matches(&t, "xyz", 5), [(3, 3)]);
}

#[test]
fn age_expiry_hides_then_removes_old_claims() {
    let mut t = tree(1 << 20, 1000, 100);
    t.insert(b"old prompt", 0, 0);
    t.insert(b"old prompt, new turn", 1, 50);
    assert_eq!(matches(&t, "old prompt", 100), [(0, 10), (1, 10)]);
    // At 101 replica 0's claim (time 0) is past the ttl; 1's (50) is not.
    assert_eq!(matches(&t, "old prompt", 101), [(1, 10)]);
    t.expire(151);
    assert_eq!(matches(&t, "old prompt", 151), []);
    assert_eq!((t.nodes(), t.bytes()), (0, 0));
}

#[test]
fn insert_sweeps_expired_claims_without_being_asked() {
    let mut t = tree(1 << 20, 1000, 100);
    t.insert(b"first", 0, 0);
    t.insert(b"second", 0, 200);
    assert_eq!(t.bytes(), "second".len());
}

#[test]
fn removing_a_tenant_keeps_shared_nodes() {
    let mut t = tree(1 << 20, 1000, 1000);
    t.insert(b"shared-a", 0, 0);
    t.insert(b"shared-b", 1, 0);
    t.remove_tenant(0);
    assert_eq!(matches(&t, "shared-a", 1), [(1, 7)]);
    assert_eq!(t.bytes(), "shared-b".len());
}

#[test]
fn prompts_longer_than_the_tree_are_cut() {
    let mut t = tree(8, 1000, 1000);
    t.insert(b"0123456789", 0, 0);
    assert_eq!(t.bytes(), 8);
    assert_eq!(matches(&t, "0123456789", 1), [(0, 8)]);
}
