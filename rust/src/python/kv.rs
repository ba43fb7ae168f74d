//! `llmgw._core.KvIndex`: the KV-event index, shared with the router.
//!
//! The index sits behind `Arc<RwLock<_>>` (`kv::SharedKvIndex`) because the
//! router reads it on every request while subscribers write event batches;
//! the pyclass is `frozen` and only clones that handle.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::kv::{self, Applied, KvConfig, SharedKvIndex};

/// Which replica's KV cache holds which prompt prefix, from the engines' KV events.
#[pyclass(module = "llmgw._core", name = "KvIndex", frozen)]
pub struct KvIndex {
    inner: SharedKvIndex,
}

impl KvIndex {
    /// The shared index, for the router's binding to hold.
    pub(crate) fn shared(&self) -> SharedKvIndex {
        Arc::clone(&self.inner)
    }
}

#[pymethods]
impl KvIndex {
    #[new]
    #[pyo3(signature = (block_size = 16, max_blocks_per_replica = 4_000_000, seed = 0))]
    fn new(block_size: u32, max_blocks_per_replica: u32, seed: u64) -> PyResult<Self> {
        if block_size == 0 {
            return Err(PyValueError::new_err("block_size must be at least 1"));
        }
        let cfg = KvConfig {
            block_size,
            max_blocks_per_replica,
            seed,
        };
        Ok(Self {
            inner: Arc::new(parking_lot::RwLock::new(kv::KvIndex::new(cfg))),
        })
    }

    /// Applies one batch; returns None (applied or ignored) or the seq to
    /// replay from when batches were missed.
    fn apply(
        &self,
        py: Python<'_>,
        replica: &str,
        seq: u64,
        payload: &Bound<'_, PyBytes>,
    ) -> PyResult<Option<u64>> {
        let bytes = payload.as_bytes();
        // Released: a subscriber thread must not hold the interpreter while it
        // waits for the write lock behind the router's readers.
        let out = py.detach(|| self.inner.write().apply(replica, seq, bytes));
        match out {
            Ok(Applied::Gap { from }) => Ok(Some(from)),
            Ok(Applied::Applied | Applied::Duplicate | Applied::Restarted) => Ok(None),
            Err(e) => Err(PyValueError::new_err(e.to_string())),
        }
    }

    /// Forgets a replica's blocks and sequence state.
    fn drop_replica(&self, replica: &str) {
        self.inner.write().drop_replica(replica);
    }

    /// Matched prefix tokens per replica holding at least the first block.
    #[pyo3(signature = (tokens, lora_id = None))]
    #[expect(
        clippy::needless_pass_by_value,
        reason = "pyo3 extracts a list into an owned Vec"
    )]
    fn score<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<u32>,
        lora_id: Option<i64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut out = Vec::new();
        py.detach(|| self.inner.read().score_into(&tokens, lora_id, &mut out));
        let d = PyDict::new(py);
        for (replica, n) in out {
            d.set_item(&*replica, n)?;
        }
        Ok(d)
    }

    /// Our block keys of a prompt's full blocks (tests and debugging).
    #[pyo3(signature = (tokens, lora_id = None))]
    #[expect(
        clippy::needless_pass_by_value,
        reason = "pyo3 extracts a list into an owned Vec"
    )]
    fn block_keys(&self, tokens: Vec<u32>, lora_id: Option<i64>) -> Vec<u64> {
        self.inner.read().block_keys(&tokens, lora_id)
    }

    /// Counters and current sizes.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.read().stats();
        let d = PyDict::new(py);
        let items = [
            ("blocks", s.blocks),
            ("tombstones", s.tombstones),
            ("replicas", s.replicas),
            ("batches", s.batches),
            ("duplicates", s.duplicates),
            ("gaps", s.gaps),
            ("restarts", s.restarts),
            ("malformed", s.malformed),
            ("stored_events", s.stored_events),
            ("removed_events", s.removed_events),
            ("cleared_events", s.cleared_events),
            ("unknown_events", s.unknown_events),
            ("other_group_events", s.other_group_events),
            ("unkeyable", s.unkeyable),
            ("stored_blocks", s.stored_blocks),
            ("removed_blocks", s.removed_blocks),
            ("removed_unknown", s.removed_unknown),
            ("evicted", s.evicted),
            ("heap_bytes", s.heap_bytes),
            ("bytes_per_block", s.bytes_per_block()),
        ];
        for (k, v) in items {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}
