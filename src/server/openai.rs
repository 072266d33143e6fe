//! OpenAI-compatible `/v1/chat/completions`, `/v1/completions` and `/v1/models`.

use super::errors::OpenAiError;
use super::generation::{Collected, Finish, GenParams, LogprobEntry, Outcome, Run, SamplingOverrides, Usage};
use super::parsers::{Parsed, ToolCall};
use super::prompt::{check_fields, content_text, parse_request, template_arguments, Conversation};
use super::wire::{self, Stop};
use super::{new_id, read_json, sse, unix_now, ApiError, AppState};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Fields of a chat completion request: used, or accepted and ignored.
const CHAT_FIELDS: &[&str] = &[
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop", "n", "tools", "tool_choice",
    "parallel_tool_calls", "reasoning_effort", "chat_template_kwargs", "logprobs", "top_logprobs",
    "response_format", "frequency_penalty", "presence_penalty", "ignore_eos", "user", "metadata", "store",
    "service_tier", "logit_bias", "prediction", "modalities", "safety_identifier", "prompt_cache_key",
    "verbosity", "functions", "function_call", "skip_special_tokens", "include_reasoning", "audio", "moderation",
    "prompt_cache_options", "prompt_cache_retention", "web_search_options",
];

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Vec<Value>,
    #[serde(default)]
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    n: Option<u32>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    reasoning_effort: Option<String>,
    chat_template_kwargs: Option<Map<String, Value>>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    response_format: Option<Value>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    logit_bias: Option<Map<String, Value>>,
    ignore_eos: Option<bool>,
    functions: Option<Value>,
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(state): State<AppState>, body: Body) -> Result<Response, OpenAiError> {
    let body = read_json(&state, body).await?;
    check_fields(&state, &body, CHAT_FIELDS, false)?;
    let req: ChatRequest = parse_request(body)?;
    state.check_model(req.model.as_deref())?;
    let n = req.n.unwrap_or(1);
    if n == 0 || n > MAX_CHOICES {
        return Err(ApiError::invalid("n", format!("n must be between 1 and {MAX_CHOICES}")).into());
    }
    if req.functions.as_ref().is_some_and(|f| !f.is_null()) {
        return Err(ApiError::invalid("functions", "the legacy `functions` parameter is not supported; use `tools`").into());
    }
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(n)) if n as usize > crate::sampling::MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid("top_logprobs", format!("top_logprobs must be at most {}", crate::sampling::MAX_TOP_LOGPROBS)).into())
        }
        (false, Some(n)) if n > 0 => return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true").into()),
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, _) => None,
    };
    let tools = function_tools(req.tools.as_deref().unwrap_or_default(), "tools")?;
    let tools_off = tool_choice_off(req.tool_choice.as_ref(), &tools, "tool_choice")?;
    let grammar = match super::constrain::tool_call(req.tool_choice.as_ref(), &tools, &state.format)? {
        Some(g) => Some((g, "tool_choice")),
        None => super::constrain::response_format(req.response_format.as_ref())?.map(|g| (g, "response_format")),
    };
    let mut extra = req.chat_template_kwargs.clone().unwrap_or_default();
    let mut enable_thinking = extra.remove("enable_thinking").and_then(|v| v.as_bool());
    if grammar.is_some() {
        // The grammar starts at the answer: no reasoning block before it.
        enable_thinking = Some(false);
    }
    // Strict tools under `auto`: only the calls are held to their schemas (text and reasoning
    // stay free).
    let grammar = match (grammar, tools_off) {
        (None, false) => super::constrain::strict_calls(req.tools.as_deref().unwrap_or_default(), &tools, &state.format).map(|g| (g, "tools")),
        (g, _) => g,
    };
    if let Some(e) = &req.reasoning_effort {
        extra.entry("reasoning_effort").or_insert(Value::String(e.clone()));
    }
    let conv = Conversation { messages: chat_messages(&req.messages)?, tools, tools_off, enable_thinking, extra };
    let prompt = conv.clone().render(&state).await?;
    let parser = conv.parser_options(&state, &prompt);
    let params = GenParams {
        prompt: prompt.ids,
        max_tokens: wire::max_tokens(req.max_completion_tokens.or(req.max_tokens), max_tokens_param(&req))?,
        sampling: SamplingOverrides {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: wire::top_k(req.top_k)?,
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
            frequency_penalty: req.frequency_penalty,
            presence_penalty: req.presence_penalty,
            logit_bias: wire::logit_bias(req.logit_bias.as_ref(), state.engine.info().config.vocab_size)?,
            seed: wire::seed(req.seed),
        }
        .apply(&state.sampling),
        stop: Stop::into_vec(req.stop, "stop")?,
        ignore_eos: req.ignore_eos.unwrap_or(false),
        parser,
        logprobs,
        grammar,
    };
    let id = new_id("chatcmpl-");
    let stream = req.stream.unwrap_or(false);
    let usage = req.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    if n > 1 && stream {
        let runs = choice_runs(&state, &params, n).await?;
        let encs = (0..runs.len()).map(|i| ChatStream::choice(id.clone(), state.model_id.clone(), usage, i)).collect();
        let close = ChatStream::new(id, state.model_id.clone(), usage);
        return Ok(sse::response_many(runs, encs, move |outcomes| close.close(usage.then(|| choices_usage(&outcomes)))));
    }
    if n > 1 {
        return Ok(Json(chat_choices(&state, &id, params, n, logprobs.is_some()).await?).into_response());
    }
    let run = Run::start(&state, params).await?;
    if stream {
        let enc = ChatStream::new(id, state.model_id.clone(), usage);
        return Ok(sse::response(run, enc));
    }
    let c = run.collect().await?;
    let mut resp = chat_response(&id, &state.model_id, &c);
    if logprobs.is_some() {
        resp["choices"][0]["logprobs"] = chat_logprobs(&c.logprobs);
    }
    Ok(Json(resp).into_response())
}

fn max_tokens_param(req: &ChatRequest) -> &'static str {
    if req.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" }
}

/// OpenAI chat messages → chat-template messages.
pub(super) fn chat_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let p = format!("messages[{i}]");
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("{p}.role"), "each message needs a string `role`"))?;
        let content = content_text(m.get("content"), &format!("{p}.content"))?;
        let mut msg = Map::new();
        match role {
            "system" | "developer" => {
                msg.insert("role".into(), "system".into());
                msg.insert("content".into(), content.into());
            }
            "user" => {
                msg.insert("role".into(), "user".into());
                msg.insert("content".into(), content.into());
            }
            "assistant" => {
                msg.insert("role".into(), "assistant".into());
                msg.insert("content".into(), content.into());
                let reasoning = m.get("reasoning_content").or_else(|| m.get("reasoning")).and_then(Value::as_str);
                if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
                    msg.insert("reasoning_content".into(), r.into());
                }
                if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
                    msg.insert("tool_calls".into(), history_tool_calls(calls, &format!("{p}.tool_calls"))?);
                }
            }
            "tool" | "function" => {
                msg.insert("role".into(), "tool".into());
                msg.insert("content".into(), content.into());
                match m.get("tool_call_id").and_then(Value::as_str) {
                    Some(id) => {
                        msg.insert("tool_call_id".into(), id.into());
                    }
                    // A tool result answers one call (OpenAI answers 400 without the id); the
                    // deprecated `function` role names the function instead.
                    None if role == "tool" => {
                        return Err(ApiError::invalid(format!("{p}.tool_call_id"), "a tool message needs the tool_call_id of the call it answers"))
                    }
                    None => {}
                }
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{p}.role"),
                    format!("unknown role `{other}` (expected system, developer, user, assistant or tool)"),
                ))
            }
        }
        if let Some(name) = m.get("name").and_then(Value::as_str) {
            msg.insert("name".into(), name.into());
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// Assistant `tool_calls` from the history, with arguments as objects for the template.
fn history_tool_calls(calls: &Value, param: &str) -> Result<Value, ApiError> {
    let list = calls.as_array().ok_or_else(|| ApiError::invalid(param, "expected a list of tool calls"))?;
    let mut out = vec![];
    for (i, c) in list.iter().enumerate() {
        let f = c.get("function").ok_or_else(|| ApiError::invalid(format!("{param}[{i}].function"), "missing `function`"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("{param}[{i}].function.name"), "expected a string"))?;
        let args = f.get("arguments").cloned().unwrap_or_else(|| json!({}));
        out.push(json!({
            "id": c.get("id").cloned().unwrap_or(Value::Null),
            "type": "function",
            "function": {"name": name, "arguments": template_arguments(&args)},
        }));
    }
    Ok(Value::Array(out))
}

/// Checks OpenAI chat `tools` (`{"type": "function", "function": {...}}`) and returns them
/// in the template's shape.
pub(crate) fn function_tools(tools: &[Value], param: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = vec![];
    for (i, t) in tools.iter().enumerate() {
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("function");
        if ty != "function" {
            return Err(ApiError::invalid(format!("{param}[{i}].type"), format!("tool type `{ty}` is not supported (only `function`)")));
        }
        let f = t.get("function").ok_or_else(|| ApiError::invalid(format!("{param}[{i}].function"), "missing `function`"))?;
        out.push(template_tool(f, &format!("{param}[{i}].function"))?);
    }
    Ok(out)
}

/// One function schema in the template's shape (`name`, `description`, `parameters`).
pub(crate) fn template_tool(f: &Value, param: &str) -> Result<Value, ApiError> {
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid(format!("{param}.name"), "each tool needs a non-empty string `name`"))?;
    let mut func = Map::new();
    func.insert("name".into(), name.into());
    if let Some(d) = f.get("description").and_then(Value::as_str) {
        func.insert("description".into(), d.into());
    }
    match f.get("parameters").or_else(|| f.get("input_schema")) {
        None | Some(Value::Null) => {
            func.insert("parameters".into(), json!({"type": "object", "properties": {}}));
        }
        Some(p @ Value::Object(_)) => {
            func.insert("parameters".into(), p.clone());
        }
        Some(_) => return Err(ApiError::invalid(format!("{param}.parameters"), "expected a JSON schema object")),
    }
    Ok(json!({"type": "function", "function": func}))
}

/// `tool_choice`: `none` turns tool calls off; a named tool must be one of the tools.
/// `required` and named choices are enforced by a grammar ([`super::constrain`]).
pub(crate) fn tool_choice_off(choice: Option<&Value>, tools: &[Value], param: &str) -> Result<bool, ApiError> {
    let named = |name: Option<&str>| -> Result<bool, ApiError> {
        let name = name.ok_or_else(|| ApiError::invalid(param, "a named tool_choice needs the function's name"))?;
        if tools.iter().any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name)) {
            Ok(false)
        } else {
            Err(ApiError::invalid(param, format!("tool_choice names `{name}`, which is not among the tools")))
        }
    };
    match choice {
        None | Some(Value::Null) => Ok(false),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(true),
            "auto" | "required" | "any" => Ok(false),
            o => Err(ApiError::invalid(param, format!("unknown tool_choice `{o}` (none, auto, required)"))),
        },
        Some(v @ Value::Object(_)) => match v.get("type").and_then(Value::as_str) {
            Some("none") => Ok(true),
            Some("auto" | "required" | "any" | "allowed_tools") => Ok(false),
            Some("function" | "tool") => named(
                v.pointer("/function/name").or_else(|| v.get("name")).and_then(Value::as_str),
            ),
            _ => Err(ApiError::invalid(param, "unknown tool_choice object")),
        },
        Some(_) => Err(ApiError::invalid(param, "expected a string or an object")),
    }
}

pub(super) fn finish_reason(o: &Outcome) -> &'static str {
    match o.finish {
        Finish::Stop if o.tool_calls > 0 => "tool_calls",
        Finish::Stop | Finish::StopSequence(_) => "stop",
        Finish::Length => "length",
    }
}

pub(super) fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached},
    })
}

fn tool_call_json(c: &ToolCall, index: usize, id: &str) -> Value {
    json!({"index": index, "id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}})
}

fn chat_response(id: &str, model: &str, c: &Collected) -> Value {
    let text = c.text();
    let reasoning = c.reasoning();
    let calls = c.calls();
    let mut message = Map::new();
    message.insert("role".into(), "assistant".into());
    message.insert("content".into(), if text.is_empty() && !calls.is_empty() { Value::Null } else { text.into() });
    message.insert("refusal".into(), Value::Null);
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), reasoning.into());
    }
    if !calls.is_empty() {
        let list: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = tool_call_json(c, i, &new_id("call_"));
                if let Some(o) = v.as_object_mut() {
                    o.remove("index");
                }
                v
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(list));
    }
    json!({
        "id": id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(&c.outcome)}],
        "usage": usage_json(&c.outcome.usage),
        "system_fingerprint": fingerprint(),
    })
}

/// The most choices (`n`) one request may ask for: each is a sequence of its own.
pub(super) const MAX_CHOICES: u32 = 8;

/// `n` choices of one prompt, each its own sequence (submitted together, so the engine runs
/// them side by side); a given seed is offset per choice so that sampled choices differ.
async fn chat_choices(state: &AppState, id: &str, params: GenParams, n: u32, logprobs: bool) -> Result<Value, ApiError> {
    let runs = choice_runs(state, &params, n).await?;
    let (mut choices, mut outcomes, mut resp) = (vec![], vec![], Value::Null);
    for (i, run) in runs.into_iter().enumerate() {
        let c = run.collect().await?;
        let mut one = chat_response(id, &state.model_id, &c);
        let mut choice = one["choices"][0].take();
        choice["index"] = i.into();
        if logprobs {
            choice["logprobs"] = chat_logprobs(&c.logprobs);
        }
        choices.push(choice);
        outcomes.push(c.outcome);
        if i == 0 {
            resp = one;
        }
    }
    resp["choices"] = Value::Array(choices);
    resp["usage"] = usage_json(&choices_usage(&outcomes));
    Ok(resp)
}

/// The `n` runs of one prompt's choices, a given seed offset per choice so that sampled
/// choices differ.
pub(super) async fn choice_runs(state: &AppState, params: &GenParams, n: u32) -> Result<Vec<Run>, ApiError> {
    let mut runs = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut p = params.clone();
        p.sampling.seed = p.sampling.seed.map(|s| s.wrapping_add(i as u64));
        runs.push(Run::start(state, p).await?);
    }
    Ok(runs)
}

/// The usage of a request's choices: the prompt once, every choice's completion.
pub(super) fn choices_usage(outcomes: &[Outcome]) -> Usage {
    let mut u = outcomes.first().map(|o| o.usage.clone()).unwrap_or_default();
    u.completion = outcomes.iter().map(|o| o.usage.completion).sum();
    u
}

pub(super) fn fingerprint() -> String {
    concat!("ft-actor-", env!("CARGO_PKG_VERSION")).to_string()
}

/// Chat completion chunks.
pub(super) struct ChatStream {
    id: String,
    model: String,
    created: u64,
    usage: bool,
    calls: usize,
    /// Log-probabilities for the next chunk.
    logprobs: Vec<LogprobEntry>,
    /// The choice this encoder writes.
    index: usize,
    /// Whether its end closes the stream (the usage chunk and `[DONE]`): not when it is one of
    /// several choices, whose stream [`ChatStream::close`] ends.
    closes: bool,
}

/// A chat choice's `logprobs`: one entry per generated token.
fn chat_logprobs(entries: &[LogprobEntry]) -> Value {
    json!({"content": entries.iter().map(LogprobEntry::chat_json).collect::<Vec<_>>(), "refusal": null})
}

impl ChatStream {
    /// An encoder for the stream `id`; `usage` adds the final usage chunk.
    pub(super) fn new(id: String, model: String, usage: bool) -> Self {
        Self { id, model, created: unix_now(), usage, calls: 0, logprobs: vec![], index: 0, closes: true }
    }

    /// An encoder for choice `index` of several in the stream `id`.
    fn choice(id: String, model: String, usage: bool, index: usize) -> Self {
        Self { index, closes: false, ..Self::new(id, model, usage) }
    }

    /// The events that end the stream: the usage chunk (when asked for) and `[DONE]`.
    fn close(&self, usage: Option<Usage>) -> String {
        let mut s = String::new();
        if let Some(u) = usage {
            let v = json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": fingerprint(), "choices": [], "usage": usage_json(&u),
            });
            s.push_str(&sse::data(&v));
        }
        s.push_str("data: [DONE]\n\n");
        s
    }

    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> String {
        let logprobs = if self.logprobs.is_empty() { Value::Null } else { chat_logprobs(&std::mem::take(&mut self.logprobs)) };
        let mut v = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "system_fingerprint": fingerprint(),
            "choices": [{"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        });
        if self.usage {
            v["usage"] = Value::Null;
        }
        sse::data(&v)
    }
}

impl sse::Encoder for ChatStream {
    fn logprobs(&mut self, entries: Vec<LogprobEntry>) {
        self.logprobs.extend(entries);
    }

    fn start(&mut self) -> String {
        self.chunk(json!({"role": "assistant", "content": ""}), None)
    }

    fn output(&mut self, items: Vec<Parsed>) -> String {
        let mut s = String::new();
        for p in items {
            let delta = match p {
                Parsed::Reasoning(t) => json!({"reasoning_content": t}),
                Parsed::Text(t) => json!({"content": t}),
                Parsed::ToolCall(c) => {
                    let d = json!({"tool_calls": [tool_call_json(&c, self.calls, &new_id("call_"))]});
                    self.calls += 1;
                    d
                }
            };
            s.push_str(&self.chunk(delta, None));
        }
        s
    }

    fn done(&mut self, o: Outcome) -> String {
        let mut s = self.chunk(json!({}), Some(finish_reason(&o)));
        if self.closes {
            s.push_str(&self.close(self.usage.then_some(o.usage)));
        }
        s
    }

    fn failed(&mut self, e: ApiError) -> String {
        sse::data(&e.body(super::Flavor::OpenAi))
    }
}

fn model_card(state: &AppState) -> Value {
    let ctx = state.engine.info().context;
    json!({
        "id": state.model_id, "object": "model", "created": state.created, "owned_by": "ft-actor",
        "context_length": ctx, "max_model_len": ctx,
    })
}

/// `GET /v1/models`.
pub async fn list_models(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&state)]}))
}

/// `GET /v1/models/{id}` (ids may contain `/`, as Hugging Face names do).
pub async fn get_model(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, OpenAiError> {
    state.check_model(Some(&id))?;
    Ok(Json(model_card(&state)))
}
