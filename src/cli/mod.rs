//! Command-line interface: argument definitions and dispatch to one module per command.

mod bench;
mod generate;
mod info;
mod launch;
mod serve;
mod synth;

use crate::device::{create_backend, BackendChoice, DeviceOptions};
use crate::model::Model;
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// ft-actor: run Mixture-of-Experts language models on your own machine.
#[derive(Parser, Debug)]
#[command(name = "ft-actor", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate text (or token ids) from a prompt.
    Generate(generate::GenerateArgs),
    /// Write the full-sequence logits of a prompt to a .npy file.
    Logits(generate::LogitsArgs),
    /// Show a model's architecture, sizes and memory plan.
    Info(info::InfoArgs),
    /// Measure prefill/decode speed against the machine's memory bandwidth.
    Bench(bench::BenchArgs),
    /// Write a checkpoint with random weights of a real model's shape.
    Synth(synth::SynthArgs),
    /// Serve the model over OpenAI- and Anthropic-compatible HTTP APIs.
    Serve(serve::ServeArgs),
    /// Run a coding agent (Claude Code, Codex, OpenCode) against the local server.
    Launch(launch::LaunchArgs),
}

/// Which model and how to run it: shared by every command that runs a model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Hugging Face checkpoint folder (default: the tiny built-in demo model).
    #[arg(long, env = "FT_MODEL")]
    pub model: Option<PathBuf>,
    /// Backend: auto, cpu, cuda or wgpu.
    #[arg(long, default_value = "auto", env = "FT_BACKEND")]
    pub backend: BackendChoice,
    /// CPU worker threads (default: all cores).
    #[arg(long, env = "FT_CPU_THREADS")]
    pub cpu_threads: Option<usize>,
    /// Context length in tokens (default: the model's max_position_embeddings).
    #[arg(long)]
    pub ctx_size: Option<usize>,
}

impl ModelArgs {
    /// The model folder to use.
    pub fn model_dir(&self) -> Result<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => crate::demo::demo_model_dir().context("cannot write the built-in demo model to the cache folder"),
        }
    }

    /// Creates the backend and loads the model, with a progress bar on a terminal.
    pub fn load(&self) -> Result<Model> {
        let dir = self.model_dir()?;
        let backend = create_backend(&DeviceOptions { backend: self.backend, cpu_threads: self.cpu_threads })
            .with_context(|| format!("cannot use --backend {:?}", self.backend))?;
        load_model(&dir, backend)
    }

    /// Context length for `model`.
    pub fn context(&self, model: &Model) -> usize {
        self.ctx_size.unwrap_or(model.config().max_position_embeddings)
    }
}

/// Loads `dir` showing per-tensor progress on a terminal.
pub fn load_model(dir: &std::path::Path, backend: Arc<dyn ft_backend::Backend>) -> Result<Model> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(dir.display().to_string());
    let model = Model::load(dir, backend, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("cannot load the model in {}", dir.display()))?;
    bar.finish_and_clear();
    Ok(model)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Parses the command line and runs the command; errors print one message and exit 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Generate(a) => generate::run_generate(a),
        Command::Logits(a) => generate::run_logits(a),
        Command::Info(a) => info::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Launch(a) => launch::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
