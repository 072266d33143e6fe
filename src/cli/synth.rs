//! `ft-actor synth`: a checkpoint with random weights of a real model's shape.

use crate::quantize::QuantFormat;
use crate::synth::{known_shapes, synth, synth_quantized, SynthOptions};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Shape to imitate (e.g. qwen3-30b-a3b); `--like list` lists them.
    #[arg(long)]
    like: String,
    /// Decoder layers (default: the real count).
    #[arg(long)]
    layers: Option<usize>,
    /// Weight dtype: bf16, f16 or f32; or a publisher's quantized layout: fp8 (128×128 block
    /// scales), nvfp4, mxfp4 (gpt-oss experts), fp8-fp4 (DeepSeek-V4), written as bf16 into a
    /// temporary folder beside the output and quantized from there.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Output folder.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Routed experts per layer (default: the real count).
    #[arg(long)]
    experts: Option<usize>,
    /// Replace an existing synthetic checkpoint in the output folder.
    #[arg(long)]
    overwrite: bool,
}

/// `synth`.
pub fn run(a: SynthArgs) -> Result<()> {
    if a.like == "list" {
        for s in known_shapes() {
            println!("{}", s.name);
        }
        return Ok(());
    }
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from(format!("synth-{}", a.like)));
    let opts = SynthOptions {
        like: a.like.clone(),
        layers: a.layers,
        dtype: a.dtype.clone(),
        out: out.clone(),
        seed: a.seed,
        experts: a.experts,
        overwrite: a.overwrite,
        ..Default::default()
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("writing [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let progress = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = match QuantFormat::parse(&a.dtype) {
        Some(format) => synth_quantized(&opts, format, progress),
        None => synth(&opts, progress),
    }
    .with_context(|| format!("cannot synthesise `{}` into {}", a.like, out.display()))?;
    bar.finish_and_clear();
    println!(
        "wrote {} ({:.2} B params, {:.2} B active per token, {:.2} GB in {} files, {:.0} MB/s) to {}",
        report.like,
        report.total_params as f64 / 1e9,
        report.active_params as f64 / 1e9,
        report.bytes as f64 / 1e9,
        report.files.len(),
        report.bytes_per_sec() / 1e6,
        out.display()
    );
    Ok(())
}
