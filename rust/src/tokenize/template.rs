//! Chat templates rendered the way Hugging Face `transformers` renders them
//! (and so the way vLLM does): Jinja with `trim_blocks` and `lstrip_blocks`,
//! loop controls, and the globals HF adds (`raise_exception`, `strftime_now`,
//! its own `tojson`), plus Python string and dict methods through
//! minijinja-contrib's pycompat, because templates are written against
//! Python's Jinja and call `.strip()`, `.items()` and the like.

use std::sync::Arc;

use jiff::tz::TimeZone;
use jiff::Timestamp;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};

use super::json;
use super::request::ContentFormat;

/// The time source of `strftime_now`; tests pass a fixed one.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The system clock.
#[must_use]
pub fn system_clock() -> Clock {
    Arc::new(Timestamp::now)
}

const NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    format: ContentFormat,
}

impl ChatTemplate {
    /// Compiles `source`.
    ///
    /// # Errors
    /// The template's syntax error, with its line.
    pub fn new(source: &str, clock: Clock) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Adds truncate and striptags (Jinja builtins minijinja lacks) and two
        // filters Jinja does not have, which no template that works in HF calls.
        minijinja_contrib::add_to_environment(&mut env);
        env.add_filter("tojson", json::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |fmt: &str| strftime(&clock, fmt));
        let source = rewrite_generation_tags(source);
        let format = content_format(&source);
        env.add_template_owned(NAME, source)?;
        Ok(Self { env, format })
    }

    /// How this template wants list-valued message content.
    #[must_use]
    pub fn content_format(&self) -> ContentFormat {
        self.format
    }

    /// Renders with the given variables.
    ///
    /// # Errors
    /// Whatever the template raises, `raise_exception` included.
    pub fn render(&self, ctx: &Value) -> Result<String, Error> {
        self.env.get_template(NAME)?.render(ctx)
    }
}

/// HF's `raise_exception(message)`: templates call it to reject conversations
/// they cannot format (e.g. roles out of order); it becomes a render error.
fn raise_exception(message: &str) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.to_owned()))
}

/// HF's `strftime_now(format)`. HF uses the server's local time; this uses
/// UTC, which is what engines in containers run on. An engine on another time
/// zone renders another date line for part of each day, and its prefixes will
/// not match then.
fn strftime(clock: &Clock, fmt: &str) -> Result<String, Error> {
    let now = TimeZone::UTC.to_datetime(clock());
    jiff::fmt::strtime::format(fmt, now)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}")))
}

/// HF's `{% generation %}...{% endgeneration %}` marks assistant text for
/// training masks and renders its body unchanged. minijinja has no custom
/// tags, so it becomes `{% if true %}...{% endif %}`, keeping the `-`/`+`
/// whitespace markers so trimming stays the same.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start + 2..start + len];
        let word = tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        out.push_str(&rest[..start + 2]);
        match replacement {
            Some(r) => out.push_str(&tag.replacen(word, r, 1)),
            None => out.push_str(tag),
        }
        out.push_str("%}");
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// vLLM's content-format detection, approximated on the source text: a
/// template that loops over a message's `content` gets the `OpenAI` list of
/// parts, any other gets one string. (vLLM walks the Jinja AST; this looks
/// at `{% for ... in X %}` tags whose X ends in `content`.)
fn content_format(source: &str) -> ContentFormat {
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = rest[start + 2..start + len]
            .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if let Some(expr) = tag
            .strip_prefix("for ")
            .and_then(|t| t.split_once(" in "))
            .map(|(_, e)| e)
        {
            let expr = expr.split('|').next().unwrap_or_default().trim();
            let expr = expr.split(" if ").next().unwrap_or_default().trim();
            if ["content", ".content", "['content']", "[\"content\"]"]
                .iter()
                .any(|s| expr.ends_with(s))
            {
                return ContentFormat::Parts;
            }
        }
        rest = &rest[start + len + 2..];
    }
    ContentFormat::String
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a test fails by panicking")]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_ifs() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation %}b{% endgeneration -%}c{{ x }}"),
            "a{%- if true %}b{% endif -%}c{{ x }}"
        );
    }

    #[test]
    fn detects_content_loops() {
        assert_eq!(
            content_format("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(
            content_format("{% for m in messages %}{%- for p in m['content'] | selectattr('type') %}{% endfor %}{% endfor %}"),
            ContentFormat::Parts
        );
    }

    #[test]
    fn strftime_uses_the_clock() {
        let clock: Clock = Arc::new(|| Timestamp::from_second(1_721_952_000).unwrap());
        let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}", clock).unwrap();
        assert_eq!(t.render(&Value::from(())).unwrap(), "26 Jul 2024");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new(
            "{{ raise_exception('roles must alternate') }}",
            system_clock(),
        )
        .unwrap();
        let e = t.render(&Value::from(())).unwrap_err();
        assert!(e.to_string().contains("roles must alternate"), "{e}");
    }
}
