//! Usage rows as a gateway sends them: each finished request one JSON array, in the
//! field order of `llmgw.protocol.wire.UsageRow`, appended to one buffer as the request ends.
//!
//! A row written here decodes to the same `UsageRow` as msgspec's encoding of that
//! Struct (`tests/unit/test_usage_rows.py` holds the two side by side): strings are
//! JSON-escaped by `serde_json`, floats written in their shortest round-trip form
//! (non-finite ones as `null`, as msgspec does), the route is the router's JSON as is,
//! and the two body fields are `null` (a row with kept bodies is encoded in Python and
//! pushed whole).

/// The fields of one finished request, borrowed from the caller.
pub struct Row<'a> {
    pub request_id: &'a str,
    pub model: &'a str,
    pub upstream_model: &'a str,
    pub replica: Option<&'a str>,
    pub status: &'a str,
    pub http_status: i64,
    pub stream: bool,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub usage_estimated: bool,
    /// Seconds; written as milliseconds to the microsecond.
    pub ttft_s: Option<f64>,
    /// Seconds; written as milliseconds to the microsecond.
    pub duration_s: f64,
    pub finish_reason: Option<&'a str>,
    pub retries: i64,
    pub started_at: f64,
    /// The router's decision, already JSON.
    pub route: Option<&'a str>,
    pub key_id: Option<&'a str>,
    pub user_id: Option<&'a str>,
    pub project_id: Option<&'a str>,
    pub team_id: Option<&'a str>,
    pub org_id: Option<&'a str>,
}

/// Seconds as milliseconds to the microsecond, as the gateway's Python rounds them
/// (`int(s * 1_000_000 + 0.5) / 1000`).
#[must_use]
pub fn millis(seconds: f64) -> f64 {
    (seconds * 1_000_000.0 + 0.5).trunc() / 1000.0
}

/// Finished requests' rows, oldest first, each followed by a comma in one buffer.
#[derive(Default)]
pub struct Rows {
    buf: Vec<u8>,
    /// Where each row ends (its comma excluded), as offsets into `buf`.
    ends: std::collections::VecDeque<usize>,
}

impl Rows {
    #[must_use]
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes held (rows and their commas).
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// Appends one row written from its fields.
    pub fn add(&mut self, r: &Row<'_>) {
        use Field::{Bool, Float, Int, Json, Str};
        let fields = [
            Str(Some(r.request_id)),
            Str(Some(r.model)),
            Str(Some(r.upstream_model)),
            Str(r.replica),
            Str(Some(r.status)),
            Int(r.http_status),
            Bool(r.stream),
            Int(r.prompt_tokens),
            Int(r.completion_tokens),
            Bool(r.usage_estimated),
            Float(r.ttft_s.map(millis)),
            Float(Some(millis(r.duration_s))),
            Str(r.finish_reason),
            Int(r.retries),
            Float(Some(r.started_at)),
            Json(r.route),
            Str(r.key_id),
            Str(r.user_id),
            Str(r.project_id),
            Str(r.team_id),
            Str(r.org_id),
            Json(None), // request_body
            Json(None), // response_body
        ];
        let b = &mut self.buf;
        // About what a row takes, so that writing it seldom grows the buffer piece by piece.
        b.reserve(256);
        b.push(b'[');
        for (i, f) in fields.iter().enumerate() {
            if i > 0 {
                b.push(b',');
            }
            f.write(b);
        }
        b.push(b']');
        self.ends.push_back(b.len());
        b.push(b',');
    }

    /// Appends one record encoded elsewhere (one JSON value: a row with kept bodies, or an
    /// object where the gateway sends objects).
    pub fn push(&mut self, row: &[u8]) {
        self.buf.extend_from_slice(row);
        self.ends.push_back(self.buf.len());
        self.buf.push(b',');
    }

    /// Puts `row` (one JSON value) in the place of the first row; nothing when there is none.
    pub fn replace_first(&mut self, row: &[u8]) {
        let Some(&end) = self.ends.front() else {
            return;
        };
        self.buf.splice(..end, row.iter().copied());
        for e in &mut self.ends {
            *e = *e - end + row.len();
        }
    }

    /// The first `n` rows (at most all), comma-separated, without brackets.
    #[must_use]
    pub fn head(&self, n: usize) -> &[u8] {
        match n.min(self.ends.len()) {
            0 => &[],
            n => &self.buf[..self.ends[n - 1]],
        }
    }

    /// Drops the first `n` rows (at most all).
    pub fn drop_head(&mut self, n: usize) {
        let n = n.min(self.ends.len());
        if n == 0 {
            return;
        }
        if n == self.ends.len() {
            self.buf.clear();
            self.ends.clear();
            return;
        }
        let cut = self.ends[n - 1] + 1;
        self.buf.drain(..cut);
        self.ends.drain(..n);
        for e in &mut self.ends {
            *e -= cut;
        }
    }
}

/// `s` as a JSON string. Ids, model names and statuses need no escaping, and are copied
/// between quotes as they are; the rest goes through `serde_json`, whose rule (escape `"`,
/// `\` and control characters, keep other UTF-8 as it is) the plain case follows, so both
/// write the same bytes as msgspec.
fn write_str(b: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if bytes.iter().all(|&c| c >= 0x20 && c != b'"' && c != b'\\') {
        b.reserve(bytes.len() + 2);
        b.push(b'"');
        b.extend_from_slice(bytes);
        b.push(b'"');
    } else {
        // Writing a str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *b, s);
    }
}

/// One field of a row, as JSON.
enum Field<'a> {
    Str(Option<&'a str>),
    Int(i64),
    Bool(bool),
    Float(Option<f64>),
    /// JSON already (the router's decision), or null.
    Json(Option<&'a str>),
}

impl Field<'_> {
    fn write(&self, b: &mut Vec<u8>) {
        match *self {
            Field::Str(Some(s)) => write_str(b, s),
            Field::Int(v) => b.extend_from_slice(itoa::Buffer::new().format(v).as_bytes()),
            Field::Bool(v) => b.extend_from_slice(if v { b"true" } else { b"false" }),
            // The shortest form that reads back as the same f64 (`1500.0`, `1e21`); msgspec
            // writes non-finite floats as null too.
            Field::Float(Some(v)) if v.is_finite() => {
                b.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
            }
            Field::Json(Some(raw)) => b.extend_from_slice(raw.as_bytes()),
            Field::Str(None) | Field::Float(_) | Field::Json(None) => b.extend_from_slice(b"null"),
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]
mod tests {
    use super::*;

    fn row(id: &str) -> Row<'_> {
        Row {
            request_id: id,
            model: "m\"odel",
            upstream_model: "up",
            replica: Some("r1"),
            status: "ok",
            http_status: 200,
            stream: true,
            prompt_tokens: 12,
            completion_tokens: 3,
            usage_estimated: false,
            ttft_s: Some(0.000_812_4),
            duration_s: 1.5,
            finish_reason: None,
            retries: 1,
            started_at: 1_764_000_000.123_456,
            route: Some(r#"{"policy":"kv"}"#),
            key_id: Some("key_1"),
            user_id: None,
            project_id: Some("proj"),
            team_id: Some("team"),
            org_id: Some("org"),
        }
    }

    #[test]
    fn a_row_is_the_fields_in_order() {
        let mut rows = Rows::default();
        rows.add(&row("a"));
        let v: serde_json::Value = serde_json::from_slice(rows.head(1)).unwrap();
        let expected = serde_json::json!([
            "a", "m\"odel", "up", "r1", "ok", 200, true, 12, 3, false, 0.812, 1500.0, null, 1,
            1_764_000_000.123_456, {"policy": "kv"}, "key_1", null, "proj", "team", "org", null, null
        ]);
        assert_eq!(v, expected);
    }

    #[test]
    fn head_and_drop_head_keep_rows_whole() {
        let mut rows = Rows::default();
        for id in ["a", "b", "c"] {
            rows.add(&row(id));
        }
        rows.push(b"[\"pushed\"]");
        assert_eq!(rows.len(), 4);
        let two: serde_json::Value =
            serde_json::from_slice(&[b"[", rows.head(2), b"]"].concat()).unwrap();
        assert_eq!(two[1][0], "b");
        rows.drop_head(2);
        assert_eq!(rows.len(), 2);
        rows.replace_first(b"[\"c2\",1]");
        let rest: serde_json::Value =
            serde_json::from_slice(&[b"[", rows.head(9), b"]"].concat()).unwrap();
        assert_eq!(rest[0][0], "c2");
        assert_eq!(rest[1][0], "pushed");
        rows.drop_head(9);
        assert!(rows.is_empty() && rows.bytes() == 0 && rows.head(1).is_empty());
    }

    #[test]
    fn millis_round_half_up_to_the_microsecond() {
        assert!((millis(0.000_812_4) - 0.812).abs() < 1e-12);
        assert!((millis(0.001_000_6) - 1.001).abs() < 1e-12);
        assert!((millis(2.0) - 2000.0).abs() < 1e-12);
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        for s in ["plain-id_1", "", "q\"uote", "back\\slash", "tab\there", "nl\n", "\u{1}", "caf\u{e9} \u{1f600}", "\u{7f}"] {
            let mut b = Vec::new();
            write_str(&mut b, s);
            assert_eq!(b, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn non_finite_floats_are_null() {
        let mut b = Vec::new();
        Field::Float(Some(f64::NAN)).write(&mut b);
        Field::Float(Some(1e21)).write(&mut b);
        assert_eq!(b, b"null1e21");
    }
}
