//! What precise (`kv`) routing asks of the KV-event index and the tokenizer.
//!
//! Both are defined here so that the router builds on its own; `crate::kv`
//! defines the same `PrefixOracle`, and the two are unified when they merge.

use std::sync::Arc;

/// Answers, for a prompt's tokens, how many leading tokens each replica holds
/// in its KV cache.
pub trait PrefixOracle: Send + Sync {
    /// Appends (replica id, matched tokens) for each replica holding a prefix of
    /// `tokens`; replicas holding nothing may be left out.
    fn matches(&self, tokens: &[u32], lora_id: Option<i64>, out: &mut Vec<(Arc<str>, u32)>);
}

/// Turns a request body into the tokens the engine will see.
pub trait PromptTokenizer: Send + Sync {
    /// The prompt's tokens (the chat template applied when `chat`), or None when
    /// the body cannot be tokenized.
    fn tokens(&self, body: &[u8], chat: bool) -> Option<Vec<u32>>;
}
