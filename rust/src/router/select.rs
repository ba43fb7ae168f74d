//! The policies: from the candidates of one request to a decision.

use std::borrow::Cow;

use super::config::{PolicyKind, RoutingConfig};
use super::reason::{Candidate, Decision, Kind, Reason, Unit};
use super::{prompt, EngineLoad, Router};

/// A replica that may take this request.
#[derive(Clone, Copy, Debug)]
struct Cand {
    /// Position in the model's served list (for the rotation).
    pos: usize,
    index: usize,
    tenant: u32,
    load: u64,
    engine: EngineLoad,
    matched: usize,
    score: Option<f64>,
}

/// Prompt matches of every candidate, in one unit.
struct Matches {
    unit: Unit,
    total: usize,
}

/// The first candidate with the fewest outstanding requests; candidates are in
/// rotation order, so ties rotate.
fn least_load(cands: &[Cand]) -> usize {
    let mut best = 0;
    for (k, c) in cands.iter().enumerate() {
        if cands.get(best).is_some_and(|b| c.load < b.load) {
            best = k;
        }
    }
    best
}

/// Matches within `total / TIE` of each other count as equally long, and the
/// less loaded replica wins among them. Without it a hot prefix held by two
/// replicas would always go to the one that happens to match a few more bytes
/// (in approximate mode the tree also holds the start of whichever user's
/// message each replica saw last), loading it up to the bound before the other
/// took a request; in precise mode it spans a few blocks of a long prompt.
const TIE: usize = 32;

/// A prefix that several replicas hold equally long is warmed on the least
/// loaded replica instead when that one has at least this many fewer requests
/// outstanding than the least loaded holder.
const WARM_GAP: u64 = 2;

/// The least loaded candidate, when the longest match `hit` won is a shared
/// prefix (two or more candidates hold it within `tie`: a tenant's system
/// prompt, not one conversation's history) and that candidate, which does not
/// hold it, is lighter than `hit` by `WARM_GAP` or more.
///
/// Why: the load bound caps the busiest replica but does nothing for the
/// least busy one. A replica that holds none of the hot prefixes got new work
/// only from cache misses, and ended a routing bench run with 15-20% fewer
/// requests than the others (load imbalance 1.31-1.35 for `kv`). Warming a
/// shared prefix there costs one prefill of it, after which the holders share
/// it by load; a conversation's own history, held by one replica, never moves
/// for this.
fn warm(
    cands: &[Cand],
    hit: usize,
    longest: usize,
    tie: usize,
    holds: impl Fn(&Cand) -> bool,
) -> Option<usize> {
    let tied = cands
        .iter()
        .filter(|c| holds(c) && c.matched + tie >= longest)
        .count();
    if tied < 2 {
        return None;
    }
    let h = cands.get(hit)?;
    let l = least_load(cands);
    let lc = cands.get(l)?;
    (lc.matched + tie < longest && lc.load.saturating_add(WARM_GAP) <= h.load).then_some(l)
}

/// The load bound of one decision: a replica may be preferred for its cache or
/// score while its outstanding requests, this one included, are at most
/// `max(guard_rel * mean, mean + guard_abs)`, where `mean` is the candidates'
/// mean with this request counted. Relative to the mean, the bound is tight
/// where balance matters (a busy model) and loose on an idle one, where a hit
/// is worth more than spreading two requests.
fn bound(cands: &[Cand], c: &RoutingConfig) -> f64 {
    let sum = cands.iter().fold(0u64, |s, c| s.saturating_add(c.load));
    let mean = (sum as f64 + 1.0) / cands.len().max(1) as f64;
    (mean * c.guard_rel).max(mean + c.guard_abs)
}

/// True when a replica with `load` outstanding may not take one more.
fn over(load: u64, bound: f64) -> bool {
    load as f64 + 1.0 > bound
}

/// Among the candidates that `pred` admits, the least loaded; ties go to the
/// longer match, then to the rotation (candidates are in rotation order).
fn lightest(cands: &[Cand], pred: impl Fn(&Cand) -> bool) -> Option<usize> {
    let mut best: Option<(usize, &Cand)> = None;
    for (k, c) in cands.iter().enumerate() {
        if !pred(c) {
            continue;
        }
        if best.is_none_or(|(_, b)| (c.load, b.matched) < (b.load, c.matched)) {
            best = Some((k, c));
        }
    }
    best.map(|(k, _)| k)
}

/// Weighted score; each term is in 0..=1 with 1 the best. Load and queue use
/// `1 - x / (max + 1)`, so that one extra request among idle replicas costs
/// half the term rather than all of it, and a gap matters less as loads grow.
fn score(c: &Cand, total: usize, max_load: u64, max_wait: u64, cfg: &RoutingConfig) -> f64 {
    let w = &cfg.weights;
    let prefix = if total == 0 {
        0.0
    } else {
        c.matched as f64 / total as f64
    };
    let load = 1.0 - c.load as f64 / (max_load as f64 + 1.0);
    let queue = 1.0 - c.engine.waiting as f64 / (max_wait as f64 + 1.0);
    let kv = 1.0 - c.engine.kv_usage;
    w.prefix * prefix + w.load * load + w.queue * queue + w.kv_usage * kv
}

impl Router {
    /// xorshift64: power of two choices needs speed and spread, not secrecy.
    fn draw(&mut self, n: usize) -> usize {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        // n is a replica count; the modulo bias is immaterial at that size.
        (x % n as u64) as usize
    }

    /// Chooses among the healthy, non-excluded replicas serving `model`, counts
    /// the request as outstanding, counts the decision, and for approximate
    /// matching records the prompt for the chosen replica.
    pub(super) fn decide(
        &mut self,
        model: &str,
        input: Option<(&[u8], bool)>,
        exclude: &[usize],
        now: u64,
    ) -> Option<Decision> {
        let mut cands = self.candidates(model, exclude);
        if cands.is_empty() {
            return None;
        }
        let state = self.models.get(model)?;
        let (mut policy, mut fallback) = state.effective();
        let cfg = state.config.clone();
        let mut matches = None;
        let mut key = None;
        if let (Some((body, chat)), PolicyKind::Prefix | PolicyKind::Kv | PolicyKind::Scored) =
            (input, policy)
        {
            if state.precise() {
                matches = self.precise_matches(model, body, chat, &mut cands);
                if matches.is_none() {
                    fallback = Some(
                        "the tokenizer could not read this body, so it was matched approximately",
                    );
                    if policy == PolicyKind::Kv {
                        policy = PolicyKind::Prefix;
                    }
                }
            }
            if matches.is_none() {
                key = prompt::render(body, chat).map(|p| truncate(p, cfg.max_prompt_bytes));
                if let Some(k) = &key {
                    matches = Some(self.tree_matches(model, k.as_bytes(), now, &mut cands));
                }
            }
        }
        let (chosen, kind, bound) = self.choose(policy, matches.as_ref(), &mut cands, &cfg);
        let c = *cands.get(chosen)?;
        let reason = Reason {
            policy,
            kind,
            unit: matches.as_ref().map(|mt| mt.unit),
            matched: c.matched,
            total: matches.as_ref().map_or(0, |mt| mt.total),
            guard: matches!(kind, Kind::Guarded | Kind::Spilled),
            bound,
            fallback,
            candidates: cands
                .iter()
                .map(|c| Candidate {
                    index: c.index,
                    load: c.load,
                    matched: c.matched,
                    score: c.score,
                })
                .collect(),
        };
        let state = self.models.get_mut(model)?;
        state.next = (c.pos + 1) % state.served.len().max(1);
        // Recorded at routing time, not when the answer ends: a burst of
        // requests sharing a new prefix then follows the first one to its
        // replica (which is computing that prefix now) instead of scattering
        // before any of them finishes. SGLang's router does the same. The cost,
        // a claim for a request that then fails, ages out with the ttl.
        if let Some(k) = key {
            state.tree.insert(k.as_bytes(), c.tenant, now);
        }
        *state.counts.entry((policy, kind)).or_insert(0) += 1;
        if let Some(r) = self.replicas.get_mut(c.index) {
            r.outstanding = r.outstanding.saturating_add(1);
        }
        Some(Decision {
            index: c.index,
            reason,
        })
    }

    /// The healthy, non-excluded replicas serving `model`, in rotation order.
    fn candidates(&self, model: &str, exclude: &[usize]) -> Vec<Cand> {
        let Some(state) = self.models.get(model) else {
            return Vec::new();
        };
        let n = state.served.len();
        (0..n)
            .filter_map(|k| {
                let pos = (state.next + k) % n;
                let index = *state.served.get(pos)?;
                let r = self.replicas.get(index)?;
                (r.healthy && !exclude.contains(&index)).then_some(Cand {
                    pos,
                    index,
                    tenant: r.tenant,
                    load: r.outstanding,
                    engine: r.engine,
                    matched: 0,
                    score: None,
                })
            })
            .collect()
    }

    /// Matched tokens per candidate from the oracle; None when the tokenizer
    /// could not read the body.
    fn precise_matches(
        &mut self,
        model: &str,
        body: &[u8],
        chat: bool,
        cands: &mut [Cand],
    ) -> Option<Matches> {
        let state = self.models.get(model)?;
        let tokens = state.tokenizer.as_ref()?.tokens(body, chat)?;
        self.oracle_out.clear();
        state
            .oracle
            .as_ref()?
            .matches(&tokens, None, &mut self.oracle_out);
        for c in cands {
            let id = self.replicas.get(c.index).map(|r| r.id.as_str());
            c.matched = self
                .oracle_out
                .iter()
                .find(|(rid, _)| Some(&**rid) == id)
                .map_or(0, |&(_, t)| t as usize);
        }
        Some(Matches {
            unit: Unit::Tokens,
            total: tokens.len(),
        })
    }

    /// Matched bytes per candidate from the model's prefix tree.
    fn tree_matches(&mut self, model: &str, key: &[u8], now: u64, cands: &mut [Cand]) -> Matches {
        if let Some(state) = self.models.get(model) {
            state.tree.matches(key, now, &mut self.tree_out);
        }
        for c in cands {
            c.matched = self
                .tree_out
                .iter()
                .find(|&&(t, _)| t == c.tenant)
                .map_or(0, |&(_, l)| l);
        }
        Matches {
            unit: Unit::Bytes,
            total: key.len(),
        }
    }

    /// The policy proper: which candidate, what kind of decision, and the load
    /// bound when the policy used one.
    fn choose(
        &mut self,
        policy: PolicyKind,
        matches: Option<&Matches>,
        cands: &mut [Cand],
        cfg: &RoutingConfig,
    ) -> (usize, Kind, Option<f64>) {
        let least = least_load(cands);
        match (policy, matches) {
            (PolicyKind::RoundRobin, _) => (0, Kind::Rotation, None),
            (PolicyKind::LeastLoad, _) => (least, Kind::LeastLoad, None),
            (PolicyKind::PowerOfTwo, _) => (self.two_choices(cands), Kind::PowerOfTwo, None),
            (_, None) => (least, Kind::NoPrompt, None),
            (PolicyKind::Scored, Some(mt)) => {
                let b = bound(cands, cfg);
                let max_load = cands.iter().map(|c| c.load).max().unwrap_or(0);
                let max_wait = cands.iter().map(|c| c.engine.waiting).max().unwrap_or(0);
                let (mut best, mut best_score) = (0, f64::MIN);
                let mut under: Option<(usize, f64)> = None;
                for (k, c) in cands.iter_mut().enumerate() {
                    let s = score(c, mt.total, max_load, max_wait, cfg);
                    c.score = Some(s);
                    if s > best_score {
                        (best, best_score) = (k, s);
                    }
                    if !over(c.load, b) && under.is_none_or(|(_, u)| s > u) {
                        under = Some((k, s));
                    }
                }
                match under {
                    Some((k, _)) if k == best => (best, Kind::Scored, Some(b)),
                    Some((k, _)) => (k, Kind::Guarded, Some(b)),
                    None => (least, Kind::Guarded, Some(b)),
                }
            }
            (_, Some(mt)) => {
                // The longest match wins unless the replicas holding it are
                // over the load bound; then the next longest under it, so that
                // a conversation that must move keeps what it can (its system
                // prompt) and a hot prefix warms a second replica, after which
                // requests choose between the two by load.
                let floor = cfg.min_match * mt.total as f64;
                let holds = |c: &Cand| c.matched > 0 && c.matched as f64 >= floor;
                let Some(longest) = cands.iter().filter(|c| holds(c)).map(|c| c.matched).max()
                else {
                    return (least, Kind::CacheMiss, None);
                };
                let tie = mt.total / TIE;
                let b = bound(cands, cfg);
                let hit = lightest(cands, |c| {
                    holds(c) && c.matched + tie >= longest && !over(c.load, b)
                });
                if let Some(k) = hit {
                    if let Some(w) = warm(cands, k, longest, tie, holds) {
                        return (w, Kind::Guarded, Some(b));
                    }
                    return (k, Kind::CacheHit, Some(b));
                }
                let next = cands
                    .iter()
                    .filter(|c| holds(c) && !over(c.load, b))
                    .map(|c| c.matched)
                    .max();
                match next.and_then(|top| {
                    lightest(cands, |c| {
                        holds(c) && c.matched + tie >= top && !over(c.load, b)
                    })
                }) {
                    Some(k) => (k, Kind::Spilled, Some(b)),
                    None => (least, Kind::Guarded, Some(b)),
                }
            }
        }
    }

    /// Power of two choices: two distinct random candidates, the less loaded
    /// wins (then the shorter engine queue, then the first drawn).
    fn two_choices(&mut self, cands: &[Cand]) -> usize {
        if cands.len() < 2 {
            return 0;
        }
        let a = self.draw(cands.len());
        let b = (a + 1 + self.draw(cands.len() - 1)) % cands.len();
        let load = |k: usize| cands.get(k).map(|c| (c.load, c.engine.waiting));
        if load(b) < load(a) {
            b
        } else {
            a
        }
    }
}

/// The first `max` bytes of a prompt, cut at a char boundary.
fn truncate(p: Cow<'_, str>, max: usize) -> Cow<'_, str> {
    if p.len() <= max {
        return p;
    }
    let mut end = max;
    while !p.is_char_boundary(end) {
        end -= 1;
    }
    match p {
        Cow::Borrowed(s) => Cow::Borrowed(s.get(..end).unwrap_or(s)),
        Cow::Owned(mut s) => {
            s.truncate(end);
            Cow::Owned(s)
        }
    }
}
