//! The per-token and per-request core of llmgw: stream taps and the replica
//! router. The logic is plain Rust; `python` only binds it as `llmgw._core`.

pub mod keys;
pub mod kv;
pub mod request;
pub mod router;
pub mod sockdiag;
pub mod stream;
pub mod tokenize;
pub mod usage;
pub mod usage_scan;

#[cfg(feature = "python")]
mod python;
