//! `ft-actor bench`: prefill and decode speed through the engine, against the machine's own
//! memory bandwidth.
//!
//! Decode of one sequence is memory-bound: every step reads the non-expert weights and the
//! chosen experts once. Every figure is measured: tokens/s from timers over repeated runs
//! (median and spread), weight bytes per token from the counter every weight-matrix product
//! adds to ([`crate::model::reads`]), GB/s as counted bytes over decode time, and the roofline
//! fraction against the median of a read-bandwidth probe run by the same command. Prefills are
//! cold (no prompt shares a first token with an earlier one). Plus the expert cache behaviour
//! (hit rate, bytes moved) and the actor overhead per step.

pub mod concurrency;
pub mod constrained;
pub mod replay;
pub mod stream;
pub mod subagents;

use crate::engine::{EngineError, EngineHandle, EngineRequest, EngineStats, GenEvent};
use ft_backend_cpu::kernels::clock::{decode_products, ProductTime};
use ft_backend_cpu::kernels::Loads;
use rayon::prelude::*;
use std::time::Instant;

/// A memory read bandwidth probe: several timed passes over one buffer, in each load pattern.
#[derive(Clone, Debug, Default)]
pub struct Bandwidth {
    /// Median pass of the faster pattern, GB/s (what rooflines are computed against).
    pub median: f64,
    /// Slowest pass of that pattern, GB/s.
    pub min: f64,
    /// Fastest pass of that pattern, GB/s.
    pub max: f64,
    /// Timed passes per pattern (after one untimed pass that faults the pages in).
    pub passes: usize,
    /// The faster pattern.
    pub loads: Loads,
    /// Median pass of the next fastest pattern, GB/s.
    pub other_median: f64,
    /// Share of the buffer the kernel gave 2 MiB pages (`None` where `/proc` does not say).
    pub huge_pages: Option<f64>,
}

/// Measures streaming read bandwidth over `bytes` of memory with `threads` threads: passes of
/// each load pattern ([`Loads::ALL`]: plain loads, loads with the weight kernels' software
/// prefetch, and those from four parts of each range in turn) alternate, `passes` of each, and
/// the pattern with the highest median is the machine's figure (median and spread; one pass
/// varies with the machine's other load). One plain sequential stream a thread can understate
/// what the memory gives: a core of some machines keeps too few misses in flight for it.
pub fn memory_bandwidth(threads: usize, bytes: usize, passes: usize) -> Bandwidth {
    let words = (bytes / 8).max(1 << 16);
    let mut buffer = ProbeBuffer::new(words);
    buffer.words().iter_mut().enumerate().for_each(|(i, w)| *w = i as u64);
    let huge_pages = buffer.huge_kib().map(|kib| (kib as f64 * 1024.0 / (words * 8) as f64).min(1.0));
    let data: &[u64] = buffer.words();
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build() {
        Ok(p) => p,
        Err(_) => return Bandwidth::default(),
    };
    let pass = |loads: Loads| {
        let start = Instant::now();
        // The widest loads the CPU has: narrower ones leave a core short of its bandwidth (the
        // probe read 20 GB/s here with 16-byte loads where 64-byte loads read 28). One
        // contiguous range per thread, as a kernel's rows are.
        let level = ft_backend_cpu::SimdLevel::Auto;
        let per = words.div_ceil(threads.max(1));
        let sum = pool.install(|| {
            data.par_chunks(per).with_max_len(1).map(|chunk| ft_backend_cpu::kernels::stream_sum(level, loads, chunk)).reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        (words * 8) as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    pass(Loads::Plain);
    let mut rates = Loads::ALL.map(|_| vec![]);
    for _ in 0..passes.max(1) {
        for (i, loads) in Loads::ALL.into_iter().enumerate() {
            rates[i].push(pass(loads));
        }
    }
    rates.iter_mut().for_each(|r| r.sort_by(f64::total_cmp));
    let medians = rates.each_ref().map(|r| median(r));
    let best = (0..medians.len()).max_by(|&a, &b| medians[a].total_cmp(&medians[b])).unwrap_or(0);
    let r = &rates[best];
    Bandwidth {
        median: median(r),
        min: r[0],
        max: r[r.len() - 1],
        passes: r.len(),
        loads: Loads::ALL[best],
        other_median: (0..medians.len()).filter(|&i| i != best).map(|i| medians[i]).fold(0.0, f64::max),
        huge_pages,
    }
}

/// The probe's memory: anonymous, advised for transparent huge pages where the kernel has
/// them, as the weights decode reads are (the hot copies, and the large folios a populated
/// mapping brings). On 4 KiB pages the probe read 23.0–23.2 GB/s here in runs where bf16
/// decode read its weights at 22.4, from 2 MiB pages: a probe on small pages understates the
/// roofline. A plain vector where the mapping fails.
enum ProbeBuffer {
    Mapped(memmap2::MmapMut),
    Vec(Vec<u64>),
}

impl ProbeBuffer {
    fn new(words: usize) -> ProbeBuffer {
        match memmap2::MmapMut::map_anon(words * 8) {
            Ok(map) => {
                #[cfg(target_os = "linux")]
                let _ = map.advise(memmap2::Advice::HugePage);
                ProbeBuffer::Mapped(map)
            }
            Err(_) => ProbeBuffer::Vec(vec![0; words]),
        }
    }

    fn words(&mut self) -> &mut [u64] {
        match self {
            // A mapping is page-aligned and a whole number of words long.
            ProbeBuffer::Mapped(m) => bytemuck::cast_slice_mut(&mut m[..]),
            ProbeBuffer::Vec(v) => v,
        }
    }

    /// KiB of the buffer in transparent huge pages, from `/proc/self/smaps`.
    fn huge_kib(&self) -> Option<u64> {
        let ProbeBuffer::Mapped(m) = self else { return Some(0) };
        crate::model::readahead::mapping_kib(m.as_ptr() as usize, "AnonHugePages")
    }
}

/// The median of sorted values (0 for none).
fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Median, minimum and maximum of repeated measurements.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (any order).
    pub fn of(values: &[f64]) -> Spread {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        Spread { median: median(&v), min: v.first().copied().unwrap_or(0.0), max: v.last().copied().unwrap_or(0.0) }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Prompt tokens to prefill.
    pub prompt_len: usize,
    /// Tokens to decode.
    pub gen_tokens: usize,
    /// Measured runs (each a cold prefill and a decode); the report gives their spread.
    pub repeats: usize,
}

/// Results of one engine configuration.
#[derive(Clone, Debug, Default)]
pub struct BenchReport {
    /// Cold prefill throughput over the runs, tokens/s.
    pub prefill_tok_s: Spread,
    /// Decode throughput over the runs, tokens/s.
    pub decode_tok_s: Spread,
    /// Weight bytes read per decoded token, counted as the matrices were used (median run).
    pub bytes_per_token: f64,
    /// What the model's shape says a decoded token reads (non-expert + top-k experts), for
    /// comparison with the count.
    pub model_bytes_per_token: u64,
    /// Achieved decode bandwidth over the runs: counted weight bytes / decode time, GB/s.
    pub decode_gb_s: Spread,
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
    /// MoE expert phases as a fraction of decode step time (timed on the device stream; the
    /// rest is attention, dense layers, routing and the head).
    pub expert_phase: f64,
    /// Busy fraction of the CPU worker pool's threads over the decode runs (their CPU time
    /// from the kernel's per-thread accounting / (threads × decode wall time)); `None` where
    /// `/proc` does not say.
    pub pool_busy: Option<f64>,
    /// Where decode-sized weight products ran on the CPU: the share of decode wall time during
    /// which at least one did, and the weight bytes they read over that time, GB/s
    /// ([`ft_backend_cpu::kernels::clock`]); `None` where none ran.
    pub cpu_products: Option<(f64, f64)>,
}

/// CPU seconds the threads named `ft-cpu-*` (the worker pool) have run, and how many there
/// are, from `/proc/self/task/*/schedstat` (nanoseconds on a CPU); `None` without `/proc`.
pub fn pool_cpu_seconds() -> Option<(f64, usize)> {
    let mut total = 0u64;
    let mut threads = 0usize;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let p = task.path();
        let Ok(name) = std::fs::read_to_string(p.join("comm")) else { continue };
        if !name.starts_with("ft-cpu-") {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(p.join("schedstat")) else { continue };
        if let Some(ns) = stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()) {
            total += ns;
            threads += 1;
        }
    }
    (threads > 0).then_some((total as f64 / 1e9, threads))
}

/// A deterministic prompt that spreads over the vocabulary (routing then varies as in text).
pub fn bench_prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab.max(1) as u32).collect()
}

/// Measures `engine`: a warm-up (so the mapped weights are resident), then `repeats` runs of a
/// cold prefill and a decode. Each run's prompt starts with a token no earlier prompt started
/// with, so every prefill is computed, not restored from the prefix store.
pub async fn run(engine: &EngineHandle, opts: &BenchOptions, progress: &mut (dyn FnMut(&str) + Send)) -> Result<BenchReport, EngineError> {
    let info = engine.info();
    let vocab = info.config.vocab_size.max(2) as u32;
    let base = bench_prompt(opts.prompt_len.max(1), info.config.vocab_size);
    let prompt_for = |run: u32| -> Vec<u32> { base.iter().map(|t| (t + run) % vocab).collect() };
    progress("warm-up");
    one_run(engine, prompt_for(0), 2).await?;
    let runs = opts.repeats.max(1);
    let (mut prefill, mut decode, mut gb_s, mut bytes) = (vec![], vec![], vec![], vec![]);
    // Over every decode run: the layer counters after each run's first token and the decode
    // steps they cover; the decode steps' seconds, actor and expert-phase seconds.
    let (mut layers, mut layer_steps) = (crate::engine::LayerStats::default(), 0u64);
    let (mut dec_s, mut actor_s, mut expert_s) = (0.0, 0.0, 0.0);
    // Pool CPU seconds and thread-seconds of wall time over every decode run.
    let (mut pool_cpu, mut pool_wall, mut pool_known) = (0.0, 0.0, true);
    // Decode-sized CPU products over every decode run, and the decode wall time they fall in.
    let (mut products, mut products_wall) = (ProductTime::default(), 0.0);
    for r in 0..runs {
        let prompt = prompt_for(1 + 2 * r as u32);
        progress(&format!("run {}/{runs}: cold prefill of {} tokens", r + 1, prompt.len()));
        let prefill_s = one_run(engine, prompt, 1).await?.first_s;
        prefill.push(prompt_len_or_1(opts) / prefill_s.max(1e-9));
        progress(&format!("run {}/{runs}: decode of {} tokens", r + 1, opts.gen_tokens));
        // Reset before the request, not at its first token: the reset then reaches the device
        // stream ahead of the request's steps, so the decode counters hold all of them (the
        // prompt's step is not a decode step). Reset at the first token, it could land after
        // the last step of a fast model and leave nothing counted.
        engine.reset_stats().await?;
        let Run { after_s: decode_s, tokens: n, pool_cpu: cpu, at_first, products: timed, .. } = one_run(engine, prompt_for(2 + 2 * r as u32), opts.gen_tokens + 1).await?;
        products = products.plus(&timed);
        products_wall += decode_s;
        match cpu {
            Some((secs, threads)) => {
                pool_cpu += secs;
                pool_wall += threads as f64 * decode_s;
            }
            None => pool_known = false,
        }
        let tok_s = n.saturating_sub(1).max(1) as f64 / decode_s.max(1e-9);
        // The engine counts the bytes its decode steps read, and the steps: both over the
        // same steps.
        let stats = engine.stats().await?;
        let per_token = stats.decode_weight_bytes as f64 / stats.decode_tokens.max(1) as f64;
        decode.push(tok_s);
        bytes.push(per_token);
        gb_s.push(per_token * tok_s / 1e9);
        (dec_s, actor_s, expert_s) = (dec_s + stats.decode_s, actor_s + stats.actor_overhead_s, expert_s + stats.decode_expert_s);
        if let Some(first) = at_first {
            layers.add(&stats.total.since(&first.total));
            layer_steps += stats.decode_tokens.saturating_sub(first.decode_tokens);
        }
    }
    let steps = layer_steps.max(1) as f64;
    let of_decode = |s: f64| if dec_s > 0.0 { s / dec_s } else { 0.0 };
    Ok(BenchReport {
        prefill_tok_s: Spread::of(&prefill),
        decode_tok_s: Spread::of(&decode),
        bytes_per_token: Spread::of(&bytes).median,
        model_bytes_per_token: info.stats.bytes_per_token,
        decode_gb_s: Spread::of(&gb_s),
        hit_rate: layers.hit_rate(),
        bytes_moved_per_token: layers.bytes_moved as f64 / steps,
        fetched_per_token: layers.fetched as f64 / steps,
        cpu_per_token: layers.cpu_computed as f64 / steps,
        actor_overhead: of_decode(actor_s),
        expert_phase: of_decode(expert_s),
        pool_busy: (pool_known && pool_wall > 0.0).then(|| pool_cpu / pool_wall),
        cpu_products: (products.bytes > 0 && products_wall > 0.0).then(|| {
            let busy = products.busy.as_secs_f64();
            (busy / products_wall, products.bytes as f64 / busy.max(1e-9) / 1e9)
        }),
    })
}

/// What [`one_run`] measured of one request.
struct Run {
    /// Seconds to the first token.
    first_s: f64,
    /// Seconds after it.
    after_s: f64,
    /// Tokens received.
    tokens: usize,
    /// The worker pool's CPU seconds after the first token, and its threads.
    pool_cpu: Option<(f64, usize)>,
    /// The engine's stats at the first token: the layer counters after it describe the
    /// decode alone (the prompt's step is done by then).
    at_first: Option<EngineStats>,
    /// Decode-sized CPU products after the first token.
    products: ProductTime,
}

/// Runs one greedy request of `tokens` tokens.
async fn one_run(engine: &EngineHandle, prompt: Vec<u32>, tokens: usize) -> Result<Run, EngineError> {
    let mut req = EngineRequest::greedy(prompt, tokens);
    req.ignore_eos = true;
    let start = Instant::now();
    let mut stream = engine.generate(req).await?;
    let (mut first, mut n, mut cpu0, mut snapshot) = (None, 0usize, None, None);
    let mut products0 = decode_products();
    while let Some(ev) = stream.next().await {
        match ev {
            GenEvent::Token { .. } => {
                n += 1;
                if first.is_none() {
                    first = Some(start.elapsed().as_secs_f64());
                    snapshot = Some(engine.stats().await?);
                    cpu0 = pool_cpu_seconds();
                    products0 = decode_products();
                }
            }
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => return Err(e),
        }
    }
    let first = first.unwrap_or_default();
    let elapsed = start.elapsed().as_secs_f64() - first;
    let cpu = match (cpu0, pool_cpu_seconds()) {
        (Some((a, _)), Some((b, threads))) => Some((b - a, threads)),
        _ => None,
    };
    let products = decode_products().since(&products0);
    Ok(Run { first_s: first, after_s: elapsed, tokens: n, pool_cpu: cpu, at_first: snapshot, products })
}

fn prompt_len_or_1(o: &BenchOptions) -> f64 {
    o.prompt_len.max(1) as f64
}
