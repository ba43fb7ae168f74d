#![expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]
//! The policies, the load guard, reasons and the precise-mode seam.

use std::sync::Arc;

use super::tests::{pick, table};
use super::*;

fn four() -> Router {
    let mut r = Router::with_seed(7);
    r.set_replicas(table(&[
        ("a", &["m"]),
        ("b", &["m"]),
        ("c", &["m"]),
        ("d", &["m"]),
    ]));
    r
}

fn policy(r: &mut Router, p: PolicyKind) {
    let c = RoutingConfig {
        policy: p,
        ..RoutingConfig::default()
    };
    r.configure("m", c).unwrap();
}

fn body(prompt: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "prompt": prompt })).unwrap()
}

fn route(r: &mut Router, prompt: &str, now: u64) -> Decision {
    r.route_at("m", &body(prompt), false, &[], now).unwrap()
}

#[test]
fn round_robin_ignores_load_and_skips_unhealthy() {
    let mut r = four();
    policy(&mut r, PolicyKind::RoundRobin);
    r.set_healthy(2, false);
    let seen: Vec<_> = (0..6).map(|_| pick(&mut r, "m").unwrap()).collect();
    assert_eq!(seen, [0, 1, 3, 0, 1, 3]);
    assert_eq!(r.pick("m", &[]).unwrap().reason.kind, Kind::Rotation);
}

#[test]
fn power_of_two_prefers_the_less_loaded_of_two() {
    let mut r = four();
    policy(&mut r, PolicyKind::PowerOfTwo);
    // Load replica 0 heavily: with two draws it can win only when drawn twice,
    // which distinct draws rule out.
    for _ in 0..50 {
        r.pick("m", &[]);
    }
    let counts: Vec<u64> = r.replicas().iter().map(|x| x.outstanding).collect();
    assert_eq!(counts.iter().sum::<u64>(), 50);
    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(max - min <= 2, "{counts:?}");
    assert_eq!(r.pick("m", &[]).unwrap().reason.kind, Kind::PowerOfTwo);
    r.set_healthy(1, false);
    r.set_healthy(2, false);
    r.set_healthy(3, false);
    assert_eq!(pick(&mut r, "m"), Some(0));
}

#[test]
fn prefix_follows_the_longest_match_and_reports_it() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    let sys = "You are a helpful assistant. ".repeat(10);
    let first = route(&mut r, &format!("{sys}question one"), 0);
    assert_eq!(first.reason.kind, Kind::CacheMiss);
    r.release(first.index);
    let second = route(&mut r, &format!("{sys}question two"), 1);
    assert_eq!(second.index, first.index);
    assert_eq!(second.reason.kind, Kind::CacheHit);
    assert_eq!(second.reason.unit, Some(Unit::Bytes));
    assert_eq!(second.reason.matched, sys.len() + "question ".len());
    assert_eq!(second.reason.total, sys.len() + "question two".len());
    assert!(!second.reason.guard);
    let json = second.reason.to_json();
    assert!(
        json.starts_with(r#"{"policy":"prefix","kind":"cache_hit","unit":"bytes","matched":"#),
        "{json}"
    );
    // A prompt with nothing in common goes to the least loaded replica.
    let other = route(&mut r, "entirely different", 2);
    assert_eq!(other.reason.kind, Kind::CacheMiss);
    assert_ne!(other.index, first.index);
    // pick() has no prompt: least load, and says so.
    assert_eq!(r.pick("m", &[]).unwrap().reason.kind, Kind::NoPrompt);
}

#[test]
fn load_bound_is_relative_to_the_mean_and_needs_both_parts() {
    let mut r = four();
    let c = RoutingConfig {
        policy: PolicyKind::Prefix,
        guard_abs: 3.0,
        guard_rel: 2.0,
        ..RoutingConfig::default()
    };
    r.configure("m", c).unwrap();
    let p = "shared prefix ".repeat(20);
    let hot = route(&mut r, &p, 0).index;
    // Never released: the hot replica's load grows while others stay idle.
    // With load L on it, the next request's bound is max(2 * mean, mean + 3)
    // for mean = (L + 1) / 4: L + 1 = 2, 3, 4 are within it, 5 is not.
    let mut seen = Vec::new();
    let mut guarded_json = String::new();
    for t in 1..=5 {
        let d = route(&mut r, &p, t);
        if d.reason.guard {
            guarded_json = d.reason.to_json();
        }
        seen.push((
            d.index == hot,
            d.reason.kind,
            d.reason.guard,
            d.reason.bound,
        ));
    }
    // The replica that took the guarded request now holds the prefix too, so
    // the next request is a hit there: the hot one is still over the bound.
    assert_eq!(
        seen,
        [
            (true, Kind::CacheHit, false, Some(3.5)),
            (true, Kind::CacheHit, false, Some(3.75)),
            (true, Kind::CacheHit, false, Some(4.0)),
            (false, Kind::Guarded, true, Some(4.25)),
            (false, Kind::CacheHit, false, Some(4.5)),
        ]
    );
    assert!(
        guarded_json.contains(r#""kind":"guarded","unit":"bytes","matched":0,"#),
        "{guarded_json}"
    );
    assert!(
        guarded_json.contains(r#""guard":true,"bound":4.25,"#),
        "{guarded_json}"
    );
    // The relative part: every other replica at 2, the hot one at 5, so the
    // mean with the next request is 3. mean + 1 = 4 alone would fire, but
    // 2.5 * 3 = 7.5 holds it back; at 1.5 * 3 = 4.5 both parts hold.
    let mut r = four();
    let loose = RoutingConfig {
        policy: PolicyKind::Prefix,
        guard_abs: 1.0,
        guard_rel: 2.5,
        ..RoutingConfig::default()
    };
    r.configure("m", loose.clone()).unwrap();
    let hot = route(&mut r, &p, 0).index;
    let others: Vec<usize> = (0..4).filter(|&i| i != hot).collect();
    for _ in 0..2 {
        for _ in 0..3 {
            r.pick("m", &[hot]);
        }
    }
    for _ in 0..4 {
        r.pick("m", &others);
    }
    assert_eq!(r.replica(hot).unwrap().outstanding, 5);
    let d = route(&mut r, &p, 1);
    assert_eq!(
        (d.index, d.reason.kind, d.reason.bound),
        (hot, Kind::CacheHit, Some(7.5))
    );
    r.release(hot);
    let tight = RoutingConfig {
        guard_rel: 1.5,
        ..loose
    };
    r.configure("m", tight).unwrap();
    let d = route(&mut r, &p, 2);
    assert_eq!((d.reason.kind, d.reason.bound), (Kind::Guarded, Some(4.5)));
}

#[test]
fn a_hot_prefix_spreads_to_a_second_replica_and_a_cold_one_does_not() {
    // The defaults: bound = max(1.25 * mean, mean + 1.5).
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    // Other traffic: two requests on every replica.
    for _ in 0..8 {
        r.pick("m", &[]);
    }
    // A cold prefix, one request at a time, stays where it first went.
    let cold = "a rarely used system prompt ".repeat(20);
    let mut homes = Vec::new();
    for t in 0..6 {
        let d = route(&mut r, &format!("{cold}question {t}"), t);
        assert!(!d.reason.guard);
        homes.push(d.index);
        r.release(d.index);
    }
    assert!(homes.iter().all(|&h| h == homes[0]), "{homes:?}");
    // A hot prefix, its requests overlapping: the first replica takes it up
    // to the bound, then a second one warms it, then they share it by load.
    let hot = "a popular system prompt ".repeat(20);
    let mut seen = Vec::new();
    for t in 10..14 {
        let d = route(&mut r, &format!("{hot}question {t}"), t);
        seen.push((d.index, d.reason.kind, d.reason.guard));
    }
    let (first, second) = (seen[0].0, seen[2].0);
    assert_ne!(first, second);
    assert_eq!(
        seen,
        [
            (first, Kind::CacheMiss, false),
            // It has 3, the others 2: with this one the mean is 2.5, the bound 4.
            (first, Kind::CacheHit, false),
            // 5 would pass 2.75 + 1.5: the least loaded takes it, unwarmed.
            (second, Kind::Guarded, true),
            // Both hold it; the less loaded of the two is a hit.
            (second, Kind::CacheHit, false),
        ]
    );
    let held = r
        .replicas()
        .iter()
        .map(|x| x.outstanding)
        .collect::<Vec<_>>();
    assert_eq!(held.iter().max(), Some(&4), "{held:?}");
    // Once that load is gone, the two share it: at equal loads the longer
    // match wins, and an overlapping request goes to the other holder.
    for i in [first, first, second, second] {
        r.release(i);
    }
    let a = route(&mut r, &format!("{hot}question 20"), 20);
    let b = route(&mut r, &format!("{hot}question 21"), 21);
    assert_eq!(
        (a.reason.kind, b.reason.kind),
        (Kind::CacheHit, Kind::CacheHit)
    );
    let mut both = [a.index, b.index];
    both.sort_unstable();
    let mut expect = [first, second];
    expect.sort_unstable();
    assert_eq!(both, expect);
}

#[test]
fn a_shared_prefix_warms_a_much_lighter_replica_and_a_conversation_stays() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    let sys = "a shared system prompt ".repeat(20);
    let turn1 = format!("{sys}user one asks {}", "x".repeat(100));
    let a = route(&mut r, &turn1, 0).index;
    r.release(a);
    let b = r
        .route_at("m", &body(&format!("{sys}user two asks")), false, &[a], 1)
        .unwrap()
        .index;
    r.release(b);
    let rest: Vec<usize> = (0..4).filter(|&i| i != a && i != b).collect();
    let (light, busy) = (rest[0], rest[1]);
    // a, b and busy have 3 outstanding, light 1: the bound (4.25) is far off.
    for _ in 0..3 {
        r.pick("m", &[b, light, busy]);
        r.pick("m", &[a, light, busy]);
        r.pick("m", &[a, b, light]);
    }
    r.pick("m", &[a, b, busy]);
    // A new user of the prompt both a and b hold: warmed on light.
    let warmed = route(&mut r, &format!("{sys}user three asks"), 2);
    assert_eq!(
        (warmed.index, warmed.reason.kind, warmed.reason.guard),
        (light, Kind::Guarded, true)
    );
    // User one's second turn: only a holds that history; it stays, although
    // light had 2 fewer requests than a before the last one.
    let t2 = route(&mut r, &format!("{turn1} a reply and question two"), 3);
    assert_eq!((t2.index, t2.reason.kind), (a, Kind::CacheHit));
    // light now holds the prompt too: a new user of it is a hit on a holder.
    r.release(light);
    let shared = route(&mut r, &format!("{sys}user four asks"), 4);
    assert_eq!(shared.reason.kind, Kind::CacheHit);
    assert!([a, b, light].contains(&shared.index));
}

#[test]
fn a_conversation_that_must_move_keeps_its_system_prompt() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    let sys = "the tenant's long system prompt ".repeat(20);
    let turn1 = format!("{sys}user one asks {}", "x".repeat(100));
    let a = route(&mut r, &turn1, 0).index;
    r.release(a);
    // Another user of the same tenant, kept off `a`, warms the prompt on `b`.
    let b = r
        .route_at("m", &body(&format!("{sys}user two asks y")), false, &[a], 1)
        .unwrap()
        .index;
    r.release(b);
    // `a` gets busy with other work.
    let rest: Vec<usize> = (0..4).filter(|&i| i != a).collect();
    for _ in 0..4 {
        r.pick("m", &rest);
    }
    // Turn 2 would be a long hit on `a`, which is over the bound (5 > 2.75):
    // it goes to `b`, which holds the system prompt, not to an empty replica.
    let turn2 = format!("{turn1} reply one and question two");
    let d = route(&mut r, &turn2, 2);
    assert_eq!(
        (d.index, d.reason.kind, d.reason.guard),
        (b, Kind::Spilled, true)
    );
    assert_eq!(d.reason.matched, sys.len() + "user ".len());
    let on_a = d.reason.candidates.iter().find(|c| c.index == a).unwrap();
    assert_eq!((on_a.load, on_a.matched), (4, turn1.len()));
}

#[test]
fn chat_is_matched_on_the_whole_conversation() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    let turn1 = br#"{"messages":[{"role":"system","content":"Long shared system prompt for everyone."},{"role":"user","content":"Tell me about cats, in detail."}]}"#;
    let turn2 = br#"{"messages":[{"role":"system","content":"Long shared system prompt for everyone."},{"role":"user","content":"Tell me about cats, in detail."},{"role":"assistant","content":"Cats are..."},{"role":"user","content":"And dogs?"}]}"#;
    let a = r.route_at("m", turn1, true, &[], 0).unwrap();
    let b = r.route_at("m", turn2, true, &[], 1).unwrap();
    assert_eq!((b.index, b.reason.kind), (a.index, Kind::CacheHit));
    assert_eq!(b.reason.matched, prompt::render_chat(turn1).unwrap().len());
    // An unreadable body still routes, by load.
    let c = r.route_at("m", b"{", true, &[], 2).unwrap();
    assert_eq!(c.reason.kind, Kind::NoPrompt);
}

#[test]
fn prefix_claims_expire_with_the_ttl() {
    let mut r = four();
    let c = RoutingConfig {
        policy: PolicyKind::Prefix,
        tree_ttl_s: 1.0,
        ..RoutingConfig::default()
    };
    r.configure("m", c).unwrap();
    let p = "x".repeat(100);
    let a = route(&mut r, &p, 0);
    r.release(a.index);
    assert_eq!(route(&mut r, &p, 1000).reason.kind, Kind::CacheHit);
    r.release(a.index);
    assert_eq!(route(&mut r, &p, 2001).reason.kind, Kind::CacheMiss);
}

#[test]
fn scored_weighs_match_against_load_and_engine_metrics() {
    let mut r = four();
    policy(&mut r, PolicyKind::Scored);
    let p = "a long common prefix ".repeat(30);
    let first = route(&mut r, &p, 0);
    r.release(first.index);
    let d = route(&mut r, &p, 1);
    assert_eq!((d.index, d.reason.kind), (first.index, Kind::Scored));
    assert_eq!(d.reason.candidates.len(), 4);
    assert!(d.reason.candidates.iter().all(|c| c.score.is_some()));
    r.release(d.index);
    // A full queue and KV cache on the cached replica outweigh the match.
    r.set_engine_load(first.index, 8, 40, 1.0);
    let c = RoutingConfig {
        policy: PolicyKind::Scored,
        weights: Weights {
            prefix: 1.0,
            load: 0.0,
            queue: 3.0,
            kv_usage: 3.0,
        },
        ..RoutingConfig::default()
    };
    r.configure("m", c).unwrap();
    let d = route(&mut r, &p, 2);
    assert_ne!(d.index, first.index);
    let st = r.status("m");
    assert_eq!(st.effective, PolicyKind::Scored);
    assert!(st.why.unwrap().contains("no tokenizer"));
}

#[test]
fn exclude_and_unhealthy_are_never_chosen_by_cache() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    let p = "cached prompt ".repeat(10);
    let a = route(&mut r, &p, 0).index;
    let d = r.route_at("m", &body(&p), false, &[a], 1).unwrap();
    assert_ne!(d.index, a);
    r.set_healthy(d.index, false);
    r.set_healthy(a, false);
    let third = route(&mut r, &p, 2);
    assert!(third.index != a && third.index != d.index);
}

#[test]
fn decisions_are_counted_by_model_policy_and_kind() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    route(&mut r, "p", 0);
    route(&mut r, "p", 1);
    r.pick("m", &[]);
    assert_eq!(
        r.decisions(),
        [
            ("m|prefix|cache_hit".to_owned(), 1),
            ("m|prefix|cache_miss".to_owned(), 1),
            ("m|prefix|no_prompt".to_owned(), 1),
        ]
    );
}

#[test]
fn config_errors_name_the_field() {
    let e = RoutingConfig::from_json("m", r#"{"polcy":"prefix"}"#).unwrap_err();
    assert!(e.0.contains("unknown field `polcy`"), "{e}");
    let e = RoutingConfig::from_json("m", r#"{"policy":"fastest"}"#).unwrap_err();
    assert!(e.0.contains("unknown variant `fastest`"), "{e}");
    let e = RoutingConfig::from_json("m", r#"{"guard_rel":0.5}"#).unwrap_err();
    assert_eq!(
        e.0,
        "the routing configuration of model \"m\" has guard_rel = 0.5, but it must be \
         a number of 1 or more; change it, or leave it out to use the default"
    );
    let e =
        RoutingConfig::from_json("m", r#"{"policy":"prefix","weights":{"load":"x"}}"#).unwrap_err();
    assert!(
        e.0.contains("is not valid in field `weights.load`: invalid type"),
        "{e}"
    );
    let e = RoutingConfig::from_json("m", r#"{"guard_abs":"3"}"#).unwrap_err();
    assert!(e.0.contains("in field `guard_abs`"), "{e}");
    let e = RoutingConfig::from_json("m", r#"{"guard_abs":-3}"#).unwrap_err();
    assert!(
        e.0.contains("has guard_abs = -3, but it must be a number of 0 or more"),
        "{e}"
    );
    let e = RoutingConfig::from_json("m", r#"{"weights":{"load":-1}}"#).unwrap_err();
    assert!(e.0.contains("weights.load"), "{e}");
    let c = RoutingConfig::from_json("m", r#"{"policy":"kv","guard_abs":9}"#).unwrap();
    assert_eq!(
        (c.policy, c.guard_abs, c.guard_rel),
        (PolicyKind::Kv, 9.0, 1.25)
    );
}

/// Tokens are the body's bytes; replica "c" holds the first 6.
struct Bytes;
impl PromptTokenizer for Bytes {
    fn tokens(&self, body: &[u8], _chat: bool) -> Option<Vec<u32>> {
        (body != b"bad").then(|| body.iter().map(|&b| u32::from(b)).collect())
    }
}
struct HoldsSix;
impl PrefixOracle for HoldsSix {
    fn matches(&self, tokens: &[u32], lora_id: Option<i64>, out: &mut Vec<(Arc<str>, u32)>) {
        assert_eq!(lora_id, None);
        out.push((Arc::from("c"), 6.min(tokens.len() as u32)));
        out.push((Arc::from("gone"), 99));
    }
}

#[test]
fn kv_uses_the_oracle_and_falls_back_to_prefix_without_a_tokenizer() {
    let mut r = four();
    policy(&mut r, PolicyKind::Kv);
    let st = r.status("m");
    assert_eq!(
        (st.config.policy, st.effective),
        (PolicyKind::Kv, PolicyKind::Prefix)
    );
    assert!(st.why.unwrap().starts_with("no tokenizer"));
    let d = r.route_at("m", b"0123456789", false, &[], 0);
    // Not a JSON body: approximate mode cannot read it either.
    assert_eq!(d.unwrap().reason.policy, PolicyKind::Prefix);
    r.set_oracle("m", Some(Arc::new(HoldsSix)));
    assert!(r.status("m").why.unwrap().starts_with("no tokenizer"));
    r.set_tokenizer("m", Some(Arc::new(Bytes)));
    let st = r.status("m");
    assert_eq!(
        (st.effective, st.why, st.oracle, st.tokenizer),
        (PolicyKind::Kv, None, true, true)
    );
    assert!(r.tokenizes("m"));
    let d = r.route_at("m", b"0123456789", false, &[], 1).unwrap();
    assert_eq!(
        (d.index, d.reason.kind, d.reason.unit),
        (2, Kind::CacheHit, Some(Unit::Tokens))
    );
    assert_eq!((d.reason.matched, d.reason.total), (6, 10));
    let mut held: Vec<_> = d
        .reason
        .candidates
        .iter()
        .map(|c| (c.index, c.matched))
        .collect();
    held.sort_unstable();
    assert_eq!(held, [(0, 0), (1, 0), (2, 6), (3, 0)]);
    // Precise mode keeps the approximate tree out of it.
    assert_eq!(r.status("m").tree_nodes, 0);
    // A body the tokenizer cannot read is matched approximately, and says so.
    let d = r.route_at("m", b"bad", false, &[], 2).unwrap();
    assert_eq!(d.reason.policy, PolicyKind::Prefix);
    assert!(d
        .reason
        .fallback
        .unwrap()
        .contains("tokenizer could not read"));
}

#[test]
fn status_of_an_unknown_model_shows_the_defaults() {
    let r = four();
    let st = r.status("nobody");
    assert_eq!(
        (st.config, st.effective, st.replicas),
        (RoutingConfig::default(), PolicyKind::LeastLoad, 0)
    );
    let st = r.status("m");
    assert_eq!((st.replicas, st.healthy), (4, 4));
}

#[test]
fn replicas_that_leave_lose_their_prefixes_and_movers_keep_them() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    let p = "the same long prompt ".repeat(5);
    let first = route(&mut r, &p, 0).index;
    r.release(first);
    let id = r.replica(first).unwrap().id.clone();
    // Reversed table: the replica moves to another index, with its prefixes.
    let mut ids: Vec<String> = r.replicas().iter().map(|x| x.id.clone()).collect();
    ids.reverse();
    r.set_replicas(ids.iter().map(|i| (i.clone(), vec!["m".to_owned()])));
    let d = route(&mut r, &p, 1);
    assert_eq!(
        (r.replica(d.index).unwrap().id.as_str(), d.reason.kind),
        (id.as_str(), Kind::CacheHit)
    );
    r.release(d.index);
    r.set_replicas(
        ids.iter()
            .filter(|i| **i != id)
            .map(|i| (i.clone(), vec!["m".to_owned()])),
    );
    let bytes = r.status("m").tree_bytes;
    assert_eq!(bytes, 0);
}

/// Not a benchmark harness: prints ns per `route()` for the figure in reports.
#[test]
fn route_speed_prefix_mode() {
    let mut r = four();
    policy(&mut r, PolicyKind::Prefix);
    let sys = "You are a careful assistant who answers briefly. ".repeat(40);
    let bodies: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            let p = format!("{}{i:04} {}", &sys[..1900], "q".repeat(95));
            serde_json::to_vec(&serde_json::json!({"messages": [{"role": "user", "content": p}]}))
                .unwrap()
        })
        .collect();
    let n = if cfg!(debug_assertions) {
        2_000
    } else {
        200_000
    };
    let start = std::time::Instant::now();
    for k in 0..n {
        let d = r
            .route_at("m", &bodies[k % bodies.len()], true, &[], k as u64)
            .unwrap();
        r.release(d.index);
    }
    let ns = start.elapsed().as_nanos() / n as u128;
    println!("route() prefix mode, 4 replicas, ~2k-char chat prompt: {ns} ns/route ({n} routes)");
}
