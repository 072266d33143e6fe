//! The model's tensors, arranged per layer, and the basic loading helpers.
//!
//! Non-expert weights become device buffers; routed experts stay in host memory
//! ([`HostMatrix`]: views of the mapped files, or of a layer's copy in huge pages, see
//! [`super::hot`]), because the expert pool lives in host RAM and only the scheduler decides
//! what reaches the device. How each architecture names and lays out
//! its tensors is in [`super::load`].

use crate::model::reads;
use super::routing::RouterParams;
use super::weights_file::{TensorRef, WeightFiles};
use super::ModelError;
use ft_backend::{Backend, BufferUsage, DType, DeviceBuffer, HostBytes, MatmulDesc, MatmulPart};
use std::sync::Arc;

/// A row-major `[rows, cols]` weight matrix in host memory (a view of a mapped file, or an
/// owned copy where the checkpoint layout had to be converted).
#[derive(Clone, Debug)]
pub struct HostMatrix {
    /// The bytes, `rows * dtype.row_bytes(cols)` of them.
    pub bytes: HostBytes,
    /// Element type.
    pub dtype: DType,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

impl HostMatrix {
    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }
}

/// The f32 biases of an expert whose projections have them (gpt-oss).
#[derive(Clone, Debug)]
pub struct ExpertBiases {
    /// `[I]`, added to the gate projection.
    pub gate: HostBytes,
    /// `[I]`, added to the up projection.
    pub up: HostBytes,
    /// `[H]`, added to the down projection.
    pub down: HostBytes,
}

/// One routed expert: `down(act(gate x + b_g, up x + b_u)) + b_d`, the activation being the
/// model's [`super::config::ExpertActivation`] (biases only where [`Self::biases`] is set).
#[derive(Clone, Debug)]
pub struct ExpertWeights {
    /// `[I, H]`.
    pub gate: HostMatrix,
    /// `[I, H]`.
    pub up: HostMatrix,
    /// `[H, I]`.
    pub down: HostMatrix,
    /// Projection biases, if the architecture has them.
    pub biases: Option<ExpertBiases>,
}

impl ExpertWeights {
    /// Bytes of the three matrices and any biases.
    pub fn size_bytes(&self) -> usize {
        let b = self.biases.as_ref().map_or(0, |b| b.gate.len() + b.up.len() + b.down.len());
        self.gate.size_bytes() + self.up.size_bytes() + self.down.size_bytes() + b
    }

    /// Parameters of the three matrices and any biases.
    pub fn params(&self) -> usize {
        let m = |x: &HostMatrix| x.rows * x.cols;
        let b = self.biases.as_ref().map_or(0, |b| (b.gate.len() + b.up.len() + b.down.len()) / 4);
        m(&self.gate) + m(&self.up) + m(&self.down) + b
    }
}

/// A linear layer `y = x Wᵀ + b`, its weights on the device, or in host memory where the
/// device has no kernel for their block type.
pub struct Linear {
    /// `[out, in]` weights.
    pub w: DeviceBuffer,
    /// Optional f32 bias.
    pub bias: Option<DeviceBuffer>,
    /// Output features.
    pub out_dim: usize,
    /// Input features.
    pub in_dim: usize,
    /// The CPU backend that holds `w` and `bias` and runs the product, when the device cannot
    /// ([`super::fallback`]); `None` for device weights.
    pub host: Option<Arc<dyn Backend>>,
}

impl Linear {
    /// `out[n, out_dim] = x[n, in_dim] · Wᵀ + b`.
    pub fn forward(&self, be: &dyn Backend, x: &DeviceBuffer, out: &mut DeviceBuffer, n: usize) -> Result<(), ModelError> {
        self.forward_desc(be, x, out, &MatmulDesc::new(n, self.in_dim, self.out_dim))
    }

    /// The product over the rows, columns and offsets `desc` names (e.g. a slice of the rows).
    pub fn forward_desc(&self, be: &dyn Backend, x: &DeviceBuffer, out: &mut DeviceBuffer, desc: &MatmulDesc) -> Result<(), ModelError> {
        match &self.host {
            None => reads::matmul(be, x, &self.w, self.bias.as_ref(), out, desc)?,
            Some(cpu) => super::fallback::matmul(be, cpu.as_ref(), x, &self.w, self.bias.as_ref(), out, desc)?,
        }
        Ok(())
    }

    /// `out_i = x · W_iᵀ + b_i` for every `(linear, out)` pair of `parts`, all over the same
    /// `n` rows of `x`, as one [`Backend::matmul_same_x`] call where every weight is on the
    /// device (a layer's q/k/v: one piece of work for the CPU pool, not three); each as
    /// [`Linear::forward`] would otherwise.
    pub fn forward_same_x(be: &dyn Backend, x: &DeviceBuffer, n: usize, parts: &mut [(&Linear, &mut DeviceBuffer)]) -> Result<(), ModelError> {
        if parts.iter().any(|(l, _)| l.host.is_some()) {
            for (l, out) in parts.iter_mut() {
                l.forward(be, x, out, n)?;
            }
            return Ok(());
        }
        let mut products: Vec<MatmulPart<'_>> = parts
            .iter_mut()
            .map(|(l, out)| {
                let desc = MatmulDesc::new(n, l.in_dim, l.out_dim);
                reads::add(desc.m * l.w.dtype().row_bytes(desc.k));
                MatmulPart { w: &l.w, bias: l.bias.as_ref(), out, desc }
            })
            .collect();
        be.matmul_same_x(x, &mut products)?;
        Ok(())
    }

    /// Bytes of weights (and bias).
    pub fn size_bytes(&self) -> usize {
        self.w.size_bytes() + self.bias.as_ref().map_or(0, |b| b.size_bytes())
    }
    /// Parameters of weights (and bias); padding of quantized rows is not counted.
    pub fn params(&self) -> usize {
        self.out_dim * self.in_dim + self.bias.as_ref().map_or(0, |b| b.len())
    }
}

/// Softmax attention projections and their optional extras.
pub struct AttentionWeights {
    /// Query projection (with the Qwen3-Next output gate: `[heads, 2, head_dim]` rows).
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub o: Linear,
    /// RMSNorm over each query head.
    pub q_norm: Option<DeviceBuffer>,
    /// RMSNorm over each key head.
    pub k_norm: Option<DeviceBuffer>,
    /// Learned per-head softmax sinks (gpt-oss), f32.
    pub sinks: Option<DeviceBuffer>,
}

/// Multi-head latent attention (DeepSeek-V3).
///
/// `kv_b_proj` is stored split and rearranged for weight absorption (owned copies made at
/// load time, together the size of the original): scores are taken against the cached
/// latent directly, so the cache never holds per-head keys or values.
pub struct MlaWeights {
    /// `q_a_proj` (absent when `q_lora_rank` is null).
    pub q_a: Option<Linear>,
    /// `q_a_layernorm`.
    pub q_a_norm: Option<DeviceBuffer>,
    /// `q_b_proj`, or `q_proj` without a query compression: `[heads · (nope + rope), ·]`.
    pub q_b: Linear,
    /// `kv_a_proj_with_mqa`: `[kv_lora + rope, hidden]`, latent rows first.
    pub kv_a: Linear,
    /// `kv_a_layernorm` over the latent.
    pub kv_a_norm: DeviceBuffer,
    /// Key up-projection, transposed per head: `[heads, kv_lora, nope]`.
    pub w_uk_t: DeviceBuffer,
    /// Value up-projection per head: `[heads, v_head_dim, kv_lora]`.
    pub w_uv: DeviceBuffer,
    /// Output projection `[hidden, heads · v_head_dim]`.
    pub o: Linear,
}

/// How a Gated DeltaNet layer's input projections are stored.
pub enum DeltaNetProjections {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    Grouped {
        /// `[Hk · (2·dk + 2·(Hv/Hk)·dv), hidden]`.
        qkvz: Linear,
        /// `[Hk · 2·(Hv/Hk), hidden]`.
        ba: Linear,
    },
    /// Qwen3.5: separate `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split {
        /// `[2·Hk·dk + Hv·dv, hidden]`.
        qkv: Linear,
        /// `[Hv·dv, hidden]`.
        z: Linear,
        /// `[Hv, hidden]`.
        b: Linear,
        /// `[Hv, hidden]`.
        a: Linear,
    },
}

/// A Gated DeltaNet (linear attention) layer.
pub struct DeltaNetWeights {
    /// Input projections.
    pub proj: DeltaNetProjections,
    /// Depthwise causal convolution filters `[conv_dim, kernel]`.
    pub conv: DeviceBuffer,
    /// `A_log [Hv]`, f32.
    pub a_log: DeviceBuffer,
    /// `dt_bias [Hv]`, f32.
    pub dt_bias: DeviceBuffer,
    /// Gated RMSNorm weight `[dv]` (plain `w`, not `1 + w`).
    pub norm: DeviceBuffer,
    /// `out_proj [hidden, Hv·dv]`.
    pub out: Linear,
}

/// What a layer mixes tokens with.
pub enum Mixer {
    /// Softmax attention over a KV cache (full or sliding window, optionally gated).
    Attention(AttentionWeights),
    /// Multi-head latent attention over a latent cache.
    Mla(MlaWeights),
    /// Gated DeltaNet over a recurrent state.
    DeltaNet(DeltaNetWeights),
    /// DeepSeek-V4's compressed sparse / heavily compressed / sliding attention, with the
    /// layer's hyper-connections.
    DeepseekV4(Box<super::deepseek_v4::V4Layer>),
}

/// A dense SwiGLU MLP on the device.
pub struct Mlp {
    /// Gate projection.
    pub gate: Linear,
    /// Up projection.
    pub up: Linear,
    /// Down projection.
    pub down: Linear,
}

/// A sparse MoE block.
pub struct MoeWeights {
    /// Router `[E, H]` (with a bias for gpt-oss).
    pub router: Linear,
    /// Scoring rule, including the selection-only bias of sigmoid routers.
    pub params: RouterParams,
    /// The routed experts (host).
    pub experts: Vec<ExpertWeights>,
    /// Always-active shared expert.
    pub shared: Option<Mlp>,
    /// `[1, H]` sigmoid gate of the shared expert (Qwen2-MoE, Qwen3-Next).
    pub shared_gate: Option<Linear>,
}

/// The feed-forward part of a layer.
pub enum FeedForward {
    /// Dense MLP.
    Dense(Mlp),
    /// Mixture of experts.
    Moe(MoeWeights),
}

/// One decoder layer.
pub struct LayerWeights {
    /// RMSNorm before the token mixer.
    pub input_norm: DeviceBuffer,
    /// RMSNorm before the feed-forward.
    pub post_attention_norm: DeviceBuffer,
    /// Attention, latent attention or linear attention.
    pub mixer: Mixer,
    /// MLP or MoE.
    pub ffn: FeedForward,
}

/// Loads tensors by name and turns them into backend buffers with checked shapes.
pub struct Loader<'a> {
    /// The checkpoint.
    pub files: &'a WeightFiles,
    /// How its linear weights are quantized.
    pub quant: &'a super::quant::QuantScheme,
    /// Where device buffers are made.
    pub backend: &'a dyn Backend,
    /// Called with each tensor name loaded (progress).
    pub on_tensor: &'a mut dyn FnMut(&str),
    /// Runs what the device has no kernel for.
    pub host_cpu: &'a super::fallback::HostCpu,
}

impl Loader<'_> {
    pub(super) fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<TensorRef, ModelError> {
        (self.on_tensor)(name);
        Ok(self.files.get_shaped(name, shape)?)
    }

    /// A weight matrix in its checkpoint dtype (quantized ones packed into the engine's block
    /// layout): a device buffer, or a CPU-backend one (with that backend) where the device
    /// has no matmul kernel for the dtype.
    pub fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<(DeviceBuffer, Option<Arc<dyn Backend>>), ModelError> {
        let m = self.packed(name, rows, cols)?;
        // The CPU reads it on every token: from huge pages rather than the file's mapping.
        let hot = |bytes: HostBytes| super::hot::copy(&bytes).unwrap_or(bytes);
        if self.backend.supports(ft_backend::Op::Matmul, m.dtype) {
            let bytes = if self.backend.kind() == ft_backend::BackendKind::Cpu { hot(m.bytes) } else { m.bytes };
            return Ok((self.backend.import_host(bytes, m.dtype, BufferUsage::Weights)?, None));
        }
        let cpu = self.host_cpu.get()?;
        tracing::debug!("`{name}` is {} and the {} backend has no kernel for it: its products run on the CPU", m.dtype, self.backend.kind());
        Ok((cpu.import_host(hot(m.bytes), m.dtype, BufferUsage::Weights)?, Some(cpu)))
    }

    /// The token embedding table, a block-quantized one left packed on the host
    /// ([`super::embedding`]).
    pub fn embedding(&mut self, name: &str, vocab: usize, hidden: usize) -> Result<super::embedding::Embedding, ModelError> {
        let m = self.packed(name, vocab, hidden)?;
        super::embedding::Embedding::new(self.backend, m.bytes, m.dtype, vocab, hidden)
    }

    /// A `[rows, cols]` weight in a plain dtype, dequantized to f32 if stored quantized (for
    /// weights the loader rearranges element by element, such as MLA's `kv_b_proj`).
    pub(super) fn dense(&mut self, name: &str, rows: usize, cols: usize) -> Result<super::quant::PackedMatrix, ModelError> {
        let m = self.packed(name, rows, cols)?;
        if !m.dtype.is_quantized() {
            return Ok(m);
        }
        let values = ft_backend::quant::dequantize_matrix(m.dtype, m.bytes.as_slice(), rows, cols)
            .ok_or_else(|| ModelError::Invalid(format!("`{name}`: packed weights shorter than {rows}×{cols}")))?;
        Ok(super::quant::PackedMatrix { bytes: HostBytes::from_vec(bytemuck::cast_slice(&values).to_vec()), dtype: DType::F32 })
    }

    /// A `[rows, cols]` weight named `name`; a quantized `….weight` comes with its scales.
    fn packed(&mut self, name: &str, rows: usize, cols: usize) -> Result<super::quant::PackedMatrix, ModelError> {
        (self.on_tensor)(name);
        match name.strip_suffix(".weight") {
            Some(base) => super::quant::load_matrix(self.files, self.quant, base, rows, cols),
            None => {
                let t = self.files.get_shaped(name, &[rows, cols])?;
                Ok(super::quant::PackedMatrix { bytes: t.bytes, dtype: t.dtype })
            }
        }
    }

    /// A small vector (norm weight, bias) converted to f32 on the device.
    pub fn vector(&mut self, name: &str, len: usize) -> Result<DeviceBuffer, ModelError> {
        let v = self.tensor(name, &[len])?.to_f32();
        self.f32_buffer(&v)
    }

    /// A small vector converted to f32 on the host.
    pub fn host_vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        Ok(self.tensor(name, &[len])?.to_f32())
    }

    pub(super) fn f32_buffer(&self, v: &[f32]) -> Result<DeviceBuffer, ModelError> {
        let mut buf = self.backend.alloc(DType::F32, v.len(), BufferUsage::Weights)?;
        self.backend.upload(ft_backend::StreamId::COMPUTE, bytemuck::cast_slice(v), &mut buf, 0)?;
        Ok(buf)
    }

    /// A device weight made from converted host bytes the model owns from now on.
    pub(super) fn owned(&self, bytes: Vec<u8>, dtype: DType) -> Result<DeviceBuffer, ModelError> {
        Ok(self.backend.import_host(HostBytes::from_vec(bytes), dtype, BufferUsage::Weights)?)
    }

    /// A linear layer `prefix.weight` (+ `prefix.bias` when `bias`).
    pub fn linear(&mut self, prefix: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Linear, ModelError> {
        let (w, host) = self.matrix(&format!("{prefix}.weight"), out_dim, in_dim)?;
        let bias = if bias { Some(self.vector(&format!("{prefix}.bias"), out_dim)?) } else { None };
        // A host product adds its bias on the host too.
        let bias = match (&host, bias) {
            (Some(cpu), Some(b)) => Some(super::fallback::move_to(self.backend, cpu.as_ref(), &b)?),
            (_, b) => b,
        };
        Ok(Linear { w, bias, out_dim, in_dim, host })
    }

    pub(super) fn host_matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostMatrix, ModelError> {
        let m = self.packed(name, rows, cols)?;
        Ok(HostMatrix { bytes: m.bytes, dtype: m.dtype, rows, cols })
    }

    /// A dense SwiGLU MLP with the usual `{gate,up,down}_proj` names.
    pub fn mlp(&mut self, prefix: &str, hidden: usize, inter: usize) -> Result<Mlp, ModelError> {
        Ok(Mlp {
            gate: self.linear(&format!("{prefix}.gate_proj"), inter, hidden, false)?,
            up: self.linear(&format!("{prefix}.up_proj"), inter, hidden, false)?,
            down: self.linear(&format!("{prefix}.down_proj"), hidden, inter, false)?,
        })
    }
}
