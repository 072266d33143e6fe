//! `ft-actor bench-replay`: an agent-like multi-turn transcript with edits, replayed with and
//! without prefix reuse, measuring per turn how many prompt tokens had to be prefilled and
//! the time to first token.
//!
//! The transcript is rendered by the model's own chat template, as a coding agent's requests
//! would be: a system prompt, user turns, assistant tool calls with large tool outputs, and
//! the agent's edits: an old tool output truncated, a rewind to an earlier turn, and a second
//! conversation (a subagent) that shares the system prompt.

use crate::chat::{ChatRequest, ChatTemplate};
use crate::engine::{EngineError, EngineHandle, EngineRequest};
use crate::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::time::Duration;

/// The shape of the replayed transcript.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Agent turns (each: assistant tool call, tool output, assistant answer, user message).
    pub turns: usize,
    /// Approximate tokens of each tool output.
    pub tool_tokens: usize,
    /// Tokens generated per request.
    pub gen_tokens: usize,
}

/// One request of the transcript.
#[derive(Clone, Debug)]
pub struct ReplayRequest {
    /// What the request does to the conversation.
    pub label: String,
    /// Its prompt tokens.
    pub prompt: Vec<u32>,
}

/// What one request cost.
#[derive(Clone, Debug)]
pub struct TurnCost {
    /// Prompt tokens restored from saved state.
    pub cached: usize,
    /// Prompt tokens prefilled.
    pub prefilled: usize,
    /// Submission to first token.
    pub ttft: Duration,
    /// Generated ids (to check that reuse does not change the output).
    pub tokens: Vec<u32>,
}

fn tool_output(turn: usize, tokens: usize) -> String {
    // About 24 tokens a line with the bundled test tokenizer and real BPE vocabularies alike.
    let lines = tokens.div_ceil(24).max(1);
    (0..lines).map(|i| format!("src/module_{turn}/file_{i}.rs:{}: fn handler_{i}(req: Request) -> Response\n", 10 + i * 7)).collect()
}

/// The system prompt the agent and its subagents share.
pub(crate) const SYSTEM_PROMPT: &str =
    "You are a coding agent working in a Rust repository. Use the tools to read and search files; keep answers short and precise.";

/// A conversation's requests as an agent sends them: the first (system and task), then per
/// turn the tool call with its output, and the answer with the next user turn (`full` holds
/// 2 + 4 × `turns` messages).
pub(crate) fn growing_requests(
    template: &ChatTemplate,
    tok: &Tokenizer,
    full: &[Value],
    turns: usize,
    label: &str,
) -> Result<Vec<ReplayRequest>, EngineError> {
    let mut out = vec![ReplayRequest { label: format!("{label}first request"), prompt: render(template, tok, &full[..2])? }];
    for t in 0..turns {
        for (what, end) in [("tool output", 2 + 4 * t + 2), ("next user turn", 2 + 4 * (t + 1))] {
            out.push(ReplayRequest { label: format!("{label}turn {}: {what}", t + 1), prompt: render(template, tok, &full[..end])? });
        }
    }
    Ok(out)
}

fn conversation(turns: usize, tool_tokens: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": "Find where requests are routed and add a health check endpoint."}),
    ];
    for t in 0..turns {
        m.push(json!({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "grep", "arguments": {"pattern": format!("handler_{t}"), "path": "src"}}}
        ]}));
        m.push(json!({"role": "tool", "content": tool_output(t, tool_tokens)}));
        m.push(json!({"role": "assistant", "content": format!("Found {} matches in module {t}; checking the next module.", tool_tokens / 24)}));
        m.push(json!({"role": "user", "content": format!("Good. Continue with step {}.", t + 2)}));
    }
    m
}

/// Prompt ids of `messages` with a generation prompt, as the server renders a chat request.
pub fn render(template: &ChatTemplate, tok: &Tokenizer, messages: &[Value]) -> Result<Vec<u32>, EngineError> {
    let req = ChatRequest {
        messages: messages.to_vec(),
        tools: None,
        documents: None,
        add_generation_prompt: true,
        continue_final_message: false,
        enable_thinking: None,
        extra: Default::default(),
    };
    let text = template.render(&req).map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
    tok.encode(&text, false).map_err(|e| EngineError::InvalidRequest(e.to_string()))
}

/// The transcript's requests: the conversation growing turn by turn, then the edits.
pub fn transcript(tok: &Tokenizer, o: &ReplayOptions) -> Result<Vec<ReplayRequest>, EngineError> {
    let template = ChatTemplate::from_tokenizer(tok).map_err(|e| EngineError::InvalidRequest(format!("chat template: {e}")))?;
    let turns = o.turns.max(3);
    let full = conversation(turns, o.tool_tokens);
    let mut out = growing_requests(&template, tok, &full, turns, "")?;
    let mut push = |label: String, messages: &[Value]| -> Result<(), EngineError> {
        out.push(ReplayRequest { label, prompt: render(&template, tok, messages)? });
        Ok(())
    };
    // The agent shortens the first tool output to save context.
    let mut cut = full.clone();
    let first_tool = &mut cut[3]["content"];
    let text = first_tool.as_str().unwrap_or_default().to_string();
    *first_tool = json!(format!("{}[... {} lines truncated ...]\n", &text[..text.len() / 4], text.lines().count() * 3 / 4));
    push("edit: first tool output truncated".into(), &cut)?;
    // A retry rewinds to the middle of the conversation with another instruction.
    let mut rewind = cut[..2 + 4 * (turns / 2)].to_vec();
    rewind.pop();
    rewind.push(json!({"role": "user", "content": "Stop; instead write a test for the router first."}));
    push("edit: rewind to the middle".into(), &rewind)?;
    // A subagent shares the system prompt only.
    push("subagent: same system prompt".into(), &[full[0].clone(), json!({"role": "user", "content": "Summarise the crate layout in three lines."})])?;
    Ok(out)
}

/// A request that shares no token with `requests`, so that measured requests do not pay for
/// first touches of the mapped weights, and it leaves no state they could reuse.
pub async fn warm_up(engine: &EngineHandle, requests: &[ReplayRequest], gen_tokens: usize) -> Result<(), EngineError> {
    let used: std::collections::HashSet<u32> = requests.iter().flat_map(|r| r.prompt.iter().copied()).collect();
    let vocab = engine.info().config.vocab_size as u32;
    // Long enough to route to nearly every expert of every layer at least once.
    let warm: Vec<u32> = (0..vocab).filter(|t| !used.contains(t)).take(256).collect();
    if !warm.is_empty() {
        engine.generate(EngineRequest::greedy(warm, gen_tokens.max(1))).await?.collect().await?;
    }
    Ok(())
}

/// Runs the requests one after another on `engine`, after a [`warm_up`].
pub async fn replay(engine: &EngineHandle, requests: &[ReplayRequest], gen_tokens: usize, progress: &mut dyn FnMut(&str)) -> Result<Vec<TurnCost>, EngineError> {
    warm_up(engine, requests, gen_tokens).await?;
    let mut out = vec![];
    for (i, r) in requests.iter().enumerate() {
        let before = engine.stats().await?.prefill_tokens;
        let stream = engine.generate(EngineRequest::greedy(r.prompt.clone(), gen_tokens.max(1))).await?;
        let (tokens, _, done) = stream.collect().await?;
        // Let the engine free (and save) the finished sequence before the next request.
        for _ in 0..200 {
            if engine.stats().await?.active == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let prefilled = (engine.stats().await?.prefill_tokens - before) as usize;
        progress(&format!("{}/{} {}: {} prompt tokens, {} prefilled", i + 1, requests.len(), r.label, r.prompt.len(), prefilled));
        out.push(TurnCost { cached: done.cached_tokens, prefilled, ttft: done.time_to_first_token, tokens });
    }
    Ok(out)
}
