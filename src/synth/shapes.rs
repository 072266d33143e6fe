//! The real model shapes `synth` can imitate, and the list of tensors each one has.
//!
//! Values are those of the published Hugging Face `config.json` files; tensor names and
//! layouts are the original hub layout (per-expert weights, row-major `[out, in]`; gpt-oss's
//! fused expert tensors), as transformers' modeling files name them.

mod plan;
mod plan_v4;
mod table;

pub use plan::tensor_plan;
use table::SHAPES;

use super::{SynthDtype, SynthError};

/// Model family; decides tensor names and the `config.json` key set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `qwen3_moe`: QK-norm, softmax top-k routing, no shared expert.
    Qwen3Moe,
    /// `qwen2_moe`: q/k/v bias, routed experts plus a sigmoid-gated shared expert.
    Qwen2Moe,
    /// `mixtral`: `block_sparse_moe` with `w1/w2/w3` experts.
    Mixtral,
    /// `glm4_moe`: sigmoid routing with `e_score_correction_bias`, shared experts, dense
    /// first layers, attention bias, partial rotary.
    Glm4Moe,
    /// `qwen3_next`: Gated DeltaNet layers (fused `in_proj_qkvz`/`in_proj_ba`) between gated
    /// full-attention layers, sigmoid-gated shared expert.
    Qwen3Next,
    /// `qwen3_5_moe`: the Qwen3-Next stack with split DeltaNet projections, saved as a
    /// vision-language checkpoint (`model.language_model.*`, config under `text_config`);
    /// the vision tower is not synthesised.
    Qwen35Moe,
    /// `deepseek_v3`: multi-head latent attention, group-limited sigmoid routing, shared
    /// expert, dense first layers, YaRN.
    DeepseekV3,
    /// `gpt_oss`: attention with biases and sinks, alternating sliding windows, fused
    /// interleaved experts with biases, YaRN.
    GptOss,
    /// `deepseek_v4`: hyper-connections, shared-KV attention with CSA/HCA compressors and a
    /// lightning indexer, hash-routed first layers; the published tensor names.
    DeepseekV4,
}

impl Arch {
    /// The `model_type` string of `config.json`.
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

    /// The `architectures[0]` class name of `config.json`.
    pub fn architecture(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
            Arch::Qwen2Moe => "Qwen2MoeForCausalLM",
            Arch::Mixtral => "MixtralForCausalLM",
            Arch::Glm4Moe => "Glm4MoeForCausalLM",
            Arch::Qwen3Next => "Qwen3NextForCausalLM",
            Arch::Qwen35Moe => "Qwen3_5MoeForConditionalGeneration",
            Arch::DeepseekV3 => "DeepseekV3ForCausalLM",
            Arch::GptOss => "GptOssForCausalLM",
            Arch::DeepseekV4 => "DeepseekV4ForCausalLM",
        }
    }

    /// Whether the head size is independent of `hidden_size` (the real `config.json`
    /// carries `head_dim`, or, for MLA, the per-head sizes are their own keys); otherwise it
    /// is `hidden_size / num_attention_heads`.
    pub fn head_dim_in_config(self) -> bool {
        !matches!(self, Arch::Qwen2Moe | Arch::Mixtral)
    }

    /// Where the text model's tensors are named from.
    pub fn weight_prefix(self) -> &'static str {
        match self {
            Arch::Qwen35Moe => "model.language_model.",
            Arch::DeepseekV4 => "",
            _ => "model.",
        }
    }
}

/// YaRN settings of a `rope_scaling` block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnSpec {
    /// Context extension factor.
    pub factor: f64,
    /// Context length before extension.
    pub original_max_position: usize,
    /// `beta_fast`.
    pub beta_fast: f64,
    /// `beta_slow`.
    pub beta_slow: f64,
    /// `mscale` and `mscale_all_dim` (DeepSeek), written only when set.
    pub mscale: Option<(f64, f64)>,
    /// `truncate` (gpt-oss writes false), written only when set.
    pub truncate: Option<bool>,
}

/// Gated DeltaNet settings of the Qwen3-Next family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridSpec {
    /// `linear_num_key_heads`.
    pub k_heads: usize,
    /// `linear_num_value_heads`.
    pub v_heads: usize,
    /// `linear_key_head_dim`.
    pub k_head_dim: usize,
    /// `linear_value_head_dim`.
    pub v_head_dim: usize,
    /// `linear_conv_kernel_dim`.
    pub conv_kernel: usize,
    /// Every this many layers one is full attention, the rest linear.
    pub full_attention_interval: usize,
    /// `partial_rotary_factor` of the full-attention layers.
    pub partial_rotary: f64,
}

/// Multi-head latent attention and routing settings of DeepSeek-V3.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaSpec {
    /// `q_lora_rank` (`None`: a plain `q_proj`).
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`.
    pub qk_nope_head_dim: usize,
    /// `qk_rope_head_dim`.
    pub qk_rope_head_dim: usize,
    /// `v_head_dim`.
    pub v_head_dim: usize,
    /// `n_group`.
    pub n_group: usize,
    /// `topk_group`.
    pub topk_group: usize,
    /// `routed_scaling_factor`.
    pub routed_scaling_factor: f64,
    /// RoPE scaling.
    pub yarn: YarnSpec,
}

/// gpt-oss settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptOssSpec {
    /// Window of the sliding-attention layers (every other layer, starting with layer 0).
    pub sliding_window: usize,
    /// `swiglu_limit`.
    pub swiglu_limit: f64,
    /// RoPE scaling.
    pub yarn: YarnSpec,
}

/// DeepSeek-V4 settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct V4Spec {
    /// `hc_mult`.
    pub hc_mult: usize,
    /// `q_lora_rank`.
    pub q_lora_rank: usize,
    /// `o_groups`.
    pub o_groups: usize,
    /// `o_lora_rank`.
    pub o_lora_rank: usize,
    /// `index_n_heads`.
    pub index_heads: usize,
    /// `index_head_dim`.
    pub index_head_dim: usize,
    /// `index_topk`.
    pub index_topk: usize,
    /// `sliding_window`.
    pub sliding_window: usize,
    /// Tokens per compressed entry of CSA layers.
    pub csa_rate: usize,
    /// Tokens per compressed entry of HCA layers.
    pub hca_rate: usize,
    /// Leading hash-routed MoE layers (`num_hash_layers`).
    pub hash_layers: usize,
    /// `qk_rope_head_dim`.
    pub qk_rope_head_dim: usize,
    /// `swiglu_limit`.
    pub swiglu_limit: f64,
    /// `routed_scaling_factor`.
    pub routed_scaling_factor: f64,
    /// `compress_rope_theta`.
    pub compress_rope_theta: f64,
    /// YaRN of the compressed branch.
    pub yarn: YarnSpec,
}

impl V4Spec {
    /// Whether layer `i` is CSA (else HCA), in transformers' default pattern: two HCA
    /// layers, then CSA and HCA alternating.
    pub fn is_csa(&self, i: usize) -> bool {
        i >= 2 && !i.is_multiple_of(2)
    }

    /// The compress rate of layer `i`.
    pub fn rate(&self, i: usize) -> usize {
        if self.is_csa(i) {
            self.csa_rate
        } else {
            self.hca_rate
        }
    }
}

/// Family-specific settings beyond the common dimensions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArchSpec {
    /// Nothing beyond the common fields.
    Plain,
    /// Qwen3-Next / Qwen3.5-MoE.
    Hybrid(HybridSpec),
    /// DeepSeek-V3.
    Mla(MlaSpec),
    /// gpt-oss.
    GptOss(GptOssSpec),
    /// DeepSeek-V4.
    V4(V4Spec),
}

/// Dimensions of one known model (or of a scaled-down variant after overrides).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeSpec {
    /// Canonical short name accepted by `SynthOptions::like`.
    pub name: &'static str,
    /// Other accepted names (lower case, without the `org/` prefix).
    pub aliases: &'static [&'static str],
    /// Model family.
    pub arch: Arch,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// Routed expert FFN width (`moe_intermediate_size`; Mixtral's `intermediate_size`).
    pub moe_intermediate: usize,
    /// Dense FFN width (`intermediate_size`), used by dense layers.
    pub intermediate: usize,
    /// Shared expert FFN width, 0 when the model has none.
    pub shared_intermediate: usize,
    /// Number of leading dense (non-MoE) layers.
    pub first_dense_layers: usize,
    /// `vocab_size`.
    pub vocab: usize,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k.
    pub qk_norm: bool,
    /// `max_window_layers` of the Qwen configs (unused unless sliding window is on).
    pub max_window_layers: usize,
    /// `transformers_version` the real config was written with.
    pub transformers_version: &'static str,
    /// Family-specific settings.
    pub spec: ArchSpec,
}

/// The shapes `synth` knows, with the values of their hub `config.json`.
pub fn known_shapes() -> &'static [ShapeSpec] {
    &SHAPES
}

/// Looks a shape up by name (case-insensitive, `org/` prefix ignored, aliases accepted).
pub fn find_shape(like: &str) -> Result<&'static ShapeSpec, SynthError> {
    let lower = like.trim().to_ascii_lowercase();
    let key = lower.rsplit('/').next().unwrap_or(&lower);
    SHAPES
        .iter()
        .find(|s| s.name == key || s.aliases.contains(&key))
        .ok_or_else(|| SynthError::UnknownShape {
            like: like.to_string(),
            known: SHAPES.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        })
}

/// How a tensor's random values are drawn: approximately normal with this mean and std.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Init {
    /// Mean of the values.
    pub mean: f32,
    /// Standard deviation of the values.
    pub std: f32,
}

/// Linear weights: the usual `initializer_range`.
const WEIGHT: Init = Init {
    mean: 0.0,
    std: 0.02,
};
/// RMSNorm weights hover around 1 (noise so a loader that drops them is detectable).
const NORM: Init = Init {
    mean: 1.0,
    std: 0.02,
};
/// Biases and GLM's routing correction bias: small, non-zero.
const BIAS: Init = Init {
    mean: 0.0,
    std: 0.02,
};

/// `(1 + w)` RMSNorm weights (Qwen3-Next family) hover around 0.
const ZERO_NORM: Init = Init {
    mean: 0.0,
    std: 0.02,
};

/// Role of a tensor in the per-token cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// Read in full for every token.
    Dense,
    /// A routed expert's weight: only `top_k / experts` of these are read per token.
    RoutedExpert,
    /// The token embedding table: one row is read per token.
    Embedding,
    /// An index table (DeepSeek-V4's `tid2eid`): not parameters, one row read per token.
    Lookup,
}

/// One tensor of the synthetic checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPlan {
    /// Hugging Face tensor name.
    pub name: String,
    /// Row-major shape (`[out, in]` for linear weights).
    pub shape: Vec<usize>,
    /// Stored dtype.
    pub dtype: SynthDtype,
    /// Value distribution.
    pub init: Init,
    /// How much of the tensor one token reads (for the active-parameter count).
    pub kind: TensorKind,
}

impl TensorPlan {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// Size of the raw data in bytes.
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size() as u64
    }
}

/// Total parameters, and parameters read per token: every dense weight (including
/// `lm_head`), `top_k` of the routed experts, and not the embedding table, of which one
/// row is looked up. This is the count that sets decode bandwidth (bytes per token =
/// active x dtype size); model cards often add the embedding (Qwen, Mixtral) or leave out
/// the head as well (GLM).
pub fn param_counts(shape: &ShapeSpec, tensors: &[TensorPlan]) -> (u64, u64) {
    let (mut dense, mut expert, mut embed) = (0u64, 0u64, 0u64);
    for t in tensors {
        match t.kind {
            TensorKind::Dense => dense += t.numel(),
            TensorKind::RoutedExpert => expert += t.numel(),
            TensorKind::Embedding => embed += t.numel(),
            TensorKind::Lookup => {}
        }
    }
    let active_experts = if shape.experts == 0 {
        0
    } else {
        expert / shape.experts as u64 * shape.top_k.min(shape.experts) as u64
    };
    (dense + expert + embed, dense + active_experts)
}
