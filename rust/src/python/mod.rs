//! The `llmgw._core` extension module: thin bindings over `stream` and `router`
//! (the router's in `router.rs`).
//!
//! `StreamTap` and `Router` are mutated from one Python thread per request, so
//! they are plain pyclasses taking `&mut self`; the borrow check is one flag.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod keys;
mod kv;
mod limits;
mod router;
mod tokenize;
mod usage;

use crate::request;
use crate::sockdiag;
use crate::stream::{self, Rename};

/// Turns an optional (from, to) pair into a rename; one without the other is a mistake.
fn rename_pair<'a>(
    from: Option<&'a str>,
    to: Option<&'a str>,
) -> PyResult<Option<(&'a str, &'a str)>> {
    match (from, to) {
        (Some(f), Some(t)) => Ok(Some((f, t))),
        (None, None) => Ok(None),
        _ => Err(PyValueError::new_err(
            "rename_from and rename_to go together",
        )),
    }
}

/// Builds the bytes an `Out` describes, or returns the fed object itself.
fn emit<'py>(
    py: Python<'py>,
    data: Option<&Bound<'py, PyBytes>>,
    out: &stream::Out<'_>,
) -> PyResult<Bound<'py, PyBytes>> {
    match data {
        Some(d) if out.is_whole() => Ok(d.clone()),
        _ => PyBytes::new_with(py, out.len(), |dst| {
            out.write_to(dst);
            Ok(())
        }),
    }
}

/// Relays one upstream SSE body to the client and extracts what it reports.
#[pyclass(module = "llmgw._core", name = "StreamTap")]
pub struct StreamTap {
    tap: stream::Tap,
}

#[pymethods]
impl StreamTap {
    #[new]
    #[pyo3(signature = (strip_usage = false, rename_from = None, rename_to = None))]
    fn new(
        strip_usage: bool,
        rename_from: Option<&str>,
        rename_to: Option<&str>,
    ) -> PyResult<Self> {
        Ok(Self {
            tap: stream::Tap::new(strip_usage, rename_pair(rename_from, rename_to)?),
        })
    }

    /// Consumes one upstream chunk; returns the bytes to send now (maybe empty).
    fn feed<'py>(&mut self, data: &Bound<'py, PyBytes>) -> PyResult<Bound<'py, PyBytes>> {
        self.tap
            .feed(data.as_bytes(), |out| emit(data.py(), Some(data), &out))
    }

    /// Returns what is left buffered (an incomplete last event) at end of body.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.tap.finish(|out| emit(py, None, &out))
    }

    #[getter]
    fn chunks(&self) -> u64 {
        self.tap.summary().chunks
    }

    /// Bytes of an incomplete event held back.
    #[getter]
    fn buffered(&self) -> usize {
        self.tap.buffered()
    }

    #[getter]
    fn content_chunks(&self) -> u64 {
        self.tap.summary().content_chunks
    }

    #[getter]
    fn has_token(&self) -> bool {
        self.tap.summary().has_token()
    }

    #[getter]
    fn done(&self) -> bool {
        self.tap.summary().done
    }

    #[getter]
    fn finish_reason(&self) -> Option<&str> {
        self.tap.summary().finish_reason.as_deref()
    }

    #[getter]
    fn prompt_tokens(&self) -> Option<u64> {
        self.tap.summary().usage.prompt_tokens
    }

    #[getter]
    fn completion_tokens(&self) -> Option<u64> {
        self.tap.summary().usage.completion_tokens
    }

    #[getter]
    fn total_tokens(&self) -> Option<u64> {
        self.tap.summary().usage.total_tokens
    }

    #[getter]
    fn error(&self) -> Option<&str> {
        self.tap.summary().error.as_deref()
    }
}

/// What a non-streamed `OpenAI` answer reported.
#[pyclass(module = "llmgw._core", name = "JsonSummary", frozen)]
pub struct JsonSummary {
    body: Py<PyBytes>,
    answer: stream::Answer,
}

#[pymethods]
impl JsonSummary {
    #[getter]
    fn body(&self, py: Python<'_>) -> Py<PyBytes> {
        self.body.clone_ref(py)
    }

    #[getter]
    fn finish_reason(&self) -> Option<&str> {
        self.answer.finish_reason.as_deref()
    }

    #[getter]
    fn prompt_tokens(&self) -> Option<u64> {
        self.answer.usage.prompt_tokens
    }

    #[getter]
    fn completion_tokens(&self) -> Option<u64> {
        self.answer.usage.completion_tokens
    }

    #[getter]
    fn total_tokens(&self) -> Option<u64> {
        self.answer.usage.total_tokens
    }

    #[getter]
    fn error(&self) -> Option<&str> {
        self.answer.error.as_deref()
    }
}

/// Extracts usage, finish reason and error from a whole JSON answer.
#[pyfunction]
#[pyo3(signature = (body, rename_from = None, rename_to = None))]
fn inspect_json(
    body: &Bound<'_, PyBytes>,
    rename_from: Option<&str>,
    rename_to: Option<&str>,
) -> PyResult<JsonSummary> {
    let rename = rename_pair(rename_from, rename_to)?
        .filter(|(f, t)| f != t)
        .map(|(f, t)| Rename::new(f, t));
    let bytes = body.as_bytes();
    let answer = stream::inspect(bytes, rename.as_ref());
    let body = match (&answer.rename, &rename) {
        (Some(r), Some(rename)) => {
            let spliced = stream::splice(bytes, r, rename.to_json());
            PyBytes::new(body.py(), &spliced).unbind()
        }
        _ => body.clone().unbind(),
    };
    Ok(JsonSummary { body, answer })
}

/// Sets the request's `model` and `stream_options.include_usage` by splicing;
/// returns the same object when the body already says so.
#[pyfunction]
#[pyo3(signature = (body, model, include_usage))]
fn patch_request<'py>(
    body: &Bound<'py, PyBytes>,
    model: Option<&str>,
    include_usage: bool,
) -> PyResult<Bound<'py, PyBytes>> {
    match request::patch_request(body.as_bytes(), model, include_usage) {
        Ok(None) => Ok(body.clone()),
        Ok(Some(patched)) => Ok(PyBytes::new(body.py(), &patched)),
        Err(e) => Err(PyValueError::new_err(e.to_string())),
    }
}

/// One connection's two ends, as `llmgw.net.connections` names them: ((ip, port), (ip, port)).
type Ends = ((String, u16), (String, u16));

/// The established connections of local `port` whose peer has sent no byte yet, in `answer`
/// (one part of the answer to `sock_diag` dump `seq`; see `crate::sockdiag`): (inode, (local, peer)) each,
/// and whether the dump goes on (False: its end, an error, or another dump's message).
/// Read with the interpreter released.
#[pyfunction]
fn silent_connections(py: Python<'_>, answer: &Bound<'_, PyBytes>, seq: u32, port: u16) -> (Vec<(u32, Ends)>, bool) {
    let bytes = answer.as_bytes();
    let mut found = Vec::new();
    let more = py.detach(|| sockdiag::silent(bytes, seq, port, &mut found));
    let named = found
        .into_iter()
        .map(|s| (s.inode, ((s.local.0.to_string(), s.local.1), (s.peer.0.to_string(), s.peer.1))))
        .collect();
    (named, more)
}

/// The `llmgw._core` module.
#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<StreamTap>()?;
    m.add_class::<JsonSummary>()?;
    m.add_class::<router::Router>()?;
    m.add_class::<kv::KvIndex>()?;
    m.add_class::<keys::KeyIndex>()?;
    m.add_class::<limits::Hold>()?;
    m.add_class::<limits::TokenLease>()?;
    m.add_class::<limits::Ticket>()?;
    m.add_class::<usage::UsageRows>()?;
    m.add_class::<usage::UsageScan>()?;
    m.add_function(wrap_pyfunction!(usage::scan_usage, m)?)?;
    m.add_class::<tokenize::ModelTokenizer>()?;
    m.add_function(wrap_pyfunction!(inspect_json, m)?)?;
    m.add_function(wrap_pyfunction!(patch_request, m)?)?;
    m.add_function(wrap_pyfunction!(silent_connections, m)?)?;
    m.add_function(wrap_pyfunction!(limits::admit, m)?)?;
    m.add_function(wrap_pyfunction!(limits::take, m)?)?;
    Ok(())
}
