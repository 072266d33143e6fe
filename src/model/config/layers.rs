//! Per-layer structure and attention-variant settings: which layers are MoE, what each
//! layer mixes tokens with, and the Gated DeltaNet / MLA dimensions.

use super::keys::Keys;
use super::{Arch, ConfigError, LayerKind, LinearAttnConfig, MlaConfig, RopeConfig, RopeScaling};
use crate::model::rope::yarn_mscale;

/// Which layers are sparse, honouring `mlp_only_layers`, `decoder_sparse_step` and
/// `first_k_dense_replace`.
pub(super) fn moe_layer_map(arch: Arch, k: &Keys, num_layers: usize) -> Result<Vec<bool>, ConfigError> {
    Ok(match arch {
        Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Qwen3Next => {
            let step = k.usize_opt(&["decoder_sparse_step"])?.unwrap_or(1);
            let dense = k.indices("mlp_only_layers")?;
            (0..num_layers).map(|i| !dense.contains(&i) && step > 0 && (i + 1) % step == 0).collect()
        }
        Arch::Mixtral | Arch::Qwen35Moe | Arch::GptOss | Arch::DeepseekV4 => vec![true; num_layers],
        Arch::Glm4Moe | Arch::DeepseekV3 => {
            let first_dense = k.usize_opt(&["first_k_dense_replace"])?.unwrap_or(0);
            (0..num_layers).map(|i| i >= first_dense).collect()
        }
    })
}

/// Each layer's token mixer, from `layer_types` or the family's default pattern.
pub(super) fn layer_kinds(arch: Arch, k: &Keys, num_layers: usize) -> Result<Vec<LayerKind>, ConfigError> {
    let interval = k.usize_opt(&["full_attention_interval"])?.unwrap_or(4).max(1);
    let default = |i: usize| match arch {
        // transformers' default: every `full_attention_interval`-th layer is full attention.
        Arch::Qwen3Next | Arch::Qwen35Moe => {
            if (i + 1).is_multiple_of(interval) {
                LayerKind::FullAttention
            } else {
                LayerKind::LinearAttention
            }
        }
        // transformers' default alternates, starting with a sliding layer.
        Arch::GptOss if i.is_multiple_of(2) => LayerKind::SlidingAttention,
        // Every V4 layer keeps a sliding window; what else it attends over is in `V4Config`.
        Arch::DeepseekV4 => LayerKind::SlidingAttention,
        _ => LayerKind::FullAttention,
    };
    let listed = match arch {
        Arch::Qwen3Next | Arch::Qwen35Moe | Arch::GptOss => k.strings("layer_types")?,
        _ => None,
    };
    let Some(names) = listed else {
        return Ok((0..num_layers).map(default).collect());
    };
    if names.len() != num_layers {
        return Err(k.invalid("layer_types", format!("lists {} layers, the model has {num_layers}", names.len())));
    }
    names
        .iter()
        .map(|n| match *n {
            "full_attention" => Ok(LayerKind::FullAttention),
            "sliding_attention" if arch == Arch::GptOss => Ok(LayerKind::SlidingAttention),
            "linear_attention" if arch.is_qwen3_next_family() => Ok(LayerKind::LinearAttention),
            other => Err(k.invalid("layer_types", format!("`{other}` is not a layer type of {}", arch.model_type()))),
        })
        .collect()
}

/// The `linear_*` keys, with transformers' Qwen3-Next defaults.
pub(super) fn linear_attn_config(k: &Keys) -> Result<LinearAttnConfig, ConfigError> {
    let c = LinearAttnConfig {
        num_k_heads: k.usize_opt(&["linear_num_key_heads"])?.unwrap_or(16),
        num_v_heads: k.usize_opt(&["linear_num_value_heads"])?.unwrap_or(32),
        k_head_dim: k.usize_opt(&["linear_key_head_dim"])?.unwrap_or(128),
        v_head_dim: k.usize_opt(&["linear_value_head_dim"])?.unwrap_or(128),
        conv_kernel: k.usize_opt(&["linear_conv_kernel_dim"])?.unwrap_or(4),
    };
    if c.num_k_heads == 0 || !c.num_v_heads.is_multiple_of(c.num_k_heads) {
        return Err(k.invalid("linear_num_value_heads", format!("({}) must be a multiple of linear_num_key_heads ({})", c.num_v_heads, c.num_k_heads)));
    }
    if c.conv_kernel == 0 || c.k_head_dim == 0 || c.v_head_dim == 0 {
        return Err(k.invalid("linear_conv_kernel_dim", "linear attention sizes must be at least 1"));
    }
    Ok(c)
}

/// The MLA keys of a DeepSeek-V2/V3 config.
pub(super) fn mla_config(k: &Keys) -> Result<MlaConfig, ConfigError> {
    let m = MlaConfig {
        q_lora_rank: k.usize_opt(&["q_lora_rank"])?,
        kv_lora_rank: k.usize(&["kv_lora_rank"])?,
        qk_nope_head_dim: k.usize(&["qk_nope_head_dim"])?,
        qk_rope_head_dim: k.usize(&["qk_rope_head_dim"])?,
        v_head_dim: k.usize(&["v_head_dim"])?,
        rope_interleave: k.bool_opt(&["rope_interleave"])?.unwrap_or(true),
    };
    if m.qk_rope_head_dim == 0 || !m.qk_rope_head_dim.is_multiple_of(2) || m.kv_lora_rank == 0 || m.v_head_dim == 0 {
        return Err(k.invalid("qk_rope_head_dim", "MLA sizes must be positive and the rotary part even"));
    }
    Ok(m)
}

/// `1/√(qk_head_dim)`, times `mscale(factor, mscale_all_dim)²` under YaRN: DeepSeek folds
/// YaRN's magnitude correction into the softmax scale rather than into cos/sin.
pub(super) fn mla_softmax_scale(m: &MlaConfig, rope: &RopeConfig) -> f32 {
    let base = 1.0 / ((m.qk_nope_head_dim + m.qk_rope_head_dim) as f64).sqrt();
    let corr = match rope.scaling {
        RopeScaling::Yarn { factor, mscale_all_dim, .. } if mscale_all_dim != 0.0 => {
            yarn_mscale(factor as f64, mscale_all_dim as f64).powi(2)
        }
        _ => 1.0,
    };
    (base * corr) as f32
}
