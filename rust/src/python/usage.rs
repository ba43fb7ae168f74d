//! `llmgw._core.UsageRows`: finished requests' usage rows, written natively as each ends.
//!
//! The gateway built a `UsageRow` Struct per request (23 fields, two new floats), kept
//! it until the next post and encoded the batch then; here the row is written into one
//! buffer at once and a post takes the head of it as bytes.

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use crate::usage::{Row, Rows};

/// Usage rows waiting for the next post to the control plane, oldest first.
///
/// With `track`, it also keeps the sink's account of requests as they end (`ending`):
/// the open a request no longer needs, its key's last use, and the bound on what waits.
#[pyclass(module = "llmgw._core", name = "UsageRows")]
#[derive(Default)]
pub struct UsageRows {
    rows: Rows,
    tracked: Option<Tracked>,
    /// Records not queued because `max_pending` were waiting (the sink logs and resets it).
    #[pyo3(get, set)]
    dropped: u64,
}

/// The sink's dicts that `ending` keeps up to date.
struct Tracked {
    /// Request id -> its open, until sent.
    opens: Py<PyDict>,
    /// Key id -> when its latest request started.
    last_used: Py<PyDict>,
    max_pending: usize,
}

#[pymethods]
impl UsageRows {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Keeps `opens` and `last_used` (the sink's dicts) as requests end, and counts
    /// records past `max_pending` (rows waiting plus opens) as dropped.
    fn track(&mut self, opens: Bound<'_, PyDict>, last_used: Bound<'_, PyDict>, max_pending: usize) {
        self.tracked = Some(Tracked {
            opens: opens.unbind(),
            last_used: last_used.unbind(),
            max_pending,
        });
    }

    /// The bound set by `track` (0: none).
    #[getter]
    fn max_pending(&self) -> usize {
        self.tracked.as_ref().map_or(0, |t| t.max_pending)
    }

    /// A request ended and its record is about to be queued: its open is taken out (its
    /// final says everything the open did, and frees the open's place first) and its
    /// key's use noted; False when too many records wait (it is dropped, and counted).
    fn ending(
        &mut self,
        request_id: &Bound<'_, PyString>,
        key_id: Option<&Bound<'_, PyString>>,
        started_at: f64,
    ) -> PyResult<bool> {
        let Some(t) = &self.tracked else {
            return Ok(true);
        };
        let py = request_id.py();
        let opens = t.opens.bind(py);
        // Only requests still running after a while have an open: most find none.
        if !opens.is_empty() && opens.contains(request_id)? {
            opens.del_item(request_id)?;
        }
        if self.rows.len() + opens.len() >= t.max_pending {
            self.dropped += 1;
            return Ok(false);
        }
        if let Some(key) = key_id {
            t.last_used.bind(py).set_item(key, started_at)?;
        }
        Ok(true)
    }

    /// A request without kept bodies ended: `ending`, then its row appended unless it
    /// was dropped (False). Durations in seconds. Without `track`, only the row.
    #[expect(
        clippy::too_many_arguments,
        reason = "one keyword argument per usage-row column, as the Python caller passes them"
    )]
    #[pyo3(signature = (request_id, model, upstream_model, replica, status, http_status, stream,
                        prompt_tokens, completion_tokens, usage_estimated, ttft_s, duration_s,
                        finish_reason, retries, started_at, route, key_id, user_id, project_id,
                        team_id, org_id))]
    fn finish(
        &mut self,
        request_id: &Bound<'_, PyString>,
        model: &str,
        upstream_model: &str,
        replica: Option<&str>,
        status: &str,
        http_status: i64,
        stream: bool,
        prompt_tokens: i64,
        completion_tokens: i64,
        usage_estimated: bool,
        ttft_s: Option<f64>,
        duration_s: f64,
        finish_reason: Option<&str>,
        retries: i64,
        started_at: f64,
        route: Option<&str>,
        key_id: Option<&Bound<'_, PyString>>,
        user_id: Option<&str>,
        project_id: Option<&str>,
        team_id: Option<&str>,
        org_id: Option<&str>,
    ) -> PyResult<bool> {
        if !self.ending(request_id, key_id, started_at)? {
            return Ok(false);
        }
        self.rows.add(&Row {
            request_id: request_id.to_str()?,
            model,
            upstream_model,
            replica,
            status,
            http_status,
            stream,
            prompt_tokens,
            completion_tokens,
            usage_estimated,
            ttft_s,
            duration_s,
            finish_reason,
            retries,
            started_at,
            route,
            key_id: key_id.map(|k| k.to_str()).transpose()?,
            user_id,
            project_id,
            team_id,
            org_id,
        });
        Ok(true)
    }

    /// Appends one record encoded elsewhere (one JSON value: a `UsageRow` with kept bodies,
    /// or a `UsageRecord` object where the gateway sends objects).
    fn push(&mut self, row: &[u8]) {
        self.rows.push(row);
    }

    /// Puts `row` (one JSON value) in the place of the first row.
    fn replace_first(&mut self, row: &[u8]) {
        self.rows.replace_first(row);
    }

    /// The first `n` rows as one JSON array.
    fn head<'py>(&self, py: Python<'py>, n: usize) -> Bound<'py, PyBytes> {
        let rows = self.rows.head(n);
        PyBytes::new_with(py, rows.len() + 2, |dst| {
            dst[0] = b'[';
            dst[1..=rows.len()].copy_from_slice(rows);
            dst[rows.len() + 1] = b']';
            Ok(())
        })
        .unwrap_or_else(|_| PyBytes::new(py, b"[]"))
    }

    /// Drops the first `n` rows (sent, or refused for good).
    fn drop_head(&mut self, n: usize) {
        self.rows.drop_head(n);
    }

    fn __len__(&self) -> usize {
        self.rows.len()
    }

    /// Bytes held.
    #[getter]
    fn nbytes(&self) -> usize {
        self.rows.bytes()
    }
}

/// One usage post read by `scan_usage` (see `crate::usage_scan`).
#[pyclass(module = "llmgw._core", name = "UsageScan", frozen)]
pub struct UsageScan {
    #[pyo3(get)]
    gateway_id: String,
    #[pyo3(get)]
    opens: Option<Py<PyBytes>>,
    #[pyo3(get)]
    key_last_used: Option<Py<PyBytes>>,
    #[pyo3(get)]
    rows: Py<PyString>,
    #[pyo3(get)]
    rows_posted: usize,
    #[pyo3(get)]
    ids: Py<PyList>,
    #[pyo3(get)]
    started_max: f64,
    #[pyo3(get)]
    groups: Py<PyList>,
    data: Py<PyBytes>,
    spans: Vec<(usize, usize)>,
}

#[pymethods]
impl UsageScan {
    /// The row of the `i`-th id, as posted.
    fn row<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyBytes>> {
        let &(from, to) = self
            .spans
            .get(i)
            .ok_or_else(|| PyIndexError::new_err(format!("no row {i}: the post has {}", self.spans.len())))?;
        Ok(PyBytes::new(py, &self.data.as_bytes(py)[from..to]))
    }
}

/// Reads a usage post natively, or returns None where msgspec must decode it.
#[pyfunction]
pub fn scan_usage(data: &Bound<'_, PyBytes>) -> PyResult<Option<UsageScan>> {
    let py = data.py();
    let Ok(s) = crate::usage_scan::scan(data.as_bytes()) else {
        return Ok(None);
    };
    let groups = PyList::empty(py);
    for ((hour, [org, team, project, user, key], model), [n, errors, prompt, completion]) in &s.groups {
        groups.append((*hour, org, team, project, user, key, model, *n, *errors, *prompt, *completion))?;
    }
    let rows = if s.rows.is_empty() { "[]" } else { std::str::from_utf8(s.rows).unwrap_or("[]") };
    Ok(Some(UsageScan {
        gateway_id: s.gateway_id.into_owned(),
        opens: s.opens.map(|b| PyBytes::new(py, b).unbind()),
        key_last_used: s.key_last_used.map(|b| PyBytes::new(py, b).unbind()),
        rows: PyString::new(py, rows).unbind(),
        rows_posted: s.rows_posted,
        ids: PyList::new(py, &s.ids)?.unbind(),
        started_max: s.started_max,
        groups: groups.unbind(),
        data: data.clone().unbind(),
        spans: s.spans,
    }))
}
