#![expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]

use super::sse::{self, Scan};
use super::*;

/// Feeds `chunks` then finishes; returns the output and whether each feed was whole.
fn run(tap: &mut Tap, chunks: &[&[u8]]) -> (Vec<u8>, Vec<bool>) {
    let mut out = Vec::new();
    let mut whole = Vec::new();
    for c in chunks {
        tap.feed(c, |o| {
            whole.push(o.is_whole());
            out.extend(o.to_vec());
        });
    }
    tap.finish(|o| out.extend(o.to_vec()));
    (out, whole)
}

fn relay(tap: &mut Tap, body: &[u8]) -> Vec<u8> {
    run(tap, &[body]).0
}

const CONTENT: &[u8] =
    b"data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
const FINISH: &[u8] = b"data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const USAGE: &[u8] = b"data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5,\"total_tokens\":8}}\n\n";
const DONE: &[u8] = b"data: [DONE]\n\n";

#[test]
fn event_end_all_line_endings() {
    for (body, end) in [
        (&b"data: x\n\ndata: y"[..], 9),
        (b"data: x\r\n\r\ndata: y", 11),
        (b"data: x\r\rdata: y", 9),
        (b"data: x\n\r\n", 10),
        (b"\n", 1),
    ] {
        assert_eq!(
            sse::event_end(body, &mut Scan::default()),
            Some(end),
            "{body:?}"
        );
    }
    assert_eq!(sse::event_end(b"data: x\n", &mut Scan::default()), None);
    assert_eq!(sse::event_end(b"data: x\r", &mut Scan::default()), None);
}

#[test]
fn event_end_resumes_across_chunks() {
    let mut scan = Scan::default();
    assert_eq!(sse::event_end(b"data: x\r", &mut scan), None);
    // The `\r` seen before was the first half of `\r\n`, not a line of its own.
    assert_eq!(sse::event_end(b"data: x\r\n", &mut scan), None);
    assert_eq!(sse::event_end(b"data: x\r\n\r\n", &mut scan), Some(11));
}

#[test]
fn data_lines_join_and_fields() {
    let d = sse::data(b"event: e\nid: 1\n: note\ndata: a\ndata:b\ndata\n\n").unwrap();
    assert_eq!(d.payload(), b"a\nb\n");
    assert!(sse::data(b": only a comment\n\n").is_none());
    assert!(sse::data(b"dataX: y\n\n").is_none());
}

#[test]
fn content_finish_usage_done() {
    let mut tap = Tap::new(false, None);
    let body = [CONTENT, CONTENT, FINISH, USAGE, DONE].concat();
    assert_eq!(relay(&mut tap, &body), body);
    let s = tap.summary();
    assert_eq!(
        (s.chunks, s.content_chunks, s.has_token(), s.done),
        (4, 2, true, true)
    );
    assert_eq!(s.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        s.usage,
        Usage {
            prompt_tokens: Some(3),
            completion_tokens: Some(5),
            total_tokens: Some(8)
        }
    );
    assert_eq!(s.error, None);
}

#[test]
fn output_kinds() {
    for ev in [
        &b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"t\"}}]}\n\n"[..],
        b"data: {\"choices\":[{\"delta\":{\"reasoning\":\"t\"}}]}\n\n",
        b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n",
        b"data: {\"choices\":[{\"text\":\"t\",\"index\":0}]}\n\n",
    ] {
        let mut tap = Tap::new(false, None);
        relay(&mut tap, ev);
        assert!(tap.summary().has_token(), "{ev:?}");
    }
    for ev in [
        &b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"[..],
        b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\n",
        b"data: {\"choices\":[{\"delta\":{\"content\":null}}]}\n\n",
        b"data: {\"choices\":[{\"text\":\"\"}]}\n\n",
    ] {
        let mut tap = Tap::new(false, None);
        relay(&mut tap, ev);
        assert_eq!(
            (tap.summary().chunks, tap.summary().has_token()),
            (1, false),
            "{ev:?}"
        );
    }
}

#[test]
fn crlf_cr_and_multiline_events() {
    let crlf = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n";
    let cr = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\rdata: [DONE]\r\r";
    let multi =
        b"data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n";
    for body in [&crlf[..], cr, multi] {
        let mut tap = Tap::new(false, None);
        assert_eq!(relay(&mut tap, body), body);
        let s = tap.summary();
        assert_eq!(
            (s.chunks, s.content_chunks, s.done),
            (1, 1, true),
            "{body:?}"
        );
    }
}

#[test]
fn comments_and_other_fields_pass_through() {
    let body = b": keep-alive\n\nevent: ping\nid: 7\n\nretry: 10\n\n";
    let mut tap = Tap::new(true, Some(("m", "alias")));
    let (out, whole) = run(&mut tap, &[body]);
    assert_eq!(out, body);
    assert_eq!(whole, [true]);
    assert_eq!(tap.summary().chunks, 0);
}

#[test]
fn non_json_data_passes_uncounted() {
    let body = b"data: hello\n\ndata: [1,2]\n\ndata: {broken\n\n";
    let mut tap = Tap::new(false, None);
    assert_eq!(relay(&mut tap, body), body);
    assert_eq!(tap.summary().chunks, 0);
}

#[test]
fn error_events() {
    let cases: [(&[u8], &str); 4] = [
        (
            b"data: {\"error\":{\"message\":\"boom\",\"type\":\"x\",\"code\":500}}\n\n",
            "boom",
        ),
        (
            b"data: {\"error\":\"plain \\\"text\\\"\"}\n\n",
            "plain \"text\"",
        ),
        (b"data: {\"error\":{\"code\":1}}\n\n", "{\"code\":1}"),
        (b"data: {\"error\":42}\n\n", "42"),
    ];
    for (ev, msg) in cases {
        let mut tap = Tap::new(false, None);
        relay(&mut tap, ev);
        assert_eq!(tap.summary().error.as_deref(), Some(msg));
        assert_eq!(tap.summary().chunks, 1);
    }
    // vLLM's old flat shape has no `error` key: it is not read as an error.
    let mut tap = Tap::new(false, None);
    relay(
        &mut tap,
        b"data: {\"object\":\"error\",\"message\":\"m\"}\n\n",
    );
    assert_eq!(tap.summary().error, None);
    // A null error is no error.
    let mut tap = Tap::new(false, None);
    relay(&mut tap, b"data: {\"error\":null,\"choices\":[]}\n\n");
    assert_eq!(tap.summary().error, None);
}

#[test]
fn long_error_is_cut() {
    let ev = format!("data: {{\"error\":\"{}\"}}\n\n", "é".repeat(600));
    let mut tap = Tap::new(false, None);
    relay(&mut tap, ev.as_bytes());
    assert_eq!(
        tap.summary().error.as_ref().map(|e| e.chars().count()),
        Some(500)
    );
}

#[test]
fn strip_usage_drops_only_usage_only_chunk() {
    let with_usage = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n";
    let body = [CONTENT, &with_usage[..], FINISH, USAGE, DONE].concat();
    let mut tap = Tap::new(true, None);
    let (out, whole) = run(&mut tap, &[&body]);
    assert_eq!(out, [CONTENT, &with_usage[..], FINISH, DONE].concat());
    assert_eq!(whole, [false]);
    assert_eq!(tap.summary().usage.total_tokens, Some(8));
    assert_eq!(tap.summary().chunks, 4);
    // Without the flag, nothing is dropped.
    let mut tap = Tap::new(false, None);
    assert_eq!(relay(&mut tap, &body), body);
}

#[test]
fn rename_splices_the_model_value() {
    let body = b"data: {\"id\":\"x\",\"model\" :  \"m\",\"choices\":[{\"delta\":{\"content\":\"\\\"model\\\":\\\"m\\\"\"}}]}\n\n";
    let want = b"data: {\"id\":\"x\",\"model\" :  \"alias\",\"choices\":[{\"delta\":{\"content\":\"\\\"model\\\":\\\"m\\\"\"}}]}\n\n";
    let mut tap = Tap::new(false, Some(("m", "alias")));
    let (out, whole) = run(&mut tap, &[body]);
    assert_eq!(out, want);
    assert_eq!(whole, [false]);
    let compact = [CONTENT, DONE].concat();
    let mut tap = Tap::new(false, Some(("m", "a\"b")));
    assert_eq!(
        relay(&mut tap, &compact),
        [&CONTENT[..15], b"\"a\\\"b\"", &CONTENT[18..], DONE].concat()
    );
}

#[test]
fn rename_leaves_other_values() {
    for ev in [
        &b"data: {\"model\":\"mm\",\"choices\":[]}\n\n"[..],
        b"data: {\"model\":\"xm\",\"choices\":[]}\n\n",
        b"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"model\\\":\\\"m\\\"\"}}]}\n\n",
        b"data: {\"choices\":[{\"delta\":{\"model\":\"m\"}}]}\n\n",
        b"data: {\"model\":null}\n\n",
    ] {
        let mut tap = Tap::new(false, Some(("m", "alias")));
        let (out, whole) = run(&mut tap, &[ev]);
        assert_eq!((out.as_slice(), whole.as_slice()), (ev, &[true][..]));
    }
}

#[test]
fn rename_escaped_and_multiline() {
    let mut tap = Tap::new(false, Some(("a/b", "x")));
    assert_eq!(
        relay(&mut tap, b"data: {\"model\":\"a\\/b\"}\n\n"),
        b"data: {\"model\":\"x\"}\n\n"
    );
    let mut tap = Tap::new(false, Some(("m", "alias")));
    assert_eq!(
        relay(&mut tap, b"data: {\"id\":1,\ndata: \"model\":\"m\"}\n\n"),
        b"data: {\"id\":1,\ndata: \"model\":\"alias\"}\n\n"
    );
}

#[test]
fn zero_copy_only_on_event_boundaries() {
    let mut tap = Tap::new(false, None);
    let (out, whole) = run(&mut tap, &[CONTENT, &FINISH[..10], &FINISH[10..], DONE]);
    assert_eq!(out, [CONTENT, FINISH, DONE].concat());
    assert_eq!(whole, [true, false, false, true]);
}

#[test]
fn finish_returns_the_tail() {
    let mut tap = Tap::new(false, Some(("m", "alias")));
    let mut fed = Vec::new();
    tap.feed(b"data: {\"model\":\"m\"}\n\ndata: [DONE]", |o| {
        fed = o.to_vec();
    });
    assert_eq!(fed, b"data: {\"model\":\"alias\"}\n\n");
    assert!(!tap.summary().done);
    let mut tail = Vec::new();
    tap.finish(|o| tail = o.to_vec());
    assert_eq!(tail, b"data: [DONE]");
    assert!(tap.summary().done);
    tap.finish(|o| assert!(o.is_empty()));
    // The tap can be reused after finish.
    tap.feed(DONE, |o| assert!(o.is_whole()));
}

#[test]
fn inspect_answers() {
    let chat = br#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"},{"index":1,"finish_reason":null}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}"#;
    let a = inspect(chat, None);
    assert_eq!(a.finish_reason.as_deref(), Some("length"));
    assert_eq!(a.usage.total_tokens, Some(5));
    assert_eq!(a.rename, None);
    let emb = br#"{"object":"list","data":[{"embedding":[0.1]}],"model":"e","usage":{"prompt_tokens":4,"total_tokens":4}}"#;
    let a = inspect(emb, None);
    assert_eq!(
        (
            a.usage.prompt_tokens,
            a.usage.completion_tokens,
            a.finish_reason
        ),
        (Some(4), None, None)
    );
    let err = br#"{"error":{"message":"no such model","type":"invalid_request_error"}}"#;
    assert_eq!(inspect(err, None).error.as_deref(), Some("no such model"));
    assert_eq!(inspect(b"not json", None), Answer::default());
    assert_eq!(inspect(b"", None), Answer::default());
}

#[test]
fn inspect_rename() {
    let body = br#"{"model": "m", "choices": [{"message": {"content": "\"model\": \"m\""}}]}"#;
    let rename = Rename::new("m", "alias");
    let a = inspect(body, Some(&rename));
    let r = a.rename.clone().unwrap();
    assert_eq!(
        splice(body, &r, rename.to_json()),
        br#"{"model": "alias", "choices": [{"message": {"content": "\"model\": \"m\""}}]}"#
    );
    assert_eq!(inspect(br#"{"model":"other"}"#, Some(&rename)).rename, None);
}
