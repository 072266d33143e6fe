//! Mixtral (`mixtral`; GGUF `llama` with experts): llama layers, a sparse MoE block, and
//! query/key rows reordered by llama.cpp's converter for its interleaved RoPE.

use super::{Arch, ArchSpec, GgufKeys, HfNames, TensorPair, HF_NAMES, LLAMA};
use crate::model::config::ConfigError;
use serde_json::{json, Map, Value};

/// The router under `block_sparse_moe`.
const ROUTER: &[TensorPair] = &[("blk.{i}.ffn_gate_inp.weight", "model.layers.{i}.block_sparse_moe.gate.weight")];

const EXPERTS: &[TensorPair] = &[
    ("blk.{i}.ffn_gate_exps.weight", "model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight"),
    ("blk.{i}.ffn_down_exps.weight", "model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight"),
    ("blk.{i}.ffn_up_exps.weight", "model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight"),
];

/// Mixtral's sparse MoE block and `w1`/`w3`/`w2` experts.
const HF: HfNames = HfNames { moe_block: "block_sparse_moe", expert_proj: ["w1", "w3", "w2"], ..HF_NAMES };

/// Mixtral as llama.cpp converts it (architecture `llama` with `expert_count` > 0).
pub const SPEC: ArchSpec = ArchSpec { arch: Arch::Mixtral, hf: HF, gguf: "llama", model_type: "mixtral", tensors: &[LLAMA, ROUTER], experts: EXPERTS, permuted_qk: true, config, extra: None };

fn config(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<(), ConfigError> {
    if k.usize_opt("expert_count")?.unwrap_or(0) == 0 {
        return Err(ConfigError::UnsupportedArch {
            path: k.path.into(),
            model_type: "llama without experts (a dense model; this engine runs mixture-of-experts models)".into(),
        });
    }
    // Mixtral's expert width is its only FFN width.
    if let Some(n) = k.usize_opt("expert_feed_forward_length")? {
        c.insert("intermediate_size".into(), json!(n));
    }
    Ok(())
}
