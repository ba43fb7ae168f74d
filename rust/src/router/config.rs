//! The routing configuration of one model: the policy, its weights, the load
//! guard and the prefix tree's bounds. The defaults live here and only here; the
//! Python side passes only what the operator set.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a model's replicas are chosen.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Each healthy replica in turn.
    RoundRobin,
    /// Fewest outstanding requests, ties in turn (the gateway's original policy).
    #[default]
    LeastLoad,
    /// Two healthy replicas drawn at random; the less loaded one wins.
    PowerOfTwo,
    /// The replica whose approximate prefix tree matches most of the prompt.
    Prefix,
    /// The replica whose KV cache holds most of the prompt's tokens (an oracle
    /// fed by the engines' KV events); falls back to `Prefix` without a tokenizer.
    Kv,
    /// A weighted sum of prefix (or KV) match, load, queue depth and KV-cache use.
    Scored,
}

impl PolicyKind {
    /// The name used in configuration, reasons and metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::LeastLoad => "least_load",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::Prefix => "prefix",
            PolicyKind::Kv => "kv",
            PolicyKind::Scored => "scored",
        }
    }
}

/// The weights of the `scored` policy. Each term is normalized to 0..=1 with 1
/// the best, so a weight says how much that term can move a decision.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Weights {
    /// The fraction of the prompt already cached on the replica.
    pub prefix: f64,
    /// Outstanding requests from this gateway (fresh, but only this gateway's).
    pub load: f64,
    /// `vllm:num_requests_waiting` (every client's, but as old as the last scrape).
    pub queue: f64,
    /// One minus `vllm:kv_cache_usage_perc`: room left for new blocks.
    pub kv_usage: f64,
}

impl Default for Weights {
    /// llm-d's default profile weighs the prefix scorer above the load scorers;
    /// these keep that order.
    fn default() -> Self {
        Self {
            prefix: 3.0,
            load: 2.0,
            queue: 1.0,
            kv_usage: 1.0,
        }
    }
}

/// The routing configuration of one model, crossing from Python once per change.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// The policy.
    pub policy: PolicyKind,
    /// Weights of the `scored` policy.
    pub weights: Weights,
    /// Load bound, absolute part: a replica is passed over for the cache when
    /// taking the request would leave it more than `guard_abs` outstanding
    /// requests above the mean of the candidates (this request counted)...
    pub guard_abs: f64,
    /// ...and above `guard_rel` times that mean. Both must hold, so that a
    /// small count on an idle model (2 against a mean of 0.5) does not throw
    /// away a cache hit, while on a busy one the bound follows the load. The
    /// bound is relative to the mean, not to the least loaded replica: a gap
    /// to the minimum of 4 or more requests is rare when the mean is 4, so a
    /// hot prefix stayed pinned to one replica (bench/README.md, routing).
    pub guard_rel: f64,
    /// The fraction of the prompt a replica must hold for the cache to be
    /// followed; below it the request goes to the least loaded replica, which
    /// spreads new prefixes instead of piling them where a shared preamble is.
    pub min_match: f64,
    /// Most bytes kept in one model's prefix tree.
    pub tree_max_bytes: usize,
    /// Most nodes in one model's prefix tree.
    pub tree_max_nodes: usize,
    /// A replica's claim to a prefix expires this many seconds after it was last
    /// routed there: engines evict cold blocks too, so an old claim is a guess.
    pub tree_ttl_s: f64,
    /// Only the first this many bytes of a prompt are matched and inserted; the
    /// rest rarely changes which replica wins and would cost memory per request.
    pub max_prompt_bytes: usize,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            policy: PolicyKind::default(),
            weights: Weights::default(),
            guard_abs: 1.5,
            guard_rel: 1.25,
            min_match: 0.1,
            tree_max_bytes: 16 << 20,
            tree_max_nodes: 200_000,
            tree_ttl_s: 600.0,
            max_prompt_bytes: 64 << 10,
        }
    }
}

/// The field that makes `json` fail to parse, found by parsing each field
/// alone: serde's errors give a line and column, which an operator who wrote
/// YAML cannot map back. Only runs on the error path.
fn locate(json: &str) -> Option<String> {
    let serde_json::Value::Object(fields) = serde_json::from_str(json).ok()? else {
        return None;
    };
    for (k, v) in fields {
        let alone = serde_json::Value::Object([(k.clone(), v.clone())].into_iter().collect());
        if serde_json::from_value::<RoutingConfig>(alone).is_ok() {
            continue;
        }
        if let (true, serde_json::Value::Object(inner)) = (k == "weights", &v) {
            for (wk, wv) in inner {
                let alone =
                    serde_json::Value::Object([(wk.clone(), wv.clone())].into_iter().collect());
                if serde_json::from_value::<Weights>(alone).is_err() {
                    return Some(format!("`weights.{wk}`"));
                }
            }
        }
        return Some(format!("`{k}`"));
    }
    None
}

/// A configuration that cannot be used, as a sentence for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl RoutingConfig {
    /// Parses and validates a JSON object; fields left out take their defaults.
    ///
    /// # Errors
    /// A sentence naming the model, the bad field and what to do.
    pub fn from_json(model: &str, json: &str) -> Result<Self, ConfigError> {
        let config: Self = serde_json::from_str(json).map_err(|e| {
            let at = locate(json).map_or(String::new(), |f| format!(" in field {f}"));
            ConfigError(format!(
                "the routing configuration of model {model:?} is not valid{at}: {e}; \
                 fix that field, or leave it out to use its default"
            ))
        })?;
        config.validate(model)?;
        Ok(config)
    }

    /// Checks the ranges serde cannot express.
    ///
    /// # Errors
    /// A sentence naming the model, the bad field and what to do.
    pub fn validate(&self, model: &str) -> Result<(), ConfigError> {
        let bad = |field: &str, what: &str, got: String| {
            Err(ConfigError(format!(
                "the routing configuration of model {model:?} has {field} = {got}, \
                 but it must be {what}; change it, or leave it out to use the default"
            )))
        };
        let w = &self.weights;
        for (field, v) in [
            ("weights.prefix", w.prefix),
            ("weights.load", w.load),
            ("weights.queue", w.queue),
            ("weights.kv_usage", w.kv_usage),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, "a number of 0 or more", v.to_string());
            }
        }
        if !(self.guard_abs.is_finite() && self.guard_abs >= 0.0) {
            return bad(
                "guard_abs",
                "a number of 0 or more",
                self.guard_abs.to_string(),
            );
        }
        if !(self.guard_rel.is_finite() && self.guard_rel >= 1.0) {
            return bad(
                "guard_rel",
                "a number of 1 or more",
                self.guard_rel.to_string(),
            );
        }
        if !(0.0..=1.0).contains(&self.min_match) {
            return bad("min_match", "between 0 and 1", self.min_match.to_string());
        }
        if !(self.tree_ttl_s.is_finite() && self.tree_ttl_s > 0.0) {
            return bad(
                "tree_ttl_s",
                "a positive number of seconds",
                self.tree_ttl_s.to_string(),
            );
        }
        for (field, v) in [
            ("tree_max_bytes", self.tree_max_bytes),
            ("tree_max_nodes", self.tree_max_nodes),
            ("max_prompt_bytes", self.max_prompt_bytes),
        ] {
            if v == 0 {
                return bad(field, "at least 1", v.to_string());
            }
        }
        Ok(())
    }

    /// The tree's age limit in milliseconds, the unit the router's clock counts.
    #[must_use]
    #[expect(
        clippy::cast_sign_loss,
        reason = "validated positive; `as` saturates huge values"
    )]
    pub fn ttl_ms(&self) -> u64 {
        (self.tree_ttl_s * 1000.0) as u64
    }
}
