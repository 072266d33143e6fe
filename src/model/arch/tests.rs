//! The GGUF name tables and the metadata → config mapping, on hand-built metadata.

use super::*;
use crate::model::config::ModelConfig;

fn meta(arch: &str, extra: &[(&str, MetaValue)]) -> Metadata {
    super::test_meta::gguf_meta(
        arch,
        &[
            ("block_count", MetaValue::U32(2)),
            ("embedding_length", MetaValue::U32(64)),
            ("feed_forward_length", MetaValue::U32(128)),
            ("attention.head_count", MetaValue::U32(4)),
            ("attention.head_count_kv", MetaValue::U32(2)),
            ("expert_count", MetaValue::U32(8)),
            ("expert_used_count", MetaValue::U32(2)),
            ("expert_feed_forward_length", MetaValue::U32(32)),
            ("rope.freq_base", MetaValue::F32(1e6)),
            ("vocab_size", MetaValue::U32(1024)),
        ],
        extra,
    )
}

fn config(m: &Metadata, has: &dyn Fn(&str) -> bool) -> Result<Value, ConfigError> {
    let path = Path::new("/models/x.gguf");
    let spec = spec_for(m, path)?;
    config_json(spec, &GgufKeys { meta: m, arch: spec.gguf, path, tensors: has })
}

#[test]
fn metadata_becomes_the_folders_config() {
    let m = meta(
        "qwen3moe",
        &[
            ("qwen3moe.attention.key_length", MetaValue::U32(32)),
            ("tokenizer.ggml.eos_token_id", MetaValue::U32(7)),
            ("tokenizer.ggml.eot_token_id", MetaValue::U32(9)),
            ("qwen3moe.rope.scaling.type", MetaValue::String("yarn".into())),
            ("qwen3moe.rope.scaling.factor", MetaValue::F32(4.0)),
            ("qwen3moe.rope.scaling.original_context_length", MetaValue::U32(32768)),
        ],
    );
    // Layer 0 has no router: a dense layer.
    let has = |n: &str| n != "blk.0.ffn_gate_inp.weight" && n != "output.weight";
    let c = config(&m, &has).unwrap();
    assert_eq!(c["model_type"], "qwen3_moe");
    assert_eq!(c["mlp_only_layers"], json!([0]));
    assert_eq!(c["eos_token_id"], json!([7, 9]));
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["rope_scaling"]["rope_type"], "yarn");
    assert_eq!(c["rope_scaling"]["original_max_position_embeddings"], 32768);
    let cfg = ModelConfig::from_json(&c, Path::new("/models/x.gguf")).unwrap();
    assert_eq!((cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.num_experts, cfg.top_k), (2, 2, 32, 8, 2));
    assert_eq!(cfg.moe_layers, vec![false, true]);
    assert!(cfg.norm_topk_prob, "llama.cpp renormalises Qwen3-MoE's top-k weights");
}

#[test]
fn bad_metadata_names_the_key_and_file() {
    let mut m = meta("qwen3moe", &[]);
    m.remove("qwen3moe.expert_count");
    let e = config(&m, &|_| true).unwrap_err().to_string();
    assert!(e.contains("qwen3moe.expert_count") && e.contains("x.gguf"), "{e}");

    let m = meta("qwen3moe", &[("qwen3moe.attention.head_count_kv", MetaValue::Array(vec![MetaValue::U32(2), MetaValue::U32(4)]))]);
    let e = config(&m, &|_| true).unwrap_err().to_string();
    assert!(e.contains("head_count_kv") && e.contains("differs between layers"), "{e}");

    let m = meta("qwen3moe", &[("qwen3moe.block_count", MetaValue::String("two".into()))]);
    let e = config(&m, &|_| true).unwrap_err().to_string();
    assert!(e.contains("block_count") && e.contains("STRING"), "{e}");

    let m = meta("bert", &[]);
    let e = config(&m, &|_| true).unwrap_err().to_string();
    assert!(e.contains("bert") && e.contains("qwen3moe"), "names the architecture and the supported ones: {e}");

    let mut m = meta("llama", &[]);
    m.insert("llama.expert_count".into(), MetaValue::U32(0));
    let e = config(&m, &|_| true).unwrap_err().to_string();
    assert!(e.contains("without experts"), "a dense llama is refused: {e}");
}

#[test]
fn tensor_names_map_to_the_checkpoints() {
    let q = spec_for(&meta("qwen2moe", &[]), Path::new("x")).unwrap();
    assert_eq!(hf_name(q, "blk.3.attn_q.bias"), Some(("model.layers.3.self_attn.q_proj.bias".into(), false)));
    assert_eq!(hf_name(q, "blk.1.ffn_gate_inp_shexp.weight"), Some(("model.layers.1.mlp.shared_expert_gate.weight".into(), false)));
    assert_eq!(hf_name(q, "blk.0.ffn_down_exps.weight"), Some(("model.layers.0.mlp.experts.{e}.down_proj.weight".into(), true)));
    assert_eq!(hf_name(q, "token_embd.weight"), Some(("model.embed_tokens.weight".into(), false)));
    assert_eq!(hf_name(q, "blk.x.attn_q.weight"), None);
    assert_eq!(hf_name(q, "blk.0.token_embd.weight"), None);
    assert_eq!(hf_name(q, "rope_freqs.weight"), None);
    assert_eq!(gguf_name(q, "model.layers.3.self_attn.q_proj.bias").as_deref(), Some("blk.3.attn_q.bias"));
    assert_eq!(gguf_name(q, "model.layers.0.mlp.experts.5.down_proj.weight").as_deref(), Some("blk.0.ffn_down_exps.weight[5]"));
    assert_eq!(gguf_name(q, "model.norm.weight").as_deref(), Some("output_norm.weight"));
    assert_eq!(gguf_name(q, "model.layers.0.mlp.nothing.weight"), None);
    let m = spec_for(&meta("llama", &[]), Path::new("x")).unwrap();
    assert_eq!(hf_name(m, "blk.2.ffn_up_exps.weight"), Some(("model.layers.2.block_sparse_moe.experts.{e}.w3.weight".into(), true)));
}

/// Every GGUF table entry for a family's MoE block (router, correction bias, experts, shared
/// expert) names the tensor the folder loader asks for under that family's [`HfNames`], so
/// the two loaders cannot drift apart; `spec` finds each family's own entry.
#[test]
fn gguf_tables_use_the_hf_names() {
    for s in SPECS {
        assert_eq!(spec(s.arch).gguf, s.gguf, "spec({:?}) is another family's entry", s.arch);
        let n = s.hf;
        let block = format!("model.layers.{{i}}.{}", n.moe_block);
        let mut want: Vec<(String, String)> = vec![("blk.{i}.ffn_gate_inp.weight".into(), format!("{block}.{}.weight", n.router))];
        if n.correction_bias {
            want.push(("blk.{i}.exp_probs_b.bias".into(), format!("{block}.{}.e_score_correction_bias", n.router)));
        }
        let proj = ["gate", "up", "down"];
        for (g, p) in proj.iter().zip(n.expert_proj) {
            want.push((format!("blk.{{i}}.ffn_{g}_exps.weight"), format!("{block}.experts.{{e}}.{p}.weight")));
        }
        let shared_mlp = match n.shared {
            SharedExpert::None => None,
            SharedExpert::Gated { mlp, gate } => {
                want.push(("blk.{i}.ffn_gate_inp_shexp.weight".into(), format!("{block}.{gate}.weight")));
                Some(mlp)
            }
            SharedExpert::Plain(mlp) => Some(mlp),
        };
        if let Some(mlp) = shared_mlp {
            for g in proj {
                want.push((format!("blk.{{i}}.ffn_{g}_shexp.weight"), format!("{block}.{mlp}.{g}_proj.weight")));
            }
        }
        let table: Vec<TensorPair> = s.tensors.iter().flat_map(|t| t.iter().copied()).chain(s.experts.iter().copied()).collect();
        for (gguf, hf) in &want {
            let found: Vec<&str> = table.iter().filter(|(g, _)| g == gguf).map(|(_, h)| *h).collect();
            assert_eq!(found, vec![hf.as_str()], "{}: {gguf}", s.gguf);
        }
        // Nothing in the tables names a MoE part outside the family's block.
        for (gguf, hf) in &table {
            if gguf.contains("_exps") || gguf.contains("shexp") || gguf.contains("ffn_gate_inp") {
                assert!(hf.starts_with(&block), "{}: {gguf} → {hf} is outside {block}", s.gguf);
            }
        }
    }
}
