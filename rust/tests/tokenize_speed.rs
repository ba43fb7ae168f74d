//! Prints how long a 2k-token chat request takes to tokenize (render the
//! template, then encode). Not asserted: the figure depends on the machine
//! and on the build; run `cargo test --release --test tokenize_speed --
//! --nocapture` for the number that matters.
#![expect(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::path::PathBuf;
use std::time::Instant;

use llmgw_core::tokenize::{ModelTokenizer, PromptTokenizer};

const TARGET_TOKENS: usize = 2000;

#[test]
fn time_a_2k_token_chat_request() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-bpe");
    let t = ModelTokenizer::from_dir(dir).unwrap();
    let sentence = "Prefix caching reuses the key and value cache of a shared prompt prefix, \
                    so the question is which replica holds it; ";
    // Grow a multi-turn conversation until it renders to 2k tokens.
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    let body = loop {
        let role = if messages.len() % 2 == 1 {
            "user"
        } else {
            "assistant"
        };
        messages.push(serde_json::json!({"role": role, "content": sentence.repeat(4)}));
        let body =
            serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap();
        if t.tokens(&body, true).unwrap().len() >= TARGET_TOKENS {
            break body;
        }
    };
    let n = t.tokens(&body, true).unwrap().len();
    let rounds: u32 = if cfg!(debug_assertions) { 5 } else { 200 };

    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(t.tokens(std::hint::black_box(&body), true));
    }
    let total = start.elapsed() / rounds;
    let start = Instant::now();
    let mut text = String::new();
    for _ in 0..rounds {
        text = t.render_chat(std::hint::black_box(&body), None).unwrap();
    }
    let render = start.elapsed() / rounds;
    println!(
        "tokenize a {n}-token chat request ({} messages, {} body bytes): {} µs total, {} µs of it \
         rendering ({} prompt chars); {}",
        messages.len(),
        body.len(),
        total.as_micros(),
        render.as_micros(),
        text.len(),
        if cfg!(debug_assertions) {
            "debug build"
        } else {
            "release build"
        },
    );
}
