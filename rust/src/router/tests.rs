#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn table(spec: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
    spec.iter()
        .map(|(id, models)| {
            (
                (*id).to_owned(),
                models.iter().map(|m| (*m).to_owned()).collect(),
            )
        })
        .collect()
}

fn pick(r: &mut Router, model: &str) -> Option<usize> {
    r.pick(model, &[]).map(|d| d.index)
}

#[test]
fn least_load_with_round_robin_ties() {
    let mut r = Router::new();
    r.set_replicas(table(&[("a", &["m"]), ("b", &["m"]), ("c", &["m"])]));
    // Equal replicas share load even when every request ends at once.
    let mut seen = Vec::new();
    for _ in 0..6 {
        let i = pick(&mut r, "m").unwrap();
        r.release(i);
        seen.push(i);
    }
    assert_eq!(seen, [0, 1, 2, 0, 1, 2]);
    // Without releases, counts stay level.
    for _ in 0..6 {
        pick(&mut r, "m");
    }
    assert_eq!(
        (0..3)
            .map(|i| r.replica(i).unwrap().outstanding)
            .collect::<Vec<_>>(),
        [2, 2, 2]
    );
    r.release(1);
    r.release(1);
    let d = r.pick("m", &[]).unwrap();
    assert_eq!(d.index, 1);
    assert_eq!((d.reason.policy, d.reason.kind), (PolicyKind::LeastLoad, Kind::LeastLoad));
}

#[test]
fn health_exclude_and_models() {
    let mut r = Router::new();
    r.set_replicas(table(&[("a", &["m", "n"]), ("b", &["m"]), ("c", &["n"])]));
    assert!(r.has_model("n") && !r.has_model("x"));
    assert_eq!(pick(&mut r, "x"), None);
    assert!(r.set_healthy(0, false));
    assert!(!r.set_healthy(9, false));
    assert_eq!(r.healthy_count(), 2);
    assert_eq!(pick(&mut r, "m"), Some(1));
    assert_eq!(pick(&mut r, "m"), Some(1));
    assert_eq!(r.pick("m", &[1]), None);
    assert_eq!(r.pick("n", &[7]).map(|d| d.index), Some(2));
    // An unhealthy replica still counts as serving its models.
    r.set_healthy(2, false);
    r.set_healthy(0, false);
    assert!(r.has_model("n"));
    assert_eq!(pick(&mut r, "n"), None);
}

#[test]
fn release_saturates_and_ignores_bad_index() {
    let mut r = Router::new();
    r.set_replicas(table(&[("a", &["m"])]));
    r.release(0);
    r.release(5);
    assert_eq!(r.replica(0).unwrap().outstanding, 0);
}

#[test]
fn set_replicas_keeps_state_by_id() {
    let mut r = Router::new();
    r.set_replicas(table(&[("a", &["m"]), ("b", &["m"])]));
    pick(&mut r, "m");
    pick(&mut r, "m");
    pick(&mut r, "m");
    r.set_healthy(1, false);
    let before: Vec<_> = r
        .replicas()
        .iter()
        .map(|x| (x.healthy, x.outstanding))
        .collect();
    assert_eq!(before, [(true, 2), (false, 1)]);
    r.set_replicas(table(&[
        ("c", &["m"]),
        ("b", &["m", "n"]),
        ("a", &["m"]),
        ("a", &["m"]),
    ]));
    let after: Vec<_> = r
        .replicas()
        .iter()
        .map(|x| (x.id.as_str(), x.healthy, x.outstanding))
        .collect();
    assert_eq!(
        after,
        [
            ("c", true, 0),
            ("b", false, 1),
            ("a", true, 2),
            ("a", true, 0)
        ]
    );
    assert!(r.has_model("n"));
    r.set_replicas(Vec::new());
    assert_eq!((r.healthy_count(), pick(&mut r, "m")), (0, None));
}

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
    assert!(json.starts_with(r#"{"policy":"prefix","kind":"cache_hit","unit":"bytes","matched":"#), "{json}");
    // A prompt with nothing in common goes to the least loaded replica.
    let other = route(&mut r, "entirely different", 2);
    assert_eq!(other.reason.kind, Kind::CacheMiss);
    assert_ne!(other.index, first.index);
    // pick() has no prompt: least load, and says so.
    assert_eq!(r.pick("m", &[]).unwrap().reason.kind, Kind::NoPrompt);
}

#[test]
fn load_guard_overrides_the_cache_only_past_both_thresholds() {
    let mut r = four();
    let c = RoutingConfig {
        policy: PolicyKind::Prefix,
        guard_abs: 3,
        guard_rel: 2.0,
        ..RoutingConfig::default()
    };
    r.configure("m", c).unwrap();
    let p = "shared prefix ".repeat(20);
    let hot = route(&mut r, &p, 0).index;
    // Never released: the hot replica's load grows while others stay idle.
    let mut seen = Vec::new();
    let mut guarded_json = String::new();
    for t in 1..=5 {
        let d = route(&mut r, &p, t);
        if d.reason.guard {
            guarded_json = d.reason.to_json();
        }
        seen.push((d.index == hot, d.reason.kind, d.reason.guard));
    }
    // Loads 1, 2, 3 are within min(0) + 3; at 4 the guard holds (4 > 3 and
    // 4 > 0). The replica that took the guarded request now holds the prefix
    // too, so the next request is a hit there.
    assert_eq!(
        seen,
        [
            (true, Kind::CacheHit, false),
            (true, Kind::CacheHit, false),
            (true, Kind::CacheHit, false),
            (false, Kind::Guarded, true),
            (false, Kind::CacheHit, false),
        ]
    );
    assert!(guarded_json.contains(r#""kind":"guarded","unit":"bytes","matched":0,"#), "{guarded_json}");
    assert!(guarded_json.contains(r#""guard":true"#), "{guarded_json}");
    // The relative threshold: with every other replica at 2, 5 is not > 2 * 2.5.
    let mut r = four();
    let c = RoutingConfig {
        policy: PolicyKind::Prefix,
        guard_abs: 1,
        guard_rel: 2.5,
        ..RoutingConfig::default()
    };
    r.configure("m", c).unwrap();
    let hot = route(&mut r, &p, 0).index;
    for i in 0..4 {
        if i != hot {
            r.pick("m", &[hot]);
            r.pick("m", &[hot]);
        }
    }
    for _ in 0..4 {
        r.pick("m", &[0, 1, 2, 3].into_iter().filter(|&i| i != hot).collect::<Vec<_>>());
    }
    assert_eq!(r.replica(hot).unwrap().outstanding, 5);
    let d = route(&mut r, &p, 1);
    assert_eq!((d.index, d.reason.kind), (hot, Kind::CacheHit));
    let d = route(&mut r, &p, 2);
    assert_eq!(d.reason.kind, Kind::Guarded);
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
        weights: Weights { prefix: 1.0, load: 0.0, queue: 3.0, kv_usage: 3.0 },
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
    let e = RoutingConfig::from_json("m", r#"{"weights":{"load":-1}}"#).unwrap_err();
    assert!(e.0.contains("weights.load"), "{e}");
    let c = RoutingConfig::from_json("m", r#"{"policy":"kv","guard_abs":9}"#).unwrap();
    assert_eq!((c.policy, c.guard_abs, c.guard_rel), (PolicyKind::Kv, 9, 1.5));
}
