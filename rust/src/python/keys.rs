//! `llmgw._core.KeyIndex`: an API key -> its snapshot entry, hash and lookup in one call.
//!
//! On the gateway's request path the keyed `BLAKE2b` through `hashlib` (a state copy, an
//! update and a hex digest, each a Python call and an object) cost about 1 µs with warm
//! caches and 35 µs with cold ones; here it is one call into native code.

use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::keys::KeyTable;

/// API keys by the keyed hash they are stored under; each maps to the object given for it.
#[pyclass(module = "llmgw._core", name = "KeyIndex", frozen)]
pub struct KeyIndex {
    table: KeyTable<Py<PyAny>>,
}

#[pymethods]
impl KeyIndex {
    #[new]
    fn new(hash_key: &[u8], entries: Vec<(String, Py<PyAny>)>) -> PyResult<Self> {
        KeyTable::new(hash_key, entries)
            .map(|table| Self { table })
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The object stored under `key`'s keyed hash, or None.
    fn get(&self, py: Python<'_>, key: &str) -> Option<Py<PyAny>> {
        self.table.get(key).map(|v| v.clone_ref(py))
    }

    /// The object of the key `header` carries after `scheme` (as in `Bearer sk-llmgw-...`),
    /// or None: a header not starting with `scheme`, or a key that matches no hash. One
    /// call for the header as nearly every client sends it; other shapes (another case,
    /// extra spaces) are for the caller's slower path.
    fn get_after(&self, py: Python<'_>, header: &str, scheme: &str) -> Option<Py<PyAny>> {
        header
            .strip_prefix(scheme)
            .and_then(|key| self.table.get(key))
            .map(|v| v.clone_ref(py))
    }

    /// As `get_after`, but only for an object whose `expires_at` (seconds since the epoch,
    /// or None) has not passed by the wall clock: the request path's one call for a key
    /// that is valid. None sends the caller to its slower path, which tells why.
    fn get_live(&self, py: Python<'_>, header: &str, scheme: &str) -> PyResult<Option<Py<PyAny>>> {
        let Some(value) = header.strip_prefix(scheme).and_then(|key| self.table.get(key)) else {
            return Ok(None);
        };
        let expires_at: Option<f64> = value.bind(py).getattr(intern!(py, "expires_at"))?.extract()?;
        if let Some(at) = expires_at {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            if at <= now {
                return Ok(None);
            }
        }
        Ok(Some(value.clone_ref(py)))
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }

    /// Entries left out because their hash was not 64 hexadecimal digits (they match no key).
    #[getter]
    fn skipped(&self) -> usize {
        self.table.skipped()
    }
}
