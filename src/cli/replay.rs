//! `ft-actor bench-replay`: an agent transcript with edits, with and without prefix reuse.

use super::{runtime, start_engine, ModelArgs};
use crate::bench::replay::{replay, transcript, ReplayOptions, TurnCost};
use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `bench-replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Agent turns in the transcript (each adds a tool call, its output, an answer and a user turn).
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// Approximate tokens of each tool output.
    #[arg(long, default_value_t = 400)]
    tool_tokens: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 4)]
    gen_tokens: usize,
    /// Saved-state budget of the run with reuse (bytes, e.g. 4GiB).
    #[arg(long, default_value = "4GiB")]
    prefix_cache_budget: String,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `bench-replay`.
pub fn run(a: ReplayArgs) -> Result<()> {
    let budget = crate::policy::parse_bytes(&a.prefix_cache_budget).context("--prefix-cache-budget")?;
    let opts = ReplayOptions { turns: a.turns, tool_tokens: a.tool_tokens, gen_tokens: a.gen_tokens };
    let rt = runtime()?;
    let mut runs: Vec<Vec<TurnCost>> = vec![];
    let mut requests = vec![];
    for (label, budget) in [("reuse", budget), ("no reuse", 0)] {
        let mut config = a.model.engine_config();
        config.prefix_cache_budget = budget;
        let costs = rt.block_on(async {
            let engine = start_engine(config).await?;
            let tok = engine.tokenizer().cloned().context("bench-replay needs the model's tokenizer and chat template")?;
            requests = transcript(&tok, &opts)?;
            let r = replay(&engine, &requests, opts.gen_tokens, &mut |line| eprintln!("[{label}] {line}")).await;
            engine.shutdown().await;
            anyhow::Ok(r?)
        })?;
        runs.push(costs);
    }
    let (with, without) = (&runs[0], &runs[1]);
    println!("| # | request | prompt tokens | reused | prefilled (reuse) | TTFT reuse | prefilled (no reuse) | TTFT no reuse | speed-up |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, ((r, w), wo)) in requests.iter().zip(with).zip(without).enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {:.0} ms | {} | {:.0} ms | {:.1}× |",
            i + 1,
            r.label,
            r.prompt.len(),
            w.cached,
            w.prefilled,
            ms(w.ttft),
            wo.prefilled,
            ms(wo.ttft),
            ms(wo.ttft) / ms(w.ttft).max(1e-9)
        );
    }
    let sum = |v: &[TurnCost], f: fn(&TurnCost) -> f64| v.iter().map(f).sum::<f64>();
    let (pw, pwo) = (sum(with, |c| c.prefilled as f64), sum(without, |c| c.prefilled as f64));
    let (tw, two) = (sum(with, |c| ms(c.ttft)), sum(without, |c| ms(c.ttft)));
    println!(
        "| | total | {} | {} | {pw:.0} | {tw:.0} ms | {pwo:.0} | {two:.0} ms | {:.1}× |",
        requests.iter().map(|r| r.prompt.len()).sum::<usize>(),
        sum(with, |c| c.cached as f64),
        two / tw.max(1e-9)
    );
    let same = with.iter().zip(without).all(|(a, b)| a.tokens == b.tokens);
    println!("outputs identical with and without reuse: {}", if same { "yes" } else { "NO" });
    if !same {
        anyhow::bail!("reuse changed the generated tokens");
    }
    Ok(())
}
