//! DeepSeek-V4 (`deepseek_v4`): the published checkpoints keep DeepSeek's own tensor names
//! (`layers.{i}.ffn.experts.{e}.w1`, `layers.{i}.attn.wq_a`, `hc_head_fn`, …), which
//! transformers only renames; the loader in `model::deepseek_v4` reads them directly. No GGUF
//! layout for this architecture is known to this engine, so it is not in [`super::SPECS`].

use super::{Arch, ArchSpec, GgufKeys, HfNames, SharedExpert, HF_NAMES};
use crate::model::config::ConfigError;
use serde_json::{Map, Value};

/// The MoE block `ffn` with `w1`/`w3`/`w2` experts and summed shared experts.
const HF: HfNames = HfNames { moe_block: "ffn", expert_proj: ["w1", "w3", "w2"], shared: SharedExpert::Plain("shared_experts"), ..HF_NAMES };

/// DeepSeek-V4's names (folder checkpoints only).
pub const SPEC: ArchSpec = ArchSpec { arch: Arch::DeepseekV4, hf: HF, gguf: "deepseek4", model_type: "deepseek_v4", tensors: &[], experts: &[], permuted_qk: false, config, extra: None };

fn config(k: &GgufKeys, _: &mut Map<String, Value>) -> Result<(), ConfigError> {
    Err(ConfigError::UnsupportedArch { path: k.path.into(), model_type: "deepseek4 (DeepSeek-V4 runs from its safetensors folder; no GGUF layout is known)".into() })
}
