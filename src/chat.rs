//! Chat-template rendering compatible with transformers' `apply_chat_template`.
//!
//! Templates are Jinja2 source from the model folder. They are rendered with minijinja set up
//! like transformers' Jinja2 environment: `trim_blocks`, `lstrip_blocks`, loop controls, no
//! autoescaping, a `tojson` filter that behaves like Python's `json.dumps`, the
//! `raise_exception` and `strftime_now` globals, Python string/dict methods, and Python-style
//! printing of `None`/`True`/lists.

use std::borrow::Cow;
use std::collections::BTreeMap;

use minijinja::value::{from_args, Serde, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

use crate::tokenizer::Tokenizer;

mod python;
use python::{py_rsplit, py_str, strftime_utc, tojson_filter, unix_now};

const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The model folder has no chat template.
    #[error("the tokenizer has no chat template")]
    NoTemplate,
    /// The template source does not parse.
    #[error("chat template syntax error: {message}")]
    Syntax {
        /// minijinja's message, including `(in chat_template:LINE)`.
        message: String,
        /// 1-based line of the error, when known.
        line: Option<usize>,
    },
    /// The template failed while rendering (undefined operation, bad filter argument...).
    #[error("chat template render error: {message}")]
    Render {
        /// minijinja's message, including `(in chat_template:LINE)`.
        message: String,
        /// 1-based line of the error, when known.
        line: Option<usize>,
    },
    /// The template called `raise_exception(message)` (usually: the conversation is invalid).
    #[error("chat template raised: {0}")]
    Raised(String),
    /// The request cannot be rendered (e.g. `continue_final_message` with nothing to continue).
    #[error("invalid chat request: {0}")]
    InvalidRequest(String),
}

/// One `apply_chat_template` call: the conversation and the template switches.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatRequest {
    /// Message objects as given by the client (role, content as a string or a list of parts,
    /// tool_calls, reasoning_content, name, tool_call_id...). Passed to the template unchanged;
    /// key order is kept as far as `serde_json::Map` keeps it (its `preserve_order` feature).
    pub messages: Vec<serde_json::Value>,
    /// Tool (function) schemas; `None` renders as Python `None`, as transformers passes it.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Retrieval documents for templates that support them; `None` renders as `None`.
    pub documents: Option<Vec<serde_json::Value>>,
    /// Append the header of a new assistant turn.
    pub add_generation_prompt: bool,
    /// Cut the output right after the last message's content so the model continues it
    /// (assistant prefill). Exclusive with `add_generation_prompt`.
    pub continue_final_message: bool,
    /// `None` leaves `enable_thinking` undefined in the template (transformers' behaviour when
    /// the kwarg is not passed), which differs from `Some(false)` for most templates.
    pub enable_thinking: Option<bool>,
    /// Further template variables (e.g. `reasoning_effort`, `builtin_tools`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Marks an error produced by the template's `raise_exception` call.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

/// A compiled chat template with its special-token variables. Cheap to share (`Send + Sync`).
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// bos_token, eos_token, ... as passed by transformers from the special tokens map.
    special_tokens: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` become template variables when given.
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, ChatError> {
        let mut special = BTreeMap::new();
        if let Some(b) = bos_token {
            special.insert("bos_token".to_string(), b.to_string());
        }
        if let Some(e) = eos_token {
            special.insert("eos_token".to_string(), e.to_string());
        }
        Self::with_special_tokens(source, special)
    }

    /// Compiles `source` with an arbitrary map of special-token variables (`bos_token`,
    /// `eos_token`, `pad_token`, `unk_token`...).
    pub fn with_special_tokens(
        source: &str,
        special_tokens: BTreeMap<String, String>,
    ) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| syntax_error(&e))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(python_methods);
        env.set_formatter(|out, _state, value| out.write_str(&py_str(value)).map_err(Error::from));
        env.add_filter("tojson", tojson_filter);
        env.add_filter("string", |v: &Value| py_str(v));
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg.clone())
                .with_source(RaisedByTemplate(msg)))
        });
        env.add_function("strftime_now", |fmt: String| strftime_utc(&fmt, unix_now()));
        let src = rewrite_generation_tags(source).into_owned();
        env.add_template_owned(TEMPLATE_NAME, src)
            .map_err(|e| syntax_error(&e))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            special_tokens,
        })
    }

    /// Compiles the tokenizer's default chat template with all its named special tokens.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Self, ChatError> {
        let source = tok.chat_template().ok_or(ChatError::NoTemplate)?;
        let mut special = BTreeMap::new();
        let named = [
            ("bos_token", tok.bos_token()),
            ("eos_token", tok.eos_token()),
            ("pad_token", tok.pad_token()),
            ("unk_token", tok.unk_token()),
        ];
        for (name, value) in named {
            if let Some(v) = value {
                special.insert(name.to_string(), v.to_string());
            }
        }
        Self::with_special_tokens(source, special)
    }

    /// The template source as given (before internal rewriting).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation to the prompt text (not tokenized; encode it without adding
    /// special tokens, as transformers does, because the template writes them itself).
    pub fn render(&self, req: &ChatRequest) -> Result<String, ChatError> {
        if req.continue_final_message && req.add_generation_prompt {
            return Err(ChatError::InvalidRequest(
                "continue_final_message and add_generation_prompt are mutually exclusive".into(),
            ));
        }
        // Later inserts win, giving transformers' precedence: special tokens < kwargs < the
        // named render arguments.
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in &self.special_tokens {
            ctx.insert(k.clone(), Value::from(v.as_str()));
        }
        for (k, v) in &req.extra {
            ctx.insert(k.clone(), Value::from(Serde(v)));
        }
        if let Some(t) = req.enable_thinking {
            ctx.insert("enable_thinking".into(), Value::from(t));
        }
        ctx.insert("messages".into(), Value::from(Serde(&req.messages)));
        ctx.insert("tools".into(), Value::from(Serde(&req.tools)));
        ctx.insert("documents".into(), Value::from(Serde(&req.documents)));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(req.add_generation_prompt),
        );

        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| syntax_error(&e))?;
        let rendered = tmpl
            .render(Value::from(ctx))
            .map_err(|e| render_error(&e))?;
        if req.continue_final_message {
            return cut_after_final_message(rendered, req.messages.last());
        }
        Ok(rendered)
    }
}

fn syntax_error(e: &Error) -> ChatError {
    ChatError::Syntax {
        message: e.to_string(),
        line: e.line(),
    }
}

fn render_error(e: &Error) -> ChatError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(raised) = c.downcast_ref::<RaisedByTemplate>() {
            return ChatError::Raised(raised.0.clone());
        }
        cause = c.source();
    }
    ChatError::Render {
        message: e.to_string(),
        line: e.line(),
    }
}

/// transformers' `continue_final_message`: truncate after the final message's text so the
/// model continues it instead of starting a new turn.
fn cut_after_final_message(
    rendered: String,
    last: Option<&serde_json::Value>,
) -> Result<String, ChatError> {
    let content = last.and_then(|m| m.get("content"));
    let text = match content {
        Some(serde_json::Value::String(s)) => s.as_str(),
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .rev()
            .find_map(|p| p.get("text").and_then(serde_json::Value::as_str))
            .ok_or_else(|| {
                ChatError::InvalidRequest("final message has no text to continue".into())
            })?,
        _ => {
            return Err(ChatError::InvalidRequest(
                "final message has no text to continue".into(),
            ))
        }
    };
    let stripped = text.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(ChatError::InvalidRequest(
            "the final message does not appear in the rendered chat; cannot continue it".into(),
        ));
    };
    // Keep the message's own trailing whitespace when the template kept it.
    let keep = text.trim_start();
    let end = if rendered[loc..].starts_with(keep) {
        loc + keep.len()
    } else {
        loc + stripped.len()
    };
    let mut out = rendered;
    out.truncate(end);
    Ok(out)
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (assistant-mask
/// markers minijinja does not know) into an always-true `if`, keeping whitespace control.
fn rewrite_generation_tags(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start + 2..];
        let inner = tag.strip_prefix(['-', '+']).unwrap_or(tag);
        let open_len = tag.len() - inner.len();
        let body = inner.trim_start();
        let replacement = if let Some(after) = body.strip_prefix("endgeneration") {
            Some(("endif", after))
        } else {
            body.strip_prefix("generation")
                .map(|after| ("if true", after))
        };
        match replacement {
            Some((word, after)) if after.trim_start().starts_with(['-', '+', '%']) => {
                out.push_str("{%");
                out.push_str(&tag[..open_len]);
                out.push(' ');
                out.push_str(word);
                rest = after;
            }
            _ => {
                out.push_str("{%");
                rest = tag;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Python string methods missing from minijinja-contrib's pycompat, then pycompat itself.
fn python_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "rsplit" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
                return py_rsplit(s, sep, maxsplit.unwrap_or(-1)).map(Value::from);
            }
            "removeprefix" => {
                let (p,): (&str,) = from_args(args)?;
                return Ok(Value::from(s.strip_prefix(p).unwrap_or(s)));
            }
            "removesuffix" => {
                let (p,): (&str,) = from_args(args)?;
                return Ok(Value::from(s.strip_suffix(p).unwrap_or(s)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str) -> Result<String, ChatError> {
        ChatTemplate::new(src, Some("<s>"), Some("</s>"))?.render(&ChatRequest::default())
    }

    #[test]
    fn template_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
    }

    #[test]
    fn python_printing() {
        assert_eq!(
            render("{{ none }} {{ true }} {{ [1, 'a', none] }} {{ {'k': false} }} {{ 4 / 2 }}")
                .unwrap(),
            "None True [1, 'a', None] {'k': False} 2.0"
        );
        assert_eq!(render("{{ bos_token }}{{ eos_token }}").unwrap(), "<s></s>");
    }

    #[test]
    fn tojson_matches_json_dumps() {
        let src = r#"{{ {"b": [1, 2.5, "é\n\"", none, true], "a": {}} | tojson }}"#;
        assert_eq!(
            render(src).unwrap(),
            r#"{"b": [1, 2.5, "é\n\"", null, true], "a": {}}"#
        );
        let src = r#"{{ {"b": [1, {"c": []}], "a": "x"} | tojson(indent=2, sort_keys=true) }}"#;
        assert_eq!(
            render(src).unwrap(),
            "{\n  \"a\": \"x\",\n  \"b\": [\n    1,\n    {\n      \"c\": []\n    }\n  ]\n}"
        );
        assert_eq!(
            render(r#"{{ "é🦀<>" | tojson(ensure_ascii=true) }}"#).unwrap(),
            r#""\u00e9\ud83e\udd80<>""#
        );
        assert_eq!(
            render(r#"{{ [1,2] | tojson(separators=[",", ":"]) }}"#).unwrap(),
            "[1,2]"
        );
        assert!(matches!(
            render("{{ x | tojson }}"),
            Err(ChatError::Render { .. })
        ));
    }

    #[test]
    fn python_methods_and_tags() {
        let src = "{{ 'x.y.z'.rsplit('.', 1)[0] }}|{{ ' Hi '.strip().lower() }}|{{ {'a': 1}.get('b', 2) }}";
        assert_eq!(render(src).unwrap(), "x.y|hi|2");
        let src = "{%- generation -%}\n  A\n{%- endgeneration %}B";
        assert_eq!(render(src).unwrap(), "AB");
        assert_eq!(
            rewrite_generation_tags("{% if generation_x %}"),
            "{% if generation_x %}"
        );
    }
}
