//! Embedding ft-actor in a tokio application: spawn the engine in your own runtime, stream
//! tokens, run two requests at once, resize the expert cache, read the stats.
//!
//! `cargo run --release --example embed -- [MODEL_DIR]` (default: the built-in demo model).

use ft_actor::engine::{Engine, EngineConfig, EngineRequest, GenEvent};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = EngineConfig {
        model: std::env::args().nth(1).map(Into::into),
        // A small expert cache so the example shows hits, fetches and CPU work.
        expert_cache_slots: Some(4),
        ..Default::default()
    };
    let engine = Engine::spawn(config, None).await?;
    let info = engine.info();
    println!("{} on {} ({})", info.config.arch.model_type(), info.backend, info.moe_mode);

    let tok = engine.tokenizer().cloned();
    let prompt = match &tok {
        Some(t) => t.encode("The router selects the experts", false)?,
        None => vec![1, 2, 3],
    };
    let mut stream = engine.generate(EngineRequest::greedy(prompt.clone(), 12)).await?;
    while let Some(ev) = stream.next().await {
        match ev {
            GenEvent::Token { text, .. } => print!("{text}"),
            GenEvent::Done(c) => println!("\n[{} tokens, {:?}]", c.completion_tokens, c.finish),
            GenEvent::Error(e) => anyhow::bail!(e),
        }
    }

    // Two generations at once share the engine; the cache is resized between steps.
    let a = engine.generate(EngineRequest::greedy(prompt.clone(), 8)).await?;
    let b = engine.generate(EngineRequest::greedy(prompt, 8)).await?;
    engine.resize_cache(8).await?;
    let (a, b) = tokio::join!(a.collect(), b.collect());
    assert_eq!(a?.0, b?.0, "same prompt, same greedy tokens");

    let stats = engine.stats().await?;
    println!(
        "cache {} slots, hit rate {:.0} %, {} fetched, {} on the CPU, actor overhead {:.2} % of decode",
        stats.cache_slots,
        stats.total.hit_rate() * 100.0,
        stats.total.fetched,
        stats.total.cpu_computed,
        stats.actor_overhead_fraction() * 100.0
    );
    engine.shutdown().await;
    Ok(())
}
