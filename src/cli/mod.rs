//! Command-line interface: argument definitions and dispatch to one module per command.

mod bench;
mod generate;
mod info;
mod launch;
mod plan;
mod quantize;
mod replay;
mod serve;
mod shell;
mod synth;

use crate::device::BackendChoice;
use crate::engine::{Engine, EngineConfig, EngineHandle, PrefillMode};
use crate::policy::{MoeMode, VramBudget};
use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Will a model fit, and how fast will it decode? From its config and headers, before download.
    Plan(plan::PlanArgs),
    /// Measure prefill/decode speed against the machine's memory bandwidth.
    Bench(bench::BenchArgs),
    /// Replay an agent transcript with edits, with and without prefix reuse (prefill, TTFT).
    BenchReplay(replay::ReplayArgs),
    /// Write a checkpoint with random weights of a real model's shape.
    Synth(synth::SynthArgs),
    /// Write a checkpoint in a publisher's quantized layout (FP8, NVFP4, MXFP4).
    Quantize(quantize::QuantizeArgs),
    /// Serve the model over OpenAI- and Anthropic-compatible HTTP APIs.
    Serve(serve::ServeArgs),
    /// Run a coding agent (Claude Code, Codex, OpenCode) against the local server.
    Launch(launch::LaunchArgs),
    /// Chat with the model in the terminal.
    Shell(shell::ShellArgs),
}

/// Sampling flags shared by the commands that generate (`generate`, `shell`); each unset one
/// keeps the model's generation_config.json value.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature (0 = greedy). Default: the model's generation_config.json.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Drop tokens below min_p × the best probability.
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalty for repeated tokens (1 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Random seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The flags as overrides of the model's sampling defaults.
    pub fn overrides(&self) -> crate::sampling::SamplingOverrides {
        crate::sampling::SamplingOverrides {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            ..Default::default()
        }
    }
}

/// Which model and how to run it: shared by every command that runs a model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Checkpoint folder, GGUF file, or Hugging Face model name (`org/name[:revision]`,
    /// `org/name/file.gguf`; downloaded into the hub cache). Default: the built-in demo model.
    #[arg(long, env = "FT_MODEL")]
    pub model: Option<PathBuf>,
    /// Backend: auto, cpu, cuda or wgpu.
    #[arg(long, default_value = "auto", env = "FT_BACKEND")]
    pub backend: BackendChoice,
    /// CPU threads of the backend and of the CPU expert executors (default: all cores).
    #[arg(long, env = "FT_CPU_THREADS")]
    pub cpu_threads: Option<usize>,
    /// CPU products with reduced-precision activations: int8 (activations rounded to int8 for
    /// quantized weights and to bf16 for bf16 weights, as llama.cpp; fast) or exact (f32).
    #[arg(long, default_value = "int8", env = "FT_QUANT_DOT")]
    pub quant_dot: crate::engine::QuantDot,
    /// Context length in tokens (default: the model's max_position_embeddings).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Device memory to use: `auto` (free memory minus a margin) or a size such as `12GiB`.
    #[arg(long, default_value = "auto", env = "FT_VRAM_BUDGET")]
    pub vram_budget: VramBudget,
    /// Expert cache slots, overriding the number derived from the budget.
    #[arg(long, env = "FT_EXPERT_CACHE_SLOTS")]
    pub expert_cache_slots: Option<u64>,
    /// Where expert cache misses run: auto, offload (fetch all), cpu, hybrid (split).
    #[arg(long, default_value = "auto", env = "FT_MOE_MODE")]
    pub moe_mode: MoeMode,
    /// Prefill path: auto (planner), decode, stream (double-buffered layers).
    #[arg(long, default_value = "auto")]
    pub prefill: PrefillMode,
}

impl ModelArgs {
    /// The engine configuration these flags describe.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            model: self.model.clone(),
            backend: self.backend,
            cpu_threads: self.cpu_threads,
            quant_dot: self.quant_dot,
            vram_budget: self.vram_budget,
            expert_cache_slots: self.expert_cache_slots,
            moe_mode: self.moe_mode,
            prefill: self.prefill,
            ctx_size: self.ctx_size,
            ..Default::default()
        }
    }

    /// Starts the engine (loading shows a progress bar on a terminal).
    pub async fn start(&self) -> Result<EngineHandle> {
        start_engine(self.engine_config()).await
    }
}

/// Starts an engine with a loading progress bar on a terminal.
pub async fn start_engine(mut config: EngineConfig) -> Result<EngineHandle> {
    config.model = resolve_model(config.model.take()).await?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading [{bar:30}] {pos}/{len} tensors")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let progress_bar = bar.clone();
    let handle = Engine::spawn_with_progress(
        config,
        None,
        Box::new(move |done, total| {
            progress_bar.set_length(total as u64);
            progress_bar.set_position(done as u64);
        }),
    )
    .await;
    bar.finish_and_clear();
    let handle = handle?;
    // Said on stderr by every command that runs the model: `--backend auto` may have fallen
    // back to the CPU, which the logs only say at info level.
    let info = handle.info();
    eprintln!("running on {} · MoE mode {}", info.backend, info.moe_mode);
    Ok(handle)
}

/// `--model` as a local path: a hub model name is looked up in the Hugging Face cache and
/// what is missing downloaded (blocking I/O, so off the async workers).
pub async fn resolve_model(model: Option<PathBuf>) -> Result<Option<PathBuf>> {
    let Some(m) = model else { return Ok(None) };
    let path = tokio::task::spawn_blocking(move || crate::hub::resolve_model_arg(&m)).await??;
    Ok(Some(path))
}

/// A tokio runtime for a command.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
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
        Command::Plan(a) => plan::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchReplay(a) => replay::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Launch(a) => launch::run(a),
        Command::Shell(a) => shell::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
