//! Synthesise a Hugging Face checkpoint folder with random weights of a real model shape,
//! so loading and decode speed can be measured at realistic sizes without a download.
//!
//! The folder holds `config.json` (older hub style, top-level `rope_theta` and
//! `rope_scaling`; Qwen3.5-MoE as the vision-language wrapper with `text_config`),
//! `generation_config.json`, the bundled test tokenizer, safetensors shards (with
//! `model.safetensors.index.json` when there is more than one) and `synth.json`, a note
//! recording that the weights are synthetic and how they were made.

mod files;
mod shapes;
mod writer;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use thiserror::Error;

pub use shapes::{
    find_shape, known_shapes, param_counts, tensor_plan, Arch, ArchSpec, GptOssSpec, HybridSpec,
    Init, MlaSpec, ShapeSpec, TensorKind, TensorPlan, V4Spec, YarnSpec,
};

/// Default shard size (2 GiB), close to what the hub's checkpoints use.
pub const DEFAULT_SHARD_BYTES: u64 = 2 << 30;

/// Vocabulary size of the bundled tokenizer; the embedding must have a row for each id.
pub const TOKENIZER_VOCAB: usize = 1024;

/// Errors from [`synth`] and [`plan`].
#[derive(Debug, Error)]
pub enum SynthError {
    /// `like` names no known shape.
    #[error("unknown model shape {like:?}; known shapes: {known}")]
    UnknownShape {
        /// What was asked for.
        like: String,
        /// Comma-separated known names.
        known: String,
    },
    /// `dtype` is not one of f32, bf16, f16.
    #[error("unsupported dtype {0:?}; use f32, bf16 or f16 (fp8, nvfp4, mxfp4 and fp8-fp4 are written by `synth --dtype`, through quantize)")]
    BadDtype(String),
    /// An override or size option is out of range.
    #[error("invalid synth option: {0}")]
    InvalidOption(String),
    /// The output directory cannot be created.
    #[error("cannot create output directory {path}: {source}")]
    OutDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The output directory already holds safetensors weights and `overwrite` is off.
    #[error("{path} already contains a checkpoint ({file}); choose another directory or enable overwrite")]
    OutputExists {
        /// The directory.
        path: PathBuf,
        /// The first conflicting file.
        file: String,
    },
    /// Reading or writing a file failed (including a full disk).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Quantizing the synthesised weights into a published layout failed.
    #[error("quantizing the synthetic checkpoint: {0}")]
    Quantize(#[from] crate::quantize::QuantizeError),
    /// A bug: an internal step failed.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Element type of the synthetic weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynthDtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
    /// 64-bit integers (index tables such as DeepSeek-V4's `tid2eid`; never a `--dtype`).
    I64,
}

impl SynthDtype {
    /// Parses `f32`/`float32`, `bf16`/`bfloat16`, `f16`/`float16`/`half` (any case).
    pub fn parse(s: &str) -> Result<Self, SynthError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" | "fp16" | "half" => Ok(Self::F16),
            _ => Err(SynthError::BadDtype(s.to_string())),
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::I64 => 8,
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    /// The `torch_dtype` value of `config.json`.
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
            Self::I64 => "int64",
        }
    }
}

/// What to synthesise and where.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Name of a known shape (see [`known_shapes`]), e.g. `qwen3-30b-a3b`.
    pub like: String,
    /// Number of decoder layers; `None` keeps the real count.
    pub layers: Option<usize>,
    /// `f32`, `bf16` or `f16`.
    pub dtype: String,
    /// Output directory (created if missing).
    pub out: PathBuf,
    /// Seed of the random values; same seed, same bytes.
    pub seed: u64,
    /// Target size of one safetensors shard (a larger tensor gets a shard of its own).
    pub shard_bytes: u64,
    /// Number of routed experts; `None` keeps the real count (top-k is capped to it).
    pub experts: Option<usize>,
    /// Test/smoke only: hidden size override. Head count and head_dim stay real; for
    /// families whose head_dim is implicit (Mixtral, Qwen2-MoE) it must divide into an even
    /// head_dim. The result is no longer the real shape.
    pub hidden: Option<usize>,
    /// Test/smoke only: vocabulary size override (>= [`TOKENIZER_VOCAB`]).
    pub vocab: Option<usize>,
    /// Replace an existing checkpoint in `out` (its safetensors and index files are
    /// deleted first); otherwise such a directory is refused.
    pub overwrite: bool,
}

impl Default for SynthOptions {
    /// Full-size Qwen3-30B-A3B in bf16 under `./synth-qwen3-30b-a3b`.
    fn default() -> Self {
        Self {
            like: "qwen3-30b-a3b".into(),
            layers: None,
            dtype: "bf16".into(),
            out: PathBuf::from("synth-qwen3-30b-a3b"),
            seed: 0,
            shard_bytes: DEFAULT_SHARD_BYTES,
            experts: None,
            hidden: None,
            vocab: None,
            overwrite: false,
        }
    }
}

/// The resolved checkpoint: shape after overrides, tensors and their shard files.
#[derive(Debug, Clone)]
pub struct SynthPlan {
    /// The shape actually written.
    pub shape: ShapeSpec,
    /// Weight dtype (GLM's routing bias stays f32).
    pub dtype: SynthDtype,
    /// Every tensor, in module order.
    pub tensors: Vec<TensorPlan>,
    /// Shard file names and the indices (into `tensors`) each holds.
    pub shards: Vec<(String, Vec<usize>)>,
    /// Total parameter count.
    pub total_params: u64,
    /// Parameters read per token (see [`param_counts`]).
    pub active_params: u64,
    /// Bytes of tensor data (the index's `total_size`).
    pub total_bytes: u64,
}

/// Outcome of [`synth`].
#[derive(Debug, Clone)]
pub struct SynthReport {
    /// Canonical name of the imitated shape.
    pub like: String,
    /// Total parameter count.
    pub total_params: u64,
    /// Parameters read per token (see [`param_counts`]).
    pub active_params: u64,
    /// Bytes of tensor data written.
    pub bytes: u64,
    /// Every file written, shards first.
    pub files: Vec<PathBuf>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl SynthReport {
    /// Tensor bytes written per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Applies the overrides of `opts` to its shape and checks them.
fn resolve_shape(opts: &SynthOptions) -> Result<ShapeSpec, SynthError> {
    let mut s = *find_shape(&opts.like)?;
    let bad = |m: String| Err(SynthError::InvalidOption(m));
    if let Some(layers) = opts.layers {
        if layers == 0 {
            return bad("layers must be at least 1".into());
        }
        s.layers = layers;
    }
    if let Some(experts) = opts.experts {
        if experts == 0 {
            return bad("experts must be at least 1".into());
        }
        s.experts = experts;
        s.top_k = s.top_k.min(experts);
    }
    if let Some(hidden) = opts.hidden {
        if hidden == 0 || hidden % 2 != 0 {
            return bad(format!(
                "hidden must be a positive even number, got {hidden}"
            ));
        }
        if !s.arch.head_dim_in_config() {
            let hd = hidden / s.heads;
            if hidden % s.heads != 0 || hd % 2 != 0 {
                return bad(format!(
                    "hidden {hidden} must be a multiple of 2 x {} heads for {} (head_dim is hidden / heads)",
                    s.heads, s.name
                ));
            }
            s.head_dim = hd;
        }
        s.hidden = hidden;
    }
    if let Some(vocab) = opts.vocab {
        if vocab < TOKENIZER_VOCAB {
            return bad(format!(
                "vocab must be at least {TOKENIZER_VOCAB} (the bundled tokenizer's size), got {vocab}"
            ));
        }
        s.vocab = vocab;
    }
    Ok(s)
}

/// Resolves options into the full list of tensors and shard files, without writing.
pub fn plan(opts: &SynthOptions) -> Result<SynthPlan, SynthError> {
    plan_shape(resolve_shape(opts)?, opts)
}

/// [`plan`] for an already resolved shape.
fn plan_shape(shape: ShapeSpec, opts: &SynthOptions) -> Result<SynthPlan, SynthError> {
    let dtype = SynthDtype::parse(&opts.dtype)?;
    if opts.shard_bytes == 0 {
        return Err(SynthError::InvalidOption("shard_bytes must be > 0".into()));
    }
    let tensors = tensor_plan(&shape, dtype);
    let (total_params, active_params) = param_counts(&shape, &tensors);

    // Greedy packing in module order, like transformers' sharding: a layer's tensors stay
    // together unless the shard overflows.
    let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
    let mut used = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let size = t.nbytes();
        let current = groups.last().map_or(0, Vec::len);
        if current > 0 && used + size > opts.shard_bytes {
            groups.push(Vec::new());
            used = 0;
        }
        used += size;
        if let Some(g) = groups.last_mut() {
            g.push(i);
        }
    }
    let n = groups.len();
    let shards = groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let name = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
            };
            (name, g)
        })
        .collect();
    let total_bytes = tensors.iter().map(TensorPlan::nbytes).sum();
    Ok(SynthPlan {
        shape,
        dtype,
        tensors,
        shards,
        total_params,
        active_params,
        total_bytes,
    })
}

/// Writes the synthetic checkpoint described by `opts`.
///
/// `progress(done, total)` is called on the calling thread as tensor bytes are written.
pub fn synth(
    opts: &SynthOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    write_plan(plan(opts)?, opts, &mut progress)
}

/// [`synth`] in a publisher's quantized layout (`--dtype fp8|nvfp4|mxfp4|fp8-fp4`): bf16
/// weights written into a temporary folder beside `opts.out` (removed afterwards, also on
/// failure), then [`crate::quantize::quantize_checkpoint`] into `opts.out`. The report counts
/// the quantized files' bytes.
pub fn synth_quantized(
    opts: &SynthOptions,
    format: crate::quantize::QuantFormat,
    mut progress: impl FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    use crate::quantize::{quantize_checkpoint, QuantizeOptions};
    // Refuse an occupied output before writing anything.
    files::prepare_out_dir(&opts.out, opts.overwrite)?;
    let name = opts.out.file_name().map_or_else(|| "synth".into(), |n| n.to_string_lossy().into_owned());
    let tmp = opts.out.with_file_name(format!(".{name}.bf16-synth"));
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Remove(tmp.clone());
    let bf16 = SynthOptions { out: tmp.clone(), dtype: "bf16".into(), overwrite: true, ..opts.clone() };
    let start = Instant::now();
    let mut report = synth(&bf16, &mut progress)?;
    let q = quantize_checkpoint(&QuantizeOptions { model: tmp, out: opts.out.clone(), format, overwrite: true, twin: None }, |_, _| {})?;
    let mut written: Vec<PathBuf> = std::fs::read_dir(&opts.out)
        .map_err(|source| SynthError::Io { path: opts.out.clone(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    written.sort();
    report.files = written;
    report.bytes = q.bytes_out;
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Writes the checkpoint of a resolved plan.
fn write_plan(
    plan: SynthPlan,
    opts: &SynthOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    let start = Instant::now();
    files::prepare_out_dir(&opts.out, opts.overwrite)?;

    let mut files = Vec::new();
    let mut done = 0u64;
    let total = plan.total_bytes;
    progress(0, total);
    for (name, indices) in &plan.shards {
        let path = opts.out.join(name);
        let tensors: Vec<&TensorPlan> = indices.iter().map(|&i| &plan.tensors[i]).collect();
        writer::write_shard(&path, &tensors, opts.seed, &mut |n| {
            done += n;
            progress(done, total);
        })?;
        files.push(path);
    }
    files.extend(files::write_side_files(opts, &plan)?);

    Ok(SynthReport {
        like: plan.shape.name.to_string(),
        total_params: plan.total_params,
        active_params: plan.active_params,
        bytes: total,
        files,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod load_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(like: &str) -> SynthOptions {
        SynthOptions {
            like: like.into(),
            ..SynthOptions::default()
        }
    }

    /// Parameter counts of the unmodified shapes match the published model sizes.
    #[test]
    fn real_shapes_have_published_sizes() {
        // (name, total B, active B as the model card counts it, card adds the embedding,
        // card adds the head, tolerance of the active count). GLM-4.5-Air's 106B includes
        // its MTP layer, and its "12B active" counts neither embedding nor head. Qwen's
        // "A3B" labels are rounded: Qwen3-Next reads 3.25B per token without embedding and
        // head. gpt-oss's card counts the unembedding but not the embedding; so does this
        // count of DeepSeek-V4-Flash's "13B activated" (its card does not say).
        let expected = [
            ("qwen3-30b-a3b", 30.5, 3.3, true, true, 0.05),
            ("qwen3-235b-a22b", 235.0, 22.0, true, true, 0.05),
            ("qwen2-57b-a14b", 57.4, 14.2, true, true, 0.05),
            ("mixtral-8x7b", 46.7, 12.9, true, true, 0.05),
            ("glm-4.5-air", 106.0, 12.0, false, false, 0.05),
            ("qwen3.6-35b-a3b", 35.0, 3.0, false, true, 0.05),
            ("qwen3-next-80b-a3b", 80.0, 3.0, false, false, 0.1),
            ("deepseek-v3", 671.0, 37.0, true, true, 0.05),
            ("gpt-oss-20b", 20.9, 3.6, false, true, 0.02),
            ("gpt-oss-120b", 116.8, 5.1, false, true, 0.02),
            ("deepseek-v4-flash", 284.0, 13.0, false, true, 0.05),
        ];
        for (name, total, card, with_embed, with_head, tol) in expected {
            let p = plan(&opts(name)).expect("plan");
            let table = (p.shape.vocab * p.shape.hidden) as u64;
            let mut active = p.active_params;
            if with_embed {
                active += table;
            }
            if !with_head {
                active -= table;
            }
            let t = p.total_params as f64 / 1e9;
            let a = active as f64 / 1e9;
            assert!(
                (t - total).abs() / total < 0.04,
                "{name}: total {t:.2}B vs {total}B"
            );
            assert!(
                (a - card).abs() / card < tol,
                "{name}: active {a:.2}B vs {card}B"
            );
        }
        // The 12-layer Qwen3-30B-A3B benchmark shape: 0.99B read per token.
        let p = plan(&SynthOptions {
            layers: Some(12),
            ..opts("qwen3-30b-a3b")
        })
        .expect("plan");
        assert!((p.active_params as f64 / 1e9 - 0.99).abs() < 0.01);
    }

    #[test]
    fn names_are_matched_loosely() {
        assert_eq!(
            find_shape("Qwen/Qwen3-30B-A3B").map(|s| s.name).ok(),
            Some("qwen3-30b-a3b")
        );
        assert_eq!(
            find_shape("mistralai/Mixtral-8x7B-v0.1")
                .map(|s| s.name)
                .ok(),
            Some("mixtral-8x7b")
        );
        assert_eq!(
            find_shape("Qwen/Qwen3.6-35B-A3B").map(|s| s.name).ok(),
            Some("qwen3.6-35b-a3b")
        );
        assert_eq!(
            find_shape("deepseek-ai/DeepSeek-R1").map(|s| s.name).ok(),
            Some("deepseek-v3")
        );
        assert_eq!(
            find_shape("openai/gpt-oss-20b").map(|s| s.name).ok(),
            Some("gpt-oss-20b")
        );
        let err = find_shape("llama-3-8b").unwrap_err().to_string();
        assert!(
            err.contains("glm-4.5-air") && err.contains("qwen3-30b-a3b"),
            "{err}"
        );
    }

    #[test]
    fn overrides_are_validated() {
        let bad = [
            SynthOptions {
                layers: Some(0),
                ..opts("qwen3-30b-a3b")
            },
            SynthOptions {
                experts: Some(0),
                ..opts("qwen3-30b-a3b")
            },
            SynthOptions {
                vocab: Some(10),
                ..opts("qwen3-30b-a3b")
            },
            SynthOptions {
                hidden: Some(100),
                ..opts("mixtral-8x7b")
            },
            SynthOptions {
                shard_bytes: 0,
                ..opts("qwen3-30b-a3b")
            },
        ];
        for o in bad {
            assert!(
                matches!(plan(&o), Err(SynthError::InvalidOption(_))),
                "{o:?}"
            );
        }
        let p = plan(&SynthOptions {
            experts: Some(4),
            ..opts("qwen3-30b-a3b")
        })
        .expect("plan");
        assert_eq!((p.shape.experts, p.shape.top_k), (4, 4));
    }
}
