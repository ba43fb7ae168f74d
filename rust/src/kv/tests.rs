//! Unit tests: the key function is pinned (keys must be stable across
//! processes and versions), and the shard's bookkeeping holds.
#![expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]

use super::hash;
use super::shard::Shard;

#[test]
fn keys_are_pinned() {
    let t: Vec<u32> = (0..16).collect();
    let root = hash::root(0, None, None);
    let k0 = hash::chain(root, hash::content(&t));
    // Printed once and pinned: changing any of these breaks every gateway
    // that runs a different version against the same engines.
    assert_eq!(
        [
            root,
            hash::content(&t),
            k0,
            hash::content(&t[..5]),
            hash::bytes(b"abc"),
            hash::root(1, Some(3), Some(9))
        ],
        PINNED
    );
}

const PINNED: [u64; 6] = [
    11_216_705_944_786_624_478,
    8_535_230_924_625_321_643,
    13_396_454_088_769_225_041,
    10_422_845_854_773_923_882,
    14_410_345_305_821_098_369,
    11_545_737_691_250_588_086,
];

#[test]
fn one_changed_block_changes_every_key_from_it_on() {
    // The chain step is a bijection of the parent (odd multiplier) and of the
    // content: a prompt differing from another in one block's content can
    // never share a key with it at or after that block.
    let a: Vec<u32> = (0..16 * 64).map(|x| x * 7919 % 150_000).collect();
    let ka: Vec<u64> = {
        let mut v = Vec::new();
        hash::extend_keys(hash::root(0, None, None), &a, 16, &mut v);
        v
    };
    for j in [0usize, 1, 31, 63] {
        let mut b = a.clone();
        b[16 * j + 5] += 1;
        let mut kb = Vec::new();
        hash::extend_keys(hash::root(0, None, None), &b, 16, &mut kb);
        assert_eq!(ka[..j], kb[..j]);
        assert!(
            ka[j..].iter().zip(&kb[j..]).all(|(x, y)| x != y),
            "block {j}"
        );
    }
}

#[test]
fn content_depends_on_order_and_length() {
    let a: Vec<u32> = (0..32).collect();
    let mut b = a.clone();
    b.swap(0, 16); // chunks 0 and 4 swapped would collide without per-chunk secrets
    assert_ne!(hash::content(&a), hash::content(&b));
    assert_ne!(hash::content(&[1, 2, 0]), hash::content(&[1, 2]));
    assert_ne!(hash::root(0, None, None), hash::root(0, Some(0), None));
}

#[test]
fn the_16_token_fast_path_matches_the_general_loop() {
    let t: Vec<u32> = (100..116).map(|x| x * 7919).collect();
    assert_eq!(hash::content(&t), hash::content_loop(&t));
}

fn store(s: &mut Shard, parent: Option<u64>, keys: &[u64], engines: &[u64], max: u32) {
    let p = s.parent(parent, 0).unwrap();
    s.store(p, keys, engines, max);
}

#[test]
fn tombstones_go_when_their_last_child_goes() {
    let mut s = Shard::new();
    store(&mut s, None, &[10, 11, 12], &[1, 2, 3], 100);
    assert!(s.remove(1));
    assert!(s.remove(2));
    assert_eq!((s.held(), s.tombstones()), (1, 2));
    assert!(s.remove(3));
    assert_eq!((s.held(), s.tombstones()), (0, 0));
    assert!(!s.remove(3));
}

#[test]
fn same_key_new_engine_hash_latest_wins() {
    let mut s = Shard::new();
    store(&mut s, None, &[10], &[1], 100);
    store(&mut s, None, &[10], &[2], 100);
    // Children of the new hash chain on it; the old one is forgotten.
    assert!(s.parent(Some(2), 0).is_some());
    assert!(s.parent(Some(1), 0).is_none());
    assert_eq!(s.held(), 1);
}

#[test]
fn slots_are_reused_and_memory_is_bounded() {
    let mut s = Shard::new();
    for round in 0..50u64 {
        let keys: Vec<u64> = (0..100).map(|i| round * 1000 + i + 1).collect();
        let engines: Vec<u64> = keys.iter().map(|k| k + 7).collect();
        store(&mut s, None, &keys, &engines, 1000);
        for e in &engines {
            s.remove(*e);
        }
    }
    assert_eq!(s.held(), 0);
    assert!(s.heap_bytes() < 64 * 1000, "{}", s.heap_bytes());
}

#[test]
fn longest_gallops_and_bisects_exactly() {
    let mut s = Shard::new();
    let keys: Vec<u64> = (1..=100).collect();
    let engines: Vec<u64> = (1001..=1100).collect();
    for n in [1usize, 2, 3, 37, 64, 99, 100] {
        s.clear();
        store(&mut s, None, &keys[..n], &engines[..n], 1000);
        assert_eq!(s.longest(100, |i| keys[i]), n);
        assert_eq!(s.longest(n, |i| keys[i]), n);
    }
    assert_eq!(s.longest(0, |i| keys[i]), 0);
}

#[test]
fn extend_keys_chains_content_for_any_block_size() {
    let t: Vec<u32> = (0..100).map(|x| x * 7919).collect();
    for bs in [1usize, 3, 16, 17] {
        let mut k = 5;
        let want: Vec<u64> = t
            .chunks_exact(bs)
            .map(|b| {
                k = hash::chain(k, hash::content(b));
                k
            })
            .collect();
        let mut got = vec![1];
        let last = hash::extend_keys(5, &t, bs, &mut got);
        assert_eq!(got[1..], want[..]);
        assert_eq!(last, *want.last().unwrap());
    }
}

#[test]
fn joint_search_matches_each_shard_alone() {
    let keys: Vec<u64> = (1..=100).collect();
    let engines: Vec<u64> = (1001..=1100).collect();
    // Equal, longer, shorter and empty matches, one shard with a tombstone.
    let lens = [37usize, 37, 100, 1, 0, 64, 37, 99, 2];
    let mut shards: Vec<Shard> = lens
        .iter()
        .map(|&n| {
            let mut s = Shard::new();
            if n > 0 {
                store(&mut s, None, &keys[..n], &engines[..n], 1000);
            }
            s
        })
        .collect();
    assert!(shards[6].remove(engines[10]));
    for n in [0usize, 1, 2, 36, 37, 38, 63, 99, 100] {
        let mut got = vec![0; shards.len()];
        super::search::longest_all(
            shards.iter().enumerate(),
            n,
            |i| keys[i],
            |owner, m| got[owner] = m,
        );
        let want: Vec<usize> = shards.iter().map(|s| s.longest(n, |i| keys[i])).collect();
        assert_eq!(got, want, "n = {n}");
    }
    shards.clear();
}
