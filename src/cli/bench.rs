//! `ft-actor bench`: one engine per `--moe-mode` in `--modes`, same model and cache cap.

use super::{runtime, start_engine, ModelArgs};
use crate::bench::concurrency::{decode_together, long_prompt_arrivals, ArrivalReport, ConcurrencyReport};
use crate::bench::constrained::{constrained_overhead, ConstrainedReport};
use crate::bench::{memory_bandwidth, run as run_bench, BenchOptions};
use crate::policy::MoeMode;
use anyhow::Result;
use clap::Args;

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens to prefill.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Tokens to decode.
    #[arg(long, default_value_t = 32)]
    gen_tokens: usize,
    /// Measured runs per mode (a cold prefill and a decode each); the spread is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Timed passes of the bandwidth probe (their median is the roofline's bandwidth).
    #[arg(long, default_value_t = 7)]
    bandwidth_passes: usize,
    /// MoE modes to compare (default: just --moe-mode).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<MoeMode>,
    /// MiB streamed to measure memory bandwidth.
    #[arg(long, default_value_t = 1024)]
    bandwidth_mib: usize,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Also measure aggregate decode with this many streams decoding together (e.g. 1,4,8).
    #[arg(long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// With --concurrency: a prompt of this many tokens arrives while streams decode (--repeat
    /// times); its time to first token (p50, p99) and the longest pause it causes are reported.
    #[arg(long, default_value_t = 0)]
    arrival_prompt: usize,
    /// Streams decoding when the --arrival-prompt arrives (default: the largest --concurrency).
    #[arg(long)]
    arrival_streams: Option<usize>,
    /// Also measure decode with a JSON grammar's mask on every token against decode without.
    #[arg(long)]
    constrained: bool,
}

/// Where the bench says what it is doing: a spinner with the current step on a terminal, a
/// line per step otherwise (logs keep every step; a terminal keeps one line).
struct Status(Option<indicatif::ProgressBar>);

impl Status {
    fn new() -> Status {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return Status(None);
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(indicatif::ProgressStyle::with_template("{spinner} [{elapsed}] {msg}").unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Status(Some(bar))
    }

    fn say(&self, line: &str) {
        match &self.0 {
            Some(bar) => bar.set_message(line.to_string()),
            None => eprintln!("{line}"),
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// `bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    let threads = a.model.cpu_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!("measuring memory read bandwidth ({} MiB, {threads} threads, {} passes)", a.bandwidth_mib, a.bandwidth_passes);
    let bw = memory_bandwidth(threads, a.bandwidth_mib << 20, a.bandwidth_passes);
    let memory_gb_s = bw.median;
    let modes = if a.modes.is_empty() { vec![a.model.moe_mode] } else { a.modes.clone() };
    let opts = BenchOptions { prompt_len: a.prompt_len.max(1), gen_tokens: a.gen_tokens.max(1), repeats: a.repeat.max(1) };
    let rt = runtime()?;
    let mut rows = vec![];
    for mode in modes {
        let mut config = a.model.engine_config();
        config.moe_mode = mode;
        if let Some(&most) = a.concurrency.iter().max() {
            // The arriving prompt runs beside its streams, not after them.
            let beside = a.arrival_streams.unwrap_or(most) + 1;
            config.max_active = config.max_active.max(most).max(if a.arrival_prompt > 0 { beside } else { 0 });
        }
        let r = rt.block_on(async {
            let engine = start_engine(config).await?;
            let info = engine.info().clone();
            let status = Status::new();
            let r = run_bench(&engine, &opts, &mut |line| status.say(&format!("[{mode}] {line}"))).await;
            status.done();
            let mut together = vec![];
            let mut arrival = None;
            if r.is_ok() {
                for (k, &n) in a.concurrency.iter().enumerate() {
                    eprintln!("[{mode}] {n} streams decoding together ({} runs)", opts.repeats);
                    let salt = 1_000 + 100 * k as u32;
                    together.push(decode_together(&engine, n.max(1), opts.prompt_len, opts.gen_tokens, opts.repeats, salt).await?);
                }
                if let (Some(&most), true) = (a.concurrency.iter().max(), a.arrival_prompt > 0) {
                    let n = a.arrival_streams.unwrap_or(most).max(1);
                    eprintln!("[{mode}] a {}-token prompt arriving while {n} streams decode ({} runs)", a.arrival_prompt, opts.repeats);
                    arrival = Some(long_prompt_arrivals(&engine, n, a.arrival_prompt, opts.repeats, 5_000).await?);
                }
                if a.constrained {
                    eprintln!("[{mode}] decode with and without a grammar ({} pairs of runs)", opts.repeats);
                    let c = constrained_overhead(&engine, opts.prompt_len, opts.gen_tokens, opts.repeats, 5_000).await?;
                    print_constrained(mode, &c, a.json);
                }
            }
            engine.shutdown().await;
            anyhow::Ok((info, (r?, together, arrival)))
        })?;
        rows.push((mode, r));
    }
    let spread = |s: &crate::bench::Spread, digits: usize| format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.min, s.max, d = digits);
    if !a.json {
        println!(
            "memory read bandwidth {:.1} GB/s (median of {} passes summing {} MiB with {threads} threads and the widest vector loads, {}; {:.1}–{:.1}; \
             the fastest of three patterns, the next one's median {:.1}; {} of the buffer in 2 MiB pages)",
            bw.median,
            bw.passes,
            a.bandwidth_mib,
            bw.loads.describe(),
            bw.min,
            bw.max,
            bw.other_median,
            bw.huge_pages.map_or("unknown share".to_string(), |f| format!("{:.0} %", f * 100.0))
        );
        println!(
            "{} runs per mode: tokens/s from timers (median, min–max); weight bytes per token from the counter of every \
             weight-matrix product (the model's shape says the figure in brackets); GB/s = counted bytes / decode time; \
             roofline = that / the median bandwidth; prefills are cold; quantized weights meet {} activations; \
             step split = decode wall time in MoE expert phases · the rest (attention, dense layers, routing, head), timed \
             on the device stream; pool busy = CPU time of the worker pool's threads (kernel accounting; idle workers poll for work while a step runs, and that counts) / (threads × decode time); \
             in CPU products = the share of decode wall time during which a pooled weight product of at most 4 tokens ran (timestamps at \
             entry and exit, overlaps counted once) · the weight bytes those products read / that time",
            opts.repeats,
            a.model.quant_dot
        );
        println!("| mode | effective | cache slots | prefill tok/s | decode tok/s | MB read/tok | GB/s | roofline | hit rate | MB moved/tok | fetched/tok | CPU experts/tok | actor overhead | step split experts · rest | pool busy | in CPU products |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    let mut extra: Vec<(MoeMode, Vec<ConcurrencyReport>, Option<ArrivalReport>)> = vec![];
    for (mode, (info, (r, together, arrival))) in rows {
        extra.push((mode, together, arrival));
        let roofline = r.decode_gb_s.median / memory_gb_s.max(1e-9);
        if a.json {
            let s = |s: &crate::bench::Spread| serde_json::json!({"median": s.median, "min": s.min, "max": s.max});
            let v = serde_json::json!({
                "mode": mode.to_string(), "effective": info.moe_mode, "cache_slots": info.memory.cache_slots,
                "runs": opts.repeats, "quant_dot": a.model.quant_dot.name(), "prefill_tokens": opts.prompt_len, "decode_tokens": opts.gen_tokens,
                "prefill_tok_s": s(&r.prefill_tok_s), "decode_tok_s": s(&r.decode_tok_s),
                "bytes_per_token_counted": r.bytes_per_token, "bytes_per_token_model": r.model_bytes_per_token,
                "decode_gb_s": s(&r.decode_gb_s),
                "memory_gb_s": {"median": bw.median, "min": bw.min, "max": bw.max, "passes": bw.passes,
                    "loads": bw.loads.describe(), "other_loads_median": bw.other_median, "huge_page_fraction": bw.huge_pages},
                "roofline_fraction": roofline,
                "hit_rate": r.hit_rate, "bytes_moved_per_token": r.bytes_moved_per_token,
                "fetched_per_token": r.fetched_per_token, "cpu_experts_per_token": r.cpu_per_token,
                "actor_overhead_fraction": r.actor_overhead, "b_p": info.b_p, "b_h": info.b_h,
                "step_expert_fraction": r.expert_phase, "step_rest_fraction": 1.0 - r.expert_phase,
                "pool_busy_fraction": r.pool_busy,
                "cpu_products_fraction": r.cpu_products.map(|p| p.0), "cpu_products_gb_s": r.cpu_products.map(|p| p.1),
            });
            println!("{v}");
        } else {
            println!(
                "| {mode} | {} | {} | {} | {} | {:.0} ({:.0}) | {} | {:.0} % | {:.0} % | {:.1} | {:.1} | {:.1} | {:.2} % | {:.0} % · {:.0} % | {} | {} |",
                info.moe_mode.split(' ').nth(2).unwrap_or("?"),
                info.memory.cache_slots,
                spread(&r.prefill_tok_s, 1),
                spread(&r.decode_tok_s, 2),
                r.bytes_per_token / 1e6,
                r.model_bytes_per_token as f64 / 1e6,
                spread(&r.decode_gb_s, 1),
                roofline * 100.0,
                r.hit_rate * 100.0,
                r.bytes_moved_per_token / 1e6,
                r.fetched_per_token,
                r.cpu_per_token,
                r.actor_overhead * 100.0,
                r.expert_phase * 100.0,
                (1.0 - r.expert_phase) * 100.0,
                r.pool_busy.map_or("n/a".to_string(), |b| format!("{:.0} %", b * 100.0)),
                r.cpu_products.map_or("n/a".to_string(), |(f, gb)| format!("{:.0} % · {gb:.1} GB/s", f * 100.0))
            );
        }
    }
    print_concurrency(&extra, memory_gb_s, a.json);
    Ok(())
}

/// The `--concurrency` and `--arrival-prompt` tables (or JSON lines).
fn print_concurrency(rows: &[(MoeMode, Vec<ConcurrencyReport>, Option<ArrivalReport>)], memory_gb_s: f64, json: bool) {
    if rows.iter().all(|(_, t, a)| t.is_empty() && a.is_none()) {
        return;
    }
    if !json {
        println!(
            "\nstreams decoding together: aggregate tokens/s counted over the window in which every stream decodes (from the last \
             stream's first token to the first stream's end; median, min–max of the runs); weight bytes per batched step from the \
             read counter over that window; speed-up against the 1-stream row when measured"
        );
        println!("| mode | streams | aggregate decode tok/s | per stream | speed-up | MB read/step | GB/s | roofline | mean batch |");
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    for (mode, together, arrival) in rows {
        let one = together.iter().find(|r| r.streams == 1).map(|r| r.aggregate_tok_s.median);
        for r in together {
            let speedup = one.map(|o| r.aggregate_tok_s.median / o.max(1e-9));
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "mode": mode.to_string(), "streams": r.streams,
                        "aggregate_tok_s": {"median": r.aggregate_tok_s.median, "min": r.aggregate_tok_s.min, "max": r.aggregate_tok_s.max},
                        "speedup_vs_1": speedup, "bytes_per_step": r.bytes_per_step, "gb_s": r.gb_s,
                        "roofline_fraction": r.gb_s / memory_gb_s.max(1e-9), "mean_batch": r.mean_batch,
                    })
                );
            } else {
                let s = &r.aggregate_tok_s;
                println!(
                    "| {mode} | {} | {:.2} ({:.2}–{:.2}) | {:.2} | {} | {:.0} | {:.1} | {:.0} % | {:.2} |",
                    r.streams,
                    s.median,
                    s.min,
                    s.max,
                    s.median / r.streams.max(1) as f64,
                    speedup.map_or("n/a".into(), |x| format!("{x:.2}×")),
                    r.bytes_per_step / 1e6,
                    r.gb_s,
                    r.gb_s / memory_gb_s.max(1e-9) * 100.0,
                    r.mean_batch
                );
            }
        }
        if let Some(a) = arrival {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"mode": mode.to_string(), "arrival_prompt": a.prompt_len, "streams": a.streams, "runs": a.runs,
                        "ttft_p50_s": a.ttft_p50_s, "ttft_p99_s": a.ttft_p99_s, "longest_pause_s": a.longest_pause_s,
                        "typical_gap_s": a.typical_gap_s, "longest_step_s": a.longest_step_s})
                );
            } else {
                println!(
                    "[{mode}] a {}-token prompt arriving while {} streams decode ({} runs, each cold): time to first token p50 {:.2} s, \
                     p99 {:.2} s (nearest rank); longest pause a running stream saw meanwhile {:.3} s (their usual gap between tokens \
                     before it: {:.3} s) from token timestamps; longest single step meanwhile (one prompt chunk beside the decodes) \
                     {:.3} s from the engine's step timer",
                    a.prompt_len, a.streams, a.runs, a.ttft_p50_s, a.ttft_p99_s, a.longest_pause_s, a.typical_gap_s, a.longest_step_s
                );
            }
        }
    }
}

/// The `--constrained` line (or JSON line) of one mode.
fn print_constrained(mode: MoeMode, c: &ConstrainedReport, json: bool) {
    if json {
        let s = |s: &crate::bench::Spread| serde_json::json!({"median": s.median, "min": s.min, "max": s.max});
        println!(
            "{}",
            serde_json::json!({"mode": mode.to_string(), "free_decode_tok_s": s(&c.free_tok_s), "constrained_decode_tok_s": s(&c.constrained_tok_s),
                "mask_overhead_fraction": c.overhead, "grammar_vocab_tokens": c.vocab_tokens})
        );
    } else {
        println!(
            "[{mode}] constrained decoding (a JSON array of strings, the mask computed beside each step over a {}-token vocabulary; \
             tokens/s from timers over alternating runs, median and min–max): free {:.2} ({:.2}–{:.2}), constrained {:.2} ({:.2}–{:.2}); \
             overhead {:.1} %",
            c.vocab_tokens, c.free_tok_s.median, c.free_tok_s.min, c.free_tok_s.max, c.constrained_tok_s.median, c.constrained_tok_s.min,
            c.constrained_tok_s.max, c.overhead * 100.0
        );
    }
}
