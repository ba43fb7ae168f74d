//! Splicing the few values of an `OpenAI` request body that the gateway must change.
//!
//! A prompt can be megabytes; decoding it into objects and encoding it again to
//! change one short value is the cost this module avoids. It scans the top
//! level of the JSON object only as far as it must, skipping nested values by
//! bracket depth, and copies the body once with the new values in place.

use std::ops::Range;

/// Why a body could not be patched.
#[derive(Debug, PartialEq, Eq)]
pub struct NotAnObject;

impl std::fmt::Display for NotAnObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body is not a JSON object")
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// Index just past the string that starts at `i` (which must be a quote).
fn skip_string(b: &[u8], i: usize) -> Result<usize, NotAnObject> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err(NotAnObject)
}

/// Index just past the JSON value that starts at `i`.
fn skip_value(b: &[u8], i: usize) -> Result<usize, NotAnObject> {
    match b.get(i) {
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Err(NotAnObject)
        }
        Some(_) => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            if j == i {
                Err(NotAnObject)
            } else {
                Ok(j)
            }
        }
        None => Err(NotAnObject),
    }
}

/// Raw key bytes (without quotes) and value range of each member of an object.
type Members = Vec<(Range<usize>, Range<usize>)>;

/// The members of the object starting at `open` (its `{`): for each, the raw key
/// bytes (without quotes) and the value's byte range; plus the index of `}`.
fn members(b: &[u8], open: usize) -> Result<(Members, usize), NotAnObject> {
    if b.get(open) != Some(&b'{') {
        return Err(NotAnObject);
    }
    let mut out = Vec::new();
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b'}') {
        return Ok((out, i));
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return Err(NotAnObject);
        }
        let key_end = skip_string(b, i)?;
        let key = i + 1..key_end - 1;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return Err(NotAnObject);
        }
        let start = skip_ws(b, i + 1);
        let end = skip_value(b, start)?;
        out.push((key, start..end));
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Ok((out, i)),
            _ => return Err(NotAnObject),
        }
    }
}

fn find<'a>(
    b: &[u8],
    m: &'a [(Range<usize>, Range<usize>)],
    key: &[u8],
) -> Option<&'a Range<usize>> {
    m.iter().find(|(k, _)| &b[k.clone()] == key).map(|(_, v)| v)
}

/// Returns the patched body, or `None` when it already says what was asked.
///
/// `model` replaces the top-level `"model"` value; `include_usage` makes
/// `stream_options.include_usage` true, creating `stream_options` if needed.
///
/// # Errors
///
/// `NotAnObject` when the body is not a JSON object.
pub fn patch_request(
    body: &[u8],
    model: Option<&str>,
    include_usage: bool,
) -> Result<Option<Vec<u8>>, NotAnObject> {
    let open = skip_ws(body, 0);
    let (top, close) = members(body, open)?;
    // (position, bytes removed, bytes inserted), applied in order of position.
    let mut edits: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    if let Some(name) = model {
        let encoded = serde_json::to_vec(name).map_err(|_| NotAnObject)?;
        match find(body, &top, b"model") {
            Some(v) if body[v.clone()] == encoded[..] => {}
            Some(v) => edits.push((v.start, v.len(), encoded)),
            None => {
                let mut ins = b"\"model\":".to_vec();
                ins.extend_from_slice(&encoded);
                ins.push(if top.is_empty() { b' ' } else { b',' });
                edits.push((open + 1, 0, ins));
            }
        }
    }
    if include_usage {
        match find(body, &top, b"stream_options") {
            Some(v) if body[v.start] == b'{' => {
                let (inner, _) = members(body, v.start)?;
                match find(body, &inner, b"include_usage") {
                    Some(u) if &body[u.clone()] == b"true" => {}
                    Some(u) => edits.push((u.start, u.len(), b"true".to_vec())),
                    None => {
                        let sep: &[u8] = if inner.is_empty() { b"" } else { b"," };
                        edits.push((
                            v.start + 1,
                            0,
                            [b"\"include_usage\":true".as_slice(), sep].concat(),
                        ));
                    }
                }
            }
            Some(v) => edits.push((v.start, v.len(), b"{\"include_usage\":true}".to_vec())),
            None => {
                let sep: &[u8] = if top.is_empty() { b"" } else { b"," };
                edits.push((
                    close,
                    0,
                    [
                        sep,
                        b"\"stream_options\":{\"include_usage\":true}".as_slice(),
                    ]
                    .concat(),
                ));
            }
        }
    }
    if edits.is_empty() {
        return Ok(None);
    }
    edits.sort_by_key(|e| e.0);
    let grow: usize = edits.iter().map(|e| e.2.len()).sum();
    let mut out = Vec::with_capacity(body.len() + grow);
    let mut at = 0;
    for (pos, removed, inserted) in edits {
        out.extend_from_slice(&body[at..pos]);
        out.extend_from_slice(&inserted);
        at = pos + removed;
    }
    out.extend_from_slice(&body[at..]);
    Ok(Some(out))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]
mod tests {
    use super::*;

    fn patched(body: &str, model: Option<&str>, usage: bool) -> serde_json::Value {
        let out = patch_request(body.as_bytes(), model, usage)
            .unwrap()
            .unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn renames_only_the_top_level_model() {
        let v = patched(
            r#"{"tools":[{"model":"a"}], "model" : "alias", "messages":[{"content":"\"model\":\"alias\""}]}"#,
            Some("real"),
            false,
        );
        assert_eq!(v["model"], "real");
        assert_eq!(v["tools"][0]["model"], "a");
        assert_eq!(v["messages"][0]["content"], "\"model\":\"alias\"");
    }

    #[test]
    fn adds_stream_options_when_absent() {
        let v = patched(r#"{"model":"m","stream":true}"#, None, true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream"], true);
    }

    #[test]
    fn fixes_stream_options_when_present() {
        for body in [
            r#"{"model":"m","stream_options":null}"#,
            r#"{"model":"m","stream_options":{}}"#,
            r#"{"model":"m","stream_options":{"include_usage":false}}"#,
            r#"{"model":"m","stream_options":{"continuous_usage_stats":true}}"#,
        ] {
            let v = patched(body, None, true);
            assert_eq!(v["stream_options"]["include_usage"], true, "{body}");
        }
    }

    #[test]
    fn leaves_a_body_that_already_says_it() {
        let body = br#"{"model":"m","stream_options":{"include_usage":true}}"#;
        assert_eq!(patch_request(body, Some("m"), true), Ok(None));
    }

    #[test]
    fn both_edits_at_once_keep_everything_else() {
        let v = patched(
            r#" {"model":"a","x":[1,{"y":"}"}],"stream":true} "#,
            Some("b\"q"),
            true,
        );
        assert_eq!(v["model"], "b\"q");
        assert_eq!(v["x"][1]["y"], "}");
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn rejects_what_is_not_an_object() {
        for body in ["[1]", "\"x\"", "{\"a\":", "", "{\"a\" 1}"] {
            assert_eq!(
                patch_request(body.as_bytes(), Some("m"), true),
                Err(NotAnObject),
                "{body}"
            );
        }
    }
}
