//! Config normalisation tests.

use super::*;
use serde_json::json;

fn parse(v: Value) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_json(&v, Path::new("config.json"))
}

fn qwen3(extra: Value) -> Value {
    let mut v = json!({
        "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8,
        "num_experts_per_tok": 2, "vocab_size": 100
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn older_top_level_rope_keys_are_read() {
    let c = parse(qwen3(json!({"rope_theta": 1000000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}))).unwrap();
    assert_eq!(c.rope.theta, 1e6);
    assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 2.0 });
}

#[test]
fn transformers5_rope_parameters_are_read() {
    let c = parse(qwen3(json!({"rope_parameters": {"rope_theta": 5e5, "rope_type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.5}}))).unwrap();
    assert_eq!(c.rope.theta, 5e5);
    assert_eq!(c.rotary_dim(), 16);
    assert!(matches!(c.rope.scaling, RopeScaling::Yarn { factor, original_max_position: 1024, .. } if factor == 4.0));
}

#[test]
fn sparse_layer_selection_honours_every_key() {
    let c = parse(qwen3(json!({"mlp_only_layers": [0], "decoder_sparse_step": 2}))).unwrap();
    assert_eq!(c.moe_layers, vec![false, true, false, true]);
    let mut glm = qwen3(json!({"first_k_dense_replace": 2, "n_routed_experts": 8, "routed_scaling_factor": 2.5}));
    glm["model_type"] = json!("glm4_moe");
    let c = parse(glm).unwrap();
    assert_eq!(c.moe_layers, vec![false, false, true, true]);
    assert_eq!(c.routed_scaling_factor, 2.5);
    assert!(matches!(c.routing, RoutingKind::SigmoidGroupLimited { n_group: 1, topk_group: 1 }));
}

#[test]
fn expert_count_aliases_and_text_config_nesting() {
    let mut v = qwen3(json!({}));
    v.as_object_mut().unwrap().remove("num_experts");
    v["num_local_experts"] = json!(16);
    let wrapped = json!({"model_type": "qwen3_moe", "text_config": v, "tie_word_embeddings": true});
    let c = parse(wrapped).unwrap();
    assert_eq!(c.num_experts, 16);
    assert!(c.tie_word_embeddings);
}

#[test]
fn bad_values_name_the_key() {
    let e = parse(qwen3(json!({"hidden_size": "big"}))).unwrap_err().to_string();
    assert!(e.contains("hidden_size") && e.contains("integer"), "{e}");
    let e = parse(qwen3(json!({"num_experts_per_tok": 9}))).unwrap_err().to_string();
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = parse(qwen3(json!({"num_key_value_heads": 3}))).unwrap_err().to_string();
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = parse(qwen3(json!({"rope_scaling": {"rope_type": "dynamic-ntk-weird"}}))).unwrap_err().to_string();
    assert!(e.contains("dynamic-ntk-weird"), "{e}");
    let e = parse(json!([1, 2])).unwrap_err().to_string();
    assert!(e.contains("JSON object"), "{e}");
}

fn fixture_config(name: &str) -> ModelConfig {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).join("checkpoint");
    ModelConfig::from_dir(&dir).unwrap()
}

#[test]
fn hybrid_configs_list_their_layer_kinds() {
    for name in ["qwen3_next", "qwen3_5_moe"] {
        let c = fixture_config(name);
        assert!(c.arch.is_qwen3_next_family());
        assert_eq!(c.layer_kinds[..], [LayerKind::LinearAttention, LayerKind::LinearAttention, LayerKind::LinearAttention, LayerKind::FullAttention]);
        let l = c.linear_attn.unwrap();
        assert_eq!((l.num_k_heads, l.num_v_heads, l.k_head_dim, l.v_head_dim, l.conv_kernel), (2, 4, 16, 16, 4));
        assert_eq!(l.conv_dim(), 2 * 2 * 16 + 4 * 16);
        assert!(c.norm_unit_offset && c.attn_output_gate && c.shared_expert_gated && c.norm_topk_prob);
        assert_eq!((c.rotary_dim(), c.shared_intermediate_size), (8, 48));
        assert_eq!(c.moe_layers, vec![true; 4]);
    }
    // Without `layer_types`, every fourth layer is full attention.
    let mut v = qwen3(json!({"linear_num_key_heads": 2, "linear_num_value_heads": 4, "full_attention_interval": 2}));
    v["model_type"] = json!("qwen3_next");
    let c = parse(v).unwrap();
    assert_eq!(c.layer_kinds, [LayerKind::LinearAttention, LayerKind::FullAttention].repeat(2));
}

#[test]
fn deepseek_v3_reads_mla_and_folds_yarn_mscale_into_the_softmax_scale() {
    let c = fixture_config("deepseek_v3");
    let m = c.mla.unwrap();
    assert_eq!((m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim), (Some(48), 32, 16, 8, 16));
    assert!(m.rope_interleave);
    assert_eq!(c.head_dim, 8);
    assert_eq!(c.routing, RoutingKind::SigmoidGroupLimited { n_group: 4, topk_group: 2 });
    assert_eq!(c.moe_layers, vec![false, true, true]);
    let mscale = 0.1 * 4f32.ln() + 1.0;
    assert!((c.attention_scale - mscale * mscale / 24f32.sqrt()).abs() < 1e-6);
}

#[test]
fn gpt_oss_alternates_sliding_layers_and_clamps_its_swiglu() {
    let c = fixture_config("gpt_oss");
    assert_eq!(c.layer_kinds, [LayerKind::SlidingAttention, LayerKind::FullAttention, LayerKind::SlidingAttention]);
    assert_eq!(c.sliding_window, Some(8));
    assert_eq!(c.routing, RoutingKind::TopKSoftmax);
    assert_eq!(c.expert_activation, ExpertActivation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 });
    assert!(c.qkv_bias && c.attention_sinks && c.router_bias && c.expert_bias);
    assert_eq!(c.moe_intermediate_size, 32);
    assert!(matches!(c.rope.scaling, RopeScaling::Yarn { truncate: false, original_max_position: 512, .. }));
}

#[test]
fn yarn_follows_transformers_defaults() {
    // No factor: the context extension ratio; a top-level original length wins.
    let c = parse(qwen3(json!({"max_position_embeddings": 8192, "original_max_position_embeddings": 2048,
        "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}}))).unwrap();
    assert!(matches!(c.rope.scaling, RopeScaling::Yarn { factor, original_max_position: 2048, mscale, truncate: true, .. }
        if factor == 4.0 && mscale == 0.0));
    // No original length anywhere: max_position_embeddings.
    let c = parse(qwen3(json!({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}))).unwrap();
    assert!(matches!(c.rope.scaling, RopeScaling::Yarn { original_max_position: 8192, .. }));
}

#[test]
fn every_supported_model_type_parses_and_unknown_ones_list_them() {
    for mt in Arch::SUPPORTED {
        assert_eq!(Arch::from_model_type(mt).map(Arch::model_type), Some(mt));
    }
    let mut v = qwen3(json!({}));
    v["model_type"] = json!("llama4_text");
    let e = parse(v).unwrap_err().to_string();
    assert!(Arch::SUPPORTED.iter().all(|m| e.contains(m)), "{e}");
    let mut v = qwen3(json!({"layer_types": ["linear_attention", "full_attention"]}));
    v["model_type"] = json!("qwen3_next");
    let e = parse(v).unwrap_err().to_string();
    assert!(e.contains("layer_types"), "{e}");
}
