//! The router without a socket: malformed and hostile requests get the right status and
//! each API's own error shape, and the server keeps serving; plus the shapes of the
//! operations routes. The engine is the demo model (random weights: shapes, not content).


use axum::body::Body;
use axum::http::{Request, StatusCode};
use ft_actor::server::{app, AppState, ServerSettings, ToolParser};
use serde_json::{json, Value};
use crate::server_common::test_engine_config;
use std::sync::OnceLock;
use tower::ServiceExt;

struct Fixture {
    rt: tokio::runtime::Runtime,
    open: AppState,
    keyed: AppState,
    /// `max_tokens_limit` 4.
    capped: AppState,
    /// The demo model's tool calls read (and forced) in each family's markup.
    markups: Vec<(ToolParser, AppState)>,
}

/// One engine for the whole file (model loading is the slow part), two server states on it.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let (open, keyed, capped, markups) = rt.block_on(async {
            let engine = ft_actor::engine::Engine::spawn(test_engine_config(), None).await.expect("engine");
            let small = ServerSettings { max_body_bytes: 64 * 1024, ..ServerSettings::default() };
            let open = AppState::new(engine.clone(), small).expect("state");
            let keyed = AppState::new(engine.clone(), ServerSettings { api_key: Some("s3cret".into()), ..ServerSettings::default() })
                .expect("state");
            let capped = AppState::new(engine.clone(), ServerSettings { max_tokens_limit: Some(4), ..ServerSettings::default() }).expect("state");
            let markups = [ToolParser::Deepseek, ToolParser::Kimi, ToolParser::Mistral, ToolParser::Minimax, ToolParser::DeepseekDsml]
                .into_iter()
                .map(|p| (p, AppState::new(engine.clone(), ServerSettings { tool_parser: p, ..ServerSettings::default() }).expect("state")))
                .collect();
            (open, keyed, capped, markups)
        });
        Fixture { rt, open, keyed, capped, markups }
    })
}

struct Out {
    status: StatusCode,
    body: Value,
    text: String,
}

fn call_with(state: &AppState, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Out {
    let f = fixture();
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Body::from(body)).expect("request");
    let router = app(state.clone());
    f.rt.block_on(async move {
        let resp = router.oneshot(req).await.expect("infallible");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Out { status, body, text }
    })
}

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

fn post(path: &str, body: &Value) -> Out {
    call_with(&fixture().open, "POST", path, JSON, body.to_string().into_bytes())
}

fn post_raw(path: &str, body: &[u8]) -> Out {
    call_with(&fixture().open, "POST", path, &[("content-type", "application/json")], body.to_vec())
}

fn get(path: &str) -> Out {
    call_with(&fixture().open, "GET", path, &[], vec![])
}

/// OpenAI error shape with this status and (when given) this `param`.
fn openai_error(o: &Out, status: u16, param: Option<&str>) {
    assert_eq!(o.status.as_u16(), status, "{}", o.text);
    let e = &o.body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", o.text);
    assert!(e["type"].is_string(), "{}", o.text);
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{}", o.text);
    if let Some(p) = param {
        assert_eq!(e["param"].as_str(), Some(p), "{}", o.text);
    }
}

/// Anthropic error shape with this status and error type.
fn anthropic_error(o: &Out, status: u16, ty: &str) {
    assert_eq!(o.status.as_u16(), status, "{}", o.text);
    assert_eq!(o.body["type"], "error", "{}", o.text);
    assert_eq!(o.body["error"]["type"], ty, "{}", o.text);
    assert!(o.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", o.text);
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"model": "ft-actor-demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    b
}

fn message(extra: Value) -> Value {
    let mut b = json!({"model": "ft-actor-demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    b
}

/// The server still answers a normal request (after each hostile one).
fn still_serving() {
    let o = post("/v1/chat/completions", &chat(json!({})));
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["object"], "chat.completion");
}

#[test]
fn malformed_and_hostile_requests() {
    // 1. Bad JSON.
    openai_error(&post_raw("/v1/chat/completions", b"{\"model\": "), 400, Some("body"));
    anthropic_error(&post_raw("/v1/messages", b"not json"), 400, "invalid_request_error");
    // 2. Wrong types.
    openai_error(&post("/v1/chat/completions", &chat(json!({"temperature": "hot"}))), 400, Some("temperature"));
    openai_error(&post("/v1/chat/completions", &chat(json!({"messages": "hello"}))), 400, Some("messages"));
    anthropic_error(&post("/v1/messages", &message(json!({"max_tokens": "many"}))), 400, "invalid_request_error");
    // 3. Unknown fields (the real APIs reject them too)...
    openai_error(&post("/v1/chat/completions", &chat(json!({"frobnicate": true}))), 400, Some("frobnicate"));
    anthropic_error(&post("/v1/messages", &message(json!({"frobnicate": true}))), 400, "invalid_request_error");
    // ...except Anthropic beta requests, whose new fields the server cannot know yet.
    let beta = call_with(
        &fixture().open,
        "POST",
        "/v1/messages",
        &[("content-type", "application/json"), ("anthropic-beta", "context-management-2025-06-27")],
        message(json!({"context_management": {"edits": []}, "some_future_field": 1})).to_string().into_bytes(),
    );
    assert_eq!(beta.status, StatusCode::OK, "{}", beta.text);
    // 4. Huge max_tokens: not an integer that fits → 400 naming the field.
    openai_error(&post("/v1/chat/completions", &chat(json!({"max_tokens": 1e300}))), 400, Some("max_tokens"));
    openai_error(&post_raw("/v1/chat/completions", br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":99999999999999999999}"#), 400, None);
    openai_error(&post("/v1/chat/completions", &chat(json!({"max_tokens": -5}))), 400, Some("max_tokens"));
    openai_error(&post("/v1/chat/completions", &chat(json!({"max_tokens": 0}))), 400, Some("max_tokens"));
    // 5. Empty messages / missing required fields.
    openai_error(&post("/v1/chat/completions", &chat(json!({"messages": []}))), 400, Some("messages"));
    anthropic_error(&post("/v1/messages", &message(json!({"messages": []}))), 400, "invalid_request_error");
    let no_max = post("/v1/messages", &json!({"model": "ft-actor-demo", "messages": [{"role": "user", "content": "x"}]}));
    anthropic_error(&no_max, 400, "invalid_request_error");
    assert!(no_max.body["error"]["message"].as_str().unwrap_or("").starts_with("max_tokens"), "{}", no_max.text);
    openai_error(&post("/v1/chat/completions", &chat(json!({"messages": [{"content": "no role"}]}))), 400, Some("messages[0].role"));
    // 6. Oversized body (the fixture's limit is 64 KiB).
    let big = chat(json!({"messages": [{"role": "user", "content": "x".repeat(100 * 1024)}]}));
    openai_error(&post("/v1/chat/completions", &big), 413, None);
    anthropic_error(&post("/v1/messages", &message(json!({"system": "y".repeat(100 * 1024)}))), 413, "request_too_large");
    // 7. Unknown model → 404 in each API's shape.
    let o = post("/v1/chat/completions", &chat(json!({"model": "gpt-9"})));
    openai_error(&o, 404, None);
    assert_eq!(o.body["error"]["code"], "model_not_found");
    anthropic_error(&post("/v1/messages", &message(json!({"model": "claude-opus-9"}))), 404, "not_found_error");
    // 8. Unknown route → 404, in the Anthropic shape when the client speaks Anthropic.
    openai_error(&get("/v1/nothing"), 404, None);
    let o = call_with(&fixture().open, "POST", "/v1/messages/nothing", &[("anthropic-version", "2023-06-01")], b"{}".to_vec());
    anthropic_error(&o, 404, "not_found_error");
    // 9. Prompt longer than the context (1024 tokens here) → 400 that agents recognise.
    let long = "word ".repeat(3000);
    let o = post("/v1/chat/completions", &chat(json!({"messages": [{"role": "user", "content": long}]})));
    openai_error(&o, 400, Some("messages"));
    assert_eq!(o.body["error"]["code"], "context_length_exceeded");
    let o = post("/v1/messages", &message(json!({"messages": [{"role": "user", "content": long}]})));
    anthropic_error(&o, 400, "invalid_request_error");
    assert!(o.body["error"]["message"].as_str().unwrap_or("").contains("prompt is too long"), "{}", o.text);
    // 10. Out-of-range sampling, unsupported features, bad roles, images.
    openai_error(&post("/v1/chat/completions", &chat(json!({"top_p": 0}))), 400, Some("top_p"));
    openai_error(&post("/v1/chat/completions", &chat(json!({"n": 0}))), 400, Some("n"));
    openai_error(&post("/v1/chat/completions", &chat(json!({"messages": [{"role": "wizard", "content": "x"}]}))), 400, Some("messages[0].role"));
    let img = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]});
    openai_error(&post("/v1/chat/completions", &chat(img)), 400, Some("messages[0].content[0]"));
    let tc = json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}});
    openai_error(&post("/v1/chat/completions", &chat(tc)), 400, Some("tool_choice"));
    openai_error(&post("/v1/completions", &json!({"prompt": [1, 2, 999_999], "max_tokens": 2})), 400, Some("prompt"));
    openai_error(&post("/v1/responses", &json!({"input": [{"type": "item_reference", "id": "x"}]})), 400, Some("input[0].type"));
    // 11. Non-object bodies and empty bodies.
    openai_error(&post_raw("/v1/chat/completions", b"[1,2,3]"), 400, Some("body"));
    openai_error(&post_raw("/v1/responses", b""), 400, Some("body"));
    // 12. Unknown stored response.
    openai_error(&get("/v1/responses/resp_missing"), 404, None);
    // 13. Bad cache resize.
    openai_error(&post("/v1/cache/resize", &json!({"slots": -1})), 400, Some("slots"));
    // 14. A route asked with the wrong method → 405 with a body in the API's shape.
    openai_error(&get("/v1/chat/completions"), 405, None);
    anthropic_error(&get("/v1/messages"), 405, "invalid_request_error");
    // 15. A tool result without the id of the call it answers.
    let calls = json!([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]);
    let no_id = json!({"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "content": "42"},
    ]});
    openai_error(&post("/v1/chat/completions", &chat(no_id)), 400, Some("messages[2].tool_call_id"));

    still_serving();
}

#[test]
fn api_key_is_checked_in_each_apis_shape() {
    let f = fixture();
    let body = chat(json!({})).to_string().into_bytes();
    let ct = ("content-type", "application/json");
    let o = call_with(&f.keyed, "POST", "/v1/chat/completions", &[ct], body.clone());
    openai_error(&o, 401, None);
    let o = call_with(&f.keyed, "POST", "/v1/chat/completions", &[ct, ("authorization", "Bearer wrong")], body.clone());
    openai_error(&o, 401, None);
    let o = call_with(&f.keyed, "POST", "/v1/messages", &[ct, ("x-api-key", "nope")], message(json!({})).to_string().into_bytes());
    anthropic_error(&o, 401, "authentication_error");
    let o = call_with(&f.keyed, "POST", "/v1/chat/completions", &[ct, ("authorization", "Bearer s3cret")], body);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let o = call_with(&f.keyed, "POST", "/v1/messages", &[ct, ("x-api-key", "s3cret")], message(json!({})).to_string().into_bytes());
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    // Health needs no key (probes and `launch` use it).
    assert_eq!(call_with(&f.keyed, "GET", "/health", &[], vec![]).status, StatusCode::OK);
}

#[test]
fn operations_routes() {
    let h = get("/health");
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.body["status"], "ok");
    let m = get("/v1/models");
    assert_eq!(m.body["object"], "list");
    assert_eq!(m.body["data"][0]["id"], "ft-actor-demo");
    assert_eq!(m.body["data"][0]["context_length"], 1024);
    assert_eq!(get("/v1/models/ft-actor-demo").body["id"], "ft-actor-demo");
    still_serving();
    let metrics = get("/metrics");
    assert_eq!(metrics.status, StatusCode::OK);
    for name in ["ft_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}", "ft_expert_cache_hit_rate", "ft_prompt_tokens_reused_total", "ft_requests_waiting", "ft_decode_tokens_per_second", "ft_expert_bytes_moved_total"] {
        assert!(metrics.text.contains(name), "metrics lack {name}:\n{}", metrics.text);
    }
    let st = get("/v1/cache/status");
    assert_eq!(st.status, StatusCode::OK, "{}", st.text);
    assert!(st.body["slots"].is_u64() && st.body["hit_rate"].is_number() && st.body["layers"].is_array(), "{}", st.text);
    let slots = st.body["slots"].as_u64().unwrap_or(0);
    let r = post("/v1/cache/resize", &json!({"slots": slots}));
    assert!(r.status == StatusCode::OK || r.status == StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    if r.status == StatusCode::OK {
        assert!(r.body["slots"].is_u64(), "{}", r.text);
    }
}

#[test]
fn count_tokens_sees_system_tools_and_drops_the_billing_header() {
    let base = json!({"model": "ft-actor-demo", "messages": [{"role": "user", "content": "What is the weather?"}]});
    let plain = post("/v1/messages/count_tokens", &base);
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text);
    let n = plain.body["input_tokens"].as_u64().expect("input_tokens");
    let mut with_tools = base.clone();
    with_tools["tools"] = json!([{"name": "get_weather", "description": "Weather for a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let t = post("/v1/messages/count_tokens", &with_tools).body["input_tokens"].as_u64().expect("n");
    assert!(t > n + 10, "tools are rendered into the prompt by the chat template ({t} vs {n})");
    let mut billed = base.clone();
    billed["system"] = json!([{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0; cch=abcdef;"}]);
    let b = post("/v1/messages/count_tokens", &billed).body["input_tokens"].as_u64().expect("n");
    assert_eq!(b, n, "the billing header block is dropped");
}

#[test]
fn current_claude_code_requests_are_accepted() {
    // What Claude Code 2.1 sends: system entries inside `messages`, adaptive thinking,
    // context-management edits, output_config, metadata, cache_control on blocks.
    let body = json!({
        "model": "ft-actor-demo", "max_tokens": 4, "stream": false,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "The user is in /tmp."},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "greet", "signature": "x"}, {"type": "text", "text": "hi"}]},
            {"role": "user", "content": "again"},
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        ],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "metadata": {"user_id": "u"},
    });
    let o = post("/v1/messages", &body);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["type"], "message");
    // The system entries reach the prompt (joined to the system prompt, in order).
    let count = |b: &Value| post("/v1/messages/count_tokens", b).body["input_tokens"].as_u64().expect("input_tokens");
    let mut without = body.clone();
    for k in ["max_tokens", "stream", "metadata"] {
        without.as_object_mut().unwrap().remove(k);
    }
    let with_n = count(&without);
    without["messages"] = json!([body["messages"][0], body["messages"][2], body["messages"][3]]);
    assert!(with_n > count(&without), "system entries are rendered");
    let bad = post("/v1/messages", &message(json!({"thinking": {"type": "sometimes"}})));
    anthropic_error(&bad, 400, "invalid_request_error");
    assert!(bad.text.contains("thinking.type"), "{}", bad.text);
}

#[test]
fn logit_bias_and_penalties_reach_the_sampler() {
    let tok = fixture().open.tokenizer.clone();
    let id = tok.encode("hello", false).expect("encode")[0];
    let forced = tok.decode(&[id, id, id], false).expect("decode");
    let body = json!({"model": "ft-actor-demo", "prompt": "x", "max_tokens": 3, "ignore_eos": true, "logit_bias": {id.to_string(): 100}});
    let o = post("/v1/completions", &body);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["choices"][0]["text"], forced.as_str(), "a +100 bias forces the token");
    // With a presence penalty the forced token still wins (100 − 2), and the request is valid.
    let mut pen = body.clone();
    pen["presence_penalty"] = json!(2.0);
    pen["frequency_penalty"] = json!(-1.5);
    assert_eq!(post("/v1/completions", &pen).body["choices"][0]["text"], forced.as_str());
    let mut chat = chat(json!({"logit_bias": {id.to_string(): 100}, "max_tokens": 2, "ignore_eos": true}));
    chat["messages"] = json!([{"role": "user", "content": "hi"}]);
    let o = post("/v1/chat/completions", &chat);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["choices"][0]["message"]["content"], tok.decode(&[id, id], false).expect("decode").as_str());
    openai_error(&post("/v1/completions", &json!({"prompt": "x", "logit_bias": {"99999999": 1}})), 400, Some("logit_bias.99999999"));
    openai_error(&post("/v1/completions", &json!({"prompt": "x", "logit_bias": {"abc": 1}})), 400, Some("logit_bias.abc"));
    openai_error(&post("/v1/completions", &json!({"prompt": "x", "logit_bias": {"1": 101}})), 400, Some("logit_bias.1"));
    openai_error(&post("/v1/completions", &json!({"prompt": "x", "presence_penalty": 3})), 400, Some("presence_penalty"));
}

#[test]
fn logprobs_are_reported_in_each_apis_shape() {
    let mut body = chat(json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 5, "temperature": 0, "ignore_eos": true}));
    body["messages"] = json!([{"role": "user", "content": "hi"}]);
    let o = post("/v1/chat/completions", &body);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let content = o.body["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content").clone();
    assert_eq!(content.len() as u64, o.body["usage"]["completion_tokens"].as_u64().expect("usage"));
    for e in &content {
        let lp = e["logprob"].as_f64().expect("logprob");
        let top = e["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 2);
        assert!(lp <= 0.0 && top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(), "{e}");
        // Greedy: the chosen token is the most likely one.
        assert!((lp - top[0]["logprob"].as_f64().unwrap()).abs() < 1e-6, "{e}");
        assert_eq!(e["bytes"].as_array().map(Vec::len), e["token"].as_str().map(str::len));
    }
    let text: String = content.iter().map(|e| e["token"].as_str().unwrap().to_string()).collect();
    // (The reply's leading whitespace is trimmed; the tokens keep it.)
    assert_eq!(o.body["choices"][0]["message"]["content"].as_str(), Some(text.trim_start()), "the tokens spell the text");
    // Without the flag: null, as OpenAI answers.
    body.as_object_mut().unwrap().remove("top_logprobs");
    body["logprobs"] = json!(false);
    assert!(post("/v1/chat/completions", &body).body["choices"][0]["logprobs"].is_null());

    let o = post("/v1/completions", &json!({"prompt": "x", "max_tokens": 4, "logprobs": 3, "ignore_eos": true, "temperature": 0}));
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let lp = &o.body["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().map(Vec::len), Some(4));
    assert!(lp["top_logprobs"].as_array().expect("top").iter().all(|t| t.as_object().is_some_and(|m| !m.is_empty() && m.len() <= 3)));
    let offsets: Vec<u64> = lp["text_offset"].as_array().expect("offsets").iter().map(|v| v.as_u64().unwrap()).collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0, "{offsets:?}");

    openai_error(&post("/v1/chat/completions", &chat(json!({"top_logprobs": 3}))), 400, Some("top_logprobs"));
    openai_error(&post("/v1/chat/completions", &chat(json!({"logprobs": true, "top_logprobs": 21}))), 400, Some("top_logprobs"));
}

/// A weather tool whose arguments are finite (an enum and a bounded integer): a random
/// model under the grammar must still end them.
fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false}}})
}

fn assert_weather_args(args: &Value) {
    assert!(["Paris", "Rome", "Oslo"].contains(&args["city"].as_str().unwrap_or("")), "{args}");
    assert!(args["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)), "{args}");
    assert_eq!(args.as_object().map(|o| o.len()), Some(2), "{args}");
}

#[test]
fn forced_tool_calls_and_json_schemas_are_obeyed_by_a_random_model() {
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "get_weather"}})] {
        let mut body = chat(json!({"tools": [weather_tool(), {"type": "function", "function": {"name": "other", "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}],
            "tool_choice": choice, "max_tokens": 200}));
        body["messages"] = json!([{"role": "user", "content": "weather?"}]);
        let o = post("/v1/chat/completions", &body);
        assert_eq!(o.status, StatusCode::OK, "{}", o.text);
        let c = &o.body["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{}", o.text);
        let call = &c["message"]["tool_calls"][0]["function"];
        if choice.is_object() {
            assert_eq!(call["name"], "get_weather");
        }
        if call["name"] == "get_weather" {
            let args: Value = serde_json::from_str(call["arguments"].as_str().expect("arguments string")).expect("arguments are JSON");
            assert_weather_args(&args);
        }
    }
    // Anthropic: tool_choice `tool`.
    let body = message(json!({"tools": [{"name": "get_weather", "description": "Weather", "input_schema": weather_tool()["function"]["parameters"]}],
        "tool_choice": {"type": "tool", "name": "get_weather"}, "max_tokens": 200}));
    let o = post("/v1/messages", &body);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["stop_reason"], "tool_use", "{}", o.text);
    let block = o.body["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").expect("a tool_use block").clone();
    assert_eq!(block["name"], "get_weather");
    assert_weather_args(&block["input"]);
    // A JSON schema response.
    let schema = weather_tool()["function"]["parameters"].clone();
    let mut body = chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": true}}, "max_tokens": 200}));
    body["messages"] = json!([{"role": "user", "content": "weather?"}]);
    let o = post("/v1/chat/completions", &body);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["choices"][0]["finish_reason"], "stop", "{}", o.text);
    let v: Value = serde_json::from_str(o.body["choices"][0]["message"]["content"].as_str().unwrap()).expect("the reply is JSON");
    assert_weather_args(&v);
    // The Responses API: text.format and a named function.
    let o = post("/v1/responses", &json!({"input": "weather?", "max_output_tokens": 200,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": true}}}));
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let text = o.body["output"].as_array().unwrap().iter().find(|i| i["type"] == "message").expect("message")["content"][0]["text"].clone();
    assert_weather_args(&serde_json::from_str(text.as_str().unwrap()).expect("JSON reply"));
    let f = weather_tool()["function"].clone();
    let o = post("/v1/responses", &json!({"input": "weather?", "max_output_tokens": 200,
        "tools": [{"type": "function", "name": "get_weather", "parameters": f["parameters"]}], "tool_choice": {"type": "function", "name": "get_weather"}}));
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let call = o.body["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").expect("a function call").clone();
    assert_eq!(call["name"], "get_weather");
    assert_weather_args(&serde_json::from_str(call["arguments"].as_str().unwrap()).expect("JSON arguments"));
    let bad = post("/v1/responses", &json!({"input": "x", "text": {"format": {"type": "yaml"}}}));
    openai_error(&bad, 400, Some("text.format.type"));
    // Bad schemas and unknown formats are 400s naming the field.
    let mut bad = chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "frobnicate"}}}}));
    bad["messages"] = json!([{"role": "user", "content": "x"}]);
    openai_error(&post("/v1/chat/completions", &bad), 400, Some("response_format"));
    openai_error(&post("/v1/chat/completions", &chat(json!({"response_format": {"type": "yaml"}}))), 400, Some("response_format.type"));
}

/// An operator's `max_tokens_limit` clamps what a client asks for (agents ask for tens of
/// thousands) and the reply stops with each API's length reason.
#[test]
fn the_servers_token_limit_clamps_every_request() {
    let capped = &fixture().capped;
    let mut c = chat(json!({"max_tokens": 50, "ignore_eos": true}));
    c["messages"] = json!([{"role": "user", "content": "hi"}]);
    let o = call_with(capped, "POST", "/v1/chat/completions", JSON, c.to_string().into_bytes());
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["usage"]["completion_tokens"], 4);
    assert_eq!(o.body["choices"][0]["finish_reason"], "length");
    // The Messages API has no `ignore_eos`: the model may end its turn first.
    let o = call_with(capped, "POST", "/v1/messages", JSON, message(json!({"max_tokens": 50})).to_string().into_bytes());
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let n = o.body["usage"]["output_tokens"].as_u64().expect("output_tokens");
    assert!(n <= 4, "{}", o.text);
    assert_eq!(o.body["stop_reason"] == "max_tokens", n == 4, "{}", o.text);
    // Without the limit the same request runs to what it asked.
    let o = post("/v1/chat/completions", &chat(json!({"max_tokens": 6, "ignore_eos": true, "messages": [{"role": "user", "content": "hi"}]})));
    assert_eq!(o.body["usage"]["completion_tokens"], 6, "{}", o.text);
}

/// A forced call is written in the served model's own markup (the grammar) and read back by
/// its parser, on both APIs; a markup whose parameters are not JSON refuses it clearly.
#[test]
fn forced_calls_in_each_familys_markup() {
    for (parser, state) in &fixture().markups {
        // DSML's full-width markers are many byte tokens in the demo's vocabulary.
        let mut body = chat(json!({"tools": [weather_tool()], "tool_choice": "required", "max_tokens": 400}));
        body["messages"] = json!([{"role": "user", "content": "weather?"}]);
        let o = call_with(state, "POST", "/v1/chat/completions", JSON, body.to_string().into_bytes());
        assert_eq!(o.status, StatusCode::OK, "{parser:?}: {}", o.text);
        let c = &o.body["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{parser:?}: {}", o.text);
        let call = &c["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{parser:?}");
        assert_weather_args(&serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("JSON arguments"));
        let m = message(json!({"tools": [{"name": "get_weather", "input_schema": weather_tool()["function"]["parameters"]}],
            "tool_choice": {"type": "tool", "name": "get_weather"}, "max_tokens": 400}));
        let o = call_with(state, "POST", "/v1/messages", JSON, m.to_string().into_bytes());
        assert_eq!(o.body["stop_reason"], "tool_use", "{parser:?}: {}", o.text);
    }
}

/// A strict tool under `tool_choice: auto`: the model stays free to answer in text (the
/// random-weight demo model does), and any call it makes is held to the tool's schema.
#[test]
fn strict_tools_under_auto_leave_text_free() {
    let mut tool = weather_tool();
    tool["function"]["strict"] = json!(true);
    for seed in [1, 2, 3] {
        let mut body = chat(json!({"tools": [tool], "tool_choice": "auto", "max_tokens": 40, "temperature": 1.0, "seed": seed}));
        body["messages"] = json!([{"role": "user", "content": "weather?"}]);
        let o = post("/v1/chat/completions", &body);
        assert_eq!(o.status, StatusCode::OK, "{}", o.text);
        let m = &o.body["choices"][0]["message"];
        for call in m["tool_calls"].as_array().into_iter().flatten() {
            assert_weather_args(&serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments")).expect("JSON arguments"));
        }
        assert!(m["content"].is_string() || m["tool_calls"].is_array(), "{}", o.text);
    }
}

#[test]
fn several_choices_are_separate_sequences() {
    let mut body = chat(json!({"n": 3, "max_tokens": 6, "temperature": 1.0, "seed": 11, "ignore_eos": true}));
    body["messages"] = json!([{"role": "user", "content": "hi"}]);
    let o = post("/v1/chat/completions", &body);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let choices = o.body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert!(c["message"]["content"].is_string());
    }
    assert_eq!(o.body["usage"]["completion_tokens"], 18);
    let texts: std::collections::HashSet<&str> = choices.iter().map(|c| c["message"]["content"].as_str().unwrap()).collect();
    assert!(texts.len() > 1, "sampled choices with offset seeds differ: {texts:?}");
    // Reproducible: the same request gives the same choices.
    assert_eq!(post("/v1/chat/completions", &body).body["choices"], o.body["choices"]);
    let mut greedy = body.clone();
    greedy["temperature"] = json!(0);
    let g = post("/v1/chat/completions", &greedy);
    let all: Vec<&Value> = g.body["choices"].as_array().unwrap().iter().map(|c| &c["message"]["content"]).collect();
    assert!(all.iter().all(|t| *t == all[0]), "greedy choices are equal");
    openai_error(&post("/v1/chat/completions", &chat(json!({"n": 9}))), 400, Some("n"));
    let completion = |extra: Value| {
        let mut b = json!({"model": "ft-actor-demo", "prompt": "hi", "max_tokens": 2});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post("/v1/completions", &b)
    };
    openai_error(&completion(json!({"n": 9})), 400, Some("n"));
    openai_error(&completion(json!({"n": 2, "best_of": 3})), 400, Some("best_of"));
    assert_eq!(completion(json!({"n": 2, "best_of": 2})).body["choices"].as_array().map(Vec::len), Some(2));
    // Streamed, the choices' chunks interleave, each tagged with its index; one usage chunk
    // and one [DONE] end the stream, and each choice says what the unstreamed one said.
    let mut streamed = greedy.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let o = post("/v1/chat/completions", &streamed);
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let events: Vec<&str> = o.text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", o.text);
    assert_eq!(events.iter().filter(|e| **e == "[DONE]").count(), 1);
    let (mut text, mut finished, mut usage) = (vec![String::new(); 3], [0; 3], vec![]);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).expect("chunk json");
        if v["choices"].as_array().is_some_and(|c| c.is_empty()) {
            usage.push(v["usage"].clone());
            continue;
        }
        let c = &v["choices"][0];
        let i = c["index"].as_u64().expect("index") as usize;
        text[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
        if c["finish_reason"].is_string() {
            finished[i] += 1;
        }
    }
    assert_eq!(finished, [1, 1, 1], "each choice ends once: {}", o.text);
    assert_eq!(usage.len(), 1, "one usage chunk");
    assert_eq!(usage[0]["completion_tokens"], 18);
    for (i, t) in text.iter().enumerate() {
        assert_eq!(Some(t.as_str()), g.body["choices"][i]["message"]["content"].as_str(), "choice {i}");
    }
}

#[test]
fn tool_history_round_trips_through_the_template() {
    // An assistant tool call and its result in the history, in each API's shape.
    let o = post("/v1/chat/completions", &chat(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})));
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let o = post("/v1/messages", &message(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": "x"}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]}, {"type": "text", "text": "Thanks"}]},
    ]})));
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["type"], "message");
    let o = post("/v1/responses", &json!({"max_output_tokens": 4, "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ]}));
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    assert_eq!(o.body["object"], "response");
}

#[test]
fn full_queue_is_429_and_dropped_streams_free_their_places() {
    // A second engine: one sequence generating, one waiting, nobody else.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cfg = ft_actor::engine::EngineConfig { max_active: 1, max_queue: 1, ctx_size: Some(4096), ..test_engine_config() };
    let state = rt.block_on(async {
        let engine = ft_actor::engine::Engine::spawn(cfg, None).await.expect("engine");
        AppState::new(engine, ServerSettings::default()).expect("state")
    });
    let req = |stream: bool, n: u32| {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": n, "stream": stream, "ignore_eos": true});
        Request::builder().method("POST").uri("/v1/chat/completions").body(Body::from(body.to_string())).expect("request")
    };
    // True once the engine shows `active` generating and `queued` waiting.
    let reach = |state: &AppState, active: usize, queued: usize| {
        let state = state.clone();
        async move {
            let t0 = std::time::Instant::now();
            while t0.elapsed() < std::time::Duration::from_secs(5) {
                let s = state.engine.stats().await.expect("stats");
                if (s.active, s.queued) == (active, queued) {
                    return true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            false
        }
    };
    rt.block_on(async {
        // Streams whose bodies are not read hold their places while they generate. The
        // demo model is fast, so a try can lose the race against a finishing generation:
        // then it is repeated.
        let mut saw_429 = false;
        for _ in 0..10 {
            let first = app(state.clone()).oneshot(req(true, 4000)).await.expect("response");
            assert_eq!(first.status(), StatusCode::OK);
            if !reach(&state, 1, 0).await {
                continue;
            }
            let second = app(state.clone()).oneshot(req(true, 4000)).await.expect("response");
            assert_eq!(second.status(), StatusCode::OK);
            if !reach(&state, 1, 1).await {
                continue;
            }
            let third = app(state.clone()).oneshot(req(false, 2)).await.expect("response");
            if third.status() != StatusCode::TOO_MANY_REQUESTS {
                continue;
            }
            assert!(third.headers().contains_key("retry-after"));
            let bytes = axum::body::to_bytes(third.into_body(), usize::MAX).await.expect("body");
            let v: Value = serde_json::from_slice(&bytes).expect("json");
            assert_eq!(v["error"]["type"], "rate_limit_error");
            // Dropping the streams cancels their generations; the places free up.
            drop(first);
            drop(second);
            assert!(reach(&state, 0, 0).await, "cancelled streams still hold their places");
            saw_429 = true;
            break;
        }
        assert!(saw_429, "a full queue never answered 429");
        let r = app(state.clone()).oneshot(req(false, 2)).await.expect("response");
        assert_eq!(r.status(), StatusCode::OK);
    });
}
