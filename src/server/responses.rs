//! OpenAI Responses API: `POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`.
//!
//! Input items (messages, function calls and their outputs, reasoning) become template
//! messages; output comes back as `reasoning`, `message` and `function_call` items, and a
//! stream carries the Responses event sequence (`response.created` … `response.completed`).
//! Finished responses are kept in a bounded store for retrieval and `previous_response_id`.

use super::errors::OpenAiError;
use super::generation::{Collected, Finish, GenParams, Outcome, Run, SamplingOverrides, Usage};
use super::openai::{template_tool, tool_choice_off};
use super::parsers::{Parsed, ToolCall};
use super::prompt::{check_fields, content_text, not_found, parse_request, template_arguments, Conversation};
use super::store::{Store, Stored};
use super::{new_id, read_json, sse, unix_now, ApiError, AppState};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::sync::Arc;

const FIELDS: &[&str] = &[
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stream", "stream_options", "store",
    "previous_response_id", "reasoning", "text", "metadata", "user", "include", "truncation", "prompt_cache_key",
    "service_tier", "background", "max_tool_calls", "safety_identifier", "client_metadata", "top_logprobs",
    "access_programs", "background_options", "context_management", "conversation", "image", "moderation", "prompt",
    "prompt_cache_options", "prompt_cache_retention",
];

#[derive(Deserialize)]
struct Request {
    model: Option<String>,
    #[serde(default)]
    input: Value,
    instructions: Option<String>,
    #[serde(default)]
    tools: Vec<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_output_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    reasoning: Option<Value>,
    text: Option<Value>,
    metadata: Option<Value>,
    background: Option<bool>,
    truncation: Option<String>,
    conversation: Option<Value>,
    prompt: Option<Value>,
}

/// Request fields echoed in the response object.
struct Echo {
    instructions: Option<String>,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    temperature: f64,
    top_p: f64,
    max_output_tokens: Option<u32>,
    previous_response_id: Option<String>,
    reasoning: Value,
    text: Value,
    metadata: Value,
    store: bool,
    truncation: String,
}

/// What one response is being built from.
struct Ctx {
    model: String,
    store: Arc<Store>,
    id: String,
    created: u64,
    echo: Echo,
    /// Names of `custom` (free-form input) tools, whose calls are `custom_tool_call` items.
    custom: HashSet<String>,
    /// The conversation so far (without instructions), to store with the result.
    conversation: Vec<Value>,
}

/// `POST /v1/responses`.
pub async fn create(State(state): State<AppState>, body: Body) -> Result<Response, OpenAiError> {
    let body = read_json(&state, body).await?;
    check_fields(&state, &body, FIELDS, false)?;
    let req: Request = parse_request(body)?;
    state.check_model(req.model.as_deref())?;
    if req.background == Some(true) {
        return Err(ApiError::invalid("background", "background responses are not supported").into());
    }
    if req.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(ApiError::invalid("conversation", "conversations are not supported; use previous_response_id").into());
    }
    if req.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(ApiError::invalid("prompt", "stored prompt templates are not supported; send instructions and input").into());
    }
    let (tools, custom) = responses_tools(&req.tools)?;
    let tools_off = tool_choice_off(req.tool_choice.as_ref(), &tools, "tool_choice")?;
    let grammar = match super::constrain::tool_call(req.tool_choice.as_ref(), &tools, &state.format)? {
        Some(g) => Some((g, "tool_choice")),
        None => super::constrain::response_format(req.text.as_ref().and_then(|t| t.get("format")))
            .map_err(|e| ApiError { param: e.param.map(|p| p.replace("response_format", "text.format")), ..e })?
            .map(|g| (g, "text.format")),
    };
    let mut conversation = match &req.previous_response_id {
        Some(prev) => state.responses.get(prev).ok_or_else(|| not_found("response", prev))?.conversation,
        None => vec![],
    };
    conversation.extend(input_messages(&req.input)?);
    let mut messages = vec![];
    if let Some(i) = req.instructions.as_deref().filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(conversation.iter().cloned());
    let mut extra = Map::new();
    let effort = req.reasoning.as_ref().and_then(|r| r.get("effort")).and_then(Value::as_str);
    if let Some(e) = effort {
        extra.insert("reasoning_effort".into(), e.into());
    }
    // Effort "none" (or "minimal") asks for an answer without reasoning.
    // A grammar starts at the answer, too.
    let enable_thinking = (matches!(effort, Some("none" | "minimal")) || grammar.is_some()).then_some(false);
    // Strict tools under `auto`: only the calls are held to their schemas.
    let grammar = match (grammar, tools_off) {
        (None, false) => super::constrain::strict_calls(&req.tools, &tools, &state.format).map(|g| (g, "tools")),
        (g, _) => g,
    };
    let conv = Conversation { messages, tools, tools_off, enable_thinking, extra };
    let prompt = conv.clone().render(&state).await?;
    let params = GenParams {
        prompt: prompt.ids.clone(),
        max_tokens: super::wire::max_tokens(req.max_output_tokens, "max_output_tokens")?,
        sampling: SamplingOverrides {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: super::wire::top_k(req.top_k)?,
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
            seed: super::wire::seed(req.seed),
            ..Default::default()
        }
        .apply(&state.sampling),
        stop: vec![],
        ignore_eos: false,
        parser: conv.parser_options(&state, &prompt),
        logprobs: None,
        grammar,
    };
    let run = Run::start(&state, params).await?;
    let echo = Echo {
        instructions: req.instructions,
        tools: req.tools,
        tool_choice: req.tool_choice.unwrap_or_else(|| "auto".into()),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        temperature: short_f64(req.temperature.unwrap_or(state.sampling.temperature)),
        top_p: short_f64(req.top_p.unwrap_or(state.sampling.top_p)),
        max_output_tokens: req.max_output_tokens,
        previous_response_id: req.previous_response_id,
        reasoning: req.reasoning.unwrap_or_else(|| json!({"effort": null, "summary": null})),
        text: req.text.unwrap_or_else(|| json!({"format": {"type": "text"}})),
        metadata: req.metadata.unwrap_or_else(|| json!({})),
        store: req.store.unwrap_or(true),
        truncation: req.truncation.unwrap_or_else(|| "disabled".into()),
    };
    let store = state.responses.clone();
    let ctx = Ctx { model: state.model_id.clone(), store, id: new_id("resp_"), created: unix_now(), echo, custom, conversation };
    if req.stream.unwrap_or(false) {
        let enc = Stream { ctx, seq: 0, open: None, output: vec![] };
        return Ok(sse::response(run, enc));
    }
    let c = run.collect().await?;
    let output = collected_items(&ctx, &c);
    Ok(Json(ctx.finish(output, &c.outcome)).into_response())
}

/// `GET /v1/responses/{id}`.
pub async fn retrieve(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, OpenAiError> {
    Ok(Json(state.responses.get(&id).ok_or_else(|| not_found("response", &id))?.response))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, OpenAiError> {
    if !state.responses.remove(&id) {
        return Err(not_found("response", &id).into());
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})))
}

/// Function tools in the template's shape; `custom` tools become functions taking one
/// string `input`. Hosted tools (web search, file search...) do not exist here and are
/// left out, so clients that always send them keep working.
pub(super) fn responses_tools(tools: &[Value]) -> Result<(Vec<Value>, HashSet<String>), ApiError> {
    let (mut out, mut custom) = (vec![], HashSet::new());
    for (i, t) in tools.iter().enumerate() {
        let p = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => out.push(template_tool(t.get("function").unwrap_or(t), &p)?),
            Some("custom") => {
                let name = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
                let name = name.ok_or_else(|| ApiError::invalid(format!("{p}.name"), "each tool needs a name"))?;
                let desc = t.get("description").and_then(Value::as_str).unwrap_or("");
                out.push(json!({"type": "function", "function": {
                    "name": name, "description": desc,
                    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
                }}));
                custom.insert(name.to_string());
            }
            Some(other) => tracing::debug!("responses: tool type `{other}` is not available here; left out"),
            None => return Err(ApiError::invalid(format!("{p}.type"), "each tool needs a `type`")),
        }
    }
    Ok((out, custom))
}

/// Responses `input` → template messages (without the instructions).
pub(super) fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::Null => return Ok(vec![]),
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => return Err(ApiError::invalid("input", "expected a string or a list of input items")),
    };
    let mut out: Vec<Value> = vec![];
    let mut reasoning = String::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("input[{i}]");
        let ty = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match ty {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                let role = match role {
                    "user" | "assistant" => role,
                    "system" | "developer" => "system",
                    o => return Err(ApiError::invalid(format!("{p}.role"), format!("unknown role `{o}`"))),
                };
                let content = content_text(item.get("content"), &format!("{p}.content"))?;
                let mut m = json!({"role": role, "content": content});
                if role == "assistant" && !reasoning.is_empty() {
                    m["reasoning_content"] = std::mem::take(&mut reasoning).into();
                }
                out.push(m);
            }
            "function_call" | "custom_tool_call" => {
                let name = item.get("name").and_then(Value::as_str);
                let name = name.ok_or_else(|| ApiError::invalid(format!("{p}.name"), "a function call needs a name"))?;
                let args = if ty == "custom_tool_call" {
                    json!({"input": item.get("input").and_then(Value::as_str).unwrap_or("")})
                } else {
                    template_arguments(item.get("arguments").unwrap_or(&json!({})))
                };
                let call = json!({"id": item.get("call_id").cloned().unwrap_or(Value::Null), "type": "function",
                    "function": {"name": name, "arguments": args}});
                // Calls following an assistant turn belong to it (one turn, several calls).
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    },
                    _ => {
                        let mut m = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        if !reasoning.is_empty() {
                            m["reasoning_content"] = std::mem::take(&mut reasoning).into();
                        }
                        out.push(m);
                    }
                }
            }
            "function_call_output" | "custom_tool_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(Some(v), &format!("{p}.output"))?,
                    Some(v) => v.to_string(),
                    None => return Err(ApiError::invalid(format!("{p}.output"), "a function call output needs `output`")),
                };
                out.push(json!({"role": "tool", "tool_call_id": item.get("call_id").cloned().unwrap_or(Value::Null), "content": output}));
            }
            "reasoning" => {
                for key in ["content", "summary"] {
                    for part in item.get(key).and_then(Value::as_array).into_iter().flatten() {
                        if let Some(t) = part.get("text").and_then(Value::as_str) {
                            reasoning.push_str(t);
                        }
                    }
                    if !reasoning.is_empty() {
                        break;
                    }
                }
            }
            "item_reference" => {
                return Err(ApiError::invalid(format!("{p}.type"), "item references are not supported; send the items themselves"))
            }
            o => return Err(ApiError::invalid(format!("{p}.type"), format!("input items of type `{o}` are not supported"))),
        }
    }
    Ok(out)
}

impl Ctx {
    fn response(&self, status: &str, output: &[Value], outcome: Option<&Outcome>) -> Value {
        let e = &self.echo;
        let usage = outcome.map(|o| usage_json(&o.usage));
        let incomplete = outcome.filter(|o| o.finish == Finish::Length).map(|_| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": null, "incomplete_details": incomplete, "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens, "model": self.model, "output": output,
            "parallel_tool_calls": e.parallel_tool_calls, "previous_response_id": e.previous_response_id,
            "reasoning": e.reasoning, "store": e.store, "temperature": e.temperature,
            "text": e.text, "tool_choice": e.tool_choice, "tools": e.tools,
            "top_p": e.top_p, "truncation": e.truncation,
            "usage": usage, "metadata": e.metadata,
        })
    }

    /// The final response object; stored when `store` is on.
    fn finish(&self, output: Vec<Value>, o: &Outcome) -> Value {
        let status = if o.finish == Finish::Length { "incomplete" } else { "completed" };
        let resp = self.response(status, &output, Some(o));
        if self.echo.store {
            let mut conversation = self.conversation.clone();
            conversation.extend(output_messages(&output));
            self.store.put(self.id.clone(), Stored { response: resp.clone(), conversation });
        }
        resp
    }

    fn call_item(&self, c: &ToolCall, status: &str) -> Value {
        let call_id = new_id("call_");
        if self.custom.contains(&c.name) {
            let input = c.arguments.get("input").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| c.arguments_json());
            return json!({"id": new_id("ctc_"), "type": "custom_tool_call", "status": status, "call_id": call_id, "name": c.name, "input": input});
        }
        json!({"id": new_id("fc_"), "type": "function_call", "status": status, "call_id": call_id, "name": c.name, "arguments": c.arguments_json()})
    }
}

/// `0.6f32` as `0.6`, not `0.6000000238418579`.
fn short_f64(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt + u.completion,
    })
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"id": id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "type": "message", "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

fn collected_items(ctx: &Ctx, c: &Collected) -> Vec<Value> {
    c.items
        .iter()
        .map(|p| match p {
            Parsed::Reasoning(t) => reasoning_item(&new_id("rs_"), t),
            Parsed::Text(t) => message_item(&new_id("msg_"), t, "completed"),
            Parsed::ToolCall(call) => ctx.call_item(call, "completed"),
        })
        .collect()
}

/// Output items → template messages, so a follow-up with `previous_response_id` sees them.
fn output_messages(output: &[Value]) -> Vec<Value> {
    let mut msg = json!({"role": "assistant", "content": ""});
    let mut calls = vec![];
    for item in output {
        match item["type"].as_str() {
            Some("reasoning") => msg["reasoning_content"] = item.pointer("/content/0/text").cloned().unwrap_or_default(),
            Some("message") => msg["content"] = item.pointer("/content/0/text").cloned().unwrap_or_default(),
            Some("function_call") => calls.push(json!({"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": template_arguments(&item["arguments"])}})),
            Some("custom_tool_call") => calls.push(json!({"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": {"input": item["input"]}}})),
            _ => {}
        }
    }
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    vec![msg]
}

/// The item being streamed.
enum Open {
    Reasoning { index: usize, id: String, text: String },
    Message { index: usize, id: String, text: String },
}

/// Responses stream events.
pub(super) struct Stream {
    ctx: Ctx,
    seq: u64,
    open: Option<Open>,
    output: Vec<Value>,
}

impl Stream {
    /// An encoder with default request fields, storing into `store` (for tests).
    #[cfg(test)]
    pub(super) fn for_test(model: &str, store: Arc<Store>, custom: &[&str]) -> Self {
        let echo = Echo {
            instructions: None,
            tools: vec![],
            tool_choice: "auto".into(),
            parallel_tool_calls: true,
            temperature: 1.0,
            top_p: 1.0,
            max_output_tokens: None,
            previous_response_id: None,
            reasoning: Value::Null,
            text: Value::Null,
            metadata: json!({}),
            store: true,
            truncation: "disabled".into(),
        };
        let custom = custom.iter().map(|c| c.to_string()).collect();
        let ctx = Ctx { model: model.into(), store, id: new_id("resp_"), created: 0, echo, custom, conversation: vec![] };
        Stream { ctx, seq: 0, open: None, output: vec![] }
    }

    fn event(&mut self, ty: &str, mut data: Value) -> String {
        data["type"] = ty.into();
        data["sequence_number"] = self.seq.into();
        self.seq += 1;
        sse::named(ty, &data)
    }

    fn close(&mut self) -> String {
        let mut s = String::new();
        match self.open.take() {
            None => {}
            Some(Open::Reasoning { index, id, text }) => {
                s += &self.event("response.reasoning_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}));
                let item = reasoning_item(&id, &text);
                s += &self.event("response.output_item.done", json!({"output_index": index, "item": item}));
                self.output.push(item);
            }
            Some(Open::Message { index, id, text }) => {
                s += &self.event("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                s += &self.event("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}));
                let item = message_item(&id, &text, "completed");
                s += &self.event("response.output_item.done", json!({"output_index": index, "item": item}));
                self.output.push(item);
            }
        }
        s
    }

    fn reasoning(&mut self, t: String) -> String {
        let mut s = String::new();
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            s += &self.close();
            let (index, id) = (self.output.len(), new_id("rs_"));
            let item = json!({"id": id, "type": "reasoning", "summary": [], "content": []});
            s += &self.event("response.output_item.added", json!({"output_index": index, "item": item}));
            self.open = Some(Open::Reasoning { index, id, text: String::new() });
        }
        if let Some(Open::Reasoning { index, id, text }) = &mut self.open {
            text.push_str(&t);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t});
            s += &self.event("response.reasoning_text.delta", data);
        }
        s
    }

    fn text(&mut self, t: String) -> String {
        let mut s = String::new();
        if !matches!(self.open, Some(Open::Message { .. })) {
            s += &self.close();
            let (index, id) = (self.output.len(), new_id("msg_"));
            let item = json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
            s += &self.event("response.output_item.added", json!({"output_index": index, "item": item}));
            let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            s += &self.event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}));
            self.open = Some(Open::Message { index, id, text: String::new() });
        }
        if let Some(Open::Message { index, id, text }) = &mut self.open {
            text.push_str(&t);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []});
            s += &self.event("response.output_text.delta", data);
        }
        s
    }

    fn call(&mut self, c: ToolCall) -> String {
        let mut s = self.close();
        let index = self.output.len();
        let done = self.ctx.call_item(&c, "completed");
        let id = done["id"].clone();
        let mut added = done.clone();
        added["status"] = "in_progress".into();
        if done["type"] == "function_call" {
            added["arguments"] = "".into();
            s += &self.event("response.output_item.added", json!({"output_index": index, "item": added}));
            let args = done["arguments"].clone();
            s += &self.event("response.function_call_arguments.delta", json!({"item_id": id, "output_index": index, "delta": args}));
            s += &self.event("response.function_call_arguments.done", json!({"item_id": id, "output_index": index, "arguments": args, "name": done["name"]}));
        } else {
            added["input"] = "".into();
            s += &self.event("response.output_item.added", json!({"output_index": index, "item": added}));
            let input = done["input"].clone();
            s += &self.event("response.custom_tool_call_input.delta", json!({"item_id": id, "output_index": index, "delta": input}));
            s += &self.event("response.custom_tool_call_input.done", json!({"item_id": id, "output_index": index, "input": input}));
        }
        s += &self.event("response.output_item.done", json!({"output_index": index, "item": done}));
        self.output.push(done);
        s
    }
}

impl sse::Encoder for Stream {
    fn start(&mut self) -> String {
        let resp = self.ctx.response("in_progress", &[], None);
        let mut s = self.event("response.created", json!({"response": resp}));
        s += &self.event("response.in_progress", json!({"response": resp}));
        s
    }

    fn output(&mut self, items: Vec<Parsed>) -> String {
        let mut s = String::new();
        for p in items {
            s += &match p {
                Parsed::Reasoning(t) => self.reasoning(t),
                Parsed::Text(t) => self.text(t),
                Parsed::ToolCall(c) => self.call(c),
            };
        }
        s
    }

    fn done(&mut self, o: Outcome) -> String {
        let mut s = self.close();
        let output = std::mem::take(&mut self.output);
        let resp = self.ctx.finish(output, &o);
        let ty = if o.finish == Finish::Length { "response.incomplete" } else { "response.completed" };
        s += &self.event(ty, json!({"response": resp}));
        s
    }

    fn failed(&mut self, e: ApiError) -> String {
        let mut resp = self.ctx.response("failed", &self.output, None);
        resp["error"] = json!({"code": "server_error", "message": e.message});
        let mut s = self.event("error", json!({"code": "server_error", "message": e.message, "param": null}));
        s += &self.event("response.failed", json!({"response": resp}));
        s
    }
}
