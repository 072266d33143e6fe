//! The stream encoders fed with structured output the demo model (random weights) never
//! produces on its own: reasoning, text and several tool calls in one turn must come out in
//! each API's event grammar.

use super::generation::{Finish, Outcome, Usage};
use super::parsers::{Parsed, ToolCall};
use super::sse::Encoder;
use serde_json::{json, Value};
use std::sync::Arc;

fn call(name: &str, args: Value) -> Parsed {
    let Value::Object(arguments) = args else { panic!("object") };
    Parsed::ToolCall(ToolCall { name: name.into(), arguments })
}

fn output() -> Vec<Parsed> {
    vec![
        Parsed::Reasoning("Two cities.".into()),
        Parsed::Text("Checking.".into()),
        call("get_weather", json!({"city": "Paris"})),
        call("get_weather", json!({"city": "Rome"})),
    ]
}

fn outcome(finish: Finish, tool_calls: usize) -> Outcome {
    Outcome { finish, usage: Usage { prompt: 20, cached: 5, completion: 9 }, tool_calls }
}

/// `(event name, data)` pairs of an SSE text.
fn events(sse: &str) -> Vec<(Option<String>, String)> {
    sse.split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|b| {
            let mut name = None;
            let mut data = String::new();
            for line in b.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_string();
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            (name, data)
        })
        .collect()
}

fn json_of(d: &str) -> Value {
    serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"))
}

#[test]
fn openai_chat_chunks() {
    let mut enc = super::openai::ChatStream::new("chatcmpl-1".into(), "m".into(), true);
    let mut s = enc.start();
    s += &enc.output(output());
    s += &enc.done(outcome(Finish::Stop, 2));
    let ev = events(&s);
    assert_eq!(ev.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| json_of(&e.1)).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[1]["choices"][0]["delta"]["reasoning_content"], "Two cities.");
    assert_eq!(chunks[2]["choices"][0]["delta"]["content"], "Checking.");
    let c1 = &chunks[3]["choices"][0]["delta"]["tool_calls"][0];
    let c2 = &chunks[4]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!((c1["index"].as_u64(), c2["index"].as_u64()), (Some(0), Some(1)));
    assert_eq!(c1["function"]["name"], "get_weather");
    assert_eq!(json_of(c2["function"]["arguments"].as_str().expect("string")), json!({"city": "Rome"}));
    assert_ne!(c1["id"], c2["id"]);
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(chunks[6]["usage"]["prompt_tokens_details"]["cached_tokens"], 5);
    assert!(chunks[..6].iter().all(|c| c["usage"].is_null()));
}

#[test]
fn anthropic_blocks() {
    let mut enc = super::anthropic::Stream::new("msg_1".into(), "m".into(), 20);
    let mut s = enc.start();
    s += &enc.output(output()[..2].to_vec());
    s += &enc.output(output()[2..].to_vec());
    s += &enc.done(outcome(Finish::Stop, 2));
    let ev: Vec<(String, Value)> = events(&s).into_iter().map(|(n, d)| (n.expect("named"), json_of(&d))).collect();
    let names: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start", "ping",
            "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop",
        ]
    );
    assert_eq!(ev[2].1["content_block"]["type"], "thinking");
    assert_eq!(ev[3].1["delta"]["thinking"], "Two cities.");
    assert_eq!(ev[4].1["delta"]["type"], "signature_delta");
    assert_eq!(ev[6].1["content_block"]["type"], "text");
    assert_eq!(ev[9].1["content_block"]["type"], "tool_use");
    assert_eq!(ev[9].1["index"], 2);
    assert_eq!(json_of(ev[10].1["delta"]["partial_json"].as_str().expect("json")), json!({"city": "Paris"}));
    assert_eq!(ev[12].1["index"], 3);
    assert_eq!(ev[15].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(ev[15].1["usage"]["cache_read_input_tokens"], 5);
    assert_eq!(ev[15].1["usage"]["input_tokens"], 15);
}

#[test]
fn anthropic_stop_sequence_and_max_tokens() {
    let mut enc = super::anthropic::Stream::new("msg_1".into(), "m".into(), 3);
    let s = enc.done(outcome(Finish::StopSequence(Some("END".into())), 0));
    let d = json_of(&events(&s)[0].1);
    assert_eq!((d["delta"]["stop_reason"].as_str(), d["delta"]["stop_sequence"].as_str()), (Some("stop_sequence"), Some("END")));
    let s = enc.done(outcome(Finish::Length, 0));
    assert_eq!(json_of(&events(&s)[0].1)["delta"]["stop_reason"], "max_tokens");
}

#[test]
fn responses_items_and_store() {
    let store = Arc::new(super::store::Store::new(4));
    let mut enc = super::responses::Stream::for_test("m", store.clone(), &[]);
    let mut s = enc.start();
    s += &enc.output(output());
    s += &enc.done(outcome(Finish::Stop, 2));
    let ev: Vec<(String, Value)> = events(&s).into_iter().map(|(n, d)| (n.expect("named"), json_of(&d))).collect();
    for (i, (name, v)) in ev.iter().enumerate() {
        assert_eq!(v["type"].as_str(), Some(name.as_str()));
        assert_eq!(v["sequence_number"].as_u64(), Some(i as u64));
    }
    let names: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names.first(), Some(&"response.created"));
    assert_eq!(names.last(), Some(&"response.completed"));
    let done: Vec<&Value> = ev.iter().filter(|e| e.0 == "response.output_item.done").map(|e| &e.1["item"]).collect();
    let kinds: Vec<&str> = done.iter().filter_map(|i| i["type"].as_str()).collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call", "function_call"]);
    assert_eq!(done[1]["content"][0]["text"], "Checking.");
    assert_eq!(json_of(done[3]["arguments"].as_str().expect("args")), json!({"city": "Rome"}));
    let final_resp = &ev.last().expect("events").1["response"];
    assert_eq!(final_resp["output"].as_array().map(Vec::len), Some(4));
    assert_eq!(final_resp["usage"]["input_tokens_details"]["cached_tokens"], 5);
    let id = final_resp["id"].as_str().expect("id");
    assert_eq!(store.response(id).as_ref(), Some(final_resp), "the finished response is stored");
    // Output indices count the items in order.
    let added: Vec<u64> = ev.iter().filter(|e| e.0 == "response.output_item.added").filter_map(|e| e.1["output_index"].as_u64()).collect();
    assert_eq!(added, [0, 1, 2, 3]);
}

#[test]
fn responses_custom_tool_and_incomplete() {
    let store = Arc::new(super::store::Store::new(4));
    let mut enc = super::responses::Stream::for_test("m", store, &["apply_patch"]);
    let mut s = enc.output(vec![call("apply_patch", json!({"input": "*** Begin Patch"}))]);
    s += &enc.done(outcome(Finish::Length, 1));
    let ev: Vec<(String, Value)> = events(&s).into_iter().map(|(n, d)| (n.expect("named"), json_of(&d))).collect();
    let item = &ev.iter().find(|e| e.0 == "response.output_item.done").expect("item").1["item"];
    assert_eq!(item["type"], "custom_tool_call");
    assert_eq!(item["input"], "*** Begin Patch");
    let last = ev.last().expect("events");
    assert_eq!(last.0, "response.incomplete");
    assert_eq!(last.1["response"]["incomplete_details"]["reason"], "max_output_tokens");
}

#[test]
fn store_is_bounded() {
    let store = Arc::new(super::store::Store::new(2));
    for _ in 0..5 {
        let mut enc = super::responses::Stream::for_test("m", store.clone(), &[]);
        enc.done(outcome(Finish::Stop, 0));
    }
    assert_eq!(store.len(), 2);
}
