//! Qwen3-MoE (`qwen3_moe`; GGUF `qwen3moe`).

use super::{Arch, ArchSpec, GgufKeys, TensorPair, HF_NAMES, LLAMA, QKV_BIAS, QK_NORM};
use crate::model::config::ConfigError;
use serde_json::{json, Map, Value};

/// What Qwen-family layers add to the llama layout beside biases and q/k norms
/// ([`QKV_BIAS`], [`QK_NORM`]): the router under `mlp.gate` and dense MLP layers.
pub(super) const QWEN: &[TensorPair] = &[
    ("blk.{i}.ffn_gate_inp.weight", "model.layers.{i}.mlp.gate.weight"),
    ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
];

/// Stacked routed experts under `mlp.experts`.
pub(super) const EXPERTS: &[TensorPair] = &[
    ("blk.{i}.ffn_gate_exps.weight", "model.layers.{i}.mlp.experts.{e}.gate_proj.weight"),
    ("blk.{i}.ffn_up_exps.weight", "model.layers.{i}.mlp.experts.{e}.up_proj.weight"),
    ("blk.{i}.ffn_down_exps.weight", "model.layers.{i}.mlp.experts.{e}.down_proj.weight"),
];

/// Qwen3-MoE as llama.cpp converts it.
pub const SPEC: ArchSpec = ArchSpec { arch: Arch::Qwen3Moe, hf: HF_NAMES, gguf: "qwen3moe", model_type: "qwen3_moe", tensors: &[LLAMA, QKV_BIAS, QK_NORM, QWEN], experts: EXPERTS, permuted_qk: false, config, extra: None };

fn config(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<(), ConfigError> {
    // llama.cpp always renormalises Qwen3-MoE's top-k weights (every published config says
    // norm_topk_prob: true); a file may say otherwise.
    c.insert("norm_topk_prob".into(), json!(k.bool_opt("expert_weights_norm")?.unwrap_or(true)));
    c.insert("attention_bias".into(), json!(k.has_qkv_bias(0)));
    Ok(())
}
