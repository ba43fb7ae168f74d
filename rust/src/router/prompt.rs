//! The prompt text that approximate routing matches, read straight from the
//! request body so that Python never builds message objects.
//!
//! A chat is rendered whole, not as its last message: turn n+1 of a
//! conversation then starts with the rendering of turn n, which is exactly the
//! prefix the engine has cached. Each message becomes `<|role|>` + its text
//! parts + `\n`; that marker cannot be confused with a role change inside
//! ordinary content, and the result is stable across clients that send content
//! as a string or as a list of text parts.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// A JSON string, borrowed from the body unless it had escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// One part of a list content; only text parts carry prompt text.
#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow)]
    text: Option<Text<'a>>,
}

/// A message's content: a string, a list of parts, or null (tool calls).
enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
    None,
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a list of parts or null")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Content::None)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Content::None)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element::<Part<'a>>()? {
                    parts.push(p);
                }
                Ok(Content::Parts(parts))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Option<Text<'a>>,
    #[serde(borrow)]
    content: Option<Content<'a>>,
}

#[derive(Deserialize)]
struct ChatBody<'a> {
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
}

/// One item of a completions `prompt` list: text, or a token id.
enum Item<'a> {
    Text(Cow<'a, str>),
    Token(u64),
    Tokens(Vec<u64>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Item<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Item<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a token id or a list of token ids")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Item::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Item::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Item::Token(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut ids = Vec::new();
                while let Some(v) = seq.next_element::<u64>()? {
                    ids.push(v);
                }
                Ok(Item::Tokens(ids))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A completions `prompt`: one string, or a list of strings or token ids.
enum Prompt<'a> {
    One(Cow<'a, str>),
    Many(Vec<Item<'a>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Prompt<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Prompt<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Prompt::One(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Prompt::One(Cow::Owned(s.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element::<Item<'a>>()? {
                    items.push(v);
                }
                Ok(Prompt::Many(items))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct CompletionBody<'a> {
    #[serde(borrow)]
    prompt: Option<Prompt<'a>>,
}

/// Renders a chat body's `messages` into one canonical text; None when the body
/// is not a JSON object with a `messages` list.
#[must_use]
pub fn render_chat(body: &[u8]) -> Option<String> {
    let chat: ChatBody<'_> = serde_json::from_slice(body).ok()?;
    let mut out = String::new();
    for m in &chat.messages {
        out.push_str("<|");
        out.push_str(m.role.as_ref().map_or("", |r| &r.0));
        out.push_str("|>");
        match &m.content {
            Some(Content::Text(t)) => out.push_str(t),
            Some(Content::Parts(parts)) => {
                for t in parts.iter().filter_map(|p| p.text.as_ref()) {
                    out.push_str(&t.0);
                }
            }
            Some(Content::None) | None => {}
        }
        out.push('\n');
    }
    Some(out)
}

/// A completions body's `prompt`: the string, or a batch's items joined by
/// newlines (token ids written in decimal), so that the first item is a prefix
/// of the result. None when there is no usable prompt.
#[must_use]
pub fn render_completion(body: &[u8]) -> Option<Cow<'_, str>> {
    let parsed: CompletionBody<'_> = serde_json::from_slice(body).ok()?;
    match parsed.prompt? {
        Prompt::One(s) => Some(s),
        Prompt::Many(items) => {
            let mut out = String::new();
            for (i, item) in items.iter().enumerate() {
                // A flat list of ids is one prompt; anything else is a batch.
                if i > 0 && !matches!(item, Item::Token(_)) {
                    out.push('\n');
                }
                match item {
                    Item::Text(t) => out.push_str(t),
                    Item::Token(v) => push_ids(&mut out, std::slice::from_ref(v)),
                    Item::Tokens(ids) => push_ids(&mut out, ids),
                }
            }
            Some(Cow::Owned(out))
        }
    }
}

fn push_ids(out: &mut String, ids: &[u64]) {
    use std::fmt::Write as _;
    for id in ids {
        // Writing to a String cannot fail.
        let _ = write!(out, "{id} ");
    }
}

/// The prompt text of a chat (`chat`) or completions body.
#[must_use]
pub fn render(body: &[u8], chat: bool) -> Option<Cow<'_, str>> {
    if chat {
        render_chat(body).map(Cow::Owned)
    } else {
        render_completion(body)
    }
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "a test fails loudly: unwrap is its assertion")]
    use super::*;

    #[test]
    fn chat_renders_every_message_in_either_content_shape() {
        let body = br#"{"model":"m","stream":true,"messages":[
            {"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there \"you\""}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}
        ],"tools":[{"type":"function"}]}"#;
        assert_eq!(
            render_chat(body).unwrap(),
            "<|system|>Be brief.\n<|user|>Hi there \"you\"\n<|assistant|>\n"
        );
    }

    #[test]
    fn next_turn_extends_the_previous_rendering() {
        let one = br#"{"messages":[{"role":"user","content":"a"}]}"#;
        let two = br#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
        assert!(render_chat(two)
            .unwrap()
            .starts_with(&render_chat(one).unwrap()));
    }

    #[test]
    fn bad_chat_bodies_give_none() {
        assert_eq!(render_chat(b"not json"), None);
        assert_eq!(render_chat(br#"{"prompt":"x"}"#), None);
        assert_eq!(
            render_chat(br#"{"messages":[{"role":"user","content":5}]}"#),
            None
        );
    }

    #[test]
    fn completion_prompts() {
        let one = br#"{"prompt":"hello","max_tokens":3}"#;
        assert!(matches!(
            render_completion(one),
            Some(Cow::Borrowed("hello"))
        ));
        let many = br#"{"prompt":["a","b"]}"#;
        assert_eq!(render_completion(many).unwrap(), "a\nb");
        let ids = br#"{"prompt":[1,2,3]}"#;
        assert_eq!(render_completion(ids).unwrap(), "1 2 3 ");
        let batch = br#"{"prompt":[[1,2],[3]]}"#;
        assert_eq!(render_completion(batch).unwrap(), "1 2 \n3 ");
        assert_eq!(render_completion(br#"{"model":"m"}"#), None);
        assert_eq!(render(br#"{"prompt":"p"}"#, false).unwrap(), "p");
    }
}
