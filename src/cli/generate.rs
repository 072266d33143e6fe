//! `ft-actor generate` and `ft-actor logits`.

use super::{runtime, ModelArgs};
use crate::chat::{ChatRequest, ChatTemplate};
use crate::engine::{EngineHandle, EngineRequest, GenEvent};
use crate::model::generation_config::GenerationConfig;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// Where the prompt comes from.
#[derive(Args, Debug, Clone)]
pub struct PromptArgs {
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids (bypasses the tokenizer).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Thinking on/off for templates that support it (with --chat).
    #[arg(long, requires = "chat")]
    pub enable_thinking: Option<bool>,
}

/// Arguments of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Most new tokens.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: super::SamplingArgs,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print the generated ids as one JSON array instead of text.
    #[arg(long)]
    output_ids: bool,
}

/// Arguments of `logits`.
#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Output file (.npy, float32 [tokens, vocab]).
    #[arg(long)]
    out: PathBuf,
}

/// Turns the prompt arguments into token ids.
fn prompt_ids(p: &PromptArgs, tok: Option<&Tokenizer>) -> Result<Vec<u32>> {
    if let Some(ids) = &p.prompt_ids {
        return Ok(ids.clone());
    }
    let Some(text) = &p.prompt else { bail!("give a prompt with --prompt TEXT or --prompt-ids 1,2,3") };
    let tok = tok.context("a tokenizer is needed for --prompt")?;
    if !p.chat {
        return Ok(tok.encode(text, true)?);
    }
    let source = tok.chat_template().context("--chat: the model folder has no chat template")?;
    let template = ChatTemplate::new(source, tok.bos_token(), tok.eos_token())?;
    let mut messages = vec![];
    if let Some(s) = &p.system {
        messages.push(serde_json::json!({"role": "system", "content": s}));
    }
    messages.push(serde_json::json!({"role": "user", "content": text}));
    let request = ChatRequest { messages, add_generation_prompt: true, enable_thinking: p.enable_thinking, ..Default::default() };
    let rendered = template.render(&request)?;
    Ok(tok.encode(&rendered, false)?)
}

/// `generate`.
pub fn run_generate(a: GenerateArgs) -> Result<()> {
    runtime()?.block_on(async {
        let engine = a.model.start().await?;
        let r = generate_with(&engine, &a).await;
        engine.shutdown().await;
        r
    })
}

async fn generate_with(engine: &EngineHandle, a: &GenerateArgs) -> Result<()> {
    let tok = engine.tokenizer().map(|t| t.as_ref());
    let prompt = prompt_ids(&a.prompt, tok)?;
    let overrides = a.sampling.overrides();
    let sampling = overrides.apply(&GenerationConfig::from_dir(&engine.info().model_dir)?.sampling());
    let prompt_len = prompt.len();
    let req = EngineRequest {
        prompt,
        max_tokens: a.max_tokens,
        sampling,
        stop: a.stop.clone(),
        stop_ids: vec![],
        ignore_eos: a.ignore_eos,
        return_logits: false,
        logprobs: None,
        constraint: None,
        keep_special_tokens: false,
    };
    let mut stream = engine.generate(req).await?;
    let mut ids = vec![];
    let stdout = std::io::stdout();
    while let Some(ev) = stream.next().await {
        match ev {
            GenEvent::Token { id, text, .. } => {
                ids.push(id);
                if !a.output_ids && !text.is_empty() {
                    let mut lock = stdout.lock();
                    lock.write_all(text.as_bytes())?;
                    lock.flush()?;
                }
            }
            GenEvent::Done(c) => {
                if a.output_ids {
                    println!("{}", serde_json::to_string(&ids)?);
                } else {
                    println!();
                }
                let decode = (c.total_time - c.time_to_first_token).as_secs_f64();
                eprintln!(
                    "[{prompt_len} prompt tokens, first token after {:.2}s, {} new tokens, {:.1} tok/s decode, finish: {:?}]",
                    c.time_to_first_token.as_secs_f64(),
                    c.completion_tokens,
                    c.completion_tokens.saturating_sub(1) as f64 / decode.max(1e-9),
                    c.finish
                );
                return Ok(());
            }
            GenEvent::Error(e) => bail!("generation failed: {e}"),
        }
    }
    bail!("the engine stopped during generation")
}

/// `logits`.
pub fn run_logits(a: LogitsArgs) -> Result<()> {
    runtime()?.block_on(async {
        let engine = a.model.start().await?;
        let r = async {
            let prompt = prompt_ids(&a.prompt, engine.tokenizer().map(|t| t.as_ref()))?;
            let n = prompt.len();
            let logits = engine.logits(prompt).await?;
            let vocab = engine.info().config.vocab_size;
            crate::npy::write_f32(&a.out, &[n, vocab], &logits).with_context(|| format!("cannot write {}", a.out.display()))?;
            eprintln!("wrote {n} × {vocab} logits to {}", a.out.display());
            Ok(())
        }
        .await;
        engine.shutdown().await;
        r
    })
}
