//! `ft-actor bench`: prefill and decode speed through the engine, against the machine's own
//! memory bandwidth.
//!
//! Decode of one sequence is memory-bound: every step reads the non-expert weights and the
//! chosen experts once. The roofline is `bandwidth / bytes_per_token`; the report gives the
//! achieved GB/s and its fraction of the read bandwidth this command measures itself, plus
//! the expert cache behaviour (hit rate, bytes moved) and the actor overhead per step.

pub mod replay;

use crate::engine::{EngineError, EngineHandle, EngineRequest, GenEvent};
use rayon::prelude::*;
use std::time::Instant;

/// Measures streaming read bandwidth (GB/s, best of several passes) over `bytes` of memory
/// with `threads` threads.
pub fn memory_bandwidth(threads: usize, bytes: usize) -> f64 {
    let words = (bytes / 8).max(1 << 16);
    let data: Vec<u64> = (0..words as u64).collect();
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build() {
        Ok(p) => p,
        Err(_) => return 0.0,
    };
    let mut best = 0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let sum = pool.install(|| {
            data.par_chunks(1 << 16)
                .map(|chunk| {
                    // Eight independent lanes let the compiler vectorise the reduction, so the
                    // loop is limited by memory, not by one add chain.
                    let mut acc = [0u64; 8];
                    for c in chunk.chunks_exact(8) {
                        for i in 0..8 {
                            acc[i] = acc[i].wrapping_add(c[i]);
                        }
                    }
                    acc.iter().fold(0u64, |a, b| a.wrapping_add(*b))
                })
                .reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        let secs = start.elapsed().as_secs_f64();
        best = best.max((words * 8) as f64 / secs / 1e9);
    }
    best
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Prompt tokens to prefill.
    pub prompt_len: usize,
    /// Tokens to decode.
    pub gen_tokens: usize,
}

/// Results of one engine configuration.
#[derive(Clone, Debug, Default)]
pub struct BenchReport {
    /// Prefill throughput.
    pub prefill_tok_s: f64,
    /// Decode throughput.
    pub decode_tok_s: f64,
    /// Weight bytes read per decoded token (non-expert + top-k experts).
    pub bytes_per_token: u64,
    /// Achieved decode bandwidth, GB/s.
    pub decode_gb_s: f64,
    /// Expert cache hit rate during decode.
    pub hit_rate: f64,
    /// Host→device bytes per decoded token.
    pub bytes_moved_per_token: f64,
    /// Misses fetched per decoded token.
    pub fetched_per_token: f64,
    /// Misses computed on the CPU per decoded token.
    pub cpu_per_token: f64,
    /// Actor messaging as a fraction of decode step time.
    pub actor_overhead: f64,
}

/// A deterministic prompt that spreads over the vocabulary (routing then varies as in text).
pub fn bench_prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab.max(1) as u32).collect()
}

async fn one_run(engine: &EngineHandle, prompt: Vec<u32>, tokens: usize, reset_after_first: bool) -> Result<(f64, f64, usize), EngineError> {
    let mut req = EngineRequest::greedy(prompt, tokens);
    req.ignore_eos = true;
    let start = Instant::now();
    let mut stream = engine.generate(req).await?;
    let (mut first, mut n) = (None, 0usize);
    while let Some(ev) = stream.next().await {
        match ev {
            GenEvent::Token { .. } => {
                n += 1;
                if first.is_none() {
                    first = Some(start.elapsed().as_secs_f64());
                    if reset_after_first {
                        engine.reset_stats().await?;
                    }
                }
            }
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => return Err(EngineError::Internal(e)),
        }
    }
    let first = first.unwrap_or_default();
    Ok((first, start.elapsed().as_secs_f64() - first, n))
}

/// Measures `engine`: a warm-up (so the mapped weights are resident), a cold prefill, a decode.
pub async fn run(engine: &EngineHandle, opts: &BenchOptions, progress: &mut (dyn FnMut(&str) + Send)) -> Result<BenchReport, EngineError> {
    let info = engine.info();
    let prompt = bench_prompt(opts.prompt_len.max(1), info.config.vocab_size);
    progress("warm-up");
    // The warm-up makes the mapped weights resident; its prompt shares no first token with the
    // measured one, so the prefill below is computed, not restored from the prefix store.
    let vocab = info.config.vocab_size.max(2) as u32;
    let warm: Vec<u32> = prompt.iter().map(|t| (t + 1) % vocab).collect();
    one_run(engine, warm, 2, false).await?;
    progress(&format!("prefill of {} tokens", prompt.len()));
    let (prefill_s, _, _) = one_run(engine, prompt.clone(), 1, false).await?;
    progress(&format!("decode of {} tokens", opts.gen_tokens));
    let (_, decode_s, n) = one_run(engine, prompt, opts.gen_tokens + 1, true).await?;
    let stats = engine.stats().await?;
    let decoded = n.saturating_sub(1).max(1) as f64;
    let steps = stats.decode_steps.max(1) as f64;
    let decode_tok_s = decoded / decode_s.max(1e-9);
    let bytes_per_token = info.stats.bytes_per_token;
    Ok(BenchReport {
        prefill_tok_s: prompt_len_or_1(opts) / prefill_s.max(1e-9),
        decode_tok_s,
        bytes_per_token,
        decode_gb_s: decode_tok_s * bytes_per_token as f64 / 1e9,
        hit_rate: stats.total.hit_rate(),
        bytes_moved_per_token: stats.total.bytes_moved as f64 / steps,
        fetched_per_token: stats.total.fetched as f64 / steps,
        cpu_per_token: stats.total.cpu_computed as f64 / steps,
        actor_overhead: stats.actor_overhead_fraction(),
    })
}

fn prompt_len_or_1(o: &BenchOptions) -> f64 {
    o.prompt_len.max(1) as f64
}
