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
    /// Also run the transcript beside this many subagents' conversations at once (and, to
    /// compare, one conversation after another).
    #[arg(long, default_value_t = 0)]
    subagents: usize,
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
    if a.subagents > 0 {
        subagents(&a, &rt, requests, &opts, budget)?;
    }
    Ok(())
}

/// The transcript and `a.subagents` subagent conversations, all at once and then one after
/// another, each on a fresh engine with prefix reuse.
fn subagents(a: &ReplayArgs, rt: &tokio::runtime::Runtime, main: Vec<crate::bench::replay::ReplayRequest>, opts: &ReplayOptions, budget: u64) -> Result<()> {
    use crate::bench::subagents::{run_chains, subagent_transcripts, ChainsReport};
    let mut reports: Vec<(&str, ChainsReport)> = vec![];
    for (label, parallel) in [("together", true), ("one after another", false)] {
        let mut config = a.model.engine_config();
        config.prefix_cache_budget = budget;
        config.max_active = config.max_active.max(a.subagents + 1);
        let report = rt.block_on(async {
            let engine = start_engine(config).await?;
            let tok = engine.tokenizer().cloned().context("bench-replay needs the model's tokenizer and chat template")?;
            let mut chains = vec![main.clone()];
            chains.extend(subagent_transcripts(&tok, opts, a.subagents)?);
            crate::bench::replay::warm_up(&engine, &chains.concat(), opts.gen_tokens).await?;
            eprintln!("[{label}] {} conversations, {} requests", chains.len(), chains.iter().map(Vec::len).sum::<usize>());
            let r = run_chains(&engine, &chains, opts.gen_tokens, parallel).await;
            engine.shutdown().await;
            anyhow::Ok(r?)
        })?;
        reports.push((label, report));
    }
    println!();
    println!(
        "the transcript and {} subagents ({} requests of {} generated tokens each): wall time and TTFT from timers, \
         prefill and generated tokens from the engine's counters",
        a.subagents,
        reports[0].1.turns.iter().map(Vec::len).sum::<usize>(),
        opts.gen_tokens
    );
    println!("| run | wall | generated tok/s | TTFT p50 | TTFT p99 | prompt tokens prefilled | reused | max batch | preemptions |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (label, r) in &reports {
        let t = r.ttfts();
        let pick = |q: f64| t.get(((t.len() as f64 * q).ceil() as usize).saturating_sub(1)).map_or(0.0, |d| ms(*d));
        println!(
            "| {label} | {:.2} s | {:.2} | {:.0} ms | {:.0} ms | {} | {} | {} | {} |",
            r.wall.as_secs_f64(),
            r.generated as f64 / r.wall.as_secs_f64().max(1e-9),
            pick(0.5),
            pick(0.99),
            r.prefilled,
            r.turns.iter().flatten().map(|t| t.cached).sum::<usize>(),
            r.max_batch,
            r.preemptions
        );
    }
    let (together, apart) = (&reports[0].1, &reports[1].1);
    println!("wall time one after another ÷ together: {:.2}×", apart.wall.as_secs_f64() / together.wall.as_secs_f64().max(1e-9));
    let same = together.turns.iter().flatten().zip(apart.turns.iter().flatten()).all(|(x, y)| x.tokens == y.tokens);
    println!("outputs identical together and one after another: {}", if same { "yes" } else { "NO" });
    if !same {
        anyhow::bail!("running the conversations together changed the generated tokens");
    }
    Ok(())
}
