//! `llmgw._core.UsageRows`: finished requests' usage rows, written natively as each ends.
//!
//! The gateway built a `UsageRow` Struct per request (23 fields, two new floats), kept
//! it until the next post and encoded the batch then; here the row is written into one
//! buffer at once and a post takes the head of it as bytes.

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::usage::{Row, Rows};

/// Usage rows waiting for the next post to the control plane, oldest first.
#[pyclass(module = "llmgw._core", name = "UsageRows")]
#[derive(Default)]
pub struct UsageRows {
    rows: Rows,
}

#[pymethods]
impl UsageRows {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Appends the row of one finished request (no kept bodies); durations in seconds.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (request_id, model, upstream_model, replica, status, http_status, stream,
                        prompt_tokens, completion_tokens, usage_estimated, ttft_s, duration_s,
                        finish_reason, retries, started_at, route, key_id, user_id, project_id,
                        team_id, org_id))]
    fn add(
        &mut self,
        request_id: &str,
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
        key_id: Option<&str>,
        user_id: Option<&str>,
        project_id: Option<&str>,
        team_id: Option<&str>,
        org_id: Option<&str>,
    ) {
        self.rows.add(&Row {
            request_id,
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
            key_id,
            user_id,
            project_id,
            team_id,
            org_id,
        });
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
