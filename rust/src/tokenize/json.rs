//! The `tojson` filter as Hugging Face defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`.
//!
//! minijinja's own `tojson` writes compact JSON and escapes `<`, `>`, `&` and
//! `'` for HTML; Python writes `{"a": 1, "b": 2}` and escapes nothing of the
//! kind. Tool-call arguments go through this filter, so every byte counts.

use std::io::{self, Write};

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter, Serializer};

/// Writes JSON with Python's separators, indentation and optional ASCII escaping.
struct PyFormatter {
    item_sep: Vec<u8>,
    key_sep: Vec<u8>,
    indent: Option<Vec<u8>>,
    ensure_ascii: bool,
    level: usize,
    /// Whether the innermost open container got a value; Python prints empty
    /// containers as `[]` and `{}` even when indenting.
    has_value: bool,
}

impl PyFormatter {
    fn newline<W: ?Sized + Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.level {
                w.write_all(indent)?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + Write>(&mut self, w: &mut W, b: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(b)
    }

    fn close<W: ?Sized + Write>(&mut self, w: &mut W, b: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        // The enclosing container necessarily holds this one.
        self.has_value = true;
        w.write_all(b)
    }

    fn item<W: ?Sized + Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(&self.item_sep)?;
        }
        self.newline(w)
    }
}

impl Formatter for PyFormatter {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(&self.key_sep)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, s: &str) -> io::Result<()> {
        if !self.ensure_ascii || s.is_ascii() {
            return w.write_all(s.as_bytes());
        }
        let mut units = [0u16; 2];
        for c in s.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
    fn write_char_escape<W: ?Sized + Write>(&mut self, w: &mut W, e: CharEscape) -> io::Result<()> {
        // Same escapes as serde_json's default; spelled out because a
        // Formatter that overrides nothing else still has to say it.
        let s: &[u8] = match e {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            CharEscape::Solidus => b"\\/",
            CharEscape::Backspace => b"\\b",
            CharEscape::FormFeed => b"\\f",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::AsciiControl(b) => return write!(w, "\\u{b:04x}"),
        };
        w.write_all(s)
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// Reads `indent`: an int gives that many spaces, a string is used as is,
/// none means one line (as in Python).
fn indent_of(v: Option<Value>) -> Result<Option<Vec<u8>>, Error> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() || v.is_undefined() => Ok(None),
        Some(v) => {
            if let Some(s) = v.as_str() {
                return Ok(Some(s.as_bytes().to_vec()));
            }
            let n =
                usize::try_from(v).map_err(|_| bad("tojson: indent must be an int or a string"))?;
            Ok(Some(vec![b' '; n]))
        }
    }
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
///
/// # Errors
/// Bad arguments, or a value JSON cannot hold.
#[expect(
    clippy::needless_pass_by_value,
    reason = "minijinja hands filters their keyword arguments by value"
)]
pub fn tojson(value: &Value, ensure_ascii: Option<bool>, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii = match ensure_ascii {
        Some(b) => b,
        None => kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    let indent = indent_of(kwargs.get::<Option<Value>>("indent")?)?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    // Python's defaults: no trailing space after "," when indenting, since the
    // newline separates items.
    let (item_sep, key_sep) = match separators.filter(|s| !s.is_none()) {
        Some(s) => {
            let part = |i: usize| -> Result<Vec<u8>, Error> {
                let v = s.get_item(&Value::from(i))?;
                v.as_str()
                    .map(|x| x.as_bytes().to_vec())
                    .ok_or_else(|| bad("tojson: separators must be two strings"))
            };
            (part(0)?, part(1)?)
        }
        None if indent.is_some() => (b",".to_vec(), b": ".to_vec()),
        None => (b", ".to_vec(), b": ".to_vec()),
    };
    let fmt = PyFormatter {
        item_sep,
        key_sep,
        indent,
        ensure_ascii,
        level: 0,
        has_value: false,
    };
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, fmt);
    let written = if sort_keys {
        // serde_json's own map is a BTreeMap here, which sorts by key as
        // Python's sort_keys does for string keys.
        serde_json::to_value(value).and_then(|v| v.serialize(&mut ser))
    } else {
        value.serialize(&mut ser)
    };
    written.map_err(|e| bad(format!("tojson: {e}")))?;
    String::from_utf8(out)
        .map(Value::from)
        .map_err(|_| bad("tojson: output is not UTF-8"))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a test fails by panicking")]
mod tests {
    use minijinja::{context, Environment};

    fn render(src: &str, v: &serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(
            src,
            context! { v => minijinja::Value::from(minijinja::value::Serde(v)) },
        )
        .unwrap()
    }

    #[test]
    fn python_separators_and_no_html_escaping() {
        let v = serde_json::json!({"a": [1, "x<y>&'é"], "b": {}, "c": [], "d": null, "e": true});
        assert_eq!(
            render("{{ v|tojson }}", &v),
            r#"{"a": [1, "x<y>&'é"], "b": {}, "c": [], "d": null, "e": true}"#
        );
    }

    #[test]
    fn indent_like_python() {
        let v = serde_json::json!({"a": [1, 2], "b": {}});
        assert_eq!(
            render("{{ v|tojson(indent=2) }}", &v),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}"
        );
    }

    #[test]
    fn ascii_sorting_and_separators() {
        let v = serde_json::json!({"b": "é😀", "a": 1});
        assert_eq!(
            render(
                "{{ v|tojson(ensure_ascii=true, sort_keys=true, separators=[',', ':']) }}",
                &v
            ),
            r#"{"a":1,"b":"\u00e9\ud83d\ude00"}"#
        );
        assert_eq!(render("{{ '\\u001b'|tojson }}", &v), r#""\u001b""#);
    }
}
