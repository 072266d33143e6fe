//! `ft-actor bench --constrained`: decode speed with a grammar's mask computed for every token
//! (beside the forward pass, as the server does it) against the same decode without one, in
//! alternating runs so that both see the same machine state.
//!
//! The grammar is a JSON array of at least 10 000 strings, so that it never completes within
//! the run and most of the vocabulary stays allowed inside the strings: the expensive case for
//! the mask, which walks the whole token trie.

use super::{bench_prompt, Spread};
use crate::engine::{EngineError, EngineHandle, EngineRequest, GenEvent};
use crate::sampling::grammar::GrammarSpec;
use std::time::Instant;

/// Free and constrained decode speed.
#[derive(Clone, Debug, Default)]
pub struct ConstrainedReport {
    /// Decode tokens/s without a grammar, per run.
    pub free_tok_s: Spread,
    /// Decode tokens/s with the grammar's mask on every token, per run.
    pub constrained_tok_s: Spread,
    /// `1 − constrained / free` of the medians.
    pub overhead: f64,
    /// Tokens the tokenizer gives the grammar (the trie the mask walks).
    pub vocab_tokens: usize,
}

/// Decode tokens/s of one request (time from its first token to its last).
async fn decode(engine: &EngineHandle, prompt: Vec<u32>, tokens: usize, constrained: bool) -> Result<f64, EngineError> {
    let mut req = EngineRequest::greedy(prompt, tokens);
    req.ignore_eos = true;
    if constrained {
        let schema = serde_json::json!({"type": "array", "items": {"type": "string"}, "minItems": 10000});
        req.constraint = Some(engine.compile_grammar(GrammarSpec::JsonSchema(schema)).await?);
    }
    let mut s = engine.generate(req).await?;
    let (mut first, mut last, mut n) = (None, None, 0usize);
    while let Some(ev) = s.next().await {
        match ev {
            GenEvent::Token { .. } => {
                n += 1;
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
            }
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => return Err(e),
        }
    }
    let secs = match (first, last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    Ok(n.saturating_sub(1) as f64 / secs.max(1e-9))
}

/// `repeats` pairs of runs (free, then constrained) of `tokens` decoded tokens after a
/// `prompt_len`-token prompt; `salt` keeps the prompts apart from other measurements'.
pub async fn constrained_overhead(engine: &EngineHandle, prompt_len: usize, tokens: usize, repeats: usize, salt: u32) -> Result<ConstrainedReport, EngineError> {
    let vocab = engine.info().config.vocab_size;
    let base = bench_prompt(prompt_len.max(1), vocab);
    let prompt = |k: u32| -> Vec<u32> { base.iter().map(|t| (t + salt + k) % vocab.max(1) as u32).collect() };
    let (mut free, mut constrained) = (vec![], vec![]);
    for r in 0..repeats.max(1) as u32 {
        free.push(decode(engine, prompt(2 * r), tokens + 1, false).await?);
        constrained.push(decode(engine, prompt(2 * r + 1), tokens + 1, true).await?);
    }
    let (free, constrained) = (Spread::of(&free), Spread::of(&constrained));
    let overhead = 1.0 - constrained.median / free.median.max(1e-9);
    let vocab_tokens = engine.tokenizer().map_or(0, |t| t.vocab_size());
    Ok(ConstrainedReport { free_tok_s: free, constrained_tok_s: constrained, overhead, vocab_tokens })
}
