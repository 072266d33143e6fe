//! Qwen2-MoE (`qwen2_moe`; GGUF `qwen2moe`): Qwen's layers with a gated shared expert.

use super::qwen3_moe::{EXPERTS, QWEN};
use super::{Arch, ArchSpec, GgufKeys, HfNames, SharedExpert, TensorPair, HF_NAMES, LLAMA, QKV_BIAS, QK_NORM};
use crate::model::config::ConfigError;
use serde_json::{json, Map, Value};

/// The gated shared expert.
const SHARED: &[TensorPair] = &[
    ("blk.{i}.ffn_gate_inp_shexp.weight", "model.layers.{i}.mlp.shared_expert_gate.weight"),
    ("blk.{i}.ffn_gate_shexp.weight", "model.layers.{i}.mlp.shared_expert.gate_proj.weight"),
    ("blk.{i}.ffn_up_shexp.weight", "model.layers.{i}.mlp.shared_expert.up_proj.weight"),
    ("blk.{i}.ffn_down_shexp.weight", "model.layers.{i}.mlp.shared_expert.down_proj.weight"),
];

/// Qwen's sigmoid-gated shared expert (Qwen2-MoE, Qwen3-Next, Qwen3.5/3.6-MoE).
pub(super) const QWEN_SHARED: HfNames =
    HfNames { shared: SharedExpert::Gated { mlp: "shared_expert", gate: "shared_expert_gate" }, ..HF_NAMES };

/// Qwen2-MoE as llama.cpp converts it.
pub const SPEC: ArchSpec = ArchSpec { arch: Arch::Qwen2Moe, hf: QWEN_SHARED, gguf: "qwen2moe", model_type: "qwen2_moe", tensors: &[LLAMA, QKV_BIAS, QK_NORM, QWEN, SHARED], experts: EXPERTS, permuted_qk: false, config, extra: None };

fn config(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<(), ConfigError> {
    if let Some(n) = k.usize_opt("expert_shared_feed_forward_length")? {
        c.insert("shared_expert_intermediate_size".into(), json!(n));
    }
    // llama.cpp does not renormalise Qwen2-MoE's top-k weights (the published configs say
    // norm_topk_prob: false).
    c.insert("norm_topk_prob".into(), json!(k.bool_opt("expert_weights_norm")?.unwrap_or(false)));
    c.insert("qkv_bias".into(), json!(k.has_qkv_bias(0)));
    Ok(())
}
