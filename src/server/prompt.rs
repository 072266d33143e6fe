//! From a request's conversation to prompt tokens, and what the model's output markup is.
//!
//! Each API converts its messages into the shape Hugging Face chat templates expect
//! (OpenAI-style `role`/`content` strings, `tool_calls` with object arguments, `tool`
//! messages, `reasoning_content`) — a [`Conversation`]; rendering and tokenizing it runs on
//! the blocking pool because long agent prompts take real CPU time.

use super::parsers::{ParamTypes, ParserOptions, ToolMarkup};
use super::settings::{ReasoningParser, ToolParser};
use super::{ApiError, AppState, ErrorKind, ServerSettings};
use crate::chat::{ChatError, ChatRequest, ChatTemplate};
use crate::tokenizer::Tokenizer;
use serde_json::{Map, Value};

/// The output markup of the served model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelFormat {
    /// `<think>…</think>` reasoning is split from the answer.
    pub reasoning: bool,
    /// Tool calls are recognised.
    pub tools: bool,
    /// Bare `<function=…>` blocks count as tool calls (Qwen3-Coder).
    pub bare_function: bool,
    /// The markup around the calls.
    pub markup: ToolMarkup,
}

impl ModelFormat {
    /// Decides the format from the settings, the vocabulary and the chat template.
    pub fn detect(tok: &Tokenizer, template: Option<&ChatTemplate>, s: &ServerSettings) -> Self {
        let has = |t: &str| tok.token_to_id(t).is_some();
        let src = template.map(ChatTemplate::source).unwrap_or("");
        let reasoning = match s.reasoning_parser {
            ReasoningParser::Auto => has("<think>") && has("</think>"),
            ReasoningParser::Think => true,
            ReasoningParser::None => false,
        };
        Self { reasoning, ..Self::tool_format(s.tool_parser, src, has("<tool_call>")) }
    }

    /// The tool-call part of the format for `parser`, from the template's source `src` and
    /// whether the vocabulary has a `<tool_call>` token.
    pub(super) fn tool_format(parser: ToolParser, src: &str, tool_call_token: bool) -> Self {
        let xml = src.contains("<function=");
        let family = |markup| Self { tools: true, markup, ..Self::default() };
        let tags = |tools, bare_function| Self { tools, bare_function, ..Self::default() };
        match parser {
            ToolParser::Auto => match ToolMarkup::from_template(src) {
                Some(m) => family(m),
                None => tags(xml || src.contains("<tool_call>") || tool_call_token, xml),
            },
            ToolParser::Hermes => tags(true, false),
            ToolParser::Qwen3Coder => tags(true, true),
            ToolParser::Deepseek => family(ToolMarkup::DeepSeek),
            ToolParser::DeepseekDsml => family(ToolMarkup::Dsml),
            ToolParser::Mistral => family(ToolMarkup::Mistral),
            ToolParser::Kimi => family(ToolMarkup::Kimi),
            ToolParser::Minimax => family(ToolMarkup::MiniMax),
            ToolParser::Harmony => family(ToolMarkup::Harmony),
            ToolParser::None => tags(false, false),
        }
    }
}

/// A conversation ready for the chat template.
#[derive(Clone, Debug, Default)]
pub struct Conversation {
    /// Template messages.
    pub messages: Vec<Value>,
    /// OpenAI-shaped tool schemas (`{"type": "function", "function": {...}}`).
    pub tools: Vec<Value>,
    /// The request forbids tool calls (`tool_choice: none`).
    pub tools_off: bool,
    /// `enable_thinking` for the template (`None`: the template's default).
    pub enable_thinking: Option<bool>,
    /// Further template variables (`reasoning_effort`, `chat_template_kwargs`).
    pub extra: Map<String, Value>,
}

/// A rendered, tokenized prompt.
#[derive(Clone, Debug)]
pub struct Prompt {
    /// Token ids.
    pub ids: Vec<u32>,
    /// The template left a `<think>` open: output starts inside the reasoning.
    pub opens_reasoning: bool,
}

impl Conversation {
    /// Renders and tokenizes on the blocking pool.
    pub async fn render(self, state: &AppState) -> Result<Prompt, ApiError> {
        let template = state.template.clone().ok_or_else(|| {
            ApiError::invalid("messages", "this model has no chat template; use /v1/completions with a raw prompt")
        })?;
        let tok = state.tokenizer.clone();
        let reasoning = state.format.reasoning;
        tokio::task::spawn_blocking(move || self.render_blocking(&template, &tok, reasoning))
            .await
            .map_err(|e| ApiError::internal(format!("prompt rendering task failed: {e}")))?
    }

    /// Renders and tokenizes on the calling thread.
    pub(super) fn render_blocking(self, template: &ChatTemplate, tok: &Tokenizer, reasoning: bool) -> Result<Prompt, ApiError> {
        // A trailing assistant message is a prefill: the model continues it (as Anthropic's
        // API and llama.cpp do) instead of starting a new turn.
        let continue_final = self
            .messages
            .last()
            .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant") && m.get("tool_calls").is_none()
                && m.get("content").and_then(Value::as_str).is_some_and(|c| !c.trim().is_empty()));
        let text = template.render(&self.chat_request(continue_final)).map_err(template_error)?;
        let ids = tok
            .encode(&text, false)
            .map_err(|e| ApiError::internal(format!("cannot tokenize the prompt: {e}")))?;
        let opens_reasoning = reasoning && opens_think(&text);
        Ok(Prompt { ids, opens_reasoning })
    }

    /// The template's input: a new assistant turn is opened unless `continue_final`.
    pub(super) fn chat_request(self, continue_final: bool) -> ChatRequest {
        ChatRequest {
            messages: self.messages,
            tools: if self.tools.is_empty() || self.tools_off { None } else { Some(self.tools) },
            documents: None,
            add_generation_prompt: !continue_final,
            continue_final_message: continue_final,
            enable_thinking: self.enable_thinking,
            extra: self.extra,
        }
    }

    /// Options for parsing this request's output.
    pub fn parser_options(&self, state: &AppState, prompt: &Prompt) -> ParserOptions {
        let tools = state.format.tools && !self.tools.is_empty() && !self.tools_off;
        ParserOptions {
            reasoning: state.format.reasoning,
            start_in_reasoning: prompt.opens_reasoning,
            tools,
            bare_function: tools && state.format.bare_function,
            markup: state.format.markup,
            param_types: if tools { ParamTypes::from_tools(&self.tools) } else { ParamTypes::default() },
            raw: false,
        }
    }
}

/// True when the last `<think>` in the prompt is not closed.
pub fn opens_think(text: &str) -> bool {
    match (text.rfind("<think>"), text.rfind("</think>")) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Template failures are the request's fault (the template rejected the conversation)
/// except when the template itself is broken.
fn template_error(e: ChatError) -> ApiError {
    match e {
        ChatError::Raised(m) => ApiError::invalid("messages", format!("the chat template rejected the conversation: {m}")),
        ChatError::InvalidRequest(m) => ApiError::invalid("messages", m),
        ChatError::Render { message, .. } => {
            ApiError::invalid("messages", format!("the chat template cannot render this conversation: {message}"))
        }
        e @ (ChatError::NoTemplate | ChatError::Syntax { .. }) => ApiError::internal(e.to_string()),
    }
}

/// Text of an OpenAI-style `content`: a string, `null`, or a list of `text` parts.
pub fn content_text(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("text");
                match ty {
                    "text" | "input_text" | "output_text" | "refusal" => {
                        let key = if ty == "refusal" { "refusal" } else { "text" };
                        let t = p.get(key).and_then(Value::as_str).ok_or_else(|| {
                            ApiError::invalid(format!("{param}[{i}].{key}"), "expected a string")
                        })?;
                        out.push_str(t);
                    }
                    "image_url" | "input_image" | "image" | "input_audio" | "file" | "input_file" | "document" => {
                        return Err(unsupported_part(&format!("{param}[{i}]"), ty))
                    }
                    other => {
                        return Err(ApiError::invalid(format!("{param}[{i}].type"), format!("unknown content part type `{other}`")))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid(param, "expected a string or a list of content parts")),
    }
}

/// The 400 for images, audio and files: the served models read text only.
pub fn unsupported_part(param: &str, ty: &str) -> ApiError {
    ApiError::invalid(param, format!("content of type `{ty}` is not supported: this server's model reads text only"))
}

/// Tool-call arguments for the template: chat templates iterate them as a mapping, so a
/// JSON string becomes the object it encodes (left as a string when it is not one).
pub fn template_arguments(args: &Value) -> Value {
    match args {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => args.clone(),
        },
        other => other.clone(),
    }
}

/// Checks the top-level keys of a request against the fields an API defines.
pub fn check_fields(state: &AppState, body: &Value, known: &[&str], lenient: bool) -> Result<(), ApiError> {
    if !state.settings.reject_unknown_fields || lenient {
        return Ok(());
    }
    if let Some(obj) = body.as_object() {
        if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ApiError::invalid(
                k.clone(),
                format!("unknown field `{k}` (the server rejects fields it does not know; set reject_unknown_fields = false to ignore them)"),
            ));
        }
    }
    Ok(())
}

/// Deserializes a request struct, naming the offending field on error.
pub fn parse_request<T: serde::de::DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // serde reports a missing field at the parent; name the field itself.
        let missing = inner.strip_prefix("missing field `").and_then(|r| r.split('`').next()).map(str::to_string);
        match (missing, path.as_str()) {
            (Some(field), ".") => ApiError::invalid(field, "Field required"),
            (Some(field), parent) => ApiError::invalid(format!("{parent}.{field}"), "Field required"),
            (None, ".") => ApiError::invalid("body", inner),
            (None, _) => ApiError::invalid(path, inner),
        }
    })
}

/// The 404 for an unknown stored object.
pub fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("no {what} with id `{id}`"))
}
