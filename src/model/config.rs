//! `config.json` of a Hugging Face checkpoint, normalised into one [`ModelConfig`].
//!
//! Hub configs name the same thing differently across families (`num_experts` vs
//! `num_local_experts` vs `n_routed_experts`, top-level `rope_theta`/`rope_scaling` vs
//! transformers 5's `rope_parameters`), so parsing goes through a tolerant key lookup and
//! every architecture-specific default is decided here, once.

mod deepseek_v4;
mod keys;
mod layers;
mod rope;
#[cfg(test)]
mod tests;

pub use deepseek_v4::{V4Attention, V4Config};
use ft_backend::BinaryOp;
use keys::Keys;
use layers::{layer_kinds, linear_attn_config, mla_config, mla_softmax_scale, moe_layer_map};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A problem with `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    /// A required key is absent.
    #[error("{path}: missing key `{key}`")]
    Missing { path: PathBuf, key: String },
    /// A key has the wrong type or an impossible value.
    #[error("{path}: key `{key}` {problem}")]
    Invalid { path: PathBuf, key: String, problem: String },
    /// The `model_type` is not one this build can run.
    #[error("{path}: model_type `{model_type}` is not supported (supported: {})", Arch::SUPPORTED.join(", "))]
    UnsupportedArch { path: PathBuf, model_type: String },
}

/// The model families the engine implements, chosen by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Qwen3-MoE (q/k RMSNorm, softmax top-k routing).
    Qwen3Moe,
    /// Qwen1.5/Qwen2-MoE (q/k/v bias, sigmoid-gated shared expert).
    Qwen2Moe,
    /// Mixtral (softmax top-k, always renormalised).
    Mixtral,
    /// GLM-4.5 MoE (sigmoid routing with correction bias, partial rotary, shared expert).
    Glm4Moe,
    /// Qwen3-Next: Gated DeltaNet layers between gated full-attention layers, `(1+w)` norms,
    /// sigmoid-gated shared expert.
    Qwen3Next,
    /// Qwen3.5/3.6-MoE: the Qwen3-Next text stack with split DeltaNet projections, usually
    /// inside a vision-language checkpoint (`model.language_model.*`, config in `text_config`).
    Qwen35Moe,
    /// DeepSeek-V3: multi-head latent attention, group-limited sigmoid routing.
    DeepseekV3,
    /// gpt-oss: sliding/full attention with sinks, top-k-then-softmax routing, clamped SwiGLU.
    GptOss,
    /// DeepSeek-V4: hyper-connected residual streams, shared-KV attention over a sliding
    /// window plus compressed entries (CSA with a lightning indexer, HCA), hash-routed and
    /// `sqrtsoftplus`-scored MoE layers.
    DeepseekV4,
}

impl Arch {
    /// `model_type` strings accepted, in the order they are listed to users.
    pub const SUPPORTED: [&'static str; 9] =
        ["qwen3_moe", "qwen2_moe", "mixtral", "glm4_moe", "qwen3_next", "qwen3_5_moe", "deepseek_v3", "gpt_oss", "deepseek_v4"];

    /// The architecture for a `model_type`.
    pub fn from_model_type(s: &str) -> Option<Arch> {
        match s {
            "qwen3_moe" => Some(Arch::Qwen3Moe),
            "qwen2_moe" => Some(Arch::Qwen2Moe),
            "mixtral" => Some(Arch::Mixtral),
            "glm4_moe" => Some(Arch::Glm4Moe),
            "qwen3_next" => Some(Arch::Qwen3Next),
            // The text-only class of a Qwen3.5-MoE checkpoint has its own model_type.
            "qwen3_5_moe" | "qwen3_5_moe_text" => Some(Arch::Qwen35Moe),
            "deepseek_v3" => Some(Arch::DeepseekV3),
            "gpt_oss" => Some(Arch::GptOss),
            "deepseek_v4" => Some(Arch::DeepseekV4),
            _ => None,
        }
    }

    /// The `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen2Moe => "qwen2_moe",
            Arch::Mixtral => "mixtral",
            Arch::Glm4Moe => "glm4_moe",
            Arch::Qwen3Next => "qwen3_next",
            Arch::Qwen35Moe => "qwen3_5_moe",
            Arch::DeepseekV3 => "deepseek_v3",
            Arch::GptOss => "gpt_oss",
            Arch::DeepseekV4 => "deepseek_v4",
        }
    }

    /// Qwen3-Next and Qwen3.5-MoE share everything but the DeltaNet projection layout.
    pub fn is_qwen3_next_family(self) -> bool {
        matches!(self, Arch::Qwen3Next | Arch::Qwen35Moe)
    }
}

/// How RoPE frequencies are derived from the base ones.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain `theta^(-2i/d)`.
    None,
    /// Positions divided by `factor` (frequencies scaled by `1/factor`).
    Linear { factor: f32 },
    /// YaRN: blend of interpolated and extrapolated frequencies plus attention scaling.
    /// `mscale`/`mscale_all_dim` of 0 mean "not set".
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
        mscale: f32,
        mscale_all_dim: f32,
        attention_factor: Option<f32>,
        truncate: bool,
    },
    /// Llama-3 style wavelength-dependent scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position: usize },
}

/// Rotary embedding settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base `theta`.
    pub theta: f32,
    /// Fraction of the head dimension that is rotated.
    pub partial_rotary_factor: f32,
    /// Frequency scaling.
    pub scaling: RopeScaling,
}

/// How router logits become expert choices and combine weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RoutingKind {
    /// Softmax over all experts, then top-k (Qwen, Mixtral).
    SoftmaxTopK,
    /// Sigmoid scores; top-k on `score + e_score_correction_bias` within the best
    /// `topk_group` of `n_group` groups; weights are the unbiased scores (GLM, DeepSeek-V3).
    SigmoidGroupLimited { n_group: usize, topk_group: usize },
    /// Top-k of the raw logits, then a softmax over the chosen ones only (gpt-oss).
    TopKSoftmax,
    /// `sqrt(softplus(logit))` scores; top-k on `score + e_score_correction_bias`, weights
    /// the unbiased scores (DeepSeek-V4).
    SqrtSoftplus,
}

/// What a decoder layer mixes tokens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Causal attention over the whole context.
    FullAttention,
    /// Causal attention over the last `sliding_window` tokens.
    SlidingAttention,
    /// Gated DeltaNet: linear attention with a recurrent state.
    LinearAttention,
}

/// Gated DeltaNet dimensions (Qwen3-Next / Qwen3.5 `linear_*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearAttnConfig {
    /// Query/key heads.
    pub num_k_heads: usize,
    /// Value heads (each has its own `[k_head_dim, v_head_dim]` state).
    pub num_v_heads: usize,
    /// Query/key head size.
    pub k_head_dim: usize,
    /// Value head size.
    pub v_head_dim: usize,
    /// Length of the causal short convolution.
    pub conv_kernel: usize,
}

impl LinearAttnConfig {
    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim
    }
    /// Width of all value heads together.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.v_head_dim
    }
    /// Elements of the recurrent state of one layer.
    pub fn state_len(&self) -> usize {
        self.num_v_heads * self.k_head_dim * self.v_head_dim
    }
}

/// Multi-head latent attention dimensions (DeepSeek-V2/V3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaConfig {
    /// Rank of the query compression; `None` means a plain `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// Width of the cached key/value latent.
    pub kv_lora_rank: usize,
    /// Per-head query/key part without position information.
    pub qk_nope_head_dim: usize,
    /// Per-head query/key part carrying RoPE (the key part is shared by all heads).
    pub qk_rope_head_dim: usize,
    /// Per-head value size.
    pub v_head_dim: usize,
    /// Rotate pairs `(2i, 2i+1)` (the checkpoints' interleaved layout) instead of halves.
    pub rope_interleave: bool,
}

impl MlaConfig {
    /// Elements cached per token and layer: the latent plus the shared rotary key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// The activation between a routed expert's gate/up and down projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) · up`.
    SwiGlu,
    /// gpt-oss: `min(gate, limit) · sigmoid(alpha · min(gate, limit)) · (clamp(up, ±limit) + 1)`.
    ClampedSwiGlu { alpha: f32, limit: f32 },
    /// DeepSeek-V4: `silu(min(gate, limit)) · clamp(up, ±limit)`.
    LimitedSwiGlu { limit: f32 },
}

impl ExpertActivation {
    /// The backend op that applies it as `gate = op(gate, up)`.
    pub fn binary_op(self) -> BinaryOp {
        match self {
            ExpertActivation::SwiGlu => BinaryOp::SwiGlu,
            ExpertActivation::ClampedSwiGlu { alpha, limit } => BinaryOp::ClampedSwiGlu { alpha, limit },
            ExpertActivation::LimitedSwiGlu { limit } => BinaryOp::LimitedSwiGlu { limit },
        }
    }
}

/// Everything the engine needs from `config.json`, with architecture defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Family.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding and lm_head).
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Per-head size (for MLA: the rotary part, as transformers sets it).
    pub head_dim: usize,
    /// Intermediate size of dense MLP layers.
    pub intermediate_size: usize,
    /// Intermediate size of each routed expert.
    pub moe_intermediate_size: usize,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Renormalise the chosen weights to sum to one.
    pub norm_topk_prob: bool,
    /// Multiplies the final routed weights.
    pub routed_scaling_factor: f32,
    /// Router scoring.
    pub routing: RoutingKind,
    /// The router linear has a bias (gpt-oss).
    pub router_bias: bool,
    /// Intermediate size of the shared expert(s), 0 when there is none.
    pub shared_intermediate_size: usize,
    /// Whether the shared expert output is gated by `sigmoid(x · w_gate)` (Qwen2-MoE, Qwen3-Next).
    pub shared_expert_gated: bool,
    /// Activation of the routed experts.
    pub expert_activation: ExpertActivation,
    /// Routed experts carry biases on gate/up and down (gpt-oss).
    pub expert_bias: bool,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Layer, final and q/k norms multiply by `(1 + w)` (Qwen3-Next family).
    pub norm_unit_offset: bool,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE.
    pub qk_norm: bool,
    /// `q_proj` also yields a per-head output gate: `out · sigmoid(gate)` (Qwen3-Next family).
    pub attn_output_gate: bool,
    /// Learned per-head softmax sinks (gpt-oss).
    pub attention_sinks: bool,
    /// Softmax scale of attention scores.
    pub attention_scale: f32,
    /// Window of sliding-attention layers.
    pub sliding_window: Option<usize>,
    /// How each layer mixes tokens.
    pub layer_kinds: Vec<LayerKind>,
    /// Gated DeltaNet dimensions, for models with linear-attention layers.
    pub linear_attn: Option<LinearAttnConfig>,
    /// Latent attention dimensions, for MLA models.
    pub mla: Option<MlaConfig>,
    /// Which layers are MoE (true) or dense MLP (false).
    pub moe_layers: Vec<bool>,
    /// Token ids that end generation, from config.json (generation_config.json adds more).
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence id, if the model has one.
    pub bos_token_id: Option<u32>,
    /// DeepSeek-V4's own settings.
    pub v4: Option<V4Config>,
}

impl ModelConfig {
    /// Reads and normalises `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<ModelConfig, ConfigError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io { path: path.clone(), source })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| ConfigError::Json { path: path.clone(), source })?;
        Self::from_json(&value, &path)
    }

    /// Normalises a parsed config; `path` is only used in error messages.
    pub fn from_json(value: &Value, path: &Path) -> Result<ModelConfig, ConfigError> {
        let root = value.as_object().ok_or_else(|| ConfigError::Invalid {
            path: path.into(),
            key: "<root>".into(),
            problem: "must be a JSON object".into(),
        })?;
        // Multimodal wrappers keep the language model's settings under `text_config`.
        let obj = match root.get("text_config") {
            Some(Value::Object(t)) => t,
            _ => root,
        };
        let k = Keys { obj, path };
        let model_type = Keys { obj: root, path }
            .find(&["model_type"])
            .and_then(|(_, v)| v.as_str())
            .or_else(|| k.find(&["model_type"]).and_then(|(_, v)| v.as_str()))
            .ok_or_else(|| ConfigError::Missing { path: path.into(), key: "model_type".into() })?;
        let arch = Arch::from_model_type(model_type)
            .ok_or_else(|| ConfigError::UnsupportedArch { path: path.into(), model_type: model_type.into() })?;

        let hidden_size = k.usize(&["hidden_size"])?;
        let num_layers = k.usize(&["num_hidden_layers"])?;
        let num_heads = k.usize(&["num_attention_heads"])?;
        let num_kv_heads = k.usize_opt(&["num_key_value_heads"])?.unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(k.invalid(
                "num_key_value_heads",
                format!("({num_kv_heads}) must divide num_attention_heads ({num_heads})"),
            ));
        }
        let mla = match arch {
            Arch::DeepseekV3 => Some(mla_config(&k)?),
            _ => None,
        };
        // transformers' DeepSeek config sets head_dim to the rotary part; RoPE uses it.
        let head_dim = match (mla, arch) {
            (Some(m), _) => m.qk_rope_head_dim,
            (None, Arch::DeepseekV4) => k.usize_opt(&["head_dim"])?.unwrap_or(512),
            (None, _) => k.usize_opt(&["head_dim"])?.unwrap_or(hidden_size / num_heads),
        };
        let v4 = match arch {
            Arch::DeepseekV4 => {
                let v = deepseek_v4::v4_config(&k, num_layers, head_dim)?;
                deepseek_v4::check(&k, &v, num_heads, head_dim)?;
                Some(v)
            }
            _ => None,
        };
        // Qwen3.5-MoE and DeepSeek-V4 have no dense FFN and their configs no `intermediate_size`.
        let intermediate_size = match arch {
            Arch::Qwen35Moe | Arch::DeepseekV4 => k.usize_opt(&["intermediate_size"])?.unwrap_or(0),
            _ => k.usize(&["intermediate_size"])?,
        };
        let num_experts = k.usize(&["num_experts", "num_local_experts", "n_routed_experts"])?;
        let top_k = k.usize(&["num_experts_per_tok"])?;
        if top_k == 0 || top_k > num_experts {
            return Err(k.invalid("num_experts_per_tok", format!("({top_k}) must be in 1..={num_experts}")));
        }
        let moe_intermediate_size = match arch {
            // Their expert width is the only FFN width they have.
            Arch::Mixtral | Arch::GptOss => intermediate_size,
            _ => k.usize(&["moe_intermediate_size"])?,
        };

        let (norm_topk_prob, routing, shared_intermediate_size, shared_expert_gated) = match arch {
            Arch::Qwen3Moe => (k.bool_opt(&["norm_topk_prob"])?.unwrap_or(false), RoutingKind::SoftmaxTopK, 0, false),
            Arch::Qwen2Moe | Arch::Qwen3Next => (
                k.bool_opt(&["norm_topk_prob"])?.unwrap_or(arch == Arch::Qwen3Next),
                RoutingKind::SoftmaxTopK,
                k.usize_opt(&["shared_expert_intermediate_size"])?.unwrap_or(0),
                true,
            ),
            // Its router always renormalises, whatever the config says.
            Arch::Qwen35Moe => {
                (true, RoutingKind::SoftmaxTopK, k.usize_opt(&["shared_expert_intermediate_size"])?.unwrap_or(0), true)
            }
            Arch::Mixtral => (true, RoutingKind::SoftmaxTopK, 0, false),
            Arch::GptOss => (false, RoutingKind::TopKSoftmax, 0, false),
            // Its routers always renormalise the chosen scores.
            Arch::DeepseekV4 => {
                (true, RoutingKind::SqrtSoftplus, k.usize_opt(&["n_shared_experts"])?.unwrap_or(1) * moe_intermediate_size, false)
            }
            Arch::Glm4Moe | Arch::DeepseekV3 => {
                let n_group = k.usize_opt(&["n_group"])?.unwrap_or(1).max(1);
                let topk_group = k.usize_opt(&["topk_group"])?.unwrap_or(1).max(1);
                if num_experts % n_group != 0 || topk_group > n_group {
                    return Err(k.invalid("n_group", format!("{n_group} groups / {topk_group} chosen do not fit {num_experts} experts")));
                }
                if n_group > 1 && num_experts / n_group < 2 {
                    return Err(k.invalid("n_group", format!("groups of {num_experts}/{n_group} experts cannot be scored by their best two")));
                }
                let shared = k.usize_opt(&["n_shared_experts"])?.unwrap_or(0) * moe_intermediate_size;
                (k.bool_opt(&["norm_topk_prob"])?.unwrap_or(true), RoutingKind::SigmoidGroupLimited { n_group, topk_group }, shared, false)
            }
        };

        let moe_layers = moe_layer_map(arch, &k, num_layers)?;
        let layer_kinds = layer_kinds(arch, &k, num_layers)?;
        let linear_attn = if layer_kinds.contains(&LayerKind::LinearAttention) { Some(linear_attn_config(&k)?) } else { None };
        let sliding_window = match (&v4, arch) {
            (Some(v), _) => Some(v.sliding_window),
            (None, Arch::GptOss) => Some(k.usize_opt(&["sliding_window"])?.unwrap_or(128)),
            _ => None,
        };
        if sliding_window == Some(0) {
            return Err(k.invalid("sliding_window", "must be at least 1"));
        }
        let rope = match &v4 {
            Some(v) => v.rope_main.clone(),
            None => rope::rope_config(obj, path, head_dim)?,
        };
        let attention_bias = k.bool_opt(&["attention_bias"])?;
        let qkv_bias = match arch {
            Arch::Qwen2Moe => k.bool_opt(&["qkv_bias"])?.unwrap_or(true),
            Arch::GptOss => attention_bias.unwrap_or(true),
            Arch::Mixtral => false,
            _ => attention_bias.unwrap_or(false),
        };
        let qk_norm = match arch {
            Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35Moe => true,
            Arch::Glm4Moe => k.bool_opt(&["use_qk_norm"])?.unwrap_or(false),
            _ => false,
        };
        let attention_scale = match mla {
            Some(m) => mla_softmax_scale(&m, &rope),
            None => 1.0 / (head_dim as f32).sqrt(),
        };
        let expert_activation = match arch {
            Arch::GptOss => ExpertActivation::ClampedSwiGlu {
                alpha: k.f32_opt(&["swiglu_alpha"])?.unwrap_or(1.702),
                limit: k.f32_opt(&["swiglu_limit"])?.unwrap_or(7.0),
            },
            Arch::DeepseekV4 => ExpertActivation::LimitedSwiGlu { limit: v4.as_ref().map_or(10.0, |v| v.swiglu_limit) },
            _ => ExpertActivation::SwiGlu,
        };
        let mut eos_token_ids = k.ids("eos_token_id")?;
        if eos_token_ids.is_empty() {
            eos_token_ids = Keys { obj: root, path }.ids("eos_token_id")?;
        }
        let bos_token_id = k.ids("bos_token_id")?.first().copied();

        Ok(ModelConfig {
            arch,
            vocab_size: k.usize(&["vocab_size"])?,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            moe_intermediate_size,
            num_experts,
            top_k,
            norm_topk_prob,
            routed_scaling_factor: k.f32_opt(&["routed_scaling_factor"])?.unwrap_or(1.0),
            routing,
            router_bias: arch == Arch::GptOss,
            shared_intermediate_size,
            shared_expert_gated,
            expert_activation,
            expert_bias: arch == Arch::GptOss,
            rms_norm_eps: k.f32_opt(&["rms_norm_eps"])?.unwrap_or(1e-6),
            norm_unit_offset: arch.is_qwen3_next_family(),
            rope,
            max_position_embeddings: k.usize_opt(&["max_position_embeddings"])?.unwrap_or(4096),
            tie_word_embeddings: k
                .bool_opt(&["tie_word_embeddings"])?
                .or(Keys { obj: root, path }.bool_opt(&["tie_word_embeddings"])?)
                .unwrap_or(false),
            qkv_bias,
            qk_norm,
            attn_output_gate: arch.is_qwen3_next_family(),
            attention_sinks: matches!(arch, Arch::GptOss | Arch::DeepseekV4),
            attention_scale,
            sliding_window,
            layer_kinds,
            linear_attn,
            mla,
            moe_layers,
            eos_token_ids,
            bos_token_id,
            v4,
        })
    }

    /// Number of rotated dimensions per head (even).
    pub fn rotary_dim(&self) -> usize {
        ((self.head_dim as f32 * self.rope.partial_rotary_factor) as usize) & !1
    }

    /// Number of MoE layers.
    pub fn num_moe_layers(&self) -> usize {
        self.moe_layers.iter().filter(|m| **m).count()
    }

    /// Whether a sequence's state summarises its tokens (Gated DeltaNet, DeepSeek-V4's
    /// compressors), so that it can only be restored whole, never cut back to a prefix.
    pub fn has_summarising_state(&self) -> bool {
        self.num_layers_of(LayerKind::LinearAttention) > 0
            || self.v4.as_ref().is_some_and(|v| v.attention.iter().any(|a| *a != V4Attention::Sliding))
    }

    /// Number of layers of `kind`.
    pub fn num_layers_of(&self, kind: LayerKind) -> usize {
        self.layer_kinds.iter().filter(|k| **k == kind).count()
    }
}
