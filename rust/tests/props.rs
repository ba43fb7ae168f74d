//! Property tests: chunk boundaries never change what the tap relays or reads,
//! and the router's counts always add up.
#![expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]

use std::collections::HashMap;

use llmgw_core::router::Router;
use llmgw_core::stream::{Summary, Tap};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Ev {
    Content(String),
    /// A content chunk whose JSON spans two data lines.
    Split(String),
    Reasoning(String),
    Finish(&'static str),
    UsageOnly(u64, u64),
    Done,
    Comment(String),
    Error(String),
    NotJson,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        4 => any::<String>().prop_map(Ev::Content),
        1 => "[a-z ]{1,8}".prop_map(Ev::Reasoning),
        1 => "[a-z ]{1,8}".prop_map(Ev::Split),
        1 => prop_oneof![Just("stop"), Just("length"), Just("tool_calls")].prop_map(Ev::Finish),
        1 => (0..10_000u64, 0..10_000u64).prop_map(|(p, c)| Ev::UsageOnly(p, c)),
        1 => Just(Ev::Done),
        1 => "[a-z \\-]{0,12}".prop_map(Ev::Comment),
        1 => any::<String>().prop_map(Ev::Error),
        1 => Just(Ev::NotJson),
    ]
}

/// One event as an upstream would write it, serving `model`.
fn write(ev: &Ev, model: &str, eol: &str, space: bool) -> String {
    let sp = if space { " " } else { "" };
    let m = serde_json::to_string(model).unwrap();
    let s = |v: &str| serde_json::to_string(v).unwrap();
    let body = match ev {
        Ev::Content(t) => format!(
            "data: {{\"id\":\"c\",\"model\":{sp}{m},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}}}}]}}",
            s(t)
        ),
        Ev::Split(t) => format!(
            "data: {{\"model\":{sp}{m},{eol}data: \"choices\":[{{\"delta\":{{\"content\":{}}}}}]}}",
            s(t)
        ),
        Ev::Reasoning(t) => format!(
            "data:{{\"model\":{sp}{m},\"choices\":[{{\"delta\":{{\"reasoning_content\":{}}}}}]}}",
            s(t)
        ),
        Ev::Finish(r) => format!(
            "event: message{eol}data: {{\"model\":{m},\"choices\":[{{\"delta\":{{}},\"finish_reason\":\"{r}\"}}]}}"
        ),
        Ev::UsageOnly(p, c) => format!(
            "data: {{\"model\":{sp}{m},\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c},\"total_tokens\":{}}}}}",
            p + c
        ),
        Ev::Done => "data: [DONE]".to_owned(),
        Ev::Comment(c) => format!(":{c}"),
        Ev::Error(e) => format!("data: {{\"error\":{{\"message\":{}}}}}", s(e)),
        Ev::NotJson => "data: not json".to_owned(),
    };
    format!("{body}{eol}{eol}")
}

/// The body, and what the client should get with the given options.
fn bodies(
    evs: &[(Ev, usize, bool)],
    strip: bool,
    alias: Option<&str>,
    cut_last: bool,
) -> (Vec<u8>, Vec<u8>) {
    const EOLS: [&str; 3] = ["\n", "\r\n", "\r"];
    let (mut body, mut want) = (String::new(), String::new());
    let (mut last_eol, mut last_kept) = ("", false);
    for (ev, eol, space) in evs {
        let eol = EOLS[eol % 3];
        last_eol = eol;
        body.push_str(&write(ev, "m", eol, *space));
        last_kept = !(strip && matches!(ev, Ev::UsageOnly(..)));
        if last_kept {
            want.push_str(&write(ev, alias.unwrap_or("m"), eol, *space));
        }
    }
    // An unterminated last event is still processed like the others.
    if cut_last && !evs.is_empty() {
        body.truncate(body.len() - last_eol.len());
        if last_kept {
            want.truncate(want.len() - last_eol.len());
        }
    }
    (body.into_bytes(), want.into_bytes())
}

fn relay(tap: &mut Tap, pieces: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        tap.feed(p, |o| {
            if o.is_whole() {
                out.extend_from_slice(p);
            } else {
                out.extend(o.to_vec());
            }
        });
    }
    tap.finish(|o| out.extend(o.to_vec()));
    out
}

fn split<'a>(body: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    at.sort_unstable();
    let mut pieces = Vec::new();
    let mut prev = 0;
    for c in at.into_iter().chain([body.len()]) {
        pieces.push(&body[prev..c]);
        prev = c;
    }
    pieces
}

fn expected(evs: &[(Ev, usize, bool)]) -> (u64, u64, bool) {
    let json = evs
        .iter()
        .filter(|(e, ..)| !matches!(e, Ev::Done | Ev::Comment(_) | Ev::NotJson))
        .count() as u64;
    let content = evs
        .iter()
        .filter(|(e, ..)| matches!(e, Ev::Content(t) | Ev::Reasoning(t) | Ev::Split(t) if !t.is_empty()))
        .count() as u64;
    (
        json,
        content,
        evs.iter().any(|(e, ..)| matches!(e, Ev::Done)),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn chunking_never_matters(
        evs in prop::collection::vec((ev(), 0..3usize, any::<bool>()), 0..12),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
        strip in any::<bool>(),
        rename in any::<bool>(),
        cut_last in any::<bool>(),
    ) {
        let alias = rename.then_some("the \"alias\"");
        let (body, want) = bodies(&evs, strip, alias, cut_last);
        let new = || Tap::new(strip, alias.map(|a| ("m", a)));
        let (mut whole, mut pieces) = (new(), new());
        let out_whole = relay(&mut whole, &[&body]);
        let out_pieces = relay(&mut pieces, &split(&body, &cuts));
        prop_assert_eq!(&out_pieces, &out_whole);
        prop_assert_eq!(pieces.summary(), whole.summary());
        prop_assert_eq!(&out_whole, &want);
        if !strip && !rename {
            prop_assert_eq!(&out_whole, &body);
        }
        let s: &Summary = whole.summary();
        prop_assert_eq!((s.chunks, s.content_chunks, s.done), expected(&evs));
    }

    #[test]
    fn router_counts_add_up(
        n in 1..6usize,
        ops in prop::collection::vec((0..5u8, 0..8usize, any::<bool>()), 0..200),
    ) {
        let mut r = Router::new();
        // Replica i serves "m" always and "n" when i is even.
        let table = |rot: usize| -> Vec<(String, Vec<String>)> {
            (0..n).map(|k| (k + rot) % n).map(|i| {
                let models = if i % 2 == 0 { vec!["m".into(), "n".into()] } else { vec!["m".into()] };
                (format!("r{i}"), models)
            }).collect()
        };
        r.set_replicas(table(0));
        let mut want: HashMap<String, u64> = HashMap::new();
        for (op, i, flag) in ops {
            let i = i % (n + 1);
            match op {
                0 | 1 => {
                    let model = if op == 0 { "m" } else { "n" };
                    let exclude = if flag { vec![i] } else { Vec::new() };
                    let eligible: Vec<usize> = (0..n).filter(|&k| {
                        let x = r.replica(k).unwrap();
                        x.healthy && !exclude.contains(&k) && x.models.iter().any(|m| m == model)
                    }).collect();
                    let least = eligible.iter().map(|&k| r.replica(k).unwrap().outstanding).min();
                    match r.pick(model, &exclude) {
                        Some(d) => {
                            prop_assert!(eligible.contains(&d.index));
                            let x = r.replica(d.index).unwrap();
                            prop_assert_eq!(Some(x.outstanding - 1), least);
                            *want.entry(x.id.clone()).or_default() += 1;
                        }
                        None => prop_assert!(eligible.is_empty()),
                    }
                }
                2 => {
                    if let Some(x) = r.replica(i) {
                        let w = want.entry(x.id.clone()).or_default();
                        *w = w.saturating_sub(1);
                    }
                    r.release(i);
                }
                3 => { r.set_healthy(i, flag); }
                _ => r.set_replicas(table(i)),
            }
            for x in r.replicas() {
                prop_assert_eq!(x.outstanding, want.get(&x.id).copied().unwrap_or(0));
            }
        }
    }
}
