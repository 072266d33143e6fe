//! A checkpoint's sizes from its tensor index alone (safetensors headers or a GGUF header):
//! what `ft-actor plan` divides memory with and predicts speed from, before any weight is read.
//!
//! [`info::stats`](super::info::stats) gives the same figures from a loaded model; a test
//! holds the two equal on the fixtures.

use super::config::ModelConfig;
use super::quant::QuantScheme;
use super::weights_file::{FileDType, WeightFiles};
use ft_backend::DType;
use std::collections::BTreeMap;

/// How much of a tensor decoding one token reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// Every value, every token (attention, norms, routers, shared experts, the head).
    Dense,
    /// One routed expert's weight: `top_k` of `num_experts` per MoE layer.
    Expert,
    /// The token embedding: one row per token (and all of it when the head is tied to it).
    Embedding,
    /// An index (DeepSeek-V4's `tid2eid`): one row, not parameters.
    Lookup,
    /// Not part of the language model the engine runs (vision tower, multi-token prediction).
    Unused,
}

/// The role of a tensor by its Hugging Face name.
pub fn role_of(name: &str, cfg: &ModelConfig) -> TensorRole {
    if name.contains("visual.") || name.contains("vision_tower") || name.starts_with("mtp.") || name.contains(".mtp.") {
        return TensorRole::Unused;
    }
    // Layers past `num_hidden_layers` are DeepSeek's multi-token-prediction modules.
    if layer_index(name).is_some_and(|l| l >= cfg.num_layers) {
        return TensorRole::Unused;
    }
    if name.contains("tid2eid") {
        TensorRole::Lookup
    } else if name.ends_with("embed_tokens.weight") || name == "embed.weight" {
        TensorRole::Embedding
    } else if name.contains(".experts.") {
        TensorRole::Expert
    } else {
        TensorRole::Dense
    }
}

/// The `N` of `…layers.N.…`.
fn layer_index(name: &str) -> Option<usize> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    rest.split('.').next()?.parse().ok()
}

/// The format a tensor is computed in: packed 4-bit bytes are NVFP4 or MXFP4 by the scheme.
pub fn compute_format(dtype: FileDType, scheme: &QuantScheme) -> Option<DType> {
    Some(match dtype {
        FileDType::Float(d) | FileDType::Packed(d) => d,
        FileDType::F8E4M3 => DType::F8E4M3,
        FileDType::U8 if *scheme == QuantScheme::Nvfp4 => DType::Nvfp4,
        FileDType::U8 | FileDType::I8 => DType::Mxfp4,
        FileDType::F8E8M0 | FileDType::I32 | FileDType::I64 => return None,
    })
}

/// Sizes of a checkpoint, as stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Footprint {
    /// Bytes of everything but routed experts (device resident on a GPU).
    pub non_expert_bytes: u64,
    /// Bytes of all routed experts (the host pool).
    pub expert_bytes: u64,
    /// Bytes of one routed expert.
    pub bytes_per_expert: u64,
    /// Routed experts across all MoE layers.
    pub total_experts: u64,
    /// MoE layers.
    pub moe_layers: u64,
    /// Bytes read to decode one token: non-expert weights (one embedding row; the whole table
    /// when the head is tied to it) plus `top_k` experts per MoE layer.
    pub bytes_per_token: u64,
    /// Non-expert bytes read per token by compute format (scales counted with the weights
    /// they scale), largest first.
    pub dense_read: Vec<(DType, u64)>,
    /// Routed-expert bytes read per token by compute format, largest first.
    pub expert_read: Vec<(DType, u64)>,
    /// The routed experts' main format.
    pub expert_format: Option<DType>,
}

/// Bytes the engine holds a weight of stored type `stored` and `shape` in, as `format`:
/// whole rows of `format` blocks. Packed 4-bit files store two values a byte.
fn engine_bytes(stored: FileDType, format: DType, shape: &[usize]) -> u64 {
    let (lead, last) = match shape.split_last() {
        Some((&last, lead)) => (lead.iter().product::<usize>().max(1), last),
        None => (1, 1),
    };
    let (rows, cols) = match stored {
        // gpt-oss `_blocks`: [.., rows, groups, 16 bytes] → rows of groups × 32 values.
        FileDType::U8 | FileDType::I8 if format == DType::Mxfp4 && last == 16 && shape.len() >= 3 => {
            let groups = shape[shape.len() - 2];
            (lead / groups, groups * 32)
        }
        FileDType::U8 | FileDType::I8 => (lead, last * 2),
        _ => (lead, last),
    };
    rows as u64 * format.row_bytes(cols) as u64
}

/// Block scales of another tensor in the file (FP8 `weight_scale_inv`, NVFP4 `weight_scale`,
/// `weight_scale_2` and `input_scale`, MXFP4 `_scales`, DeepSeek-V4 `.scale`): held inside the
/// engine's blocks of that tensor, not as tensors of their own.
fn is_side_tensor(name: &str, has: &dyn Fn(&str) -> bool) -> bool {
    let owner = |suffix: &str, with: &str| name.strip_suffix(suffix).is_some_and(|stem| has(&format!("{stem}{with}")));
    owner(".weight_scale_inv", ".weight")
        || owner(".weight_scale", ".weight")
        || owner(".weight_scale_2", ".weight")
        || owner(".input_scale", ".weight")
        || owner("_scales", "_blocks")
        || owner(".scale", ".weight")
}

/// The footprint of the tensors in `files` for the model `cfg` describes.
pub fn footprint(files: &WeightFiles, cfg: &ModelConfig, scheme: &QuantScheme) -> Footprint {
    let top_k = cfg.top_k.min(cfg.num_experts.max(1)) as f64;
    let expert_share = if cfg.num_experts == 0 { 0.0 } else { top_k / cfg.num_experts as f64 };
    let vocab = cfg.vocab_size.max(1) as f64;
    let tied = !files.contains("lm_head.weight") && !files.contains("head.weight") && cfg.tie_word_embeddings;
    let (mut non_expert, mut experts) = (0u64, 0u64);
    // Read-per-token bytes by format, dense and expert apart.
    let mut read: [BTreeMap<&'static str, (DType, f64)>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let mut main: [Option<(DType, u64)>; 2] = [None, None];
    for name in files.names() {
        let Ok(t) = files.get_raw(name) else { continue };
        let role = role_of(name, cfg);
        if matches!(role, TensorRole::Unused | TensorRole::Lookup) {
            continue;
        }
        let i = (role == TensorRole::Expert) as usize;
        let format = compute_format(t.dtype, scheme).filter(|_| !is_side_tensor(name, &|n| files.contains(n)));
        // Bytes as the engine holds the tensor: its block layout (scales inside each block,
        // rows padded to whole blocks), not the file's; side tensors live inside those blocks.
        let Some(f) = format else { continue };
        let bytes = engine_bytes(t.dtype, f, &t.shape);
        let share = match role {
            TensorRole::Dense => bytes as f64,
            TensorRole::Expert => bytes as f64 * expert_share,
            _ => bytes as f64 / vocab + if tied { bytes as f64 } else { 0.0 },
        };
        if i == 1 {
            experts += bytes;
        } else {
            non_expert += bytes;
        }
        read[i].entry(f.name()).or_insert((f, 0.0)).1 += share;
        if main[i].is_none_or(|(_, b)| bytes > b) {
            main[i] = Some((f, bytes));
        }
    }
    let sorted = |m: &BTreeMap<&'static str, (DType, f64)>| {
        let mut v: Vec<(DType, u64)> = m.values().map(|&(f, b)| (f, b.round() as u64)).filter(|(_, b)| *b > 0).collect();
        v.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
        v
    };
    let (dense_read, expert_read) = (sorted(&read[0]), sorted(&read[1]));
    let moe_layers = cfg.num_moe_layers() as u64;
    let total_experts = moe_layers * cfg.num_experts as u64;
    Footprint {
        non_expert_bytes: non_expert,
        expert_bytes: experts,
        bytes_per_expert: experts.checked_div(total_experts).unwrap_or(0),
        total_experts,
        moe_layers,
        bytes_per_token: dense_read.iter().chain(&expert_read).map(|(_, b)| b).sum(),
        dense_read,
        expert_read,
        expert_format: main[1].map(|(f, _)| f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers_and_side_tensors() {
        assert_eq!(layer_index("model.layers.61.mlp.experts.3.gate_proj.weight"), Some(61));
        assert_eq!(layer_index("layers.2.ffn.experts.0.w1.weight"), Some(2));
        assert_eq!(layer_index("model.norm.weight"), None);
        let has = |n: &str| ["a.weight", "experts.gate_up_proj_blocks", "w1.weight"].contains(&n);
        for s in ["a.weight_scale_inv", "a.weight_scale", "a.weight_scale_2", "a.input_scale", "experts.gate_up_proj_scales", "w1.scale"] {
            assert!(is_side_tensor(s, &has), "{s}");
        }
        // DeepSeek-V4's hyper-connection scales are parameters, not block scales.
        assert!(!is_side_tensor("layers.0.hc_attn_scale", &has) && !is_side_tensor("experts.gate_up_proj_blocks", &has));
    }
}
