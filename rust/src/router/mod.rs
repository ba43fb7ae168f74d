//! The replica table of one gateway worker and its routing policies.
//!
//! Replicas are addressed by their index in the list given to `set_replicas`.
//! Each model has its own configuration (`RoutingConfig`), prefix tree, and
//! optionally a KV-event oracle and a tokenizer for precise routing. Every
//! decision carries a reason, and is counted by model, policy and kind.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

mod config;
mod oracle;
pub mod prompt;
mod reason;
mod select;
mod tree;

pub use config::{ConfigError, PolicyKind, RoutingConfig, Weights};
pub use oracle::{PrefixOracle, PromptTokenizer};
pub use reason::{Candidate, Decision, Kind, Reason, Unit};
pub use tree::{Limits, PrefixTree};

#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tree_tests;

/// What an engine's `/metrics` last said about its load.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineLoad {
    /// `vllm:num_requests_running`.
    pub running: u64,
    /// `vllm:num_requests_waiting`.
    pub waiting: u64,
    /// `vllm:kv_cache_usage_perc`, a fraction in 0..=1.
    pub kv_usage: f64,
}

/// One upstream replica.
#[derive(Clone, Debug, PartialEq)]
pub struct Replica {
    /// Its stable id (kept across table updates).
    pub id: String,
    /// The model names it serves.
    pub models: Vec<String>,
    /// False while health checks or failures take it out of rotation.
    pub healthy: bool,
    /// Requests picked and not yet released.
    pub outstanding: u64,
    /// The engine's own view of its load, as last scraped.
    pub engine: EngineLoad,
    /// Its key in the prefix trees: stable per id, so that a table update that
    /// moves a replica to another index keeps its cached prefixes.
    tenant: u32,
}

/// The routing state of one model.
struct Model {
    config: RoutingConfig,
    tree: PrefixTree,
    oracle: Option<Arc<dyn PrefixOracle>>,
    tokenizer: Option<Arc<dyn PromptTokenizer>>,
    /// Indexes of the replicas serving it, in table order.
    served: Vec<usize>,
    /// Where the next search starts, so that ties rotate.
    next: usize,
    counts: BTreeMap<(PolicyKind, Kind), u64>,
}

fn limits(c: &RoutingConfig) -> Limits {
    Limits {
        max_bytes: c.tree_max_bytes,
        max_nodes: c.tree_max_nodes,
        ttl_ms: c.ttl_ms(),
    }
}

impl Model {
    fn new(config: RoutingConfig) -> Self {
        Self {
            tree: PrefixTree::new(limits(&config)),
            config,
            oracle: None,
            tokenizer: None,
            served: Vec::new(),
            next: 0,
            counts: BTreeMap::new(),
        }
    }

    /// True when precise matches are available: both an oracle and a tokenizer.
    fn precise(&self) -> bool {
        self.oracle.is_some() && self.tokenizer.is_some()
    }

    /// The policy in force and, when it is not the configured one or it cannot
    /// use precise matches, why.
    fn effective(&self) -> (PolicyKind, Option<&'static str>) {
        let why = if self.tokenizer.is_none() {
            "no tokenizer is known for this model, so prompts are matched approximately"
        } else {
            "no KV-event index feeds this model, so prompts are matched approximately"
        };
        match self.config.policy {
            PolicyKind::Kv if !self.precise() => (PolicyKind::Prefix, Some(why)),
            PolicyKind::Scored if !self.precise() => (PolicyKind::Scored, Some(why)),
            p => (p, None),
        }
    }
}

/// Where a model stands, for `status`.
#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    /// The configuration in force (defaults when never configured).
    pub config: RoutingConfig,
    /// The policy that decides now.
    pub effective: PolicyKind,
    /// Why `effective` differs from the configured policy, or why matching is
    /// approximate.
    pub why: Option<&'static str>,
    /// Replicas serving the model, healthy or not.
    pub replicas: usize,
    /// Of those, the healthy ones.
    pub healthy: usize,
    /// The prefix tree's size.
    pub tree_bytes: usize,
    /// The prefix tree's node count.
    pub tree_nodes: usize,
    /// Whether a KV-event oracle is attached.
    pub oracle: bool,
    /// Whether a tokenizer is attached.
    pub tokenizer: bool,
}

/// The replica table and the per-model policies.
pub struct Router {
    replicas: Vec<Replica>,
    models: HashMap<String, Model>,
    tenants: HashMap<String, u32>,
    next_tenant: u32,
    epoch: Instant,
    /// xorshift state for `power_of_two`; never zero.
    rng: u64,
    /// Reused per decision so that matching allocates nothing.
    tree_out: Vec<(u32, usize)>,
    oracle_out: Vec<(Arc<str>, u32)>,
}

impl Default for Router {
    fn default() -> Self {
        Self::new()
    }
}

impl Router {
    /// An empty table; models are routed with the default configuration until
    /// configured.
    #[must_use]
    pub fn new() -> Self {
        Self::with_seed(0x9E37_79B9_7F4A_7C15)
    }

    /// An empty table whose random draws start from `seed` (for tests).
    #[must_use]
    pub fn with_seed(seed: u64) -> Self {
        Self {
            replicas: Vec::new(),
            models: HashMap::new(),
            tenants: HashMap::new(),
            next_tenant: 0,
            epoch: Instant::now(),
            rng: seed | 1,
            tree_out: Vec::new(),
            oracle_out: Vec::new(),
        }
    }

    /// Milliseconds since the router was made: the trees' clock.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn tenant(&mut self, id: &str) -> u32 {
        if let Some(&t) = self.tenants.get(id) {
            return t;
        }
        let t = self.next_tenant;
        self.next_tenant = self.next_tenant.wrapping_add(1);
        self.tenants.insert(id.to_owned(), t);
        t
    }

    /// Replaces the table with (id, models) pairs, keeping the outstanding count,
    /// health, engine load and cached prefixes of each replica whose id stays.
    /// New replicas start healthy.
    pub fn set_replicas<I>(&mut self, replicas: I)
    where
        I: IntoIterator<Item = (String, Vec<String>)>,
    {
        let mut old: HashMap<String, Replica> =
            self.replicas.drain(..).map(|r| (r.id.clone(), r)).collect();
        let mut table = Vec::new();
        for (id, models) in replicas {
            // A repeated id inherits nothing: the state goes to its first use.
            let (healthy, outstanding, engine) = old
                .remove(&id)
                .map_or((true, 0, EngineLoad::default()), |r| {
                    (r.healthy, r.outstanding, r.engine)
                });
            let tenant = self.tenant(&id);
            table.push(Replica {
                id,
                models,
                healthy,
                outstanding,
                engine,
                tenant,
            });
        }
        self.replicas = table;
        for gone in old.into_values() {
            if !self.replicas.iter().any(|r| r.id == gone.id) {
                self.tenants.remove(&gone.id);
                for m in self.models.values_mut() {
                    m.tree.remove_tenant(gone.tenant);
                }
            }
        }
        for m in self.models.values_mut() {
            m.served.clear();
        }
        for (i, r) in self.replicas.iter().enumerate() {
            for name in &r.models {
                let m = self
                    .models
                    .entry(name.clone())
                    .or_insert_with(|| Model::new(RoutingConfig::default()));
                if m.served.last() != Some(&i) {
                    m.served.push(i);
                }
            }
        }
    }

    /// Sets a model's routing configuration (validated); its prefix tree and
    /// counters are kept, its tree bounds apply from the next insert.
    ///
    /// # Errors
    /// A sentence naming the bad field when the configuration is not valid.
    pub fn configure(&mut self, model: &str, config: RoutingConfig) -> Result<(), ConfigError> {
        config.validate(model)?;
        let m = self
            .models
            .entry(model.to_owned())
            .or_insert_with(|| Model::new(config.clone()));
        m.tree.set_limits(limits(&config));
        m.config = config;
        Ok(())
    }

    /// Attaches (or with None detaches) the KV-event oracle of a model.
    pub fn set_oracle(&mut self, model: &str, oracle: Option<Arc<dyn PrefixOracle>>) {
        self.model_mut(model).oracle = oracle;
    }

    /// Attaches (or with None detaches) the tokenizer of a model.
    pub fn set_tokenizer(&mut self, model: &str, tokenizer: Option<Arc<dyn PromptTokenizer>>) {
        self.model_mut(model).tokenizer = tokenizer;
    }

    fn model_mut(&mut self, model: &str) -> &mut Model {
        self.models
            .entry(model.to_owned())
            .or_insert_with(|| Model::new(RoutingConfig::default()))
    }

    /// True when routing `model` needs its tokenizer, which may be slow enough
    /// to be worth releasing the interpreter for.
    #[must_use]
    pub fn tokenizes(&self, model: &str) -> bool {
        self.models.get(model).is_some_and(|m| {
            m.precise() && matches!(m.config.policy, PolicyKind::Kv | PolicyKind::Scored)
        })
    }

    /// Chooses a replica for `model` without looking at the prompt: prompt-aware
    /// policies use the least loaded replica. Counts the request as outstanding.
    pub fn pick(&mut self, model: &str, exclude: &[usize]) -> Option<Decision> {
        let now = self.now();
        self.decide(model, None, exclude, now)
    }

    /// Chooses a replica for a request body (`chat` for chat completions) and
    /// counts it as outstanding; the prompt is read from the body here.
    pub fn route(
        &mut self,
        model: &str,
        body: &[u8],
        chat: bool,
        exclude: &[usize],
    ) -> Option<Decision> {
        let now = self.now();
        self.decide(model, Some((body, chat)), exclude, now)
    }

    /// `route` at a given time in milliseconds (tests drive the clock).
    pub fn route_at(
        &mut self,
        model: &str,
        body: &[u8],
        chat: bool,
        exclude: &[usize],
        now: u64,
    ) -> Option<Decision> {
        self.decide(model, Some((body, chat)), exclude, now)
    }

    /// Ends one outstanding request; a no-op at zero or for a bad index.
    pub fn release(&mut self, index: usize) {
        if let Some(r) = self.replicas.get_mut(index) {
            r.outstanding = r.outstanding.saturating_sub(1);
        }
    }

    /// Marks a replica healthy or not; false for a bad index.
    pub fn set_healthy(&mut self, index: usize, healthy: bool) -> bool {
        self.replicas
            .get_mut(index)
            .map(|r| r.healthy = healthy)
            .is_some()
    }

    /// Records an engine's scraped load; `kv_usage` is clamped to 0..=1 (NaN
    /// reads as 0). False for a bad index.
    pub fn set_engine_load(
        &mut self,
        index: usize,
        running: u64,
        waiting: u64,
        kv_usage: f64,
    ) -> bool {
        let kv_usage = if kv_usage.is_nan() {
            0.0
        } else {
            kv_usage.clamp(0.0, 1.0)
        };
        self.replicas
            .get_mut(index)
            .map(|r| {
                r.engine = EngineLoad {
                    running,
                    waiting,
                    kv_usage,
                };
            })
            .is_some()
    }

    /// The replica at `index`.
    #[must_use]
    pub fn replica(&self, index: usize) -> Option<&Replica> {
        self.replicas.get(index)
    }

    /// All replicas, in table order.
    #[must_use]
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// True when any replica, healthy or not, serves `model`.
    #[must_use]
    pub fn has_model(&self, model: &str) -> bool {
        self.models.get(model).is_some_and(|m| !m.served.is_empty())
    }

    /// The number of healthy replicas.
    #[must_use]
    pub fn healthy_count(&self) -> usize {
        self.replicas.iter().filter(|r| r.healthy).count()
    }

    /// Where a model stands: its configuration, the policy in force and why.
    #[must_use]
    pub fn status(&self, model: &str) -> Status {
        let fresh;
        let m = if let Some(m) = self.models.get(model) {
            m
        } else {
            // Never configured nor served: what it would get.
            fresh = Model::new(RoutingConfig::default());
            &fresh
        };
        let (effective, why) = m.effective();
        let healthy = m
            .served
            .iter()
            .filter(|&&i| self.replicas.get(i).is_some_and(|r| r.healthy))
            .count();
        Status {
            config: m.config.clone(),
            effective,
            why,
            replicas: m.served.len(),
            healthy,
            tree_bytes: m.tree.bytes(),
            tree_nodes: m.tree.nodes(),
            oracle: m.oracle.is_some(),
            tokenizer: m.tokenizer.is_some(),
        }
    }

    /// Decisions so far, keyed `model|policy|kind`, for `/metrics`.
    #[must_use]
    pub fn decisions(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (name, m) in &self.models {
            for (&(policy, kind), &n) in &m.counts {
                out.push((format!("{name}|{}|{}", policy.as_str(), kind.as_str()), n));
            }
        }
        out.sort();
        out
    }
}
