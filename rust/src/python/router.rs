//! `llmgw._core.Router`: the replica table and routing policies, bound thinly
//! over `crate::router`.
//!
//! Configuration and status cross as JSON through Python's `json` module: they
//! change rarely, and one serde type on the Rust side keeps the defaults and
//! the validation in one place. The per-request calls (`route`, `pick`,
//! `release`) take and return plain values only.

use std::collections::BTreeMap;

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::router;

/// The replica table of one gateway worker and its routing policies.
///
/// Bad indexes raise `IndexError` except in `release`, which ignores them.
#[pyclass(module = "llmgw._core", name = "Router")]
pub struct Router {
    inner: router::Router,
}

/// Converts a Python index, raising `IndexError` when it is out of range.
fn index(r: &router::Router, i: i64) -> PyResult<usize> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < r.replicas().len())
        .ok_or_else(|| PyIndexError::new_err("replica index out of range"))
}

/// Negative indexes cannot name a replica, so excluding them excludes nothing.
fn exclusions(exclude: Option<Vec<i64>>) -> Vec<usize> {
    exclude
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| usize::try_from(i).ok())
        .collect()
}

#[pymethods]
impl Router {
    #[new]
    fn new() -> Self {
        Self {
            inner: router::Router::new(),
        }
    }

    /// Replaces the table with (replica id, served model names) pairs.
    fn set_replicas(&mut self, replicas: Vec<(String, Vec<String>)>) {
        self.inner.set_replicas(replicas);
    }

    /// Sets a model's routing configuration from a dict (or its JSON text);
    /// fields left out take their defaults. Raises `ValueError` naming the bad
    /// field.
    fn configure(&mut self, model: &str, config: &Bound<'_, PyAny>) -> PyResult<()> {
        let json: String = if let Ok(s) = config.cast::<PyString>() {
            s.to_str()?.to_owned()
        } else {
            let dumps = config.py().import("json")?.getattr("dumps")?;
            match dumps.call1((config,)) {
                Ok(s) => s.extract()?,
                Err(e) => {
                    return Err(PyValueError::new_err(format!(
                        "the routing configuration of model {model:?} is not plain JSON data \
                         ({e}); use only dicts, lists, strings, numbers and booleans"
                    )))
                }
            }
        };
        let config = router::RoutingConfig::from_json(model, &json)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.inner
            .configure(model, config)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Chooses a replica without looking at the prompt and counts it outstanding.
    #[pyo3(signature = (model, exclude = None))]
    fn pick(&mut self, model: &str, exclude: Option<Vec<i64>>) -> Option<usize> {
        self.inner
            .pick(model, &exclusions(exclude))
            .map(|d| d.index)
    }

    /// Chooses a replica for a request body and counts it outstanding; returns
    /// the index and the reason as compact JSON.
    #[pyo3(signature = (model, body, chat, exclude = None))]
    fn route(
        &mut self,
        py: Python<'_>,
        model: &str,
        body: &[u8],
        chat: bool,
        exclude: Option<Vec<i64>>,
    ) -> Option<(usize, String)> {
        let exclude = exclusions(exclude);
        let inner = &mut self.inner;
        let decision = if inner.tokenizes(model) {
            // Tokenizing and templating can take a millisecond on long chats:
            // other requests' Python keeps running meanwhile.
            py.detach(|| inner.route(model, body, chat, &exclude))
        } else {
            // Approximate matching costs microseconds, less than a detach's
            // worth of contention.
            inner.route(model, body, chat, &exclude)
        };
        decision.map(|d| (d.index, d.reason.to_json()))
    }

    /// Ends one outstanding request on a replica.
    fn release(&mut self, index: i64) {
        if let Ok(i) = usize::try_from(index) {
            self.inner.release(i);
        }
    }

    fn set_healthy(&mut self, index: i64, healthy: bool) -> PyResult<()> {
        let i = self::index(&self.inner, index)?;
        self.inner.set_healthy(i, healthy);
        Ok(())
    }

    /// Records an engine's load as scraped from its `/metrics`.
    fn set_engine_load(
        &mut self,
        index: i64,
        running: u64,
        waiting: u64,
        kv_usage: f64,
    ) -> PyResult<()> {
        let i = self::index(&self.inner, index)?;
        self.inner.set_engine_load(i, running, waiting, kv_usage);
        Ok(())
    }

    fn is_healthy(&self, index: i64) -> PyResult<bool> {
        let i = self::index(&self.inner, index)?;
        Ok(self.inner.replica(i).is_some_and(|r| r.healthy))
    }

    fn outstanding(&self, index: i64) -> PyResult<u64> {
        let i = self::index(&self.inner, index)?;
        Ok(self.inner.replica(i).map_or(0, |r| r.outstanding))
    }

    /// True when any replica (healthy or not) serves `model`.
    fn has_model(&self, model: &str) -> bool {
        self.inner.has_model(model)
    }

    fn healthy_count(&self) -> usize {
        self.inner.healthy_count()
    }

    /// Where a model stands: its configuration, the policy in force and why.
    fn status<'py>(&self, py: Python<'py>, model: &str) -> PyResult<Bound<'py, PyDict>> {
        let st = self.inner.status(model);
        let json = serde_json::json!({
            "model": model,
            "policy": st.config.policy,
            "effective": st.effective,
            "why": st.why,
            "replicas": st.replicas,
            "healthy": st.healthy,
            "tree_bytes": st.tree_bytes,
            "tree_nodes": st.tree_nodes,
            "oracle": st.oracle,
            "tokenizer": st.tokenizer,
            "config": st.config,
        });
        let loads = py.import("json")?.getattr("loads")?;
        Ok(loads.call1((json.to_string(),))?.cast_into::<PyDict>()?)
    }

    /// Gives a model's precise (`kv`) mode its KV-event index (None detaches it).
    fn set_kv_index(&mut self, model: &str, index: Option<&Bound<'_, super::kv::KvIndex>>) {
        let oracle =
            index.map(|i| -> std::sync::Arc<dyn router::PrefixOracle> { i.get().shared() });
        self.inner.set_oracle(model, oracle);
    }

    /// Gives a model its tokenizer, which precise (`kv`) mode needs to read
    /// prompts as the engine does (None detaches it).
    fn set_tokenizer(
        &mut self,
        model: &str,
        tokenizer: Option<&Bound<'_, super::tokenize::ModelTokenizer>>,
    ) {
        let tok =
            tokenizer.map(|t| -> std::sync::Arc<dyn router::PromptTokenizer> { t.get().shared() });
        self.inner.set_tokenizer(model, tok);
    }

    /// Decisions so far, keyed `model|policy|kind`.
    fn decisions(&self) -> BTreeMap<String, u64> {
        self.inner.decisions().into_iter().collect()
    }
}
