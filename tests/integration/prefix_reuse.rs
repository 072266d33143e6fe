//! Agent-aware prefix reuse, replayed through the real server on loopback: an agent-like
//! transcript (turns appended, a tool output truncated in the middle of the history, a
//! thinking block dropped, a rewind to an earlier turn, a second conversation sharing the
//! system prompt), on an attention-only model (qwen3_moe) and a hybrid one with recurrent
//! layers (qwen3_5_moe).
//!
//! For every request the test checks that
//! - the prompt tokens reported as cached (`usage.prompt_tokens_details.cached_tokens`) are
//!   exactly the restore point the rules allow, computed here from the token ids: for
//!   attention the longest common prefix with any earlier sequence; for recurrent state
//!   the deepest position where a snapshot was taken (never a prefix without one);
//! - the tokens actually re-prefilled (`ft_prefill_tokens_total` in `/metrics`) are the
//!   prompt tokens after that point and no more;
//! - the output is the same as with reuse disabled: token for token on the engine API,
//!   and the same response through the HTTP API.


use ft_actor::chat::ChatTemplate;
use ft_actor::engine::{Engine, EngineConfig, EngineHandle, EngineRequest};
use ft_actor::kv::reuse::{PrefixStore, ReuseSettings};
use ft_actor::server::ServerSettings;
use ft_actor::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::Path;
use crate::common;
use crate::server_common::{post, request, TestServer};

const MAX_TOKENS: usize = 6;

fn engine_config(model: &Path, reuse: bool) -> EngineConfig {
    EngineConfig {
        model: Some(model.to_path_buf()),
        backend: ft_actor::device::BackendChoice::Cpu,
        cpu_threads: Some(1),
        ctx_size: Some(2048),
        max_active: 1,
        prefix_cache_budget: if reuse { 256 << 20 } else { 0 },
        ..EngineConfig::default()
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

/// Template-shaped messages (tool-call arguments as objects).
fn transcript() -> Vec<(&'static str, Vec<Value>)> {
    let sys = json!({"role": "system", "content": "You are a careful coding agent. Answer briefly and use tools when files are needed."});
    let u1 = user("List the files in the project and tell me which one holds the parser.");
    let a1 = assistant("I will look at the tree first.");
    let u2 = user("Go ahead and read src/parser.rs for me please.");
    let call = json!({"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "read_file", "arguments": {"path": "src/parser.rs"}}}
    ]});
    let output: String = (0..12).map(|i| format!("fn rule_{i}(input: &str) -> Result<Node, Error> {{ parse(input, {i}) }}\n")).collect();
    let tool = |content: &str| json!({"role": "tool", "tool_call_id": "call_0", "content": content});
    let a3 = assistant("The parser is a set of small rule functions.");
    let u3 = user("Now add a rule for comments.");
    let thinking = json!({"role": "assistant", "reasoning_content": "The user wants a comment rule; rule_12 fits the pattern of the others.", "content": "Added rule_12 for comments."});
    let no_thinking = json!({"role": "assistant", "content": "Added rule_12 for comments."});
    let u4 = user("Run the tests.");
    let a4 = assistant("All tests pass.");
    let u5 = user("Thanks, commit it.");

    let base = vec![sys.clone(), u1.clone()];
    let turn2 = [base.clone(), vec![a1.clone(), u2.clone()]].concat();
    let turn3 = [turn2.clone(), vec![call.clone(), tool(&output)]].concat();
    let turn4 = [turn3.clone(), vec![a3.clone(), u3.clone()]].concat();
    // The agent shortens the old tool output in the middle of the history.
    let truncated = format!("{}\n[... output truncated ...]", &output[..output.len() / 3]);
    let turn4_cut = [turn2.clone(), vec![call, tool(&truncated), a3, u3]].concat();
    let turn5 = [turn4_cut.clone(), vec![thinking, u4.clone()]].concat();
    // The client drops the reasoning of the earlier assistant turn.
    let turn6 = [turn4_cut.clone(), vec![no_thinking, u4, a4, u5]].concat();
    // A retry rewinds to the second turn with another question.
    let rewind = [base.clone(), vec![a1, user("Actually, read src/lexer.rs instead.")]].concat();
    // A subagent starts a new conversation with the same system prompt.
    let other = vec![sys, user("Summarise the README in one line.")];
    vec![
        ("first turn", base),
        ("turn appended", turn2),
        ("tool output appended", turn3),
        ("turn appended", turn4),
        ("tool output truncated in the middle", turn4_cut),
        ("turn with thinking", turn5),
        ("thinking removed", turn6),
        ("rewind to an earlier turn", rewind),
        ("second conversation, same system prompt", other),
    ]
}

/// The same messages as an OpenAI client sends them (tool-call arguments as JSON strings).
fn openai_messages(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for (i, c) in calls.iter_mut().enumerate() {
                    c["id"] = json!(format!("call_{i}"));
                    let args = c["function"]["arguments"].to_string();
                    c["function"]["arguments"] = json!(args);
                }
            }
            m
        })
        .collect()
}

fn render(tok: &Tokenizer, template: &ChatTemplate, messages: &[Value]) -> Vec<u32> {
    ft_actor::bench::replay::render(template, tok, messages).expect("render")
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// What an earlier sequence left behind: the tokens its state covers and where snapshots
/// were taken.
struct Seen {
    tokens: Vec<u32>,
    snapshots: Vec<usize>,
}

/// The restore point the rules allow for `prompt` after `seen`.
fn expected_restore(prompt: &[u32], seen: &[Seen], recurrent: bool) -> usize {
    let usable = prompt.len() - 1;
    seen.iter()
        .map(|s| {
            if recurrent {
                s.snapshots.iter().copied().filter(|&p| p <= usable && s.tokens[..p] == prompt[..p]).max().unwrap_or(0)
            } else {
                lcp(&s.tokens, &prompt[..usable])
            }
        })
        .max()
        .unwrap_or(0)
}

/// Where the engine snapshots a recurrent sequence: prefill pauses, the prompt's end, after
/// boundary tokens it decodes, and the sequence's end.
fn snapshot_points(store: &PrefixStore, prompt: &[u32], cached: usize, generated: &[u32]) -> Vec<usize> {
    let mut points = store.prefill_stops(prompt, cached);
    points.push(prompt.len());
    let mut last = prompt.len();
    // The last sampled token is never run through the model.
    for (j, &t) in generated.iter().enumerate().take(generated.len().saturating_sub(1)) {
        let len = prompt.len() + j + 1;
        if store.anchor_after_decode(t, len, last) {
            points.push(len);
            last = len;
        }
    }
    points.push(prompt.len() + generated.len().saturating_sub(1));
    points
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

struct EngineRun {
    prompt_len: usize,
    cached: usize,
    prefilled: u64,
    tokens: Vec<u32>,
}

/// Replays the prompts on the engine API, one request after another.
fn replay_engine(rt: &tokio::runtime::Runtime, engine: &EngineHandle, prompts: &[Vec<u32>]) -> Vec<EngineRun> {
    rt.block_on(async {
        let mut out = vec![];
        for p in prompts {
            let before = engine.stats().await.expect("stats").prefill_tokens;
            let stream = engine.generate(EngineRequest::greedy(p.clone(), MAX_TOKENS)).await.expect("submit");
            let (tokens, _, done) = stream.collect().await.expect("generation");
            // The sequence's end is saved when the engine frees it, just after `Done`.
            let mut after = engine.stats().await.expect("stats");
            for _ in 0..100 {
                if after.active == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                after = engine.stats().await.expect("stats");
            }
            out.push(EngineRun { prompt_len: p.len(), cached: done.cached_tokens, prefilled: after.prefill_tokens - before, tokens });
        }
        out
    })
}

fn prefill_total(base: &str) -> u64 {
    let text = request(base, "GET", "/metrics", &[], b"").body;
    text.lines()
        .find_map(|l| l.strip_prefix("ft_prefill_tokens_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("ft_prefill_tokens_total in /metrics") as u64
}

struct ApiRun {
    usage: Value,
    message: Value,
    prefilled: u64,
}

fn replay_api(server: &TestServer, model_id: &str, transcript: &[(&str, Vec<Value>)]) -> Vec<ApiRun> {
    transcript
        .iter()
        .map(|(_, messages)| {
            let before = prefill_total(&server.base);
            let body = json!({"model": model_id, "messages": openai_messages(messages), "max_tokens": MAX_TOKENS, "temperature": 0});
            let r = post(&server.base, "/v1/chat/completions", &body);
            assert_eq!(r.status, 200, "{}", r.body);
            let v = r.json();
            ApiRun { usage: v["usage"].clone(), message: v["choices"][0]["message"].clone(), prefilled: prefill_total(&server.base) - before }
        })
        .collect()
}

/// `model` names the fixture (its layer kinds decide the rules); `path` is what is served:
/// its checkpoint folder or a GGUF made from it.
fn check_transcript(model: &str, path: &Path) {
    let tok = Tokenizer::open(path).expect("tokenizer");
    let template = ChatTemplate::from_tokenizer(&tok).expect("template");
    let transcript = transcript();
    let prompts: Vec<Vec<u32>> = transcript.iter().map(|(_, m)| render(&tok, &template, m)).collect();
    // Chat-template stability: the same history renders to the same tokens every time, and a
    // history extended by a turn renders to a strict extension of the shorter one.
    for ((_, m), p) in transcript.iter().zip(&prompts) {
        assert_eq!(&render(&tok, &template, m), p, "{model}: rendering is not deterministic");
    }
    assert_eq!(lcp(&prompts[0], &prompts[1]), prompts[0].len(), "{model}: an appended turn extends the prompt");

    let rt = rt();
    let (on, off) = rt.block_on(async {
        let on = Engine::spawn(engine_config(path, true), None).await.expect("engine");
        let off = Engine::spawn(engine_config(path, false), None).await.expect("engine");
        (on, off)
    });
    let recurrent = on.info().config.has_summarising_state();
    assert_eq!(recurrent, matches!(model, "qwen3_5_moe" | "deepseek_v4"), "{model}: layer kinds");
    let with = replay_engine(&rt, &on, &prompts);
    let without = replay_engine(&rt, &off, &prompts);

    // The rules, applied here independently of the engine's index.
    let policy = PrefixStore::new(
        ReuseSettings {
            budget: 1,
            device_budget: 1,
            interval: EngineConfig::default().anchor_interval,
            boundary_ids: tok.boundary_ids(),
        },
        recurrent,
        common::cpu_backend(),
    );
    let mut seen: Vec<Seen> = vec![];
    let mut total_reused = 0;
    for (i, ((name, _), (w, wo))) in transcript.iter().zip(with.iter().zip(&without)).enumerate() {
        let prompt = &prompts[i];
        let want = expected_restore(prompt, &seen, recurrent);
        assert_eq!(w.cached, want, "{model}, request {i} ({name}): restored {} tokens, the rules allow {want}", w.cached);
        assert_eq!(w.prefilled as usize, w.prompt_len - w.cached, "{model}, request {i} ({name}): re-prefilled tokens");
        assert_eq!(wo.cached, 0, "{model}: reuse disabled still reused");
        assert_eq!(wo.prefilled as usize, wo.prompt_len, "{model}: reuse disabled");
        assert_eq!(w.tokens, wo.tokens, "{model}, request {i} ({name}): output differs from reuse disabled");
        total_reused += w.cached;
        let covered = [&prompt[..], &w.tokens[..w.tokens.len().saturating_sub(1)]].concat();
        seen.push(Seen { snapshots: snapshot_points(&policy, prompt, w.cached, &w.tokens), tokens: covered });
    }
    let total: usize = prompts.iter().map(Vec::len).sum();
    eprintln!("{model}: {total_reused} of {total} prompt tokens reused: {:?}", with.iter().map(|w| (w.cached, w.prompt_len)).collect::<Vec<_>>());

    // Every edit kind still reuses something, and mostly a lot.
    let cached = |i: usize| with[i].cached;
    assert!(cached(1) >= prompts[0].len() - 1, "{model}: an appended turn resumes after the previous prompt");
    let tool_open = tok.token_to_id("<tool_response>").expect("<tool_response> in the vocabulary");
    let tool_start = prompts[4].iter().position(|&t| t == tool_open).expect("tool message") + 1;
    assert!(cached(4) >= tool_start, "{model}: a truncated tool output keeps everything before the tool output");
    assert!(cached(4) < prompts[3].len(), "{model}: state after the edit point is never reused");
    let think_open = tok.token_to_id("<think>").expect("<think>");
    let think_at = prompts[5].iter().position(|&t| t == think_open).expect("thinking block");
    let slack = if recurrent { 2 } else { 0 };
    assert!(cached(6) + slack >= think_at, "{model}: dropping thinking reuses up to the assistant header ({} < {think_at})", cached(6));
    assert!(cached(7) > prompts[0].len() / 2, "{model}: a rewind reuses the earlier turns");
    assert!(cached(8) >= lcp(&prompts[0], &prompts[8]) - slack - 2, "{model}: a second conversation reuses the system prompt");
    assert!(cached(8) > 0);

    // The same transcript through the HTTP API: same restore points, same responses.
    let settings = ServerSettings::default();
    let api_on = TestServer::start(engine_config(path, true), settings.clone());
    let api_off = TestServer::start(engine_config(path, false), settings);
    let model_id = ServerSettings::default().model_id(path, false);
    let via_on = replay_api(&api_on, &model_id, &transcript);
    let via_off = replay_api(&api_off, &model_id, &transcript);
    for (i, (name, _)) in transcript.iter().enumerate() {
        let (a, b) = (&via_on[i], &via_off[i]);
        assert_eq!(a.usage["prompt_tokens"], prompts[i].len(), "{model}, request {i}: the server renders the same prompt");
        let cached_api = a.usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
        assert_eq!(cached_api as usize, with[i].cached, "{model}, request {i} ({name}): API cached_tokens");
        assert_eq!(a.prefilled, prompts[i].len() as u64 - cached_api, "{model}, request {i} ({name}): /metrics re-prefilled");
        assert_eq!(b.usage["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(a.message, b.message, "{model}, request {i} ({name}): response differs from reuse disabled");
        assert_eq!(a.usage["completion_tokens"], b.usage["completion_tokens"]);
    }

    // The budget and the saved state are visible.
    let status = request(&api_on.base, "GET", "/v1/cache/status", &[], b"").body;
    let status: Value = serde_json::from_str(&status).expect("status JSON");
    let pc = &status["prefix_cache"];
    assert_eq!(pc["budget_bytes"], 256u64 << 20, "{status}");
    assert!(pc["anchors"].as_u64().unwrap_or(0) > 0 && pc["bytes"].as_u64().unwrap_or(0) > 0, "{status}");
    assert_eq!(pc["reused_tokens"].as_u64(), Some(total_reused as u64), "{status}");
    let metrics = request(&api_on.base, "GET", "/metrics", &[], b"").body;
    assert!(metrics.contains(&format!("ft_prefix_cache_budget_bytes {}", 256u64 << 20)), "{metrics}");
    assert!(metrics.contains(&format!("ft_prompt_tokens_reused_total {total_reused}")), "{metrics}");
}

#[test]
fn agent_transcript_attention_model() {
    check_transcript("qwen3_moe", &common::fixture("qwen3_moe").join("checkpoint"));
}

#[test]
fn agent_transcript_hybrid_model_reuses_only_snapshots() {
    check_transcript("qwen3_5_moe", &common::fixture("qwen3_5_moe").join("checkpoint"));
}

/// DeepSeek-V4's compressors carry state like a recurrent layer: reuse restores whole
/// snapshots only, and every response equals the one without reuse.
#[test]
fn agent_transcript_deepseek_v4_reuses_only_snapshots() {
    check_transcript("deepseek_v4", &common::fixture("deepseek_v4").join("checkpoint"));
}

/// The same transcript served from a Q8_0 GGUF of the fixture: its rebuilt tokenizer and
/// chat template render the same prompts, and reuse follows the same rules.
#[test]
fn agent_transcript_gguf_model() {
    let Some(py) = common::gguf_python() else { return };
    let (gguf, _) = common::gguf_convert(&py, &common::fixture("qwen3_moe").join("checkpoint"), "prefix-reuse", "q8_0", &[]);
    check_transcript("qwen3_moe", &gguf);
}

/// Anthropic's API reports the reused prompt tokens as `cache_read_input_tokens` and the
/// rest as `input_tokens`.
#[test]
fn anthropic_messages_report_cache_reads() {
    let server = TestServer::start(engine_config(&common::fixture("qwen3_moe").join("checkpoint"), true), ServerSettings::default());
    let system = "You are a careful coding agent. Answer briefly.";
    let first = vec![json!({"role": "user", "content": "Which file holds the parser?"})];
    let second = [first.clone(), vec![json!({"role": "assistant", "content": "src/parser.rs"}), json!({"role": "user", "content": "Open it."})]].concat();
    let mut usages = vec![];
    for messages in [first, second] {
        let before = prefill_total(&server.base);
        let body = json!({"model": "checkpoint", "system": system, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0});
        let r = post(&server.base, "/v1/messages", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let u = r.json()["usage"].clone();
        let input = u["input_tokens"].as_u64().expect("input_tokens");
        assert_eq!(prefill_total(&server.base) - before, input, "input_tokens are the prefilled ones: {u}");
        usages.push(u);
    }
    assert_eq!(usages[0]["cache_read_input_tokens"], 0);
    let reused = usages[1]["cache_read_input_tokens"].as_u64().expect("cache_read_input_tokens");
    let first_prompt = usages[0]["input_tokens"].as_u64().unwrap_or(0);
    assert!(reused >= first_prompt - 1, "the second turn resumes after the first prompt: {usages:?}");
}
