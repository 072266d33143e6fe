//! `ft-actor bench`.

use super::ModelArgs;
use crate::bench::{run as run_bench, BenchOptions};
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
    /// MiB streamed to measure memory bandwidth.
    #[arg(long, default_value_t = 1024)]
    bandwidth_mib: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    let model = a.model.load()?;
    let threads = a.model.cpu_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let opts = BenchOptions { prompt_len: a.prompt_len.max(1), gen_tokens: a.gen_tokens.max(1), threads, bandwidth_bytes: a.bandwidth_mib << 20 };
    let r = run_bench(&model, &opts, &mut |line| eprintln!("{line}"))?;
    if a.json {
        let v = serde_json::json!({
            "model_dir": model.dir(), "backend": model.backend().kind().to_string(),
            "prompt_len": opts.prompt_len, "gen_tokens": opts.gen_tokens,
            "prefill_tok_s": r.prefill_tok_s, "decode_tok_s": r.decode_tok_s,
            "bytes_per_token": r.bytes_per_token, "decode_gb_s": r.decode_gb_s,
            "memory_gb_s": r.memory_gb_s, "roofline_fraction": r.roofline_fraction,
            "roofline_tok_s": r.roofline_tok_s, "active_params": r.stats.active_params,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("| model | backend | prefill tok/s | decode tok/s | MB read/token | decode GB/s | memory GB/s | roofline |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {:.0} % ({:.2} tok/s max) |",
        model.dir().file_name().map_or_else(|| model.dir().display().to_string(), |n| n.to_string_lossy().into_owned()),
        model.backend().kind(),
        r.prefill_tok_s,
        r.decode_tok_s,
        r.bytes_per_token as f64 / 1e6,
        r.decode_gb_s,
        r.memory_gb_s,
        r.roofline_fraction * 100.0,
        r.roofline_tok_s
    );
    Ok(())
}
