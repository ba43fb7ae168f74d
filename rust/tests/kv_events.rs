//! The KV-event index fed batches byte for byte as vLLM and `SGLang` publish them:
//! fixtures made by msgspec (tests/fixtures/kv/gen.py) and hand-built ones.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::many_single_char_names,
    reason = "a test fails loudly; prompts are named a, b, c as the scenarios draw them"
)]

#[path = "kv/msgpack.rs"]
mod msgpack;

use std::collections::BTreeMap;

use llmgw_core::kv::{Applied, KvConfig, KvIndex};
use msgpack::{batch, enc, ints, removed_map, stored_arr, stored_map, toks, V};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/kv/{name}.bin",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn index(bs: u32) -> KvIndex {
    KvIndex::new(KvConfig {
        block_size: bs,
        max_blocks_per_replica: 1000,
        seed: 7,
    })
}

fn scores(ix: &KvIndex, tokens: &[u32]) -> BTreeMap<String, u32> {
    ix.score(tokens, None)
        .into_iter()
        .map(|(r, n)| (r.to_string(), n))
        .collect()
}

fn one(r: &str, n: u32) -> BTreeMap<String, u32> {
    BTreeMap::from([(r.to_string(), n)])
}

fn cat(parts: &[Vec<u32>]) -> Vec<u32> {
    parts.concat()
}

/// The story of gen.py's `scenario`, in any of the three encodings.
fn captured(prefix: &str) {
    let mut ix = index(4);
    let a = toks(100, 12);
    let p = cat(&[a.clone(), toks(200, 8), toks(900, 3)]);
    let b = toks(300, 8);
    let c = toks(400, 8);
    let f = |s: &str| fixture(&format!("{prefix}_{s}"));

    assert_eq!(ix.apply("r1", 0, &f("seq0")).unwrap(), Applied::Applied);
    assert_eq!(scores(&ix, &p), one("r1", 12));
    assert_eq!(ix.apply("r1", 1, &f("seq1")).unwrap(), Applied::Applied);
    assert_eq!(scores(&ix, &p), one("r1", 20));
    // seq 2 was lost: seq 3 is refused, and nothing of it applies.
    assert_eq!(
        ix.apply("r1", 3, &f("seq3")).unwrap(),
        Applied::Gap { from: 2 }
    );
    assert_eq!(scores(&ix, &p), one("r1", 20));
    assert!(scores(&ix, &b).is_empty());
    // The replay reply for seq 2, then seq 3 again (now in order).
    assert_eq!(
        ix.apply("r1", 2, &f("replay_seq2")).unwrap(),
        Applied::Applied
    );
    assert_eq!(scores(&ix, &b), one("r1", 8));
    assert_eq!(ix.apply("r1", 3, &f("seq3")).unwrap(), Applied::Applied);
    assert_eq!(scores(&ix, &p), one("r1", 16), "last block removed");
    assert_eq!(ix.apply("r1", 4, &f("seq4")).unwrap(), Applied::Applied);
    // The live copy of seq 3 arriving late is a duplicate.
    assert_eq!(ix.apply("r1", 3, &f("seq3")).unwrap(), Applied::Duplicate);
    let s = ix.stats();
    assert_eq!(
        (s.removed_unknown, s.unknown_events, s.gaps, s.duplicates),
        (1, 1, 1, 1)
    );
    assert_eq!((s.blocks, s.stored_blocks, s.removed_blocks), (6, 7, 1));
    // The engine restarts: seq 0 again, with a clear and a new chain.
    assert_eq!(
        ix.apply("r1", 0, &f("restart_seq0")).unwrap(),
        Applied::Restarted
    );
    assert!(scores(&ix, &p).is_empty());
    assert!(scores(&ix, &b).is_empty());
    assert_eq!(scores(&ix, &cat(&[c, toks(1, 3)])), one("r1", 8));
    let s = ix.stats();
    assert_eq!(
        (s.restarts, s.cleared_events, s.blocks, s.batches),
        (1, 1, 2, 6)
    );
}

#[test]
fn vllm_map_encoding() {
    captured("map");
}

#[test]
fn vllm_array_encoding() {
    captured("array");
}

#[test]
fn sglang_map_encoding() {
    captured("sglang");
}

#[test]
fn oldest_array_form_without_dp_rank() {
    let mut ix = index(4);
    assert_eq!(
        ix.apply("r", 0, &fixture("array_v0_seq0")).unwrap(),
        Applied::Applied
    );
    assert_eq!(scores(&ix, &toks(500, 8)), one("r", 4));
}

#[test]
fn both_encodings_give_the_same_keys() {
    let mut ix = index(4);
    let t = toks(100, 12);
    ix.apply("map", 0, &fixture("map_seq0")).unwrap();
    ix.apply("arr", 0, &fixture("array_seq0")).unwrap();
    let mut got: Vec<_> = ix
        .score(&t, None)
        .into_iter()
        .map(|(r, n)| (r.to_string(), n))
        .collect();
    got.sort();
    assert_eq!(got, [("arr".into(), 12), ("map".into(), 12)]);
}

#[test]
fn keys_ignore_engine_hashes() {
    // Two engines with different hash seeds store the same tokens.
    let mut ix = index(4);
    let t = toks(10, 8);
    ix.apply(
        "a",
        0,
        &batch(vec![stored_map(&[1, 2], None, &t, 4, None)], Some(0)),
    )
    .unwrap();
    ix.apply(
        "b",
        0,
        &batch(vec![stored_arr(&[-5, 77], None, &t, 4)], Some(0)),
    )
    .unwrap();
    assert_eq!(ix.score(&t, None).len(), 2);
    assert_eq!(ix.block_keys(&t, None).len(), 2);
}

#[test]
fn unknown_fields_and_type_last_in_the_map() {
    let ev = V::M(vec![
        (
            "future_field",
            V::M(vec![("x", V::A(vec![V::F(1.5), V::B(vec![1, 2])]))]),
        ),
        ("block_hashes", ints([5])),
        ("token_ids", msgpack::tok_list(&toks(0, 4))),
        ("block_size", V::Int(4)),
        ("parent_block_hash", V::Nil),
        ("type", V::S("BlockStored")),
    ]);
    let mut ix = index(4);
    ix.apply("r", 0, &batch(vec![ev], None)).unwrap();
    assert_eq!(scores(&ix, &toks(0, 4)), one("r", 4));
}

#[test]
fn bytes_hashes_chain_and_remove() {
    let h1 = V::B(vec![0xab; 32]);
    let h2 = V::B(vec![0xcd; 32]);
    let st = |hashes: Vec<V>, parent: V, t: &[u32]| {
        V::M(vec![
            ("type", V::S("BlockStored")),
            ("block_hashes", V::A(hashes)),
            ("parent_block_hash", parent),
            ("token_ids", msgpack::tok_list(t)),
            ("block_size", V::Int(4)),
        ])
    };
    let mut ix = index(4);
    let t = toks(0, 8);
    ix.apply(
        "r",
        0,
        &batch(vec![st(vec![h1.clone()], V::Nil, &t[..4])], None),
    )
    .unwrap();
    ix.apply(
        "r",
        1,
        &batch(vec![st(vec![h2.clone()], h1.clone(), &t[4..])], None),
    )
    .unwrap();
    assert_eq!(scores(&ix, &t), one("r", 8));
    let rm = V::M(vec![
        ("type", V::S("BlockRemoved")),
        ("block_hashes", V::A(vec![h2])),
    ]);
    ix.apply("r", 2, &batch(vec![rm], None)).unwrap();
    assert_eq!(scores(&ix, &t), one("r", 4));
}

#[test]
fn lora_and_salt_separate_namespaces() {
    let mut ix = index(4);
    let t = toks(0, 8);
    ix.apply(
        "r",
        0,
        &batch(vec![stored_map(&[1, 2], None, &t, 4, Some(3))], None),
    )
    .unwrap();
    assert!(scores(&ix, &t).is_empty());
    assert_eq!(ix.score(&t, Some(3)).len(), 1);
    assert!(ix.score(&t, Some(4)).is_empty());
    let salted = V::M(vec![
        ("type", V::S("BlockStored")),
        ("block_hashes", ints([9])),
        ("parent_block_hash", V::Nil),
        ("token_ids", msgpack::tok_list(&t[..4])),
        ("block_size", V::Int(4)),
        ("cache_salt", V::S("tenant-1")),
    ]);
    ix.apply("s", 0, &batch(vec![salted], None)).unwrap();
    assert!(
        scores(&ix, &t).is_empty(),
        "salted blocks never match unsalted prompts"
    );
}

#[test]
fn unknown_parent_and_wrong_block_size_are_unkeyable() {
    let mut ix = index(4);
    let t = toks(0, 8);
    let evs = vec![
        stored_map(&[1], Some(12345), &t[..4], 4, None),
        stored_map(&[2], None, &t, 8, None),
    ];
    ix.apply("r", 0, &batch(evs, None)).unwrap();
    assert_eq!(ix.stats().unkeyable, 2);
    assert!(scores(&ix, &t).is_empty());
}

#[test]
fn dp_ranks_have_their_own_sequences_and_blocks() {
    let mut ix = index(4);
    let t = toks(0, 8);
    ix.apply(
        "r",
        0,
        &batch(vec![stored_map(&[1], None, &t[..4], 4, None)], Some(0)),
    )
    .unwrap();
    ix.apply(
        "r",
        0,
        &batch(vec![stored_map(&[1, 2], None, &t, 4, None)], Some(1)),
    )
    .unwrap();
    assert_eq!(scores(&ix, &t), one("r", 8), "best rank");
    let rm = batch(vec![removed_map(&[2])], Some(1));
    assert_eq!(ix.apply("r", 2, &rm).unwrap(), Applied::Gap { from: 1 });
    assert_eq!(ix.apply("r", 1, &rm).unwrap(), Applied::Applied);
    assert_eq!(scores(&ix, &t), one("r", 4));
}

#[test]
fn other_kv_cache_groups_are_ignored() {
    let mut ix = index(4);
    let t = toks(0, 4);
    let mut sw = stored_map(&[1], None, &t, 4, None);
    if let V::M(kv) = &mut sw {
        kv.retain(|(k, _)| *k != "group_idx" && *k != "kv_cache_spec_kind");
        kv.push(("group_idx", V::Int(1)));
        kv.push(("kv_cache_spec_kind", V::S("sliding_window")));
    }
    let full = stored_map(&[1], None, &t, 4, None);
    let rm_sw = V::M(vec![
        ("type", V::S("BlockRemoved")),
        ("block_hashes", ints([1])),
        ("group_idx", V::Int(1)),
    ]);
    ix.apply("r", 0, &batch(vec![sw, full, rm_sw], None))
        .unwrap();
    assert_eq!(scores(&ix, &t), one("r", 4));
    assert_eq!(ix.stats().other_group_events, 2);
}

#[test]
fn malformed_payload_is_an_error_and_does_not_advance() {
    let mut ix = index(4);
    ix.apply("r", 0, &batch(vec![], None)).unwrap();
    let good = batch(vec![stored_map(&[1], None, &toks(0, 4), 4, None)], None);
    for bad in [
        &good[..good.len() - 3],
        b"\x93\x01",
        &enc(&V::A(vec![V::F(0.0), V::A(vec![V::Int(1)])])),
    ] {
        assert!(ix.apply("r", 1, bad).is_err());
    }
    assert_eq!(ix.stats().malformed, 3);
    assert_eq!(ix.apply("r", 1, &good).unwrap(), Applied::Applied);
}

#[test]
fn removing_a_middle_block_stops_the_match_there_until_stored_again() {
    let mut ix = index(4);
    let t = toks(0, 16);
    ix.apply(
        "r",
        0,
        &batch(vec![stored_map(&[1, 2, 3, 4], None, &t, 4, None)], None),
    )
    .unwrap();
    ix.apply("r", 1, &batch(vec![removed_map(&[2])], None))
        .unwrap();
    assert_eq!(scores(&ix, &t), one("r", 4));
    assert_eq!(ix.stats().tombstones, 1);
    ix.apply(
        "r",
        2,
        &batch(vec![stored_map(&[2], Some(1), &t[4..8], 4, None)], None),
    )
    .unwrap();
    assert_eq!(scores(&ix, &t), one("r", 16));
    assert_eq!(ix.stats().tombstones, 0);
}

#[test]
fn drop_replica_forgets_blocks_and_sequence() {
    let mut ix = index(4);
    let t = toks(0, 4);
    let b = batch(vec![stored_map(&[1], None, &t, 4, None)], None);
    ix.apply("r", 5, &b).unwrap();
    ix.drop_replica("r");
    assert!(scores(&ix, &t).is_empty());
    assert_eq!(ix.stats().replicas, 0);
    assert_eq!(
        ix.apply("r", 9, &b).unwrap(),
        Applied::Applied,
        "a fresh start"
    );
}

#[test]
fn the_bound_evicts_tails_first() {
    let mut ix = KvIndex::new(KvConfig {
        block_size: 4,
        max_blocks_per_replica: 5,
        seed: 0,
    });
    let a = toks(0, 16);
    let b = toks(100, 16);
    ix.apply(
        "r",
        0,
        &batch(vec![stored_map(&[1, 2, 3, 4], None, &a, 4, None)], None),
    )
    .unwrap();
    ix.apply(
        "r",
        1,
        &batch(vec![stored_map(&[5, 6, 7, 8], None, &b, 4, None)], None),
    )
    .unwrap();
    let s = ix.stats();
    assert_eq!((s.blocks, s.evicted, s.tombstones), (5, 3, 0));
    assert_eq!(scores(&ix, &a), one("r", 4), "chain a lost its tail");
    assert_eq!(scores(&ix, &b), one("r", 16));
}
