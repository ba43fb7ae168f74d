//! Binds `tokenize::ModelTokenizer` as `llmgw._core.ModelTokenizer`.
//!
//! The class is frozen: the tokenizer and template are read-only once loaded,
//! so every worker thread can call it at once without a borrow flag.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::tokenize;

/// Inputs shorter than this are encoded holding the interpreter: releasing
/// and taking it back costs about as much as encoding a few hundred bytes.
const DETACH_BYTES: usize = 2048;

fn value_error(e: &tokenize::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A model's tokenizer and chat template, loaded from its Hugging Face files.
#[pyclass(module = "llmgw._core", name = "ModelTokenizer", frozen)]
pub struct ModelTokenizer {
    // An Arc so the router can hold the same tokenizer without a copy.
    inner: Arc<tokenize::ModelTokenizer>,
}

impl ModelTokenizer {
    /// The tokenizer itself, for the router's precise mode.
    pub(crate) fn shared(&self) -> Arc<tokenize::ModelTokenizer> {
        Arc::clone(&self.inner)
    }
}

#[pymethods]
impl ModelTokenizer {
    /// Loads `tokenizer.json` and `tokenizer_config.json` from a model directory.
    #[staticmethod]
    fn from_dir(py: Python<'_>, path: &str) -> PyResult<Self> {
        // A large vocabulary takes a good fraction of a second to parse.
        let inner = py
            .detach(|| tokenize::ModelTokenizer::from_dir(path))
            .map_err(|e| value_error(&e))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Encodes text to token ids.
    #[pyo3(signature = (text, add_special_tokens = true))]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        let run = || self.inner.encode(text, add_special_tokens);
        let ids = if text.len() < DETACH_BYTES {
            run()
        } else {
            py.detach(run)
        };
        ids.map_err(|e| value_error(&e))
    }

    /// Renders a chat completions body with the model's chat template.
    #[pyo3(signature = (body, add_generation_prompt = true))]
    fn render_chat(
        &self,
        py: Python<'_>,
        body: &[u8],
        add_generation_prompt: bool,
    ) -> PyResult<String> {
        py.detach(|| self.inner.render_chat(body, Some(add_generation_prompt)))
            .map_err(|e| value_error(&e))
    }

    /// The prompt's token ids as the engine will see them, or None.
    fn tokens(&self, py: Python<'_>, body: &[u8], chat: bool) -> Option<Vec<u32>> {
        py.detach(|| tokenize::PromptTokenizer::tokens(&*self.inner, body, chat))
    }

    #[getter]
    fn has_chat_template(&self) -> bool {
        self.inner.has_chat_template()
    }
}
