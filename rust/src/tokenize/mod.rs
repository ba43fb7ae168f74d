//! Turns an `OpenAI` request into the token ids vLLM will see, so that routing
//! can look up which replica's KV cache holds the prompt's prefix.
//!
//! Chat requests are rendered with the model's chat template and encoded
//! without special tokens (the template writes BOS as text, and vLLM's chat
//! path encodes with `add_special_tokens=False`); completions prompts are
//! encoded with them, as vLLM's completions path does by default.
//!
//! Multi-turn prefix caching relies on a conversation's tokens being a prefix
//! of the tokens of the same conversation with one more turn. That holds for
//! templates that end every turn in a special token and leave past turns as
//! they were (the tests check it for a Llama-3-style and a `ChatML` template).
//! It does not hold across turns for templates that rewrite history, such as
//! Qwen3's, which drops the reasoning of earlier assistant turns, nor across a
//! day boundary for templates that print today's date: the engine's cache
//! misses there too, so routing on these ids is still right.

mod config;
mod json;
mod request;
mod template;

use std::fmt;
use std::path::{Path, PathBuf};

use minijinja::value::Value;
use tokenizers::Tokenizer;

pub use config::TokenizerConfig;
pub use request::ContentFormat;
pub use template::{system_clock, ChatTemplate, Clock};

/// Anything that can turn a request body into its prompt's token ids.
pub trait PromptTokenizer: Send + Sync {
    /// The ids the engine will see for this body, or `None` when they cannot
    /// be known (bad body, no template, a request shape not reproduced); the
    /// caller then routes without them.
    fn tokens(&self, body: &[u8], chat: bool) -> Option<Vec<u32>>;
}

/// Why loading or tokenizing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The model directory or its files; a sentence for the operator.
    Load(String),
    /// The body is not a request this module renders.
    Request(String),
    /// The chat template failed, or the model has none.
    Template(String),
    /// The tokenizer failed.
    Encode(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Load(m) | Self::Request(m) | Self::Template(m) | Self::Encode(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for Error {}

/// A model's tokenizer and chat template.
pub struct ModelTokenizer {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// Kept to rebuild the template with another clock.
    template_source: Option<String>,
    config: TokenizerConfig,
    bos_id: Option<u32>,
}

fn read(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Load(format!(
            "Could not read {}: {e}. Check the file's permissions.",
            path.display()
        ))),
    }
}

fn load_tokenizer(path: &Path, bytes: &[u8]) -> Result<Tokenizer, Error> {
    Tokenizer::from_bytes(bytes).map_err(|e| {
        Error::Load(format!(
            "{} is not a tokenizer the tokenizers library can load ({e}). Check that the file \
             is complete and was written by tokenizers 0.23 or older.",
            path.display()
        ))
    })
}

impl ModelTokenizer {
    /// Loads a Hugging Face model directory: `tokenizer.json` (required) and
    /// `tokenizer_config.json`; the chat template comes from
    /// `chat_template.jinja` when present (newer `transformers` save it there
    /// and prefer it), else from the config.
    ///
    /// # Errors
    /// A sentence naming the missing or bad file and what to do.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, Error> {
        let dir = dir.as_ref();
        let tok_path = dir.join("tokenizer.json");
        let Some(bytes) = read(&tok_path)? else {
            return Err(Error::Load(format!(
                "{} was not found. Download the model with its tokenizer.json (models that ship \
                 only tokenizer.model or vocab files need converting: save them once with \
                 transformers' AutoTokenizer.save_pretrained).",
                tok_path.display()
            )));
        };
        let tokenizer = load_tokenizer(&tok_path, &bytes)?;
        let cfg_path = dir.join("tokenizer_config.json");
        let mut config = match read(&cfg_path)? {
            Some(b) => TokenizerConfig::parse(&b).map_err(|e| {
                Error::Load(format!(
                    "{} is not a valid tokenizer config ({e}). Fix the file or remove it.",
                    cfg_path.display()
                ))
            })?,
            None => TokenizerConfig::default(),
        };
        let jinja_path = dir.join("chat_template.jinja");
        if let Some(b) = read(&jinja_path)? {
            let text = String::from_utf8(b).map_err(|_| {
                Error::Load(format!(
                    "{} is not UTF-8 text. Fix or remove the file.",
                    jinja_path.display()
                ))
            })?;
            config.chat_template = Some(text);
        }
        let template_from: PathBuf = if config.chat_template.is_some() && jinja_path.exists() {
            jinja_path
        } else {
            cfg_path
        };
        Self::build(tokenizer, config, system_clock()).map_err(|e| match e {
            Error::Template(m) => Error::Load(format!(
                "The chat template in {} does not compile: {m}. Fix the template or pass one \
                 that works with Hugging Face transformers.",
                template_from.display()
            )),
            other => other,
        })
    }

    /// Loads a `tokenizer.json` file with an optional chat template text; no
    /// BOS/EOS strings are known to the template then.
    ///
    /// # Errors
    /// As [`ModelTokenizer::from_dir`].
    pub fn from_files(
        tokenizer_json: impl AsRef<Path>,
        chat_template: Option<String>,
    ) -> Result<Self, Error> {
        let path = tokenizer_json.as_ref();
        let Some(bytes) = read(path)? else {
            return Err(Error::Load(format!(
                "{} was not found. Pass the path of the model's tokenizer.json.",
                path.display()
            )));
        };
        let tokenizer = load_tokenizer(path, &bytes)?;
        let config = TokenizerConfig {
            chat_template,
            ..TokenizerConfig::default()
        };
        Self::build(tokenizer, config, system_clock())
    }

    fn build(tokenizer: Tokenizer, config: TokenizerConfig, clock: Clock) -> Result<Self, Error> {
        let template = config
            .chat_template
            .as_deref()
            .map(|t| ChatTemplate::new(t, clock))
            .transpose()
            .map_err(|e| Error::Template(format!("{e:#}")))?;
        let bos_id = config
            .bos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t));
        Ok(Self {
            tokenizer,
            template,
            template_source: config.chat_template.clone(),
            config,
            bos_id,
        })
    }

    /// The same tokenizer with `strftime_now` reading `clock`.
    ///
    /// # Errors
    /// None in practice: the template compiled before.
    pub fn with_clock(self, clock: Clock) -> Result<Self, Error> {
        let mut config = self.config;
        config.chat_template = self.template_source;
        Self::build(self.tokenizer, config, clock)
    }

    /// Whether a chat template is loaded.
    #[must_use]
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Encodes text, adding the post-processor's special tokens when asked.
    ///
    /// # Errors
    /// The tokenizer's failure (rare: e.g. a token missing from the vocab).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        // encode_fast skips character offsets, which routing never reads.
        let enc = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| Error::Encode(format!("encode: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if add_special_tokens {
            self.apply_add_bos(&mut ids);
        }
        Ok(ids)
    }

    /// transformers' Llama and Gemma tokenizers rebuild their post-processor
    /// from `add_bos_token`, so a config that says false drops the BOS that
    /// tokenizer.json's post-processor would add, and true adds one it lacks.
    fn apply_add_bos(&self, ids: &mut Vec<u32>) {
        let (Some(add), Some(bos)) = (self.config.add_bos_token, self.bos_id) else {
            return;
        };
        let has = ids.first() == Some(&bos);
        if add && !has {
            ids.insert(0, bos);
        } else if !add && has {
            ids.remove(0);
        }
    }

    /// Renders a chat completions body as the engine's prompt text.
    /// `add_generation_prompt` overrides the body's own (default true).
    ///
    /// # Errors
    /// No template, a body that is not a chat request, or a template error.
    pub fn render_chat(
        &self,
        body: &[u8],
        add_generation_prompt: Option<bool>,
    ) -> Result<String, Error> {
        self.render(body, add_generation_prompt)
            .map(|(text, _)| text)
    }

    fn render(
        &self,
        body: &[u8],
        add_generation_prompt: Option<bool>,
    ) -> Result<(String, bool), Error> {
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| Error::Template("the model has no chat template".to_owned()))?;
        let chat = request::chat(body, template.content_format()).map_err(Error::Request)?;
        let add_generation_prompt = add_generation_prompt.unwrap_or(chat.add_generation_prompt);
        if add_generation_prompt && chat.continue_final_message {
            // vLLM rejects this combination with a 400.
            return Err(Error::Request(
                "add_generation_prompt and continue_final_message together".to_owned(),
            ));
        }
        let final_text = chat
            .continue_final_message
            .then(|| final_text(&chat.messages))
            .flatten();
        let mut vars = chat.kwargs;
        vars.push(("messages".into(), Value::from(chat.messages)));
        vars.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let token = |t: &Option<String>| t.as_deref().map_or(Value::UNDEFINED, Value::from);
        vars.push(("bos_token".into(), token(&self.config.bos_token)));
        vars.push(("eos_token".into(), token(&self.config.eos_token)));
        let mut text = template
            .render(&Value::from_pairs(vars))
            .map_err(|e| Error::Template(format!("render chat template: {e:#}")))?;
        if let Some(last) = final_text {
            truncate_after_final(&mut text, &last)?;
        }
        Ok((text, chat.add_special_tokens))
    }

    /// The token ids for a request body, or why not.
    ///
    /// # Errors
    /// See [`PromptTokenizer::tokens`].
    pub fn try_tokens(&self, body: &[u8], chat: bool) -> Result<Vec<u32>, Error> {
        if chat {
            let (text, add_special_tokens) = self.render(body, None)?;
            return self.encode(&text, add_special_tokens);
        }
        match request::completion(body).map_err(Error::Request)? {
            request::Completion::Ids(ids) => Ok(ids),
            request::Completion::Text {
                text,
                add_special_tokens,
            } => self.encode(&text, add_special_tokens),
        }
    }
}

impl PromptTokenizer for ModelTokenizer {
    fn tokens(&self, body: &[u8], chat: bool) -> Option<Vec<u32>> {
        self.try_tokens(body, chat).ok()
    }
}

/// The final message's text (the last text part of list content).
fn final_text(messages: &[Value]) -> Option<String> {
    let content = messages.last()?.get_attr("content").ok()?;
    if let Some(s) = content.as_str() {
        return Some(s.to_owned());
    }
    let parts: Vec<Value> = content.try_iter().ok()?.collect();
    parts
        .iter()
        .rev()
        .find_map(|p| p.get_attr("text").ok()?.as_str().map(str::to_owned))
}

/// `continue_final_message` as transformers does it: cut the rendering right
/// after the final message's text, so the model continues that message.
fn truncate_after_final(text: &mut String, last: &str) -> Result<(), Error> {
    let stripped = last.trim();
    let at = text.rfind(stripped).ok_or_else(|| {
        Error::Template("the final message does not appear in the rendered chat".to_owned())
    })?;
    let lstripped_len = last.trim_start().len();
    // The template kept the message's trailing spacing: keep it too.
    let end = if text.get(at..at + lstripped_len) == Some(last) {
        at + lstripped_len
    } else {
        at + stripped.len()
    };
    text.truncate(end);
    Ok(())
}

#[cfg(test)]
mod tests;
