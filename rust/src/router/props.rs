#![expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]

use proptest::prelude::*;

use super::tree::{Limits, PrefixTree};
use super::{PolicyKind, Router, RoutingConfig};

const TTL: u64 = 100;

#[derive(Clone, Debug)]
enum Op {
    /// Insert a prompt for a tenant, `dt` ms after the previous op.
    Insert(Vec<u8>, u32, u64),
    /// Sweep expired claims, `dt` ms after the previous op.
    Expire(u64),
}

/// Prompts over a tiny alphabet, so that they share prefixes often.
fn prompt() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(b"abc".to_vec()), 0..12)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prompt(), 0u32..4, 0u64..40).prop_map(|(p, t, dt)| Op::Insert(p, t, dt)),
        1 => (0u64..80).prop_map(Op::Expire),
    ]
}

fn lcp(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The naive model: every insert kept, searched by longest common prefix.
fn naive(log: &[(Vec<u8>, u32, u64)], key: &[u8], now: u64) -> Vec<(u32, usize)> {
    let mut best: Vec<(u32, usize)> = Vec::new();
    for (p, t, time) in log {
        if *time + TTL < now {
            continue;
        }
        let l = lcp(p, key);
        if l == 0 {
            continue;
        }
        match best.iter_mut().find(|(x, _)| x == t) {
            Some(e) => e.1 = e.1.max(l),
            None => best.push((*t, l)),
        }
    }
    best.sort_unstable();
    best
}

fn tree_matches(t: &PrefixTree, key: &[u8], now: u64) -> Vec<(u32, usize)> {
    let mut out = Vec::new();
    t.matches(key, now, &mut out);
    out.sort_unstable();
    out
}

proptest! {
    /// Within its bounds, the tree answers exactly as the naive model, whatever
    /// the sequence of inserts and age sweeps.
    #[test]
    fn tree_agrees_with_naive_model(ops in prop::collection::vec(op(), 1..60), queries in prop::collection::vec(prompt(), 1..8)) {
        let mut t = PrefixTree::new(Limits { max_bytes: 1 << 20, max_nodes: 1 << 20, ttl_ms: TTL });
        let mut log = Vec::new();
        let mut now = 0;
        for op in ops {
            match op {
                Op::Insert(p, tenant, dt) => {
                    now += dt;
                    t.insert(&p, tenant, now);
                    log.push((p, tenant, now));
                }
                Op::Expire(dt) => {
                    now += dt;
                    t.expire(now);
                }
            }
            for q in queries.iter().chain(log.iter().map(|(p, _, _)| p)) {
                prop_assert_eq!(tree_matches(&t, q, now), naive(&log, q, now), "query {:?}", q);
            }
        }
    }

    /// Past its bounds, the tree stays within them, never claims more than was
    /// inserted, and keeps the newest prompt whole (LRU evicts it last).
    #[test]
    fn bounded_tree_never_overclaims(ops in prop::collection::vec((prompt(), 0u32..4), 1..60), max_bytes in 1usize..40, small_nodes in any::<bool>()) {
        let max_nodes = if small_nodes { 5 } else { 1000 };
        let mut t = PrefixTree::new(Limits { max_bytes, max_nodes, ttl_ms: 1 << 40 });
        let mut log = Vec::new();
        for (now, (p, tenant)) in (1u64..).zip(ops) {
            t.insert(&p, tenant, now);
            let kept = p.len().min(max_bytes);
            log.push((p.clone(), tenant, now));
            prop_assert!(t.bytes() <= max_bytes && t.nodes() <= max_nodes);
            for (q, _, _) in &log {
                let got = tree_matches(&t, q, now);
                let all = naive(&log, q, now);
                for (tenant, l) in &got {
                    let bound = all.iter().find(|(x, _)| x == tenant).map_or(0, |e| e.1);
                    prop_assert!(*l <= bound, "{:?} claims {} > {}", tenant, l, bound);
                }
            }
            if !small_nodes && kept > 0 && kept <= max_bytes - max_bytes / 10 {
                let got = tree_matches(&t, &p, now);
                prop_assert!(got.contains(&(tenant, kept)), "{:?} lost its newest prompt: {:?}", tenant, got);
            }
        }
    }

    /// Whatever the policy and the sequence of picks, releases, exclusions and
    /// health changes: outstanding = picks - releases (at 0 a release does
    /// nothing), and no unhealthy or excluded replica is ever chosen.
    #[test]
    fn router_invariants(
        policy in prop::sample::select(vec![PolicyKind::RoundRobin, PolicyKind::LeastLoad, PolicyKind::PowerOfTwo, PolicyKind::Prefix, PolicyKind::Kv, PolicyKind::Scored]),
        ops in prop::collection::vec((0u8..4, 0usize..4, prompt(), prop::collection::vec(0usize..4, 0..3)), 1..100),
    ) {
        let mut r = Router::with_seed(3);
        r.set_replicas((0..4).map(|i| (format!("r{i}"), vec!["m".to_owned()])));
        r.configure("m", RoutingConfig { policy, guard_abs: 2.0, ..RoutingConfig::default() }).unwrap();
        let mut out = [0u64; 4];
        let mut healthy = [true; 4];
        for (now, (what, i, p, exclude)) in (0u64..).zip(ops) {
            match what {
                0 | 1 => {
                    let body = serde_json::to_vec(&serde_json::json!({ "prompt": String::from_utf8(p).unwrap() })).unwrap();
                    let d = if what == 0 { r.route_at("m", &body, false, &exclude, now) } else { r.pick("m", &exclude) };
                    let open = (0..4).any(|k| healthy[k] && !exclude.contains(&k));
                    prop_assert_eq!(d.is_some(), open);
                    if let Some(d) = d {
                        prop_assert!(healthy[d.index] && !exclude.contains(&d.index));
                        out[d.index] += 1;
                    }
                }
                2 => {
                    r.release(i);
                    out[i] = out[i].saturating_sub(1);
                }
                _ => {
                    healthy[i] = !healthy[i];
                    r.set_healthy(i, healthy[i]);
                }
            }
            let got: Vec<u64> = r.replicas().iter().map(|x| x.outstanding).collect();
            prop_assert_eq!(got, out.to_vec());
        }
    }
}
