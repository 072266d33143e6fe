//! `ft-actor generate` and `ft-actor logits`.

use super::ModelArgs;
use crate::chat::{ChatRequest, ChatTemplate};
use crate::generate::{generate, GenerateRequest};
use crate::kv::SequenceState;
use crate::model::generation_config::GenerationConfig;
use crate::model::{Logits, Model};
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
    /// Sampling temperature (0 = greedy). Default: the model's generation_config.json.
    #[arg(long)]
    temperature: Option<f32>,
    /// Nucleus sampling mass.
    #[arg(long)]
    top_p: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    top_k: Option<usize>,
    /// Drop tokens below min_p × the best probability.
    #[arg(long)]
    min_p: Option<f32>,
    /// Penalty for repeated tokens (1 = off).
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Random seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
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

/// Loads the tokenizer of `model`, which may be absent when ids are given directly.
fn tokenizer(model: &Model, needed: bool) -> Result<Option<Tokenizer>> {
    match Tokenizer::from_dir(model.dir()) {
        Ok(t) => Ok(Some(t)),
        Err(e) if needed => Err(e).context("a tokenizer is needed for --prompt"),
        Err(e) => {
            tracing::warn!("no tokenizer: {e}; output will be ids only");
            Ok(None)
        }
    }
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
    let model = a.model.load()?;
    let tok = tokenizer(&model, a.prompt.prompt.is_some())?;
    let prompt = prompt_ids(&a.prompt, tok.as_ref())?;
    let gen_cfg = GenerationConfig::from_dir(model.dir())?;
    let mut sampling = gen_cfg.sampling();
    if let Some(t) = a.temperature {
        sampling.temperature = t;
    }
    if let Some(p) = a.top_p {
        sampling.top_p = p;
    }
    if let Some(k) = a.top_k {
        sampling.top_k = k;
    }
    if let Some(m) = a.min_p {
        sampling.min_p = m;
    }
    if let Some(r) = a.repetition_penalty {
        sampling.repetition_penalty = r;
    }
    sampling.seed = a.seed;
    let mut eos_ids = model.config().eos_token_ids.clone();
    eos_ids.extend(&gen_cfg.eos_token_ids);
    if let Some(id) = tok.as_ref().and_then(|t| t.eos_token_id()) {
        eos_ids.push(id);
    }
    if a.ignore_eos {
        eos_ids.clear();
    }
    let req = GenerateRequest {
        prompt,
        max_tokens: a.max_tokens,
        sampling,
        eos_ids,
        stop: a.stop.clone(),
        context: a.model.context(&model),
    };
    let stdout = std::io::stdout();
    let text_tok = if a.output_ids { None } else { tok.as_ref() };
    let out = generate(&model, text_tok, &req, &mut |piece| {
        let mut lock = stdout.lock();
        let _ = lock.write_all(piece.as_bytes());
        let _ = lock.flush();
    })?;
    if a.output_ids {
        println!("{}", serde_json::to_string(&out.ids)?);
    } else {
        println!();
    }
    let decode_tokens = out.ids.len().saturating_sub(1);
    eprintln!(
        "[{} prompt tokens in {:.2}s, {} new tokens, {:.1} tok/s decode, finish: {:?}]",
        req.prompt.len(),
        out.prefill_time.as_secs_f64(),
        out.ids.len(),
        decode_tokens as f64 / out.decode_time.as_secs_f64().max(1e-9),
        out.finish
    );
    Ok(())
}

/// `logits`.
pub fn run_logits(a: LogitsArgs) -> Result<()> {
    let model = a.model.load()?;
    let tok = tokenizer(&model, a.prompt.prompt.is_some())?;
    let prompt = prompt_ids(&a.prompt, tok.as_ref())?;
    let context = a.model.context(&model);
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    if prompt.len() > context {
        bail!("prompt has {} tokens but the context holds {context}", prompt.len());
    }
    let mut state = SequenceState::new(&model, prompt.len())?;
    let logits = model.forward(&mut state, &prompt, Logits::All)?;
    crate::npy::write_f32(&a.out, &[prompt.len(), model.config().vocab_size], &logits)
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!("wrote {} × {} logits to {}", prompt.len(), model.config().vocab_size, a.out.display());
    Ok(())
}
