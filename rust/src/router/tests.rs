#![expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]

use super::*;

pub(super) fn table(spec: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
    spec.iter()
        .map(|(id, models)| {
            (
                (*id).to_owned(),
                models.iter().map(|m| (*m).to_owned()).collect(),
            )
        })
        .collect()
}

pub(super) fn pick(r: &mut Router, model: &str) -> Option<usize> {
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
    assert_eq!(
        (d.reason.policy, d.reason.kind),
        (PolicyKind::LeastLoad, Kind::LeastLoad)
    );
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
