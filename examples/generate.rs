//! Using ft-actor as a library: load a checkpoint on the CPU backend and generate greedily.
//!
//! `cargo run --release --example generate -- [MODEL_DIR] [PROMPT]` (default: the demo model).

use ft_actor::generate::{generate, GenerateRequest};
use ft_actor::model::Model;
use ft_actor::sampling::SamplingParams;
use ft_actor::tokenizer::Tokenizer;
use std::sync::Arc;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = match args.next() {
        Some(d) => std::path::PathBuf::from(d),
        None => ft_actor::demo::demo_model_dir()?,
    };
    let prompt = args.next().unwrap_or_else(|| "The router selects the experts".into());
    let backend = Arc::new(ft_backend_cpu::CpuBackend::new(Default::default())?);
    let model = Model::load(&dir, backend, &mut |_, _| {})?;
    let tok = Tokenizer::from_dir(&dir)?;
    let req = GenerateRequest {
        prompt: tok.encode(&prompt, true)?,
        max_tokens: 24,
        sampling: SamplingParams::greedy(),
        eos_ids: model.config().eos_token_ids.clone(),
        stop: vec![],
        context: model.config().max_position_embeddings,
    };
    print!("{prompt}");
    let out = generate(&model, Some(&tok), &req, &mut |piece| print!("{piece}"))?;
    println!("\n[{} tokens, finish: {:?}]", out.ids.len(), out.finish);
    Ok(())
}
