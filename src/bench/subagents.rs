//! `ft-actor bench-replay --subagents N`: an agent and N subagents working at once, as a coding
//! agent fans out. Each conversation is a chain of requests (the next sent when the previous
//! reply is complete, with the conversation grown by a tool output or a user turn); all start
//! together, so their steps share forward passes. The same conversations run one after another
//! on a fresh engine for comparison: wall time, time to first token, prefill work, and whether
//! each request's tokens are the same both ways.

use super::replay::{growing_requests, ReplayOptions, ReplayRequest, SYSTEM_PROMPT};
use crate::chat::ChatTemplate;
use crate::engine::{EngineError, EngineHandle, EngineRequest};
use crate::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Subagent `k`'s conversation, grown turn by turn: the agent's system prompt, its own task,
/// and tool calls whose outputs are its own (so subagents share only the system prompt).
fn subagent_conversation(k: usize, o: &ReplayOptions) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": format!("Subtask {k}: list the public functions of crate part {k} and note which lack tests.")}),
    ];
    for t in 0..o.turns.max(1) {
        let lines = o.tool_tokens.div_ceil(24).max(1);
        let output: String = (0..lines).map(|i| format!("crates/part_{k}/src/item_{t}_{i}.rs:{}: pub fn item_{k}_{t}_{i}() -> Result<()>\n", 3 + i * 5)).collect();
        m.push(json!({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "grep", "arguments": {"pattern": format!("pub fn item_{k}_{t}"), "path": format!("crates/part_{k}")}}}
        ]}));
        m.push(json!({"role": "tool", "content": output}));
        m.push(json!({"role": "assistant", "content": format!("Part {k}, batch {t}: {lines} functions listed.")}));
        m.push(json!({"role": "user", "content": "Next batch."}));
    }
    m
}

/// The requests of `n` subagents, one chain each: the first request, then per turn the tool
/// output and the next user turn.
pub fn subagent_transcripts(tok: &Tokenizer, o: &ReplayOptions, n: usize) -> Result<Vec<Vec<ReplayRequest>>, EngineError> {
    let template = ChatTemplate::from_tokenizer(tok).map_err(|e| EngineError::InvalidRequest(format!("chat template: {e}")))?;
    (0..n).map(|k| growing_requests(&template, tok, &subagent_conversation(k, o), o.turns.max(1), &format!("subagent {k}: "))).collect()
}

/// One request's cost in a chain.
#[derive(Clone, Debug)]
pub struct ChainTurn {
    /// Submission to first token.
    pub ttft: Duration,
    /// Prompt tokens restored from saved state.
    pub cached: usize,
    /// Generated ids.
    pub tokens: Vec<u32>,
}

/// What running the chains cost.
#[derive(Clone, Debug)]
pub struct ChainsReport {
    /// First submission to last reply.
    pub wall: Duration,
    /// Per chain, per request.
    pub turns: Vec<Vec<ChainTurn>>,
    /// Prompt tokens the engine prefilled (after reuse), from its counters.
    pub prefilled: u64,
    /// Tokens generated.
    pub generated: u64,
    /// The most sequences one step advanced.
    pub max_batch: u64,
    /// Running sequences preempted for KV room.
    pub preemptions: u64,
}

impl ChainsReport {
    /// Times to first token, sorted.
    pub fn ttfts(&self) -> Vec<Duration> {
        let mut v: Vec<Duration> = self.turns.iter().flatten().map(|t| t.ttft).collect();
        v.sort();
        v
    }
}

async fn run_chain(engine: EngineHandle, chain: Vec<ReplayRequest>, gen_tokens: usize) -> Result<Vec<ChainTurn>, EngineError> {
    let mut out = vec![];
    for r in chain {
        let (tokens, _, done) = engine.generate(EngineRequest::greedy(r.prompt, gen_tokens.max(1))).await?.collect().await?;
        out.push(ChainTurn { ttft: done.time_to_first_token, cached: done.cached_tokens, tokens });
    }
    Ok(out)
}

/// Runs `chains` on `engine`: all at once (`parallel`), or one chain after another.
pub async fn run_chains(engine: &EngineHandle, chains: &[Vec<ReplayRequest>], gen_tokens: usize, parallel: bool) -> Result<ChainsReport, EngineError> {
    let before = engine.stats().await?;
    let start = Instant::now();
    let mut turns = vec![];
    if parallel {
        let tasks: Vec<_> = chains.iter().map(|c| tokio::spawn(run_chain(engine.clone(), c.clone(), gen_tokens))).collect();
        for t in tasks {
            turns.push(t.await.map_err(|e| EngineError::Internal(format!("a chain's task failed: {e}")))??);
        }
    } else {
        for c in chains {
            turns.push(run_chain(engine.clone(), c.clone(), gen_tokens).await?);
        }
    }
    let wall = start.elapsed();
    let after = engine.stats().await?;
    Ok(ChainsReport {
        wall,
        turns,
        prefilled: after.prefill_tokens - before.prefill_tokens,
        generated: after.tokens_generated - before.tokens_generated,
        max_batch: after.max_batch,
        preemptions: after.preemptions - before.preemptions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subagents_share_only_the_system_prompt() {
        let o = ReplayOptions { turns: 2, tool_tokens: 48, gen_tokens: 1 };
        let (a, b) = (subagent_conversation(0, &o), subagent_conversation(1, &o));
        assert_eq!(a.len(), 2 + 4 * 2);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[3], b[3]);
    }
}
