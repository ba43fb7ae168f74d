//! What one `OpenAI` JSON object (a stream chunk or a whole answer) reports.
//!
//! Only the few fields the gateway needs are decoded, borrowed from the input;
//! serde skips the rest without building values.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The most characters kept of an error that has no `message`.
const ERROR_CHARS: usize = 500;

/// The fields of a chunk or answer that the gateway reads.
#[derive(Debug, Default, Deserialize)]
pub struct Frame<'a> {
    /// The top-level `model` value as written, quotes included.
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    /// A summary of `choices`.
    #[serde(borrow, default)]
    pub choices: Option<Choices<'a>>,
    /// The `usage` object.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// The top-level `error` value (a null one counts as absent).
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

impl Frame<'_> {
    /// True for the usage-only chunk sent for `stream_options.include_usage`.
    #[must_use]
    pub fn is_usage_only(&self) -> bool {
        self.usage.is_some() && self.choices.as_ref().is_some_and(|c| c.count == 0)
    }

    /// The message of the error, if the object carries one.
    pub fn error_message(&self) -> Option<String> {
        self.error.map(error_message)
    }
}

/// Token counts of a `usage` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// Tokens generated (absent for embeddings).
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// Both together.
    #[serde(default)]
    pub total_tokens: Option<u64>,
}

/// What the `choices` array says, folded while it is parsed (no vector built).
#[derive(Debug, Default)]
pub struct Choices<'a> {
    /// Number of choices.
    pub count: usize,
    /// The last non-null `finish_reason`.
    pub finish_reason: Option<Cow<'a, str>>,
    /// True when a choice carried generated output.
    pub output: bool,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    text: Filled,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Filled,
    #[serde(default)]
    reasoning_content: Filled,
    #[serde(default)]
    reasoning: Filled,
    #[serde(default)]
    tool_calls: Filled,
}

impl Choice<'_> {
    fn output(&self) -> bool {
        let delta = self.delta.as_ref().is_some_and(|d| {
            d.content.0 || d.reasoning_content.0 || d.reasoning.0 || d.tool_calls.0
        });
        delta || self.text.0
    }
}

/// True unless the value is null or an empty string, array or object; read
/// without building it.
#[derive(Clone, Copy, Debug, Default)]
struct Filled(bool);

impl<'de> Deserialize<'de> for Filled {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;

        impl<'de> Visitor<'de> for V {
            type Value = Filled;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }

            fn visit_str<E>(self, v: &str) -> Result<Filled, E> {
                Ok(Filled(!v.is_empty()))
            }

            fn visit_unit<E>(self) -> Result<Filled, E> {
                Ok(Filled(false))
            }

            fn visit_none<E>(self) -> Result<Filled, E> {
                Ok(Filled(false))
            }

            fn visit_bool<E>(self, _: bool) -> Result<Filled, E> {
                Ok(Filled(true))
            }

            fn visit_i64<E>(self, _: i64) -> Result<Filled, E> {
                Ok(Filled(true))
            }

            fn visit_u64<E>(self, _: u64) -> Result<Filled, E> {
                Ok(Filled(true))
            }

            fn visit_f64<E>(self, _: f64) -> Result<Filled, E> {
                Ok(Filled(true))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Filled, A::Error> {
                let mut any = false;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(Filled(any))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Filled, A::Error> {
                let mut any = false;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(Filled(any))
            }
        }

        de.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Fold<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for Fold<'a> {
            type Value = Choices<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of choices")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Choices::default();
                while let Some(c) = seq.next_element::<Choice<'de>>()? {
                    out.count += 1;
                    out.output |= c.output();
                    if c.finish_reason.is_some() {
                        out.finish_reason = c.finish_reason;
                    }
                }
                Ok(out)
            }
        }

        de.deserialize_seq(Fold(std::marker::PhantomData))
    }
}

/// Parses a JSON object; None for anything else (invalid JSON, arrays, scalars).
#[must_use]
pub fn parse(payload: &[u8]) -> Option<Frame<'_>> {
    let first = payload.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'{' {
        return None;
    }
    serde_json::from_slice(payload).ok()
}

/// The message of an `error` value: `error.message` when it is an object with a
/// string message, else the value itself (a string decoded) cut to 500 characters.
#[must_use]
pub fn error_message(raw: &RawValue) -> String {
    #[derive(Deserialize)]
    struct WithMessage<'a> {
        #[serde(borrow)]
        message: Cow<'a, str>,
    }
    let s = raw.get();
    if s.starts_with('{') {
        if let Ok(m) = serde_json::from_str::<WithMessage<'_>>(s) {
            return m.message.into_owned();
        }
    }
    let text = if s.starts_with('"') {
        serde_json::from_str::<Cow<'_, str>>(s).unwrap_or(Cow::Borrowed(s))
    } else {
        Cow::Borrowed(s)
    };
    match text.char_indices().nth(ERROR_CHARS) {
        Some((cut, _)) => text[..cut].to_owned(),
        None => text.into_owned(),
    }
}

/// A model rename: the alias the client asked for replaces the served name.
#[derive(Clone, Debug)]
pub struct Rename {
    from: String,
    from_json: String,
    to_json: Vec<u8>,
}

impl Rename {
    /// Renames the model `from` into `to`.
    #[must_use]
    pub fn new(from: &str, to: &str) -> Self {
        Self {
            from: from.to_owned(),
            from_json: encode(from),
            to_json: encode(to).into_bytes(),
        }
    }

    /// The JSON string that replaces the matched value, quotes included.
    #[must_use]
    pub fn to_json(&self) -> &[u8] {
        &self.to_json
    }

    /// Where in `payload` the `model` value of `frame` (parsed from `payload`)
    /// lies, when it is the string to rename.
    #[must_use]
    pub fn span(&self, payload: &[u8], frame: &Frame<'_>) -> Option<Range<usize>> {
        let raw = frame.model?.get();
        let same = raw == self.from_json
            || (raw.starts_with('"')
                && raw.contains('\\')
                && serde_json::from_str::<Cow<'_, str>>(raw).is_ok_and(|v| v == self.from));
        if !same {
            return None;
        }
        // The raw value borrows from `payload`: its address gives its offset.
        let start = (raw.as_ptr() as usize).checked_sub(payload.as_ptr() as usize)?;
        let r = start..start + raw.len();
        (payload.get(r.clone()) == Some(raw.as_bytes())).then_some(r)
    }
}

/// Encodes a string as JSON.
fn encode(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// What a whole non-streamed answer reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// The last non-null `finish_reason` among the choices.
    pub finish_reason: Option<String>,
    /// Its token counts (all None when it has no usage).
    pub usage: Usage,
    /// The message of its error.
    pub error: Option<String>,
    /// Where the `model` value to rename lies in the body.
    pub rename: Option<Range<usize>>,
}

/// Inspects a whole answer; invalid JSON gives an empty `Answer`.
pub fn inspect(body: &[u8], rename: Option<&Rename>) -> Answer {
    let Some(frame) = parse(body) else {
        return Answer::default();
    };
    Answer {
        finish_reason: frame
            .choices
            .as_ref()
            .and_then(|c| c.finish_reason.as_deref())
            .map(str::to_owned),
        usage: frame.usage.unwrap_or_default(),
        error: frame.error_message(),
        rename: rename.and_then(|r| r.span(body, &frame)),
    }
}

/// Returns `body` with `range` replaced by `with`.
#[must_use]
pub fn splice(body: &[u8], range: &Range<usize>, with: &[u8]) -> Vec<u8> {
    let (Some(head), Some(tail)) = (body.get(..range.start), body.get(range.end..)) else {
        return body.to_vec();
    };
    [head, with, tail].concat()
}
