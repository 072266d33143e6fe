//! Anthropic-compatible `POST /v1/messages` and `POST /v1/messages/count_tokens`.

use super::errors::AnthropicError;
use super::generation::{Collected, Finish, GenParams, Outcome, Run, SamplingOverrides};
use super::openai::template_tool;
use super::parsers::{Parsed, ToolCall};
use super::prompt::{check_fields, parse_request, unsupported_part, Conversation};
use super::wire::{self, Stop};
use super::{new_id, read_json, sse, ApiError, AppState, Flavor};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// System blocks starting with this change on every request (Claude Code's billing
/// header); keeping them would make every prompt differ at its start and defeat reuse.
const BILLING_PREFIX: &str = "x-anthropic-billing-header";

const FIELDS: &[&str] = &[
    "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "thinking", "metadata", "service_tier", "container", "mcp_servers",
    "context_management", "output_config", "output_format", "cache_control", "diagnostics", "inference_geo",
    "speed", "user_profile_id", "workspace_id",
];

const COUNT_FIELDS: &[&str] = &[
    "model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers", "context_management",
    "output_config", "output_format", "cache_control", "speed", "user_profile_id", "workspace_id",
];

#[derive(Deserialize)]
struct Request {
    model: Option<String>,
    messages: Vec<Value>,
    max_tokens: u32,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: Option<bool>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    #[serde(default)]
    tools: Vec<Value>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

#[derive(Deserialize)]
struct CountRequest {
    model: Option<String>,
    messages: Vec<Value>,
    system: Option<Value>,
    #[serde(default)]
    tools: Vec<Value>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

/// Requests announcing beta features may carry fields this server does not know yet;
/// without the header, unknown fields are an error as in the real API.
fn beta(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-beta")
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Result<Response, AnthropicError> {
    let body = read_json(&state, body).await?;
    check_fields(&state, &body, FIELDS, beta(&headers))?;
    let req: Request = parse_request(body)?;
    state.check_model(req.model.as_deref())?;
    let mut conv = conversation(req.system.as_ref(), &req.messages, &req.tools, req.tool_choice.as_ref(), req.thinking.as_ref())?;
    let grammar = super::constrain::tool_call(req.tool_choice.as_ref(), &conv.tools, &state.format)?;
    if grammar.is_some() {
        // A forced call starts the answer: no thinking block before it (as the API itself
        // does not allow extended thinking with a forced tool_choice).
        conv.enable_thinking = Some(false);
    }
    let prompt = conv.clone().render(&state).await?;
    let params = GenParams {
        prompt: prompt.ids.clone(),
        max_tokens: wire::max_tokens(Some(req.max_tokens), "max_tokens")?,
        sampling: SamplingOverrides {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: wire::top_k(req.top_k)?,
            ..Default::default()
        }
        .apply(&state.sampling),
        stop: Stop::into_vec(req.stop_sequences.map(Stop::Many), "stop_sequences")?,
        ignore_eos: false,
        parser: conv.parser_options(&state, &prompt),
        logprobs: None,
        grammar: grammar.map(|g| (g, "tool_choice")),
    };
    let prompt_len = params.prompt.len();
    let run = Run::start(&state, params).await?;
    let id = new_id("msg_");
    if req.stream.unwrap_or(false) {
        let enc = Stream::new(id, state.model_id.clone(), prompt_len);
        return Ok(sse::response(run, enc));
    }
    let c = run.collect().await?;
    Ok(Json(message(&id, &state.model_id, &c)).into_response())
}

/// `POST /v1/messages/count_tokens`.
pub async fn count_tokens(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Result<Json<Value>, AnthropicError> {
    let body = read_json(&state, body).await?;
    check_fields(&state, &body, COUNT_FIELDS, beta(&headers))?;
    let req: CountRequest = parse_request(body)?;
    state.check_model(req.model.as_deref())?;
    let conv = conversation(req.system.as_ref(), &req.messages, &req.tools, req.tool_choice.as_ref(), req.thinking.as_ref())?;
    let prompt = conv.render(&state).await?;
    Ok(Json(json!({"input_tokens": prompt.ids.len()})))
}

pub(super) fn conversation(
    system: Option<&Value>,
    messages: &[Value],
    tools: &[Value],
    tool_choice: Option<&Value>,
    thinking: Option<&Value>,
) -> Result<Conversation, ApiError> {
    let mut out = vec![];
    let mut sys = vec![system_text(system, "system")?];
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        // Current Claude Code sends `system` entries inside `messages`. Templates differ on
        // system messages after the first (Qwen3.5 raises, DeepSeek gathers them all into
        // the prompt's head), so they join the system prompt, in order, as DeepSeek's does.
        if m.get("role").and_then(Value::as_str) == Some("system") {
            sys.push(system_text(m.get("content"), &format!("messages.{i}.content"))?);
            continue;
        }
        convert_message(m, &format!("messages.{i}"), &mut out)?;
    }
    sys.retain(|s| !s.is_empty());
    if !sys.is_empty() {
        out.insert(0, json!({"role": "system", "content": sys.join("\n\n")}));
    }
    if out.is_empty() {
        return Err(ApiError::invalid("messages", "messages must hold a user or assistant message"));
    }
    let tools = convert_tools(tools)?;
    let tools_off = super::openai::tool_choice_off(tool_choice, &tools, "tool_choice")?;
    // `adaptive` lets the model decide how much to think: the template's switch is on.
    let enable_thinking = match thinking.and_then(|t| t.get("type")).and_then(Value::as_str) {
        Some("enabled" | "adaptive") => Some(true),
        Some("disabled") => Some(false),
        Some(other) => return Err(ApiError::invalid("thinking.type", format!("unknown thinking type `{other}` (enabled, adaptive or disabled)"))),
        None => None,
    };
    Ok(Conversation { messages: out, tools, tools_off, enable_thinking, extra: Map::new() })
}

/// The text of a system prompt (`path` names it in errors): a string or text blocks.
fn system_text(system: Option<&Value>, path: &str) -> Result<String, ApiError> {
    match system {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut parts = vec![];
            for (i, b) in blocks.iter().enumerate() {
                let t = b
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(format!("{path}.{i}.text"), "system blocks must be text blocks"))?;
                if !t.starts_with(BILLING_PREFIX) {
                    parts.push(t);
                }
            }
            Ok(parts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid(path, "expected a string or a list of text blocks")),
    }
}

/// One Anthropic message → template messages (a user turn with tool results becomes
/// `tool` messages followed by the user's text).
fn convert_message(m: &Value, p: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = m.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(format!("{p}.role"), "Field required"))?;
    if role != "user" && role != "assistant" {
        return Err(ApiError::invalid(format!("{p}.role"), format!("unknown role `{role}` (user, assistant or system)")));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        _ => return Err(ApiError::invalid(format!("{p}.content"), "expected a string or a list of content blocks")),
    };
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), vec![]);
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{p}.content.{j}");
        let ty = b.get("type").and_then(Value::as_str).unwrap_or("");
        match (role, ty) {
            (_, "text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            ("user", "tool_result") => {
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": std::mem::take(&mut text)}));
                }
                let id = b.get("tool_use_id").cloned().unwrap_or(Value::Null);
                let mut content = tool_result_text(b.get("content"));
                if b.get("is_error").and_then(Value::as_bool) == Some(true) && !content.starts_with("Error") {
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("user", "image" | "document" | "search_result") => return Err(unsupported_part(&bp, ty)),
            ("assistant", "thinking") => reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or("")),
            ("assistant", "tool_use") => {
                let name = b.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(format!("{bp}.name"), "Field required"))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": b.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                    "function": {"name": name, "arguments": input}}));
            }
            // Hidden reasoning and server-side tool traffic have nothing for a local model.
            ("assistant", "redacted_thinking" | "server_tool_use" | "web_search_tool_result") => {}
            _ => return Err(ApiError::invalid(format!("{bp}.type"), format!("content block type `{ty}` is not valid in a {role} message"))),
        }
    }
    if role == "user" {
        if !text.is_empty() {
            out.push(json!({"role": "user", "content": text}));
        }
        return Ok(());
    }
    let mut msg = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        msg["reasoning_content"] = reasoning.into();
    }
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    out.push(msg);
    Ok(())
}

/// Text of a tool result; images in it are replaced by a note, because an agent's tool
/// (reading a picture file) must not fail the whole turn on a text-only model.
fn tool_result_text(content: Option<&Value>) -> String {
    match content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|b| match b.get("type").and_then(Value::as_str) {
                Some("text") => b.get("text").and_then(Value::as_str).unwrap_or("").to_string(),
                Some(t) => format!("[{t} omitted: this model reads text only]"),
                None => String::new(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Some(v) => v.to_string(),
    }
}

/// Client tools; server tools (`web_search_…`, `bash_…` with a versioned `type`) are left
/// out because nothing here runs them.
fn convert_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = vec![];
    for (i, t) in tools.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => out.push(template_tool(t, &format!("tools.{i}"))?),
            Some(other) => tracing::debug!("messages: server tool `{other}` is not available here; left out"),
        }
    }
    Ok(out)
}

fn stop_reason(o: &Outcome) -> (&'static str, Value) {
    match &o.finish {
        Finish::Stop if o.tool_calls > 0 => ("tool_use", Value::Null),
        Finish::Stop => ("end_turn", Value::Null),
        Finish::Length => ("max_tokens", Value::Null),
        Finish::StopSequence(s) => ("stop_sequence", s.clone().map(Value::String).unwrap_or(Value::Null)),
    }
}

/// Anthropic counts cache reads apart from `input_tokens`.
fn usage(o: &Outcome) -> Value {
    let u = &o.usage;
    json!({
        "input_tokens": u.prompt.saturating_sub(u.cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached,
        "output_tokens": u.completion,
    })
}

/// Opaque signature for thinking blocks: clients store and send it back; this server
/// does not check it.
const SIGNATURE: &str = "ft-actor";

fn tool_use(c: &ToolCall) -> Value {
    json!({"type": "tool_use", "id": new_id("toolu_"), "name": c.name, "input": Value::Object(c.arguments.clone())})
}

fn message(id: &str, model: &str, c: &Collected) -> Value {
    let content: Vec<Value> = c
        .items
        .iter()
        .map(|p| match p {
            Parsed::Reasoning(t) => json!({"type": "thinking", "thinking": t, "signature": SIGNATURE}),
            Parsed::Text(t) => json!({"type": "text", "text": t}),
            Parsed::ToolCall(call) => tool_use(call),
        })
        .collect();
    let (reason, seq) = stop_reason(&c.outcome);
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": seq, "usage": usage(&c.outcome),
    })
}

#[derive(PartialEq)]
enum Block {
    Thinking,
    Text,
}

/// Messages stream events.
pub(super) struct Stream {
    id: String,
    model: String,
    prompt_len: usize,
    index: usize,
    open: Option<Block>,
}

impl Stream {
    /// An encoder for message `id` whose prompt has `prompt_len` tokens.
    pub(super) fn new(id: String, model: String, prompt_len: usize) -> Self {
        Self { id, model, prompt_len, index: 0, open: None }
    }

    fn close(&mut self) -> String {
        let Some(b) = self.open.take() else { return String::new() };
        let mut s = String::new();
        if b == Block::Thinking {
            let d = json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "signature_delta", "signature": SIGNATURE}});
            s += &sse::named("content_block_delta", &d);
        }
        s += &sse::named("content_block_stop", &json!({"type": "content_block_stop", "index": self.index}));
        self.index += 1;
        s
    }

    fn open(&mut self, b: Block) -> String {
        if self.open.as_ref() == Some(&b) {
            return String::new();
        }
        let mut s = self.close();
        let block = match b {
            Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::Text => json!({"type": "text", "text": ""}),
        };
        s += &sse::named("content_block_start", &json!({"type": "content_block_start", "index": self.index, "content_block": block}));
        self.open = Some(b);
        s
    }

    fn delta(&self, delta: Value) -> String {
        sse::named("content_block_delta", &json!({"type": "content_block_delta", "index": self.index, "delta": delta}))
    }
}

impl sse::Encoder for Stream {
    fn start(&mut self) -> String {
        let msg = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_len, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0},
        });
        let mut s = sse::named("message_start", &json!({"type": "message_start", "message": msg}));
        s += &self.idle();
        s
    }

    fn output(&mut self, items: Vec<Parsed>) -> String {
        let mut s = String::new();
        for p in items {
            match p {
                Parsed::Reasoning(t) => {
                    s += &self.open(Block::Thinking);
                    s += &self.delta(json!({"type": "thinking_delta", "thinking": t}));
                }
                Parsed::Text(t) => {
                    s += &self.open(Block::Text);
                    s += &self.delta(json!({"type": "text_delta", "text": t}));
                }
                Parsed::ToolCall(c) => {
                    s += &self.close();
                    let mut block = tool_use(&c);
                    block["input"] = json!({});
                    s += &sse::named("content_block_start", &json!({"type": "content_block_start", "index": self.index, "content_block": block}));
                    s += &self.delta(json!({"type": "input_json_delta", "partial_json": c.arguments_json()}));
                    s += &sse::named("content_block_stop", &json!({"type": "content_block_stop", "index": self.index}));
                    self.index += 1;
                }
            }
        }
        s
    }

    fn done(&mut self, o: Outcome) -> String {
        let mut s = self.close();
        let (reason, seq) = stop_reason(&o);
        let d = json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage(&o)});
        s += &sse::named("message_delta", &d);
        s += &sse::named("message_stop", &json!({"type": "message_stop"}));
        s
    }

    fn failed(&mut self, e: ApiError) -> String {
        sse::named("error", &e.body(Flavor::Anthropic))
    }

    fn idle(&mut self) -> String {
        sse::named("ping", &json!({"type": "ping"}))
    }
}
