//! What precise (`kv`) routing asks of the KV-event index and the tokenizer.
//!
//! The index's side is `crate::kv::PrefixOracle` (the KV-event index
//! implements it); the router only names it here.

pub use crate::kv::PrefixOracle;

/// Turns a request body into the tokens the engine will see.
pub trait PromptTokenizer: Send + Sync {
    /// The prompt's tokens (the chat template applied when `chat`), or None when
    /// the body cannot be tokenized.
    fn tokens(&self, body: &[u8], chat: bool) -> Option<Vec<u32>>;
}
