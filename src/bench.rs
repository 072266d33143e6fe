//! `ft-actor bench`: prefill and decode speed against the machine's own memory bandwidth.
//!
//! Decode of one sequence is memory-bound: every step reads the non-expert weights and the
//! chosen experts once. The roofline is `bandwidth / bytes_per_token`; the report gives the
//! achieved GB/s and its fraction of the read bandwidth this command measures itself.

use crate::kv::SequenceState;
use crate::model::info::{stats, ModelStats};
use crate::model::{Logits, Model, ModelError};
use crate::sampling::argmax;
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
    /// Threads for the bandwidth measurement.
    pub threads: usize,
    /// Bytes to stream when measuring bandwidth.
    pub bandwidth_bytes: usize,
}

/// Results of a benchmark run.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// Model size facts.
    pub stats: ModelStats,
    /// Prefill throughput.
    pub prefill_tok_s: f64,
    /// Decode throughput.
    pub decode_tok_s: f64,
    /// Weight bytes read per decoded token.
    pub bytes_per_token: u64,
    /// Achieved decode bandwidth, GB/s.
    pub decode_gb_s: f64,
    /// Measured memory read bandwidth, GB/s.
    pub memory_gb_s: f64,
    /// `decode_gb_s / memory_gb_s`.
    pub roofline_fraction: f64,
    /// Decode tok/s if bandwidth were the only limit.
    pub roofline_tok_s: f64,
}

/// Runs the benchmark; `progress` receives short status lines.
pub fn run(model: &Model, opts: &BenchOptions, progress: &mut dyn FnMut(&str)) -> Result<BenchReport, ModelError> {
    let st = stats(model);
    progress(&format!("measuring memory read bandwidth ({} MiB, {} threads)", opts.bandwidth_bytes >> 20, opts.threads));
    let memory_gb_s = memory_bandwidth(opts.threads, opts.bandwidth_bytes);
    let vocab = model.config().vocab_size as u32;
    // A deterministic prompt that spreads over the vocabulary (routing then varies as in text).
    let prompt: Vec<u32> = (0..opts.prompt_len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab).collect();
    let mut state = SequenceState::new(model, opts.prompt_len + opts.gen_tokens + 1)?;
    progress(&format!("prefill of {} tokens", opts.prompt_len));
    let start = Instant::now();
    let mut logits = model.forward(&mut state, &prompt, Logits::Last)?;
    let prefill_tok_s = opts.prompt_len as f64 / start.elapsed().as_secs_f64();
    progress(&format!("decode of {} tokens", opts.gen_tokens));
    let start = Instant::now();
    for i in 0..opts.gen_tokens {
        let next = argmax(&logits);
        logits = model.forward(&mut state, &[next], Logits::Last)?;
        if (i + 1) % 8 == 0 {
            progress(&format!("  {} / {} tokens", i + 1, opts.gen_tokens));
        }
    }
    let decode_tok_s = opts.gen_tokens as f64 / start.elapsed().as_secs_f64();
    let bytes_per_token = st.bytes_per_token;
    let decode_gb_s = decode_tok_s * bytes_per_token as f64 / 1e9;
    Ok(BenchReport {
        stats: st,
        prefill_tok_s,
        decode_tok_s,
        bytes_per_token,
        decode_gb_s,
        memory_gb_s,
        roofline_fraction: if memory_gb_s > 0.0 { decode_gb_s / memory_gb_s } else { 0.0 },
        roofline_tok_s: memory_gb_s * 1e9 / bytes_per_token.max(1) as f64,
    })
}
