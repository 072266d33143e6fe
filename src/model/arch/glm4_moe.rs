//! GLM-4.5 MoE (`glm4_moe`; GGUF `glm4moe`): attention with q/k/v biases, optional q/k norms
//! and partial rotary, sigmoid routing with a correction bias, shared experts and leading
//! dense layers.
//!
//! llama.cpp's converter (`Glm4MoeModel`) counts the MTP (NextN) layers in `block_count`
//! (`num_hidden_layers + num_nextn_predict_layers`, written as `nextn_predict_layers`) and
//! stores them after the decoder layers (their own tensors as `blk.N.nextn.*`); llama.cpp
//! loads but never runs them, and neither does this engine. The second norm is
//! `post_attention_norm`, the rotated part of each head is `rope.dimension_count`
//! (`head_dim · partial_rotary_factor`), and without `expert_gating_func` llama.cpp routes
//! with sigmoid.

use super::deepseek2::{decoder_layers, sigmoid_routing, MOE};
use super::qwen3_moe::EXPERTS;
use super::{Arch, ArchSpec, GgufKeys, ATTN_PROJ, POST_NORM_LAYOUT, QKV_BIAS, QK_NORM};
use crate::model::config::ConfigError;
use serde_json::{json, Map, Value};

/// GLM-4.5 MoE as llama.cpp converts it.
pub const SPEC: ArchSpec = ArchSpec { arch: Arch::Glm4Moe, hf: super::deepseek2::CORRECTED_SHARED, gguf: "glm4moe", model_type: "glm4_moe", tensors: &[POST_NORM_LAYOUT, ATTN_PROJ, QKV_BIAS, QK_NORM, MOE], experts: EXPERTS, permuted_qk: false, config, extra: None };

/// llama.cpp's default gating for GLM4_MOE: sigmoid.
const GATING_DEFAULT: usize = 2;

fn config(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<(), ConfigError> {
    decoder_layers(k, c)?;
    let head_dim = match k.usize_opt("attention.key_length")? {
        Some(d) => d,
        None => k.usize("embedding_length")? / k.usize("attention.head_count")?.max(1),
    };
    // llama.cpp rotates all of each head without rope.dimension_count.
    let rot = k.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
    if rot == 0 || rot > head_dim || rot % 2 != 0 {
        return Err(k.invalid(&k.full("rope.dimension_count"), format!("({rot}) must be even and in 2..={head_dim} (the head size)")));
    }
    c.insert("partial_rotary_factor".into(), json!(rot as f64 / head_dim as f64));
    c.insert("use_qk_norm".into(), json!(k.has("blk.0.attn_q_norm.weight")));
    c.insert("attention_bias".into(), json!(k.has_qkv_bias(0)));
    c.insert("first_k_dense_replace".into(), json!(k.usize_opt("leading_dense_block_count")?.unwrap_or(0)));
    sigmoid_routing(k, c, Some(GATING_DEFAULT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::test_meta::{gguf_meta, load_config};
    use crate::model::arch::{hf_name, spec_for};
    use crate::model::config::{ModelConfig, RoutingKind};
    use crate::model::gguf::{MetaValue, Metadata};
    use std::path::Path;

    /// Metadata as llama.cpp's converter writes it for a small GLM-4.5 with one MTP layer.
    fn meta() -> Metadata {
        gguf_meta(
            "glm4moe",
            &[
                ("block_count", MetaValue::U32(4)),
                ("nextn_predict_layers", MetaValue::U32(1)),
                ("context_length", MetaValue::U32(4096)),
                ("embedding_length", MetaValue::U32(64)),
                ("feed_forward_length", MetaValue::U32(128)),
                ("attention.head_count", MetaValue::U32(4)),
                ("attention.head_count_kv", MetaValue::U32(2)),
                ("attention.key_length", MetaValue::U32(32)),
                ("attention.value_length", MetaValue::U32(32)),
                ("attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5)),
                ("rope.dimension_count", MetaValue::U32(16)),
                ("rope.freq_base", MetaValue::F32(10000.0)),
                ("expert_count", MetaValue::U32(8)),
                ("expert_used_count", MetaValue::U32(2)),
                ("expert_feed_forward_length", MetaValue::U32(32)),
                ("expert_shared_count", MetaValue::U32(1)),
                ("expert_group_count", MetaValue::U32(1)),
                ("expert_group_used_count", MetaValue::U32(1)),
                ("expert_weights_scale", MetaValue::F32(2.5)),
                ("expert_weights_norm", MetaValue::Bool(true)),
                ("leading_dense_block_count", MetaValue::U32(1)),
                ("vocab_size", MetaValue::U32(1024)),
            ],
            &[],
        )
    }

    fn load(m: &Metadata) -> Result<(Value, ModelConfig), ConfigError> {
        load_config(m, "/models/glm.gguf", &|name: &str| name == "output.weight" || name.ends_with("attn_q.bias") || name.ends_with("attn_q_norm.weight"))
    }

    #[test]
    fn llama_cpps_keys_become_the_folders_config() {
        let (c, cfg) = load(&meta()).unwrap();
        assert_eq!(c["model_type"], "glm4_moe");
        // block_count 4 holds one MTP layer, which is not a decoder layer.
        assert_eq!(cfg.num_layers, 3);
        assert_eq!(cfg.moe_layers, [false, true, true]);
        assert_eq!((cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim()), (4, 2, 32, 16));
        assert!(cfg.qk_norm && cfg.qkv_bias && cfg.norm_topk_prob);
        assert_eq!(cfg.routing, RoutingKind::SigmoidGroupLimited { n_group: 1, topk_group: 1 });
        assert_eq!((cfg.routed_scaling_factor, cfg.shared_intermediate_size), (2.5, 32));
    }

    #[test]
    fn llama_cpp_defaults_apply() {
        let mut m = meta();
        // Sigmoid without expert_gating_func; no renormalisation without expert_weights_norm;
        // full rotation without rope.dimension_count.
        m.remove("glm4moe.expert_weights_norm");
        m.remove("glm4moe.rope.dimension_count");
        m.remove("glm4moe.nextn_predict_layers");
        let (_, cfg) = load(&m).unwrap();
        assert!(!cfg.norm_topk_prob);
        assert_eq!((cfg.num_layers, cfg.rotary_dim()), (4, 32));
    }

    #[test]
    fn missing_or_unsupported_keys_are_named() {
        let mut m = meta();
        m.remove("glm4moe.expert_shared_count");
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains("glm4moe.expert_shared_count") && e.contains("glm.gguf"), "{e}");
        let mut m = meta();
        m.insert("glm4moe.expert_gating_func".into(), MetaValue::U32(1));
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains("glm4moe.expert_gating_func") && e.contains("softmax"), "{e}");
        let mut m = meta();
        m.insert("glm4moe.nextn_predict_layers".into(), MetaValue::U32(4));
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains("glm4moe.nextn_predict_layers"), "{e}");
        let mut m = meta();
        m.insert("glm4moe.rope.dimension_count".into(), MetaValue::U32(48));
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains("glm4moe.rope.dimension_count"), "{e}");
    }

    #[test]
    fn tensor_names_map_to_the_checkpoints() {
        let s = spec_for(&meta(), Path::new("x")).unwrap();
        assert_eq!(hf_name(s, "blk.0.post_attention_norm.weight").unwrap().0, "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(hf_name(s, "blk.1.exp_probs_b.bias").unwrap().0, "model.layers.1.mlp.gate.e_score_correction_bias");
        assert_eq!(hf_name(s, "blk.1.ffn_down_shexp.weight").unwrap().0, "model.layers.1.mlp.shared_experts.down_proj.weight");
        assert_eq!(hf_name(s, "blk.2.attn_k_norm.weight").unwrap().0, "model.layers.2.self_attn.k_norm.weight");
        // MTP tensors are not loaded.
        assert_eq!(hf_name(s, "blk.3.nextn.eh_proj.weight"), None);
        assert_eq!(hf_name(s, "blk.0.ffn_norm.weight"), None);
    }
}
