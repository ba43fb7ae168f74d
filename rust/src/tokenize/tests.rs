//! Tests against the committed tiny byte-level BPE fixture and its two
//! templates (tests/fixtures; regenerate with `make_tiny_bpe.py`).
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test fails by panicking"
)]

use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use proptest::prelude::*;

use super::{Error, ModelTokenizer, PromptTokenizer};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixed_clock() -> super::Clock {
    // 2024-07-26 00:00 UTC.
    Arc::new(|| Timestamp::from_second(1_721_952_000).unwrap())
}

fn llama() -> ModelTokenizer {
    ModelTokenizer::from_dir(fixtures().join("tiny-bpe"))
        .unwrap()
        .with_clock(fixed_clock())
        .unwrap()
}

fn chatml() -> ModelTokenizer {
    let t = std::fs::read_to_string(fixtures().join("chatml.jinja")).unwrap();
    ModelTokenizer::from_files(fixtures().join("tiny-bpe/tokenizer.json"), Some(t)).unwrap()
}

const HEAD: &str = "<|start_header_id|>";
const TAIL: &str = "<|end_header_id|>\n\n";

#[test]
fn llama_style_string_content_and_generation_prompt() {
    let body = br#"{"model": "m", "messages": [{"role": "user", "content": " Hi there "}]}"#;
    let text = llama().render_chat(body, None).unwrap();
    assert_eq!(
        text,
        format!(
            "<|begin_of_text|>{HEAD}system{TAIL}Today is 26 Jul 2024.<|eot_id|>\
             {HEAD}user{TAIL}Hi there<|eot_id|>{HEAD}assistant{TAIL}"
        )
    );
    let bare = llama().render_chat(body, Some(false)).unwrap();
    assert!(text.starts_with(&bare) && bare.ends_with("Hi there<|eot_id|>"));
}

#[test]
fn system_and_multi_turn() {
    let body = br#"{"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "A?"},
        {"role": "assistant", "content": "B."},
        {"role": "user", "content": "C?"}], "add_generation_prompt": false}"#;
    assert_eq!(
        llama().render_chat(body, None).unwrap(),
        format!(
            "<|begin_of_text|>{HEAD}system{TAIL}Be brief.<|eot_id|>{HEAD}user{TAIL}A?<|eot_id|>\
             {HEAD}assistant{TAIL}B.<|eot_id|>{HEAD}user{TAIL}C?<|eot_id|>"
        )
    );
}

#[test]
fn list_content_both_formats() {
    let body = br#"{"messages": [{"role": "user", "content": [
        {"type": "text", "text": "one"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "two"}]}]}"#;
    // String format (the Llama-style template never loops over content).
    assert!(llama()
        .render_chat(body, None)
        .unwrap()
        .contains("one\ntwo<|eot_id|>"));
    // Parts format: the ChatML template concatenates the parts itself.
    assert_eq!(
        chatml().render_chat(body, None).unwrap(),
        "<|im_start|>user\nonetwo<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn tool_call_arguments_are_python_json() {
    let body = r#"{"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Zürich\",\"days\":2}"}}]}]}"#;
    assert_eq!(
        chatml().render_chat(body.as_bytes(), Some(false)).unwrap(),
        "<|im_start|>assistant\n\n<tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}</tool_call><|im_end|>\n"
    );
}

#[test]
fn raise_exception_is_an_error_not_a_panic() {
    let body = br#"{"messages": [{"role": "tool", "content": "x"}]}"#;
    let t = llama();
    match t.render_chat(body, None) {
        Err(Error::Template(m)) => assert!(m.contains("Only user and assistant turns"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.tokens(body, true), None);
}

#[test]
fn chat_tokens_do_not_add_a_second_bos() {
    let t = llama();
    let body = br#"{"messages": [{"role": "user", "content": "What is the capital of France?"}]}"#;
    let ids = t.tokens(body, true).unwrap();
    let bos = t.encode("<|begin_of_text|>", false).unwrap();
    assert_eq!(bos.len(), 1);
    assert_eq!(ids.iter().filter(|&&i| i == bos[0]).count(), 1);
    assert_eq!(ids[0], bos[0]);
    assert_eq!(
        ids,
        t.encode(&t.render_chat(body, None).unwrap(), false)
            .unwrap()
    );
}

#[test]
fn completion_tokens() {
    let t = llama();
    let with = t
        .tokens(br#"{"prompt": "The capital of France"}"#, false)
        .unwrap();
    let without = t.encode("The capital of France", false).unwrap();
    assert_eq!(with[1..], without[..]);
    assert_eq!(
        t.tokens(
            br#"{"prompt": "The capital of France", "add_special_tokens": false}"#,
            false
        )
        .unwrap(),
        without
    );
    assert_eq!(
        t.tokens(br#"{"prompt": [5, 6, 7]}"#, false),
        Some(vec![5, 6, 7])
    );
    assert_eq!(t.tokens(b"not json", false), None);
}

#[test]
fn continue_final_message_cuts_after_its_text() {
    let body = br#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}],
        "add_generation_prompt": false, "continue_final_message": true}"#;
    assert!(llama()
        .render_chat(body, None)
        .unwrap()
        .ends_with(&format!("{HEAD}assistant{TAIL}Hello, I")));
}

#[test]
fn tools_and_missing_template_give_no_tokens() {
    let body = br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}"#;
    assert_eq!(llama().tokens(body, true), None);
    let bare =
        ModelTokenizer::from_files(fixtures().join("tiny-bpe/tokenizer.json"), None).unwrap();
    assert!(!bare.has_chat_template());
    assert_eq!(bare.tokens(br#"{"messages": []}"#, true), None);
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmgw-tok-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn load_error(dir: &PathBuf) -> String {
    match ModelTokenizer::from_dir(dir) {
        Err(Error::Load(m)) => m,
        Err(e) => panic!("not a load error: {e:?}"),
        Ok(_) => panic!("loaded"),
    }
}

#[test]
fn from_dir_errors_name_the_file_and_the_fix() {
    let d = temp_dir("missing");
    let m = load_error(&d);
    assert!(
        m.contains("tokenizer.json was not found") && m.contains("Download"),
        "{m}"
    );

    std::fs::write(d.join("tokenizer.json"), b"{\"truncated\": ").unwrap();
    let m = load_error(&d);
    assert!(
        m.contains("tokenizer.json is not a tokenizer") && m.contains("Check"),
        "{m}"
    );

    std::fs::copy(
        fixtures().join("tiny-bpe/tokenizer.json"),
        d.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(d.join("tokenizer_config.json"), b"[1, 2]").unwrap();
    let m = load_error(&d);
    assert!(
        m.contains("tokenizer_config.json is not a valid tokenizer config"),
        "{m}"
    );

    std::fs::write(
        d.join("tokenizer_config.json"),
        br#"{"chat_template": "{% for %}"}"#,
    )
    .unwrap();
    let m = load_error(&d);
    assert!(
        m.contains("chat template in") && m.contains("does not compile"),
        "{m}"
    );

    // chat_template.jinja wins over the config's template, as in transformers.
    std::fs::write(d.join("chat_template.jinja"), b"{{ messages[0].content }}!").unwrap();
    let t = ModelTokenizer::from_dir(&d).unwrap();
    assert_eq!(
        t.render_chat(br#"{"messages": [{"role": "user", "content": "x"}]}"#, None)
            .unwrap(),
        "x!"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn add_bos_token_false_drops_the_post_processor_bos() {
    let d = temp_dir("nobos");
    std::fs::copy(
        fixtures().join("tiny-bpe/tokenizer.json"),
        d.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(
        d.join("tokenizer_config.json"),
        br#"{"bos_token": "<|begin_of_text|>", "add_bos_token": false}"#,
    )
    .unwrap();
    let t = ModelTokenizer::from_dir(&d).unwrap();
    assert_eq!(
        t.encode("hello", true).unwrap(),
        t.encode("hello", false).unwrap()
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A message body from (role index, text) turns, starting with a user turn.
fn body(turns: &[String]) -> Vec<u8> {
    let messages: Vec<serde_json::Value> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": t}))
        .collect();
    serde_json::to_vec(&serde_json::json!({"messages": messages, "add_generation_prompt": false}))
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Multi-turn prefix caching depends on this: the rendering of a
    /// conversation is a prefix of the rendering with one more turn.
    /// Both fixture templates keep it; templates that rewrite earlier turns
    /// (e.g. ones that drop the reasoning of past assistant turns) do not.
    #[test]
    fn rendering_is_deterministic_and_prefix_stable(
        turns in proptest::collection::vec("[ a-zA-Z0-9.,?!é東🙂\n]{0,40}", 1..6),
        next in "[ a-zA-Z0-9.,?!]{0,40}",
    ) {
        for t in [llama(), chatml()] {
            let a = t.render_chat(&body(&turns), None).unwrap();
            prop_assert_eq!(&a, &t.render_chat(&body(&turns), None).unwrap());
            let mut more = turns.clone();
            more.push(next.clone());
            let b = t.render_chat(&body(&more), None).unwrap();
            prop_assert!(b.starts_with(&a), "{:?} is not a prefix of {:?}", a, b);
            let (ia, ib) = (t.encode(&a, false).unwrap(), t.encode(&b, false).unwrap());
            // Tokens too, here, because every turn ends in a special token
            // that BPE merges never cross.
            prop_assert!(ib.starts_with(&ia));
        }
    }
}
