//! Each API's conversation, rendered by a chat template that reads messages the way
//! Hugging Face templates do (Qwen3-Coder style): tool schemas through
//! `tool.function.parameters.properties|items`, call arguments through
//! `tool_call.function.arguments|items` (so they must be mappings), string contents,
//! `reasoning_content`, and `tool` messages carrying `tool_call_id`.

use super::prompt::Conversation;
use crate::chat::ChatTemplate;
use crate::tokenizer::Tokenizer;
use serde_json::json;

const TEMPLATE: &str = r#"
{%- if tools %}<tools>{% for tool in tools %}<fn {{ tool.function.name }}>{% for name, p in tool.function.parameters.properties|items %}[{{ name }}:{{ p.type }}]{% endfor %}</fn>{% endfor %}</tools>{% endif %}
{%- for message in messages %}
{%- if message.content is not string %}{{ raise_exception('content must be a string') }}{% endif %}
<|{{ message.role }}|>{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}{{ message.content }}
{%- if message.tool_calls %}{% for tc in message.tool_calls %}<call {{ tc.id }} {{ tc.function.name }}>{% for k, v in tc.function.arguments|items %}({{ k }}={{ v }}){% endfor %}</call>{% endfor %}{% endif %}
{%- if message.role == 'tool' %}[result of {{ message.tool_call_id }}]{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"#;

fn render(conv: Conversation) -> String {
    let dir = crate::demo::demo_model_dir().expect("demo model");
    let tok = Tokenizer::from_dir(&dir).expect("tokenizer");
    let template = ChatTemplate::new(TEMPLATE, None, None).expect("template compiles");
    let prompt = conv.render_blocking(&template, &tok, true).expect("renders");
    tok.decode(&prompt.ids, false).expect("decodes")
}

fn expect_all(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "missing {p:?} in {text:?}");
    }
}

const EXPECTED: &[&str] = &[
    "<tools><fn get_weather>[city:string]</fn></tools>",
    "<|system|>Be brief.",
    "<|user|>Weather in Paris?",
    "<|assistant|><think>Use the tool.</think>",
    "<call call_1 get_weather>(city=Paris)</call>",
    "<|tool|>18C[result of call_1]",
];

#[test]
fn openai_chat_messages() {
    let messages = super::openai::chat_messages(&[
        json!({"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}),
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "18C"}),
    ])
    .expect("converts");
    let tools = super::openai::function_tools(
        &[json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})],
        "tools",
    )
    .expect("tools");
    let text = render(Conversation { messages, tools, ..Default::default() });
    expect_all(&text, EXPECTED);
    assert!(text.ends_with("<|assistant|>"), "a new turn is opened: {text:?}");
}

#[test]
fn anthropic_messages() {
    let conv = super::anthropic::conversation(
        Some(&json!([{"type": "text", "text": "x-anthropic-billing-header: cch=1;"}, {"type": "text", "text": "Be brief."}])),
        &[
            json!({"role": "user", "content": "Weather in Paris?"}),
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "18C"}]}]}),
        ],
        &[json!({"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}),
          json!({"type": "web_search_20250305", "name": "web_search"})],
        None,
        Some(&json!({"type": "enabled", "budget_tokens": 2000})),
    )
    .expect("converts");
    assert_eq!(conv.enable_thinking, Some(true));
    let text = render(conv);
    expect_all(&text, EXPECTED);
    assert!(!text.contains("billing") && !text.contains("web_search"), "{text:?}");
}

#[test]
fn anthropic_prefill_is_continued() {
    let conv = super::anthropic::conversation(
        None,
        &[json!({"role": "user", "content": "Say hi"}), json!({"role": "assistant", "content": "Hi, I am"})],
        &[],
        None,
        None,
    )
    .expect("converts");
    let text = render(conv);
    assert!(text.ends_with("<|assistant|>Hi, I am"), "the model continues the prefill: {text:?}");
}

#[test]
fn responses_items() {
    let messages = super::responses::input_messages(&json!([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ]))
    .expect("converts");
    let (tools, _) = super::responses::responses_tools(&[
        json!({"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}),
        json!({"type": "web_search"}),
    ])
    .expect("tools");
    let text = render(Conversation { messages, tools, ..Default::default() });
    expect_all(&text, EXPECTED);
}
