//! The replica table of one gateway worker and its balancing policy.
//!
//! Replicas are addressed by their index in the list given to `set_replicas`.
//! Every decision carries a reason so that policies can be explained and counted.

use std::collections::HashMap;

#[cfg(test)]
mod tests;

/// One upstream replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// Its stable id (kept across table updates).
    pub id: String,
    /// The model names it serves.
    pub models: Vec<String>,
    /// False while health checks or failures take it out of rotation.
    pub healthy: bool,
    /// Requests picked and not yet released.
    pub outstanding: u64,
}

/// How replicas are chosen; later policies join this enum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// Least outstanding requests, ties round robin.
    #[default]
    LeastOutstanding,
}

/// Why a replica was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// It had the fewest outstanding requests (`tied` replicas had as few).
    LeastOutstanding {
        /// Candidates that had the same count, itself included.
        tied: usize,
    },
}

impl Reason {
    /// A short label, for logs and metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::LeastOutstanding { tied: 1 } => "least_outstanding",
            Reason::LeastOutstanding { .. } => "least_outstanding_tie",
        }
    }
}

/// A routing decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The chosen replica's index.
    pub index: usize,
    /// Why it was chosen.
    pub reason: Reason,
}

/// The replicas serving one model.
#[derive(Clone, Debug, Default)]
struct Served {
    replicas: Vec<usize>,
    /// Where the next search starts, so that ties rotate.
    next: usize,
}

/// The replica table and policy.
#[derive(Clone, Debug, Default)]
pub struct Router {
    replicas: Vec<Replica>,
    models: HashMap<String, Served>,
    policy: Policy,
}

impl Router {
    /// An empty table with the default policy.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table with `policy`.
    #[must_use]
    pub fn with_policy(policy: Policy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// Replaces the table with (id, models) pairs, keeping the outstanding count
    /// and health of each replica whose id stays. New replicas start healthy.
    pub fn set_replicas<I>(&mut self, replicas: I)
    where
        I: IntoIterator<Item = (String, Vec<String>)>,
    {
        let mut old: HashMap<String, Replica> =
            self.replicas.drain(..).map(|r| (r.id.clone(), r)).collect();
        self.replicas = replicas
            .into_iter()
            .map(|(id, models)| {
                // A repeated id inherits nothing: the state goes to its first use.
                let (healthy, outstanding) = old
                    .remove(&id)
                    .map_or((true, 0), |r| (r.healthy, r.outstanding));
                Replica {
                    id,
                    models,
                    healthy,
                    outstanding,
                }
            })
            .collect();
        self.models.clear();
        for (i, r) in self.replicas.iter().enumerate() {
            for m in &r.models {
                let served = self.models.entry(m.clone()).or_default();
                if served.replicas.last() != Some(&i) {
                    served.replicas.push(i);
                }
            }
        }
    }

    /// Chooses a healthy replica serving `model` and not in `exclude`, and counts
    /// the request as outstanding on it. None when there is none.
    pub fn pick(&mut self, model: &str, exclude: &[usize]) -> Option<Decision> {
        let served = self.models.get_mut(model)?;
        let n = served.replicas.len();
        let (mut best, mut tied) = (None::<(usize, usize, u64)>, 0);
        match self.policy {
            Policy::LeastOutstanding => {
                for k in 0..n {
                    let pos = (served.next + k) % n;
                    let Some(&i) = served.replicas.get(pos) else {
                        continue;
                    };
                    let Some(r) = self.replicas.get(i) else {
                        continue;
                    };
                    if !r.healthy || exclude.contains(&i) {
                        continue;
                    }
                    match best {
                        Some((_, _, o)) if r.outstanding > o => {}
                        Some((_, _, o)) if r.outstanding == o => tied += 1,
                        _ => {
                            best = Some((pos, i, r.outstanding));
                            tied = 1;
                        }
                    }
                }
            }
        }
        let (pos, index, _) = best?;
        served.next = (pos + 1) % n;
        if let Some(r) = self.replicas.get_mut(index) {
            r.outstanding = r.outstanding.saturating_add(1);
        }
        Some(Decision {
            index,
            reason: Reason::LeastOutstanding { tied },
        })
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
        self.models.contains_key(model)
    }

    /// The number of healthy replicas.
    #[must_use]
    pub fn healthy_count(&self) -> usize {
        self.replicas.iter().filter(|r| r.healthy).count()
    }
}
