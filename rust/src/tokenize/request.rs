//! Reads the fields of an `OpenAI` request body that decide its prompt, the way
//! vLLM's `OpenAI` server reads them, into values a chat template can use.
//!
//! Only the prompt-shaping fields are deserialized; serde skips the rest of
//! the body without building it.

use std::fmt;

use minijinja::value::{Value, ValueKind};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// How a template expects list-valued `content`; vLLM detects this per template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// Text parts joined with "\n" into one string (vLLM's "string" format).
    String,
    /// A list of `{"type": "text", "text": ...}` parts (vLLM's "openai" format).
    Parts,
}

/// A chat request reduced to what the template and the encoder need.
#[derive(Debug)]
pub struct Chat {
    /// Messages as template values, content normalised as vLLM does.
    pub messages: Vec<Value>,
    /// The request's `add_generation_prompt`; vLLM's default is true.
    pub add_generation_prompt: bool,
    /// vLLM's `continue_final_message`: the prompt ends inside the last message.
    pub continue_final_message: bool,
    /// vLLM's chat default is false: the template already wrote BOS as text.
    pub add_special_tokens: bool,
    /// `chat_template_kwargs`, passed to the template as extra variables.
    pub kwargs: Vec<(String, Value)>,
}

/// What a completions request asks to run.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// Text, encoded with special tokens unless the request turns them off.
    Text {
        text: String,
        add_special_tokens: bool,
    },
    /// Token ids the engine takes as they are.
    Ids(Vec<u32>),
}

/// A JSON value read straight into a template value. Object keys keep their
/// order, as Python dicts do, because `tojson` output depends on it.
struct Json(Value);

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor).map(Json)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Json(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::from(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Ok(Value::from_pairs(Pairs::visit(map)?))
    }
}

/// A JSON object as ordered (key, value) pairs, for the objects this module
/// rewrites before handing them to the template.
struct Pairs(Vec<(String, Value)>);

impl Pairs {
    fn visit<'de, A: MapAccess<'de>>(mut map: A) -> Result<Vec<(String, Value)>, A::Error> {
        let mut pairs = Vec::new();
        while let Some((k, Json(v))) = map.next_entry::<String, Json>()? {
            pairs.push((k, v));
        }
        Ok(pairs)
    }
}

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Pairs, A::Error> {
                Pairs::visit(map).map(Pairs)
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(serde::Deserialize)]
struct ChatBody<'a> {
    messages: Vec<Pairs>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: bool,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    chat_template_kwargs: Option<Pairs>,
    #[serde(default, borrow)]
    chat_template: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(serde::Deserialize)]
struct CompletionBody {
    prompt: Prompt,
    #[serde(default)]
    add_special_tokens: Option<bool>,
}

/// Reads a chat completions body.
///
/// Fails (and the caller routes without tokens) when the body is not a chat
/// request, brings its own `chat_template`, or carries `tools`: vLLM renders
/// tools from its own pydantic dump of the request, whose keys and defaults
/// differ from the raw JSON, so any rendering here would differ from the
/// engine's from the tools block on, and a wrong prefix is worse than none.
pub fn chat(body: &[u8], format: ContentFormat) -> Result<Chat, String> {
    let b: ChatBody<'_> =
        serde_json::from_slice(body).map_err(|e| format!("read chat request: {e}"))?;
    if let Some(tools) = b.tools {
        if !matches!(tools.get().trim(), "null" | "[]") {
            return Err("requests with tools are not rendered".to_owned());
        }
    }
    // A request may bring its own template (vLLM allows it when configured);
    // running a client's template here is not worth the risk for a routing hint.
    if b.chat_template.is_some_and(|t| t.get() != "null") {
        return Err("requests with their own chat_template are not rendered".to_owned());
    }
    Ok(Chat {
        messages: b
            .messages
            .into_iter()
            .map(|m| message(m.0, format))
            .collect(),
        add_generation_prompt: b.add_generation_prompt.unwrap_or(true),
        continue_final_message: b.continue_final_message,
        add_special_tokens: b.add_special_tokens.unwrap_or(false),
        kwargs: b.chat_template_kwargs.map(|p| p.0).unwrap_or_default(),
    })
}

/// Reads a completions body. A batch of several prompts has no single prefix
/// to route on, so it is an error.
pub fn completion(body: &[u8]) -> Result<Completion, String> {
    let b: CompletionBody =
        serde_json::from_slice(body).map_err(|e| format!("read completions request: {e}"))?;
    let add_special_tokens = b.add_special_tokens.unwrap_or(true);
    let text = |text| {
        Ok(Completion::Text {
            text,
            add_special_tokens,
        })
    };
    match b.prompt {
        Prompt::Text(t) => text(t),
        Prompt::Ids(ids) => Ok(Completion::Ids(ids)),
        Prompt::Texts(mut ts) if ts.len() == 1 => text(ts.swap_remove(0)),
        Prompt::IdLists(mut ids) if ids.len() == 1 => Ok(Completion::Ids(ids.swap_remove(0))),
        Prompt::Texts(_) | Prompt::IdLists(_) => {
            Err("a batch of prompts has no single prefix".to_owned())
        }
    }
}

/// Normalises one message as vLLM does before rendering.
fn message(pairs: Vec<(String, Value)>, format: ContentFormat) -> Value {
    Value::from_pairs(pairs.into_iter().map(|(k, v)| {
        let v = match k.as_str() {
            "content" => content(&v, format),
            "tool_calls" => tool_calls(&v),
            _ => v,
        };
        (k, v)
    }))
}

/// List content keeps only its text parts. Images, audio and files become
/// placeholder tokens inside the engine, which this module cannot reproduce;
/// the text still gives the right prefix up to the first such part in most
/// templates, and an exact match is not promised for multimodal requests.
fn content(v: &Value, format: ContentFormat) -> Value {
    if v.kind() != ValueKind::Seq {
        return v.clone();
    }
    let Ok(parts) = v.try_iter() else {
        return v.clone();
    };
    let texts = parts.filter_map(|p| {
        let is_text = p.get_attr("type").ok().as_ref().and_then(Value::as_str) == Some("text");
        let text = p.get_attr("text").ok()?;
        (is_text && text.as_str().is_some()).then_some(text)
    });
    match format {
        ContentFormat::String => {
            let joined: Vec<String> = texts
                .map(|t| t.as_str().unwrap_or_default().to_owned())
                .collect();
            Value::from(joined.join("\n"))
        }
        ContentFormat::Parts => Value::from(
            texts
                .map(|t| Value::from_pairs([("type", Value::from("text")), ("text", t)]))
                .collect::<Vec<_>>(),
        ),
    }
}

/// vLLM parses each tool call's `function.arguments` from its JSON string into
/// an object before rendering, so templates print it with `tojson`.
fn tool_calls(v: &Value) -> Value {
    let Ok(calls) = v.try_iter() else {
        return v.clone();
    };
    Value::from(
        calls
            .map(|call| rewrite(&call, "function", |f| rewrite(f, "arguments", parse_json)))
            .collect::<Vec<_>>(),
    )
}

/// Rebuilds a map with `key`'s value passed through `f`, keeping key order.
fn rewrite(map: &Value, key: &str, f: impl Fn(&Value) -> Value) -> Value {
    if map.kind() != ValueKind::Map {
        return map.clone();
    }
    let Ok(keys) = map.try_iter() else {
        return map.clone();
    };
    Value::from_pairs(keys.map(|k| {
        let v = map.get_item(&k).unwrap_or_default();
        let v = if k.as_str() == Some(key) { f(&v) } else { v };
        (k, v)
    }))
}

/// Parses a JSON string into a value; anything else (or bad JSON, which vLLM
/// would reject) stays as it is.
fn parse_json(v: &Value) -> Value {
    v.as_str()
        .and_then(|s| serde_json::from_str::<Json>(s).ok())
        .map_or_else(|| v.clone(), |j| j.0)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a test fails by panicking")]
mod tests {
    use super::*;

    /// Follows a dotted path of keys and indexes.
    fn path(v: &Value, p: &str) -> Value {
        p.split('.')
            .fold(v.clone(), |v, k| match k.parse::<usize>() {
                Ok(i) => v.get_item(&Value::from(i)).unwrap(),
                Err(_) => v.get_attr(k).unwrap(),
            })
    }

    #[test]
    fn completion_prompt_shapes() {
        let t = |add| Completion::Text {
            text: "hi".into(),
            add_special_tokens: add,
        };
        assert_eq!(completion(br#"{"prompt": "hi"}"#), Ok(t(true)));
        assert_eq!(
            completion(br#"{"prompt": ["hi"], "add_special_tokens": false}"#),
            Ok(t(false))
        );
        assert_eq!(
            completion(br#"{"prompt": [1, 2]}"#),
            Ok(Completion::Ids(vec![1, 2]))
        );
        assert_eq!(
            completion(br#"{"prompt": [[3]]}"#),
            Ok(Completion::Ids(vec![3]))
        );
        assert!(completion(br#"{"prompt": ["a", "b"]}"#).is_err());
        assert!(completion(br#"{"messages": []}"#).is_err());
    }

    #[test]
    fn list_content_and_tool_arguments() {
        let body = br#"{"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}}]}
        ], "tools": null}"#;
        let c = chat(body, ContentFormat::String).unwrap();
        assert_eq!(
            c.messages[0].get_attr("content").unwrap().as_str(),
            Some("a\nb")
        );
        let args = path(&c.messages[1], "tool_calls.0.function.arguments");
        // Printed as Python prints a dict, in the request's key order.
        assert_eq!(args.to_string(), "{'z': 1, 'a': 2}");
        let p = chat(body, ContentFormat::Parts).unwrap();
        assert_eq!(path(&p.messages[0], "content.1.text").as_str(), Some("b"));
        assert!(c.add_generation_prompt && !c.add_special_tokens);
    }

    #[test]
    fn tools_refuse() {
        assert!(chat(
            br#"{"messages": [], "tools": [{"type": "function"}]}"#,
            ContentFormat::String
        )
        .is_err());
        assert!(chat(br#"{"messages": [], "tools": []}"#, ContentFormat::String).is_ok());
        assert!(chat(
            br#"{"messages": [], "chat_template": "x"}"#,
            ContentFormat::String
        )
        .is_err());
    }
}
