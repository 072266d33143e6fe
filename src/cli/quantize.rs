//! `ft-actor quantize`: a checkpoint in a publisher's quantized layout.

use crate::quantize::{quantize_checkpoint, QuantFormat, QuantizeOptions};
use anyhow::{anyhow, Context, Result};
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `quantize`.
#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// Source checkpoint folder (F32, F16 or BF16 weights).
    #[arg(long)]
    model: PathBuf,
    /// Layout to write: fp8 (128×128 block scales, as DeepSeek-V3 and Qwen-FP8), nvfp4
    /// (ModelOpt), mxfp4 (gpt-oss experts), fp8-fp4 (DeepSeek-V4: E8M0 block scales, FP4 experts).
    #[arg(long)]
    format: String,
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
    /// Replace a checkpoint already in the output folder.
    #[arg(long)]
    overwrite: bool,
    /// Also write the f32 checkpoint of exactly the values the quantized one decodes to
    /// (for accuracy comparisons).
    #[arg(long)]
    dequantized_twin: Option<PathBuf>,
}

/// `quantize`.
pub fn run(a: QuantizeArgs) -> Result<()> {
    let format = QuantFormat::parse(&a.format).ok_or_else(|| anyhow!("unknown --format `{}`: use fp8, nvfp4, mxfp4 or fp8-fp4", a.format))?;
    let opts = QuantizeOptions { model: a.model.clone(), out: a.out.clone(), format, overwrite: a.overwrite, twin: a.dequantized_twin.clone() };
    let bar = if std::io::stderr().is_terminal() { indicatif::ProgressBar::new(0) } else { indicatif::ProgressBar::hidden() };
    bar.set_style(
        indicatif::ProgressStyle::with_template("quantizing [{bar:30}] {pos}/{len} tensors ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let report = quantize_checkpoint(&opts, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("cannot quantize {} into {}", a.model.display(), a.out.display()))?;
    bar.finish_and_clear();
    println!(
        "wrote {} ({}): {} tensors quantized, {} copied, {:.1} MB → {:.1} MB",
        a.out.display(),
        a.format,
        report.quantized,
        report.copied,
        report.bytes_in as f64 / 1e6,
        report.bytes_out as f64 / 1e6
    );
    Ok(())
}
