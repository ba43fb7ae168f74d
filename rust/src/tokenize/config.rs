//! Reads the parts of a Hugging Face `tokenizer_config.json` that change the
//! prompt: the chat template, the BOS/EOS strings and `add_bos_token`.

use serde::Deserialize;

/// What `tokenizer_config.json` says about rendering and special tokens.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TokenizerConfig {
    /// The template named `default` (or the only string given), if any.
    pub chat_template: Option<String>,
    /// Text of the BOS token, as the template sees it in `bos_token`.
    pub bos_token: Option<String>,
    /// Text of the EOS token, as the template sees it in `eos_token`.
    pub eos_token: Option<String>,
    /// `add_bos_token` when the file sets it; `None` leaves the post-processor alone.
    pub add_bos_token: Option<bool>,
}

/// A special token is written either as its text or as a serialized
/// `AddedToken` object (`{"content": "<s>", "lstrip": false, ...}`).
#[derive(Deserialize)]
#[serde(untagged)]
enum TokenText {
    Plain(String),
    Added { content: String },
}

/// One entry of the list form of `chat_template` (`[{name, template}]`), which
/// models with separate tool-use or RAG templates ship.
#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

/// The raw file; every field optional because real configs omit any of them.
#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    chat_template: Option<TemplateField>,
    #[serde(default)]
    bos_token: Option<TokenText>,
    #[serde(default)]
    eos_token: Option<TokenText>,
    #[serde(default)]
    add_bos_token: Option<bool>,
}

impl TokenText {
    fn into_text(self) -> String {
        match self {
            Self::Plain(s) | Self::Added { content: s } => s,
        }
    }
}

impl TokenizerConfig {
    /// Parses the file's bytes.
    ///
    /// # Errors
    /// Not JSON, or a field of the wrong shape: a short phrase for the caller
    /// to wrap with the file name.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        // `null` tokens ("bos_token": null) are common; serde maps them to None.
        let raw: RawConfig = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let chat_template = match raw.chat_template {
            None => None,
            Some(TemplateField::One(t)) => Some(t),
            // Hugging Face uses the entry named "default" when the caller names
            // none, which is what vLLM does for a request without chat_template.
            Some(TemplateField::Named(list)) => list
                .into_iter()
                .find(|t| t.name == "default")
                .map(|t| t.template),
        };
        Ok(Self {
            chat_template,
            bos_token: raw.bos_token.map(TokenText::into_text),
            eos_token: raw.eos_token.map(TokenText::into_text),
            add_bos_token: raw.add_bos_token,
        })
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a test fails by panicking")]
mod tests {
    use super::TokenizerConfig;

    #[test]
    fn string_template_and_plain_tokens() {
        let c = TokenizerConfig::parse(
            br#"{"chat_template": "{{ x }}", "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false}"#,
        )
        .unwrap();
        assert_eq!(c.chat_template.as_deref(), Some("{{ x }}"));
        assert_eq!(c.bos_token.as_deref(), Some("<s>"));
        assert_eq!(c.eos_token.as_deref(), Some("</s>"));
        assert_eq!(c.add_bos_token, Some(false));
    }

    #[test]
    fn named_templates_and_added_token_objects() {
        let c = TokenizerConfig::parse(
            br#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
                "bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"},
                "eos_token": null}"#,
        )
        .unwrap();
        assert_eq!(c.chat_template.as_deref(), Some("D"));
        assert_eq!(c.bos_token.as_deref(), Some("<s>"));
        assert_eq!(c.eos_token, None);
        assert_eq!(c.add_bos_token, None);
    }

    #[test]
    fn list_without_default_has_no_template() {
        let c = TokenizerConfig::parse(br#"{"chat_template": [{"name": "rag", "template": "R"}]}"#)
            .unwrap();
        assert_eq!(c.chat_template, None);
    }

    #[test]
    fn empty_object_is_fine() {
        assert_eq!(
            TokenizerConfig::parse(b"{}").unwrap(),
            TokenizerConfig::default()
        );
    }
}
