//! Why a replica was chosen: what the request's record and `/metrics` show.

use serde::Serialize;

use super::config::PolicyKind;

/// The kind of a decision; with the model and policy, the key of its counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The next healthy replica in turn.
    Rotation,
    /// The fewest outstanding requests.
    LeastLoad,
    /// The less loaded of two random replicas.
    PowerOfTwo,
    /// The cache was followed: the replica holding the longest prefix.
    CacheHit,
    /// No replica held `min_match` of the prompt; the least loaded was used.
    CacheMiss,
    /// Every replica holding `min_match` of the prompt was over the load
    /// bound; the least loaded was used instead, and now holds the prompt too.
    /// Also: the longest match was a prefix several replicas hold equally (a
    /// shared system prompt), and the least loaded, lighter than all of them
    /// by 2 or more requests, was used to warm it.
    /// For `scored`: the best-scored replica was over the bound; the
    /// best-scored one under it was used.
    Guarded,
    /// The replicas holding the longest match were over the load bound; the
    /// one under it holding the next longest (at least `min_match`) was used.
    Spilled,
    /// The best weighted score.
    Scored,
    /// A prompt-aware policy got no prompt (`pick`, or a body it could not
    /// read); the least loaded was used.
    NoPrompt,
}

impl Kind {
    /// The name used in reasons and metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Rotation => "rotation",
            Kind::LeastLoad => "least_load",
            Kind::PowerOfTwo => "power_of_two",
            Kind::CacheHit => "cache_hit",
            Kind::CacheMiss => "cache_miss",
            Kind::Guarded => "guarded",
            Kind::Spilled => "spilled",
            Kind::Scored => "scored",
            Kind::NoPrompt => "no_prompt",
        }
    }
}

/// What a match length counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Tokens, from the KV-event index (precise).
    Tokens,
    /// UTF-8 bytes of the rendered prompt, from the prefix tree (approximate).
    Bytes,
}

/// One replica that could have been chosen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// Its index in the replica table.
    pub index: usize,
    /// Outstanding requests from this gateway when the decision was made.
    pub load: u64,
    /// Prompt prefix it holds, in the reason's unit (0 without a prompt).
    pub matched: usize,
    /// Its weighted score (`scored` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// Why a replica was chosen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reason {
    /// The policy that decided (the effective one, after any fallback).
    pub policy: PolicyKind,
    /// What happened.
    pub kind: Kind,
    /// What `matched` and `total` count; absent when no prompt was matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<Unit>,
    /// The prefix the chosen replica holds.
    pub matched: usize,
    /// The prompt's length.
    pub total: usize,
    /// True when the load bound overrode the cache (or the best score): the
    /// preferred replicas were all over it.
    pub guard: bool,
    /// The load bound of this decision: the most outstanding requests a
    /// replica may have, this one included, and still be preferred for its
    /// cache or score; absent for policies that do not use it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<f64>,
    /// Why the configured policy was not the one used, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<&'static str>,
    /// Every replica considered (healthy, serving the model, not excluded).
    pub candidates: Vec<Candidate>,
}

impl Reason {
    /// The reason as compact JSON, for the request's record.
    #[must_use]
    pub fn to_json(&self) -> String {
        // Serializing plain fields and finite floats cannot fail; an empty
        // object is still valid JSON if it somehow did.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// A routing decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The chosen replica's index.
    pub index: usize,
    /// Why it was chosen.
    pub reason: Reason,
}
