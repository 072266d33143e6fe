//! The model's tensors, arranged per layer, and how each architecture names them.
//!
//! Non-expert weights become device buffers; routed experts stay host views
//! ([`HostMatrix`]) of the mapped files, because the expert pool lives in host RAM and only
//! the scheduler decides what reaches the device.

use super::config::{Arch, ModelConfig};
use super::routing::RouterParams;
use super::weights_file::{TensorRef, WeightFiles, WeightsError};
use super::ModelError;
use ft_backend::{Backend, BufferUsage, DType, DeviceBuffer, HostBytes, MatmulDesc};

/// A row-major `[rows, cols]` weight matrix in host memory (a view of a mapped file).
#[derive(Clone, Debug)]
pub struct HostMatrix {
    /// The bytes, `rows * cols * dtype.size()` of them.
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

/// One routed expert: SwiGLU MLP `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct ExpertWeights {
    /// `[I, H]`.
    pub gate: HostMatrix,
    /// `[I, H]`.
    pub up: HostMatrix,
    /// `[H, I]`.
    pub down: HostMatrix,
}

impl ExpertWeights {
    /// Bytes of the three matrices.
    pub fn size_bytes(&self) -> usize {
        self.gate.size_bytes() + self.up.size_bytes() + self.down.size_bytes()
    }
}

/// A device-resident linear layer `y = x Wᵀ + b`.
pub struct Linear {
    /// `[out, in]` weights.
    pub w: DeviceBuffer,
    /// Optional f32 bias.
    pub bias: Option<DeviceBuffer>,
    /// Output features.
    pub out_dim: usize,
    /// Input features.
    pub in_dim: usize,
}

impl Linear {
    /// `out[n, out_dim] = x[n, in_dim] · Wᵀ + b`.
    pub fn forward(&self, be: &dyn Backend, x: &DeviceBuffer, out: &mut DeviceBuffer, n: usize) -> Result<(), ModelError> {
        be.matmul(x, &self.w, self.bias.as_ref(), out, &MatmulDesc::new(n, self.in_dim, self.out_dim))?;
        Ok(())
    }
    /// Bytes of weights (and bias).
    pub fn size_bytes(&self) -> usize {
        self.w.size_bytes() + self.bias.as_ref().map_or(0, |b| b.size_bytes())
    }
}

/// Attention projections and optional per-head q/k norms.
pub struct AttentionWeights {
    /// Query projection.
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
    /// Router `[E, H]`.
    pub router: Linear,
    /// Scoring rule, including the selection-only bias of sigmoid routers.
    pub params: RouterParams,
    /// The routed experts (host).
    pub experts: Vec<ExpertWeights>,
    /// Always-active shared expert.
    pub shared: Option<Mlp>,
    /// `[1, H]` gate of the shared expert (Qwen2-MoE).
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
    /// RMSNorm before attention.
    pub input_norm: DeviceBuffer,
    /// RMSNorm before the feed-forward.
    pub post_attention_norm: DeviceBuffer,
    /// Self-attention.
    pub attn: AttentionWeights,
    /// MLP or MoE.
    pub ffn: FeedForward,
}

/// Loads tensors by name and turns them into backend buffers with checked shapes.
pub struct Loader<'a> {
    /// The checkpoint.
    pub files: &'a WeightFiles,
    /// Where device buffers are made.
    pub backend: &'a dyn Backend,
    /// Called with each tensor name loaded (progress).
    pub on_tensor: &'a mut dyn FnMut(&str),
}

impl Loader<'_> {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<TensorRef, ModelError> {
        (self.on_tensor)(name);
        Ok(self.files.get_shaped(name, shape)?)
    }

    /// A weight matrix as a device buffer in its checkpoint dtype.
    pub fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<DeviceBuffer, ModelError> {
        let t = self.tensor(name, &[rows, cols])?;
        Ok(self.backend.import_host(t.bytes, t.dtype, BufferUsage::Weights)?)
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

    fn f32_buffer(&self, v: &[f32]) -> Result<DeviceBuffer, ModelError> {
        let mut buf = self.backend.alloc(DType::F32, v.len(), BufferUsage::Weights)?;
        self.backend.upload(ft_backend::StreamId::COMPUTE, bytemuck::cast_slice(v), &mut buf, 0)?;
        Ok(buf)
    }

    /// A linear layer `prefix.weight` (+ `prefix.bias` when `bias`).
    pub fn linear(&mut self, prefix: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Linear, ModelError> {
        let w = self.matrix(&format!("{prefix}.weight"), out_dim, in_dim)?;
        let bias = if bias { Some(self.vector(&format!("{prefix}.bias"), out_dim)?) } else { None };
        Ok(Linear { w, bias, out_dim, in_dim })
    }

    fn host_matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostMatrix, ModelError> {
        let t = self.tensor(name, &[rows, cols])?;
        Ok(HostMatrix { bytes: t.bytes, dtype: t.dtype, rows, cols })
    }

    /// A dense SwiGLU MLP with the usual `{gate,up,down}_proj` names.
    pub fn mlp(&mut self, prefix: &str, hidden: usize, inter: usize) -> Result<Mlp, ModelError> {
        Ok(Mlp {
            gate: self.linear(&format!("{prefix}.gate_proj"), inter, hidden, false)?,
            up: self.linear(&format!("{prefix}.up_proj"), inter, hidden, false)?,
            down: self.linear(&format!("{prefix}.down_proj"), hidden, inter, false)?,
        })
    }

    /// Routed experts, in the per-expert hub layout or the fused 3-D layout
    /// (`experts.gate_up_proj [E, 2I, H]` + `experts.down_proj [E, H, I]`).
    pub fn experts(&mut self, prefix: &str, arch: Arch, n: usize, hidden: usize, inter: usize) -> Result<Vec<ExpertWeights>, ModelError> {
        let fused = format!("{prefix}.gate_up_proj");
        if self.files.contains(&fused) {
            let gu = self.tensor(&fused, &[n, 2 * inter, hidden])?;
            let down = self.tensor(&format!("{prefix}.down_proj"), &[n, hidden, inter])?;
            let (es, m) = (gu.dtype.size(), inter * hidden);
            let view = |t: &TensorRef, off: usize, rows: usize, cols: usize| -> Result<HostMatrix, ModelError> {
                let bytes = t.bytes.slice(off * es, rows * cols * t.dtype.size()).ok_or_else(|| {
                    WeightsError::Shape { name: t.name.clone(), found: t.shape.clone(), expected: vec![n, rows, cols] }
                })?;
                Ok(HostMatrix { bytes, dtype: t.dtype, rows, cols })
            };
            return (0..n)
                .map(|e| {
                    Ok(ExpertWeights {
                        gate: view(&gu, e * 2 * m, inter, hidden)?,
                        up: view(&gu, e * 2 * m + m, inter, hidden)?,
                        down: view(&down, e * m, hidden, inter)?,
                    })
                })
                .collect();
        }
        let (g, u, d) = match arch {
            Arch::Mixtral => ("w1", "w3", "w2"),
            _ => ("gate_proj", "up_proj", "down_proj"),
        };
        (0..n)
            .map(|e| {
                Ok(ExpertWeights {
                    gate: self.host_matrix(&format!("{prefix}.{e}.{g}.weight"), inter, hidden)?,
                    up: self.host_matrix(&format!("{prefix}.{e}.{u}.weight"), inter, hidden)?,
                    down: self.host_matrix(&format!("{prefix}.{e}.{d}.weight"), hidden, inter)?,
                })
            })
            .collect()
    }

    /// One decoder layer of `cfg`'s architecture.
    pub fn layer(&mut self, cfg: &ModelConfig, i: usize) -> Result<LayerWeights, ModelError> {
        let p = format!("model.layers.{i}");
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let attn = AttentionWeights {
            q: self.linear(&format!("{p}.self_attn.q_proj"), cfg.num_heads * hd, h, cfg.qkv_bias)?,
            k: self.linear(&format!("{p}.self_attn.k_proj"), cfg.num_kv_heads * hd, h, cfg.qkv_bias)?,
            v: self.linear(&format!("{p}.self_attn.v_proj"), cfg.num_kv_heads * hd, h, cfg.qkv_bias)?,
            o: {
                let has_bias = self.files.contains(&format!("{p}.self_attn.o_proj.bias"));
                self.linear(&format!("{p}.self_attn.o_proj"), h, cfg.num_heads * hd, has_bias)?
            },
            q_norm: if cfg.qk_norm { Some(self.vector(&format!("{p}.self_attn.q_norm.weight"), hd)?) } else { None },
            k_norm: if cfg.qk_norm { Some(self.vector(&format!("{p}.self_attn.k_norm.weight"), hd)?) } else { None },
        };
        let ffn = if cfg.moe_layers[i] {
            let m = if cfg.arch == Arch::Mixtral { format!("{p}.block_sparse_moe") } else { format!("{p}.mlp") };
            let correction_bias = match cfg.arch {
                Arch::Glm4Moe => Some(self.host_vector(&format!("{m}.gate.e_score_correction_bias"), cfg.num_experts)?),
                _ => None,
            };
            let (shared, shared_gate) = match cfg.arch {
                Arch::Qwen2Moe if cfg.shared_intermediate_size > 0 => (
                    Some(self.mlp(&format!("{m}.shared_expert"), h, cfg.shared_intermediate_size)?),
                    Some(self.linear(&format!("{m}.shared_expert_gate"), 1, h, false)?),
                ),
                Arch::Glm4Moe if cfg.shared_intermediate_size > 0 => {
                    (Some(self.mlp(&format!("{m}.shared_experts"), h, cfg.shared_intermediate_size)?), None)
                }
                _ => (None, None),
            };
            FeedForward::Moe(MoeWeights {
                router: self.linear(&format!("{m}.gate"), cfg.num_experts, h, false)?,
                params: RouterParams {
                    kind: cfg.routing,
                    top_k: cfg.top_k,
                    norm_topk_prob: cfg.norm_topk_prob,
                    routed_scaling_factor: cfg.routed_scaling_factor,
                    correction_bias,
                },
                experts: self.experts(&format!("{m}.experts"), cfg.arch, cfg.num_experts, h, cfg.moe_intermediate_size)?,
                shared,
                shared_gate,
            })
        } else {
            FeedForward::Dense(self.mlp(&format!("{p}.mlp"), h, cfg.intermediate_size)?)
        };
        Ok(LayerWeights {
            input_norm: self.vector(&format!("{p}.input_layernorm.weight"), h)?,
            post_attention_norm: self.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
            attn,
            ffn,
        })
    }
}
