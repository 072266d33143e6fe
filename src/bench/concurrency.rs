//! `ft-actor bench --concurrency N,…`: aggregate decode speed with N streams decoding in the
//! same batched steps, and how long a long prompt that arrives meanwhile makes them wait.
//!
//! Aggregate tokens/s is counted over the window in which all N streams are decoding: from
//! the moment the last of them has its first token to the moment the first of them ends.
//! Weight bytes per step come from the engine's read counter over the same window.

use super::{bench_prompt, Spread};
use crate::engine::{EngineError, EngineHandle, EngineRequest, GenEvent};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One concurrency level's figures.
#[derive(Clone, Debug, Default)]
pub struct ConcurrencyReport {
    /// Streams decoding together.
    pub streams: usize,
    /// Tokens/s summed over the streams, per run.
    pub aggregate_tok_s: Spread,
    /// Counted weight bytes per batched decode step (median run).
    pub bytes_per_step: f64,
    /// Counted weight bytes / window time, GB/s (median run).
    pub gb_s: f64,
    /// Mean sequences per step over the window.
    pub mean_batch: f64,
}

/// Per stream: when each token came, and whether it ended.
type Log = Arc<Mutex<Vec<Vec<Instant>>>>;

async fn stream(engine: EngineHandle, prompt: Vec<u32>, tokens: usize, log: Log, i: usize) -> Result<(), EngineError> {
    let mut req = EngineRequest::greedy(prompt, tokens);
    req.ignore_eos = true;
    let mut s = engine.generate(req).await?;
    while let Some(ev) = s.next().await {
        match ev {
            GenEvent::Token { .. } => log.lock().unwrap_or_else(|p| p.into_inner())[i].push(Instant::now()),
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => return Err(e),
        }
    }
    Ok(())
}

/// Decodes with `streams` concurrent requests of `prompt_len`-token prompts and `gen_tokens`
/// tokens each, `repeats` times; `salt` keeps the prompts apart from other runs' (cold).
pub async fn decode_together(
    engine: &EngineHandle,
    streams: usize,
    prompt_len: usize,
    gen_tokens: usize,
    repeats: usize,
    salt: u32,
) -> Result<ConcurrencyReport, EngineError> {
    let vocab = engine.info().config.vocab_size.max(2) as u32;
    let base = bench_prompt(prompt_len.max(1), vocab as usize);
    let (mut rates, mut bytes, mut gbs, mut batch) = (vec![], vec![], vec![], vec![]);
    for r in 0..repeats.max(1) {
        let log: Log = Arc::new(Mutex::new(vec![vec![]; streams]));
        let handles: Vec<_> = (0..streams)
            .map(|i| {
                let shift = salt + (r * streams + i) as u32 * 7919 + 1;
                let prompt: Vec<u32> = base.iter().map(|t| (t + shift) % vocab).collect();
                tokio::spawn(stream(engine.clone(), prompt, gen_tokens.max(2), log.clone(), i))
            })
            .collect();
        // The window opens when every stream has a token; the counters restart there.
        loop {
            if log.lock().unwrap_or_else(|p| p.into_inner()).iter().all(|v| !v.is_empty()) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_micros(200)).await;
        }
        engine.reset_stats().await?;
        let opened = Instant::now();
        let mut closed = None;
        let mut stats = None;
        for h in handles {
            h.await.map_err(|e| EngineError::Internal(format!("bench stream: {e}")))??;
            if closed.is_none() {
                closed = Some(Instant::now());
                stats = Some(engine.stats().await?);
            }
        }
        let (Some(closed), Some(stats)) = (closed, stats) else { continue };
        // The first stream to finish is one of them; count every token inside the window.
        let log = log.lock().unwrap_or_else(|p| p.into_inner());
        let end = log.iter().filter_map(|v| v.last().copied()).min().unwrap_or(closed);
        let tokens: usize = log.iter().map(|v| v.iter().filter(|&&t| t > opened && t <= end).count()).sum();
        let secs = (end - opened).as_secs_f64().max(1e-9);
        rates.push(tokens as f64 / secs);
        let per_step = stats.decode_weight_bytes as f64 / stats.decode_steps.max(1) as f64;
        bytes.push(per_step);
        gbs.push(stats.decode_weight_bytes as f64 / stats.decode_s.max(1e-9) / 1e9);
        batch.push(stats.step_sequences as f64 / stats.steps.max(1) as f64);
    }
    Ok(ConcurrencyReport {
        streams,
        aggregate_tok_s: Spread::of(&rates),
        bytes_per_step: Spread::of(&bytes).median,
        gb_s: Spread::of(&gbs).median,
        mean_batch: Spread::of(&batch).median,
    })
}

/// A long prompt arriving while `streams` streams decode, `runs` times (each a cold prompt
/// beside fresh streams): its time to first token, and the longest gap between consecutive
/// tokens any running stream saw while it was prefilled.
#[derive(Clone, Debug, Default)]
pub struct ArrivalReport {
    /// The arriving prompt's length.
    pub prompt_len: usize,
    /// Streams decoding when it arrives.
    pub streams: usize,
    /// Arrivals measured.
    pub runs: usize,
    /// Median time to first token over the runs, seconds.
    pub ttft_p50_s: f64,
    /// 99th percentile (nearest rank: the longest of fewer than 100 runs), seconds.
    pub ttft_p99_s: f64,
    /// The longest pause of a running stream meanwhile, over all runs, seconds.
    pub longest_pause_s: f64,
    /// The running streams' median gap between tokens before it arrived, seconds.
    pub typical_gap_s: f64,
    /// The longest batched step while it was prefilled (one prompt chunk beside the decodes),
    /// over all runs, seconds, from the engine's step timer: the pause a stream cannot avoid.
    pub longest_step_s: f64,
}

/// The nearest-rank `p`-th percentile of `values` (any order; 0 when empty).
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// One arrival's figures.
struct Arrival {
    ttft_s: f64,
    longest_pause_s: f64,
    typical_gap_s: f64,
    longest_step_s: f64,
}

/// See [`ArrivalReport`]; run `r` uses prompts salted with `salt + r` so none is reused.
pub async fn long_prompt_arrivals(
    engine: &EngineHandle,
    streams: usize,
    prompt_len: usize,
    runs: usize,
    salt: u32,
) -> Result<ArrivalReport, EngineError> {
    let mut all = vec![];
    for r in 0..runs.max(1) {
        all.push(long_prompt_arrival(engine, streams, prompt_len, salt + 977 * r as u32).await?);
    }
    let ttft: Vec<f64> = all.iter().map(|a| a.ttft_s).collect();
    let gaps: Vec<f64> = all.iter().map(|a| a.typical_gap_s).collect();
    Ok(ArrivalReport {
        prompt_len,
        streams,
        runs: all.len(),
        ttft_p50_s: percentile(&ttft, 50.0),
        ttft_p99_s: percentile(&ttft, 99.0),
        longest_pause_s: all.iter().map(|a| a.longest_pause_s).fold(0.0, f64::max),
        typical_gap_s: Spread::of(&gaps).median,
        longest_step_s: all.iter().map(|a| a.longest_step_s).fold(0.0, f64::max),
    })
}

async fn long_prompt_arrival(engine: &EngineHandle, streams: usize, prompt_len: usize, salt: u32) -> Result<Arrival, EngineError> {
    let vocab = engine.info().config.vocab_size.max(2) as u32;
    let base = bench_prompt(64, vocab as usize);
    let log: Log = Arc::new(Mutex::new(vec![vec![]; streams]));
    let handles: Vec<_> = (0..streams)
        .map(|i| {
            let prompt: Vec<u32> = base.iter().map(|t| (t + salt + i as u32 * 31 + 3) % vocab).collect();
            tokio::spawn(stream(engine.clone(), prompt, prompt_len + 64, log.clone(), i))
        })
        .collect();
    // Let every stream decode a few tokens first.
    loop {
        if log.lock().unwrap_or_else(|p| p.into_inner()).iter().all(|v| v.len() >= 8) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let long: Vec<u32> = bench_prompt(prompt_len.max(1), vocab as usize).iter().map(|t| (t + salt + 17) % vocab).collect();
    // The step timer's maximum from here on belongs to the arrival's steps.
    engine.reset_stats().await?;
    let arrived = Instant::now();
    let mut req = EngineRequest::greedy(long, 1);
    req.ignore_eos = true;
    let mut s = engine.generate(req).await?;
    let mut first = None;
    while let Some(ev) = s.next().await {
        match ev {
            GenEvent::Token { .. } => first = first.or(Some(Instant::now())),
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => return Err(e),
        }
    }
    let first = first.unwrap_or_else(Instant::now);
    let longest_step_s = engine.stats().await?.max_step_s;
    for h in &handles {
        h.abort();
    }
    // The next run starts beside its own streams only: wait (a while) for these to leave.
    let gone = Instant::now();
    while engine.stats().await?.sequences > 0 && gone.elapsed().as_secs() < 60 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let log = log.lock().unwrap_or_else(|p| p.into_inner());
    let mut before = vec![];
    let mut longest = 0f64;
    for v in log.iter() {
        for w in v.windows(2) {
            let gap = (w[1] - w[0]).as_secs_f64();
            if w[1] <= arrived {
                before.push(gap);
            } else if w[0] <= first {
                longest = longest.max(gap);
            }
        }
    }
    Ok(Arrival {
        ttft_s: (first - arrived).as_secs_f64(),
        longest_pause_s: longest,
        typical_gap_s: Spread::of(&before).median,
        longest_step_s,
    })
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_by_nearest_rank() {
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), 2.0);
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 99.0), 4.0);
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 99.0), 99.0);
        assert_eq!(percentile(&hundred, 50.0), 50.0);
    }
}
