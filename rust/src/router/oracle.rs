//! What precise (`kv`) routing asks of the KV-event index and the tokenizer.
//!
//! The index's side is `crate::kv::PrefixOracle` (the KV-event index
//! implements it) and the tokenizer's `crate::tokenize::PromptTokenizer`
//! (`ModelTokenizer` implements it); the router only names them here.

pub use crate::kv::PrefixOracle;
pub use crate::tokenize::PromptTokenizer;
