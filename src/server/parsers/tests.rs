//! Real model-format outputs, fed whole, in every two-piece split, and in three-piece
//! splits: the decoded structure must not depend on where the detokenizer cut the text.

use super::*;
use serde_json::json;

fn opts(reasoning: bool, tools: bool) -> ParserOptions {
    ParserOptions { reasoning, tools, ..Default::default() }
}

fn call(name: &str, args: serde_json::Value) -> Parsed {
    let serde_json::Value::Object(arguments) = args else { panic!("args must be an object") };
    Parsed::ToolCall(ToolCall { name: name.into(), arguments })
}

/// Runs the parser over `pieces` and merges adjacent events of the same kind.
fn run(o: &ParserOptions, pieces: &[&str]) -> Vec<Parsed> {
    let mut p = OutputParser::new(o.clone());
    let mut raw = vec![];
    for piece in pieces {
        p.push(piece, &mut raw);
    }
    p.finish(&mut raw);
    let mut merged: Vec<Parsed> = vec![];
    for ev in raw {
        match (merged.last_mut(), ev) {
            (Some(Parsed::Text(a)), Parsed::Text(b)) | (Some(Parsed::Reasoning(a)), Parsed::Reasoning(b)) => a.push_str(&b),
            (_, ev) => merged.push(ev),
        }
    }
    merged
}

/// Checks `text` gives `expected` however it is cut: whole, at every character boundary,
/// and at every pair of boundaries.
fn check(o: &ParserOptions, text: &str, expected: &[Parsed]) {
    assert_eq!(run(o, &[text]), expected, "whole input");
    let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    for &a in &cuts {
        let got = run(o, &[&text[..a], &text[a..]]);
        assert_eq!(got, expected, "split at byte {a}: {:?} | {:?}", &text[..a], &text[a..]);
    }
    for (ia, &a) in cuts.iter().enumerate() {
        for &b in &cuts[ia..] {
            let got = run(o, &[&text[..a], &text[a..b], &text[b..]]);
            assert_eq!(got, expected, "split at bytes {a},{b}");
        }
    }
    // One character at a time, as a byte-level BPE detokenizer often delivers it.
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(o, &pieces), expected, "char by char");
}

#[test]
fn qwen3_thinking_then_answer() {
    let out = "<think>\nThe user greets me. I should answer politely.\n</think>\n\nHello! How can I help you today?";
    check(
        &opts(true, false),
        out,
        &[
            Parsed::Reasoning("The user greets me. I should answer politely.".into()),
            Parsed::Text("Hello! How can I help you today?".into()),
        ],
    );
}

#[test]
fn qwen3_empty_thinking_block_when_disabled_in_prompt() {
    // With enable_thinking=false the template writes the empty block into the prompt; a
    // model that repeats it anyway must not produce an empty reasoning item.
    check(&opts(true, false), "<think>\n\n</think>\n\nParis.", &[Parsed::Text("Paris.".into())]);
}

#[test]
fn prompt_opened_think_block() {
    // Qwen3-2507 "Thinking" templates end the prompt with `<think>\n`.
    let o = ParserOptions { start_in_reasoning: true, ..opts(true, true) };
    let out = "Okay, two cities.\nI will call the tool twice.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    check(
        &o,
        out,
        &[
            Parsed::Reasoning("Okay, two cities.\nI will call the tool twice.".into()),
            call("get_weather", json!({"city": "Paris"})),
        ],
    );
}

#[test]
fn hermes_two_calls_after_reasoning() {
    let out = "<think>\nNeed the weather in two cities.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>";
    check(
        &opts(true, true),
        out,
        &[
            Parsed::Reasoning("Need the weather in two cities.".into()),
            call("get_weather", json!({"city": "Paris", "unit": "celsius"})),
            call("get_weather", json!({"city": "東京"})),
        ],
    );
}

#[test]
fn hermes_text_before_call_and_string_arguments() {
    let out = "Let me look that up.\n\n<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"rust < 2\\\"}\"}\n</tool_call>";
    check(
        &opts(false, true),
        out,
        &[Parsed::Text("Let me look that up.".into()), call("search", json!({"q": "rust < 2"}))],
    );
}

#[test]
fn qwen3_coder_xml_call_with_typed_parameters() {
    let tools = vec![json!({"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}, "lines": {"type": "array"}, "raw": {"type": ["boolean", "null"]}}
    }}})];
    let o = ParserOptions { param_types: ParamTypes::from_tools(&tools), ..opts(false, true) };
    let out = "I'll read the file first.\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n<parameter=limit>\n50\n</parameter>\n<parameter=lines>\n[1, 2]\n</parameter>\n<parameter=raw>\ntrue\n</parameter>\n</function>\n</tool_call>";
    check(
        &o,
        out,
        &[
            Parsed::Text("I'll read the file first.".into()),
            call("read_file", json!({"path": "src/main.rs", "limit": 50, "lines": [1, 2], "raw": true})),
        ],
    );
}

#[test]
fn qwen3_coder_multiline_string_parameter_and_two_calls() {
    let out = "<tool_call>\n<function=write_file>\n<parameter=content>\nfn main() {\n    println!(\"<hi>\");\n}\n</parameter>\n<parameter=path>\na.rs\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=run>\n</function>\n</tool_call>";
    check(
        &opts(false, true),
        out,
        &[
            call("write_file", json!({"content": "fn main() {\n    println!(\"<hi>\");\n}", "path": "a.rs"})),
            call("run", json!({})),
        ],
    );
}

#[test]
fn bare_function_block() {
    let o = ParserOptions { bare_function: true, ..opts(true, true) };
    let out = "<think>\nok\n</think>\n\nSure.\n<function=ls>\n<parameter=dir>\n.\n</parameter>\n</function>";
    check(&o, out, &[Parsed::Reasoning("ok".into()), Parsed::Text("Sure.".into()), call("ls", json!({"dir": "."}))]);
}

#[test]
fn malformed_call_degrades_to_text() {
    let out = "Trying.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\n</tool_call>";
    check(
        &opts(true, true),
        out,
        &[Parsed::Text("Trying.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\n</tool_call>".into())],
    );
    let no_name = "<tool_call>\n{\"arguments\": {}}\n</tool_call> done";
    check(&opts(false, true), no_name, &[Parsed::Text(no_name.into())]);
    let xml = "<tool_call>\n<function=>\n</function>\n</tool_call>";
    check(&opts(false, true), xml, &[Parsed::Text(xml.into())]);
}

#[test]
fn unclosed_call_at_the_end() {
    // Cut by max_tokens before `</tool_call>`: a complete body is still a call...
    let complete = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n";
    check(&opts(false, true), complete, &[call("f", json!({"x": 1}))]);
    // ...a partial one is text.
    let partial = "Hi <tool_call>\n{\"name\": \"f\", \"argu";
    check(&opts(false, true), partial, &[Parsed::Text(partial.into())]);
}

#[test]
fn markup_without_tools_or_reasoning_is_text() {
    let out = "<think>not a block</think> and <tool_call>{\"name\": \"f\"}</tool_call>";
    check(&opts(false, false), out, &[Parsed::Text(out.into())]);
    // `<think>` only opens reasoning at the very start.
    let mid = "Use the <think> tag like this: <think>x</think>";
    check(&opts(true, false), mid, &[Parsed::Text(mid.into())]);
}

#[test]
fn partial_markers_at_the_end_are_text() {
    check(&opts(true, true), "a < b and c <tool_ca", &[Parsed::Text("a < b and c <tool_ca".into())]);
    check(&opts(true, true), "  <thi", &[Parsed::Text("<thi".into())]);
    check(&opts(true, true), "<think>unfinished thought </thi", &[Parsed::Reasoning("unfinished thought </thi".into())]);
}

#[test]
fn unicode_and_whitespace_inside_text_are_kept() {
    let out = "<think>\nçà 🦀\n\n</think>\n\nLine 1\n\n  Line 2 🦀 ";
    check(
        &opts(true, false),
        out,
        &[Parsed::Reasoning("çà 🦀".into()), Parsed::Text("Line 1\n\n  Line 2 🦀 ".into())],
    );
}

#[test]
fn text_after_a_call_is_kept() {
    let out = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nDone.";
    check(&opts(false, true), out, &[call("f", json!({})), Parsed::Text("Done.".into())]);
}

#[test]
fn json_array_and_parameters_key() {
    let out = "<tool_call>[{\"name\": \"a\", \"parameters\": {\"k\": \"v\"}}, {\"name\": \"b\"}]</tool_call>";
    check(&opts(false, true), out, &[call("a", json!({"k": "v"})), call("b", json!({}))]);
}

#[test]
fn typed_values_that_do_not_fit_stay_strings() {
    let tools = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "n": {"type": "integer"}, "o": {"type": "object"}, "b": {"type": "boolean"}, "x": {"type": "number"}
    }}}})];
    let types = ParamTypes::from_tools(&tools);
    let body = "<function=f>\n<parameter=n>\nmany\n</parameter>\n<parameter=o>\n{bad\n</parameter>\n<parameter=b>\nyes\n</parameter>\n<parameter=x>\n2.5\n</parameter>\n</function>";
    let calls = parse_tool_call_body(body, &types).expect("parses");
    assert_eq!(calls[0].arguments_json(), r#"{"n":"many","o":"{bad","b":"yes","x":2.5}"#);
}

#[test]
fn raw_mode_keeps_every_character() {
    let o = ParserOptions { raw: true, ..opts(true, true) };
    let out = "  <think> leading space kept\n<tool_call>{}</tool_call>  ";
    check(&o, out, &[Parsed::Text(out.into())]);
}

#[test]
fn glm_key_value_calls() {
    let tools = vec![json!({"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}
    }}}})];
    let o = ParserOptions { param_types: ParamTypes::from_tools(&tools), ..opts(true, true) };
    let out = "<think>Weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
    check(&o, out, &[Parsed::Reasoning("Weather.".into()), call("get_weather", json!({"city": "北京", "days": 3}))]);
    // A name with spaces is prose, not a call.
    let prose = "<tool_call>I would call a tool</tool_call>";
    check(&opts(false, true), prose, &[Parsed::Text(prose.into())]);
}

#[test]
fn deepseek_section_of_calls() {
    let o = ParserOptions { markup: ToolMarkup::DeepSeek, ..opts(true, true) };
    let out = "<think>look it up</think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>ls<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    check(
        &o,
        out,
        &[
            Parsed::Reasoning("look it up".into()),
            Parsed::Text("Checking.".into()),
            call("get_weather", json!({"city": "Paris"})),
            call("ls", json!({})),
        ],
    );
    // `<tool_call>` means nothing to this family: it stays text.
    check(&o, "<tool_call>{\"name\": \"f\"}</tool_call>", &[Parsed::Text("<tool_call>{\"name\": \"f\"}</tool_call>".into())]);
    // Arguments that are not a JSON object give the section back as text.
    let bad = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    check(&o, bad, &[Parsed::Text(bad.into())]);
}

#[test]
fn kimi_section_of_calls() {
    let o = ParserOptions { markup: ToolMarkup::Kimi, ..opts(false, true) };
    let out = "On it.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Oslo\"}<|tool_call_end|><|tool_call_begin|>functions.read_file:1<|tool_call_argument_begin|>{\"path\": \"a.rs\"}<|tool_call_end|><|tool_calls_section_end|>";
    check(
        &o,
        out,
        &[Parsed::Text("On it.".into()), call("get_weather", json!({"city": "Oslo"})), call("read_file", json!({"path": "a.rs"}))],
    );
}

#[test]
fn minimax_invokes_typed_by_the_schema() {
    let tools = [json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object",
        "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}, "filters": {"type": "object"}}}}})];
    let o = ParserOptions { markup: ToolMarkup::MiniMax, param_types: ParamTypes::from_tools(&tools), ..opts(true, true) };
    let out = "<think>\nsearch it\n</think>\n\n<minimax:tool_call>\n<invoke name=\"search\"><parameter name=\"q\">rust actors</parameter>\n<parameter name=\"limit\">5</parameter>\n<parameter name=\"filters\">{\"lang\": \"en\"}</parameter>\n</invoke>\n</minimax:tool_call>";
    check(
        &o,
        out,
        &[Parsed::Reasoning("search it".into()), call("search", json!({"q": "rust actors", "limit": 5, "filters": {"lang": "en"}}))],
    );
    // Cut off inside the block (the length limit): what was written is given back as text.
    let cut = "<minimax:tool_call>\n<invoke name=\"search\"><parameter name=\"q\">ru";
    check(&o, cut, &[Parsed::Text(cut.into())]);
}

#[test]
fn dsml_invokes_with_string_and_json_values() {
    let o = ParserOptions { markup: ToolMarkup::Dsml, ..opts(true, true) };
    let out = "<think>go</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"true\">42 apples</｜DSML｜parameter>\n<｜DSML｜parameter name=\"limit\" string=\"false\">5</｜DSML｜parameter>\n<｜DSML｜parameter name=\"tags\" string=\"false\">[\"a\", \"b\"]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
    check(&o, out, &[Parsed::Reasoning("go".into()), call("search", json!({"q": "42 apples", "limit": 5, "tags": ["a", "b"]}))]);
    // DeepSeek V4 names the block `tool_calls`.
    let v4 = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ls\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    check(&o, v4, &[call("ls", json!({}))]);
}

#[test]
fn mistral_calls_run_to_the_end_of_the_output() {
    let o = ParserOptions { markup: ToolMarkup::Mistral, ..opts(false, true) };
    let two = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]ls[ARGS]{}";
    check(&o, two, &[Parsed::Text("Sure.".into()), call("get_weather", json!({"city": "Rome"})), call("ls", json!({}))]);
    let list = "[TOOL_CALLS][{\"name\": \"ls\", \"arguments\": {\"dir\": \"/\"}}]";
    check(&o, list, &[call("ls", json!({"dir": "/"}))]);
    let cut = "[TOOL_CALLS]get_weather[ARGS]{\"ci";
    check(&o, cut, &[Parsed::Text(cut.into())]);
}

#[test]
fn harmony_channels_reasoning_answer_and_calls() {
    let o = ParserOptions { markup: ToolMarkup::Harmony, ..opts(false, true) };
    // What gpt-oss writes after `<|start|>assistant`: analysis, then the answer.
    let answer = "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!<|return|>";
    check(&o, answer, &[Parsed::Reasoning("User greets.".into()), Parsed::Text("Hello there!".into())]);
    // A call as the model writes it (recipient after the channel, `<|constrain|>`), ended by
    // `<|call|>` or by the end of the output (the engine stops at `<|call|>`).
    let model = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
    check(&o, model, &[Parsed::Reasoning("Need weather.".into()), call("get_weather", json!({"city": "Paris"}))]);
    check(&o, &format!("{model}<|call|>"), &[Parsed::Reasoning("Need weather.".into()), call("get_weather", json!({"city": "Paris"}))]);
    // As the chat template writes it: the recipient in the header, before the channel.
    let template = "<|start|>assistant to=functions.ls<|channel|>commentary json<|message|>{}<|call|>";
    check(&o, template, &[call("ls", json!({}))]);
    // A preamble to the user on the commentary channel, then a call.
    let preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.ls <|constrain|>json<|message|>{\"dir\": \"/\"}<|call|>";
    check(&o, preamble, &[Parsed::Text("Checking.".into()), call("ls", json!({"dir": "/"}))]);
    // Arguments that are not JSON come back as text; a message without its end marker ends at
    // the next header.
    let bad = "<|channel|>commentary to=functions.ls <|constrain|>json<|message|>{dir:<|call|>";
    check(&o, bad, &[Parsed::Text("{dir:".into())]);
    let unended = "<|channel|>analysis<|message|>hmm<|start|>assistant<|channel|>final<|message|>ok";
    check(&o, unended, &[Parsed::Reasoning("hmm".into()), Parsed::Text("ok".into())]);
    // Text with no header at all is the answer.
    check(&o, "plain words", &[Parsed::Text("plain words".into())]);
}

#[test]
fn harmony_is_read_from_the_gpt_oss_template() {
    let src = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates/openai-gpt-oss-120b.jinja")).expect("template");
    assert_eq!(ToolMarkup::from_template(&src), Some(ToolMarkup::Harmony));
}

#[test]
fn harmony_header_may_start_with_the_recipient() {
    // The prompt ended with `<|start|>assistant`; the model continues the header.
    let o = ParserOptions { markup: ToolMarkup::Harmony, ..opts(false, true) };
    let out = " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>";
    check(&o, out, &[call("get_weather", json!({"city": "Paris"}))]);
}
