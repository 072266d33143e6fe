//! Model definitions and loading: config, weights, architectures and the reference forward.

pub mod arch;
pub mod config;
pub mod embedding;
pub mod hot;
pub mod fallback;
pub mod fault;
pub mod batch;
pub mod deepseek_v4;
pub mod footprint;
pub mod forward;
pub mod generation_config;
pub mod gguf;
pub mod info;
mod load;
pub mod quant;
pub mod readahead;
pub mod reads;
mod mixer;
pub mod rope;
pub mod routing;
pub mod weights;
pub mod weights_file;

pub use config::{Arch, ConfigError, ModelConfig};
pub use forward::{Logits, Trace};
pub use weights_file::{WeightFiles, WeightsError};

use ft_backend::{Backend, BackendError, DeviceBuffer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weights::{FeedForward, LayerWeights, Linear, Loader};

/// Anything that stops a model from loading or running.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The folder does not exist or is not a folder.
    #[error("model folder {0} does not exist or is not a directory")]
    NoFolder(PathBuf),
    /// `config.json` problem.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Weight file problem.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// A backend call failed.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// More tokens than the sequence state was sized for.
    #[error("sequence needs {needed} tokens but its context holds {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    /// A caller passed something impossible (empty input, token id out of range).
    #[error("{0}")]
    Invalid(String),
    /// A quantized checkpoint the engine cannot read.
    #[error(transparent)]
    Quant(#[from] quant::QuantError),
    /// A GGUF file the engine cannot read.
    #[error(transparent)]
    Gguf(gguf::GgufError),
    /// The expert pipeline failed during a forward pass.
    #[error(transparent)]
    Pipeline(#[from] fault::PipelineFault),
}

impl ModelError {
    /// Whether the cause is the device running out of memory (transient: a retry can work).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            ModelError::Backend(e) => fault::is_out_of_memory(e),
            ModelError::Pipeline(p) => p.backend().is_some_and(fault::is_out_of_memory),
            _ => false,
        }
    }
}

/// A loaded model: config, device weights and the host expert pool.
pub struct Model {
    config: ModelConfig,
    backend: Arc<dyn Backend>,
    dir: PathBuf,
    pub(crate) embed: embedding::Embedding,
    pub(crate) final_norm: DeviceBuffer,
    pub(crate) lm_head: Option<Linear>,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) inv_freq: Vec<f32>,
    pub(crate) rope_scaling: f32,
    pub(crate) rotary_dim: usize,
    /// DeepSeek-V4's final collapse of the residual streams.
    pub(crate) hc_head: Option<deepseek_v4::HyperHead>,
    files: WeightFiles,
    /// Runs the ops the device has no kernel for.
    host_cpu: fallback::HostCpu,
}

/// A checkpoint's config, tensor index (headers read, data mapped, not read) and quantization
/// scheme: a folder of safetensors, or a GGUF file.
pub fn open_checkpoint(dir: &Path) -> Result<(ModelConfig, WeightFiles, quant::QuantScheme), ModelError> {
    if gguf::is_gguf(dir) {
        let g = gguf::load::GgufModel::open(dir)?;
        let files = g.weight_files()?;
        return Ok((g.config, files, quant::QuantScheme::None));
    }
    if !dir.is_dir() {
        return Err(ModelError::NoFolder(dir.to_path_buf()));
    }
    Ok((ModelConfig::from_dir(dir)?, WeightFiles::open(dir)?, quant::QuantScheme::from_dir(dir)?))
}

impl Model {
    /// Loads the checkpoint in `dir` onto `backend`. `progress(done, total)` is called per tensor.
    pub fn load(dir: &Path, backend: Arc<dyn Backend>, progress: &mut dyn FnMut(usize, usize)) -> Result<Model, ModelError> {
        let (config, files, quant) = open_checkpoint(dir)?;
        let copied_before = hot::experts_copied();
        let total = files.names().count();
        let mut done = 0usize;
        let mut on_tensor = |_: &str| {
            done += 1;
            progress(done, total);
        };
        let (h, v) = (config.hidden_size, config.vocab_size);
        let prefix = load::weight_prefix(&files);
        let host_cpu = fallback::HostCpu::default();
        let mut loader = Loader { files: &files, quant: &quant, backend: backend.as_ref(), on_tensor: &mut on_tensor, host_cpu: &host_cpu };
        let (embed, layers, final_norm, lm_head, hc_head) = if config.arch == Arch::DeepseekV4 {
            let p = deepseek_v4::load_top(&mut loader, &config)?;
            (p.embed, p.layers, p.final_norm, Some(p.lm_head), Some(p.hc_head))
        } else {
            let embed = loader.embedding(&format!("{prefix}embed_tokens.weight"), v, h)?;
            let layers = (0..config.num_layers).map(|i| loader.layer(&config, prefix, i)).collect::<Result<Vec<_>, _>>()?;
            let final_norm = loader.vector(&format!("{prefix}norm.weight"), h)?;
            let lm_head = if config.tie_word_embeddings && !files.contains("lm_head.weight") {
                embed.as_weight(backend.as_ref(), &host_cpu)?.map(|(w, host)| Linear { w, bias: None, out_dim: v, in_dim: h, host })
            } else {
                Some(loader.linear("lm_head", v, h, false)?)
            };
            (embed, layers, final_norm, lm_head, None)
        };
        progress(total, total);
        let rotary_dim = config.rotary_dim();
        let (inv_freq, rope_scaling) = rope::inv_freq(&config.rope, rotary_dim);
        let unused = files.unused();
        if !unused.is_empty() {
            tracing::info!(count = unused.len(), first = %unused[0], "checkpoint tensors not used by this architecture");
        }
        // Process-wide counter: a figure for the log, shared with models loading beside this one.
        let experts_copied_mib = hot::experts_copied().saturating_sub(copied_before) >> 20;
        tracing::info!(arch = config.arch.model_type(), layers = config.num_layers, backend = %backend.kind(), experts_copied_mib, "model loaded");
        Ok(Model {
            config,
            backend,
            dir: dir.to_path_buf(),
            embed,
            final_norm,
            lm_head,
            layers,
            inv_freq,
            rope_scaling,
            rotary_dim,
            hc_head,
            files,
            host_cpu,
        })
    }

    /// The normalised config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// A shared handle to the backend.
    pub fn backend_arc(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// The checkpoint folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint's weight files.
    pub fn files(&self) -> &WeightFiles {
        &self.files
    }

    /// The token embedding table.
    pub fn embedding(&self) -> &embedding::Embedding {
        &self.embed
    }

    /// Attention on the device, or on the CPU where the device's kernels do not take these
    /// head sizes ([`Backend::supports_attention`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend(
        &self,
        q: &DeviceBuffer,
        k_cache: &DeviceBuffer,
        v_cache: &DeviceBuffer,
        sinks: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &ft_backend::AttentionDesc,
    ) -> Result<(), ModelError> {
        let be = self.backend();
        if be.supports_attention(desc, k_cache.dtype()) {
            return Ok(be.attention(q, k_cache, v_cache, sinks, out, desc)?);
        }
        let cpu = self.host_cpu.get()?;
        fallback::attention(be, cpu.as_ref(), q, k_cache, v_cache, sinks, out, desc)
    }

    /// Attention over a paged cache on the device; where the device's kernels do not take
    /// these head sizes, over the pages gathered into contiguous rows on the CPU's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend_paged(
        &self,
        q: &DeviceBuffer,
        k_pool: &DeviceBuffer,
        v_pool: &DeviceBuffer,
        pages: &ft_backend::KvPages<'_>,
        sinks: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &ft_backend::AttentionDesc,
    ) -> Result<(), ModelError> {
        let be = self.backend();
        if be.supports_attention(desc, k_pool.dtype()) {
            return Ok(be.attention_paged(q, k_pool, v_pool, pages, sinks, out, desc)?);
        }
        let (k, v) = ft_backend::gather_kv_pages(be, k_pool, v_pool, pages, desc)?;
        self.attend(q, &k, v.as_ref().unwrap_or(&k), sinks, out, desc)
    }

    /// The CPU backend that runs what the device has no kernel for.
    pub(crate) fn host_cpu(&self) -> Result<Arc<dyn Backend>, ModelError> {
        self.host_cpu.get()
    }

    /// The output projection (the embedding when tied).
    pub(crate) fn lm_head(&self) -> &DeviceBuffer {
        match (&self.lm_head, &self.embed) {
            (Some(l), _) => &l.w,
            (None, embedding::Embedding::Device(table)) => table,
            // `load` makes a head of a host-side tied table.
            (None, embedding::Embedding::Host { .. }) => unreachable!("a host embedding always has an lm_head"),
        }
    }

    /// Decoder layers.
    pub fn layers(&self) -> &[LayerWeights] {
        &self.layers
    }

    /// Routed experts of layer `i` (empty for dense layers).
    pub fn experts(&self, i: usize) -> &[weights::ExpertWeights] {
        match &self.layers[i].ffn {
            FeedForward::Moe(m) => &m.experts,
            FeedForward::Dense(_) => &[],
        }
    }
}
