//! `llmgw._core.UsageRows`: finished requests' usage rows, written natively as each ends.
//!
//! The gateway built a `UsageRow` Struct per request (23 fields, two new floats), kept
//! it until the next post and encoded the batch then; here the row is written into one
//! buffer at once and a post takes the head of it as bytes.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

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
