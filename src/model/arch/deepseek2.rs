//! DeepSeek-V3 (`deepseek_v3`; GGUF `deepseek2`, llama.cpp's `LLM_ARCH_DEEPSEEK2`):
//! multi-head latent attention, group-limited sigmoid routing with a correction bias, shared
//! experts and leading dense layers.
//!
//! llama.cpp's converter (`DeepseekV2Model`) stores MLA for its absorbed attention:
//! - `kv_b_proj [H·(nope+v), lora]` is split per head into `attn_k_b [H, lora, nope]` (the key
//!   part, transposed) and `attn_v_b [H, v, lora]`; files from before that split have
//!   `attn_kv_b` instead (and some both). The `extra` hook rebuilds `kv_b_proj` from the pair.
//! - the metadata describes MQA over the latent: `head_count_kv` 1, `key_length`
//!   `kv_lora_rank + rope`, `value_length` `kv_lora_rank`; the per-head sizes are in
//!   `key_length_mla`/`value_length_mla` (files without them have the per-head sizes in
//!   `key_length`/`value_length`, as llama.cpp still reads them).
//! - `expert_weights_norm` is only written when true, so its absence means no renormalisation;
//!   `expert_gating_func` absent means softmax to llama.cpp (DeepSeek-V2 files).
//! - YaRN's `mscale_all_dim` is written as `yarn_log_multiplier = 0.1·mscale_all_dim`, and
//!   llama.cpp leaves cos/sin unscaled (the checkpoints' `mscale == mscale_all_dim`), folding
//!   `mscale(factor, mscale_all_dim)²` into the softmax scale.

use super::qwen3_moe::EXPERTS;
use super::{Arch, ArchSpec, GgufKeys, HfNames, SharedExpert, TensorPair, HF_NAMES, LLAMA};
use crate::model::config::ConfigError;
use crate::model::gguf::load::{file_dtype, format_err, GgufModel};
use crate::model::gguf::GgufTensor;
use crate::model::weights_file::{ExternalTensor, FileDType};
use crate::model::ModelError;
use ft_backend::{DType, HostBytes};
use serde_json::{json, Map, Value};

/// Multi-head latent attention.
const MLA: &[TensorPair] = &[
    ("blk.{i}.attn_q_a.weight", "model.layers.{i}.self_attn.q_a_proj.weight"),
    ("blk.{i}.attn_q_a_norm.weight", "model.layers.{i}.self_attn.q_a_layernorm.weight"),
    ("blk.{i}.attn_q_b.weight", "model.layers.{i}.self_attn.q_b_proj.weight"),
    ("blk.{i}.attn_kv_a_mqa.weight", "model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight"),
    ("blk.{i}.attn_kv_a_norm.weight", "model.layers.{i}.self_attn.kv_a_layernorm.weight"),
    // Older files; newer ones have attn_k_b/attn_v_b, which the extra hook merges.
    ("blk.{i}.attn_kv_b.weight", "model.layers.{i}.self_attn.kv_b_proj.weight"),
];

/// The router with its correction bias, shared experts and dense MLP layers under `mlp`
/// (DeepSeek-V3 and GLM-4.5).
pub(super) const MOE: &[TensorPair] = &[
    ("blk.{i}.ffn_gate_inp.weight", "model.layers.{i}.mlp.gate.weight"),
    // The converter renames `e_score_correction_bias` to `e_score_correction.bias` to map it.
    ("blk.{i}.exp_probs_b.bias", "model.layers.{i}.mlp.gate.e_score_correction_bias"),
    ("blk.{i}.ffn_gate_shexp.weight", "model.layers.{i}.mlp.shared_experts.gate_proj.weight"),
    ("blk.{i}.ffn_up_shexp.weight", "model.layers.{i}.mlp.shared_experts.up_proj.weight"),
    ("blk.{i}.ffn_down_shexp.weight", "model.layers.{i}.mlp.shared_experts.down_proj.weight"),
    ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
];

/// DeepSeek-V3 as llama.cpp converts it.
/// Plain shared experts and a router correction bias (DeepSeek-V3, GLM-4.5).
pub(super) const CORRECTED_SHARED: HfNames =
    HfNames { shared: SharedExpert::Plain("shared_experts"), correction_bias: true, ..HF_NAMES };

pub const SPEC: ArchSpec =
    ArchSpec { arch: Arch::DeepseekV3, hf: CORRECTED_SHARED, gguf: "deepseek2", model_type: "deepseek_v3", tensors: &[LLAMA, MLA, MOE], experts: EXPERTS, permuted_qk: false, config, extra: Some(extra) };

/// llama.cpp's `expert_gating_func` values.
const GATING_SOFTMAX: usize = 1;
const GATING_SIGMOID: usize = 2;

/// Decoder layers: `block_count` less the MTP (NextN) layers llama.cpp stores after them and
/// never runs (`n_layer = n_layer_all - n_layer_nextn`).
pub(super) fn decoder_layers(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<usize, ConfigError> {
    let blocks = k.usize("block_count")?;
    let nextn = k.usize_opt("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks {
        return Err(k.invalid(&k.full("nextn_predict_layers"), format!("({nextn}) must be less than block_count ({blocks})")));
    }
    let layers = blocks - nextn;
    c.insert("num_hidden_layers".into(), json!(layers));
    Ok(layers)
}

/// The routing keys DeepSeek-V3 and GLM-4.5 share: `gating` is what llama.cpp assumes without
/// `expert_gating_func`.
pub(super) fn sigmoid_routing(k: &GgufKeys, c: &mut Map<String, Value>, gating: Option<usize>) -> Result<(), ConfigError> {
    let key = k.full("expert_gating_func");
    match k.usize_opt("expert_gating_func")?.or(gating) {
        Some(GATING_SIGMOID) => {}
        Some(GATING_SOFTMAX) => {
            return Err(k.invalid(&key, "is softmax (DeepSeek-V2 style routing); this engine runs sigmoid routing for this architecture".into()))
        }
        None => return Err(k.invalid(&key, "is absent, which llama.cpp reads as softmax (DeepSeek-V2); this engine runs sigmoid routing (2)".into())),
        Some(other) => return Err(k.invalid(&key, format!("({other}) is not a gating function this engine runs (sigmoid = 2)"))),
    }
    c.insert("n_shared_experts".into(), json!(k.usize("expert_shared_count")?));
    // Without the key llama.cpp neither renormalises nor scales.
    c.insert("norm_topk_prob".into(), json!(k.bool_opt("expert_weights_norm")?.unwrap_or(false)));
    let scale = k.f64_opt("expert_weights_scale")?.filter(|s| *s != 0.0).unwrap_or(1.0);
    c.insert("routed_scaling_factor".into(), json!(scale));
    for (gguf_key, hf_key) in [("expert_group_count", "n_group"), ("expert_group_used_count", "topk_group")] {
        if let Some(n) = k.usize_opt(gguf_key)?.filter(|n| *n > 0) {
            c.insert(hf_key.into(), json!(n));
        }
    }
    Ok(())
}

fn config(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<(), ConfigError> {
    decoder_layers(k, c)?;
    // The folder's attention has a key/value head per query head; the file's head_count_kv (1)
    // describes llama.cpp's absorbed MQA.
    c.insert("num_key_value_heads".into(), json!(k.usize("attention.head_count")?));
    let rope = k.usize("rope.dimension_count")?;
    let kv_lora = k.usize("attention.kv_lora_rank")?;
    let (qk, v) = match (k.usize_opt("attention.key_length_mla")?, k.usize_opt("attention.value_length_mla")?) {
        (Some(qk), Some(v)) if qk > 0 && v > 0 => (qk, v),
        _ => (k.usize("attention.key_length")?, k.usize("attention.value_length")?),
    };
    if qk <= rope {
        return Err(k.invalid(&k.full("attention.key_length_mla"), format!("({qk}) must exceed rope.dimension_count ({rope})")));
    }
    if let Some(q) = k.usize_opt("attention.q_lora_rank")?.filter(|q| *q > 0) {
        c.insert("q_lora_rank".into(), json!(q));
    } else {
        c.insert("q_lora_rank".into(), Value::Null);
    }
    c.insert("kv_lora_rank".into(), json!(kv_lora));
    c.insert("qk_nope_head_dim".into(), json!(qk - rope));
    c.insert("qk_rope_head_dim".into(), json!(rope));
    c.insert("v_head_dim".into(), json!(v));
    c.insert("head_dim".into(), json!(rope));
    // llama.cpp rotates DeepSeek's pairs (2i, 2i+1) (LLAMA_ROPE_TYPE_NORM), as the checkpoints do.
    c.insert("rope_interleave".into(), json!(true));
    c.insert("attention_bias".into(), json!(false));
    c.insert("first_k_dense_replace".into(), json!(k.usize("leading_dense_block_count")?));
    sigmoid_routing(k, c, None)?;
    if let Some(Value::Object(s)) = c.get_mut("rope_scaling") {
        if s.get("rope_type").and_then(Value::as_str) == Some("yarn") {
            s.insert("attention_factor".into(), json!(k.f64_opt("rope.scaling.yarn_attn_factor")?.unwrap_or(1.0)));
        }
    }
    Ok(())
}

/// `kv_b_proj` rebuilt from `attn_k_b`/`attn_v_b` for the layers that have no `attn_kv_b`.
fn extra(m: &GgufModel) -> Result<Vec<ExternalTensor>, ModelError> {
    let Some(mla) = m.config.mla else { return Ok(vec![]) };
    let (nh, nope, v, lora) = (m.config.num_heads, mla.qk_nope_head_dim, mla.v_head_dim, mla.kv_lora_rank);
    let mut out = vec![];
    for i in 0..m.config.num_layers {
        let (k_name, v_name) = (format!("blk.{i}.attn_k_b.weight"), format!("blk.{i}.attn_v_b.weight"));
        if m.file.contains(&format!("blk.{i}.attn_kv_b.weight")) || !m.file.contains(&k_name) || !m.file.contains(&v_name) {
            // The table's kv_b, or a missing tensor the loader reports.
            continue;
        }
        let (kt, vt) = (m.file.tensor(&k_name)?, m.file.tensor(&v_name)?);
        let k_b = values(&kt, &[nh, lora, nope])?;
        let v_b = values(&vt, &[nh, v, lora])?;
        let kv_b = merge_kv_b(&k_b, &v_b, nh, nope, v, lora);
        out.push(ExternalTensor {
            name: format!("model.layers.{i}.self_attn.kv_b_proj.weight"),
            file: m.file_index(&kt),
            dtype: Ok(FileDType::Float(DType::F32)),
            shape: vec![nh * (nope + v), lora],
            bytes: HostBytes::from_vec(bytemuck::cast_slice(&kv_b).to_vec()),
        });
    }
    Ok(out)
}

/// The values of `t`, which must hold `shape` (outermost first; a 2-D file tensor with the
/// same innermost size and count is accepted), decoded to f32.
pub(super) fn values(t: &GgufTensor, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
    let cols = *shape.last().unwrap_or(&0);
    let count: usize = shape.iter().product();
    let dims_count: usize = t.dims.iter().product();
    if t.dims.first() != Some(&cols) || dims_count != count {
        let found: Vec<usize> = t.dims.iter().rev().copied().collect();
        return Err(format_err(t, format!("expected shape {shape:?} from the model's MLA sizes, found {found:?}")));
    }
    let rows = count / cols.max(1);
    let decoded = match file_dtype(t.ggml_type).map_err(|kind| format_err(t, format!("is {kind}")))? {
        FileDType::Float(d) => ft_backend::dtype::to_f32_vec(t.bytes.as_slice(), d).ok(),
        FileDType::Packed(d) => ft_backend::quant::dequantize_matrix(d, t.bytes.as_slice(), rows, cols),
        other => return Err(format_err(t, format!("{other:?} cannot be decoded"))),
    };
    match decoded {
        Some(v) if v.len() == count => Ok(v),
        _ => Err(format_err(t, format!("{} bytes do not hold {count} values", t.bytes.len()))),
    }
}

/// `kv_b_proj [H·(nope+v), lora]` (per head: `nope` key rows, then `v` value rows) from
/// `k_b [H, lora, nope]` and `v_b [H, v, lora]`.
fn merge_kv_b(k_b: &[f32], v_b: &[f32], nh: usize, nope: usize, v: usize, lora: usize) -> Vec<f32> {
    let mut out = vec![0f32; nh * (nope + v) * lora];
    for h in 0..nh {
        let base = h * (nope + v);
        for d in 0..nope {
            for l in 0..lora {
                out[(base + d) * lora + l] = k_b[(h * lora + l) * nope + d];
            }
        }
        let rows = &v_b[h * v * lora..(h + 1) * v * lora];
        out[(base + nope) * lora..(base + nope + v) * lora].copy_from_slice(rows);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::test_meta::{gguf_meta, load_config};
    use crate::model::arch::{hf_name, spec_for};
    use crate::model::config::{ModelConfig, RopeScaling, RoutingKind};
    use crate::model::gguf::{MetaValue, Metadata};
    use std::path::Path;

    /// Metadata as llama.cpp's converter writes it for a small DeepSeek-V3.
    fn meta() -> Metadata {
        gguf_meta(
            "deepseek2",
            &[
                ("block_count", MetaValue::U32(3)),
                ("context_length", MetaValue::U32(4096)),
                ("embedding_length", MetaValue::U32(64)),
                ("feed_forward_length", MetaValue::U32(128)),
                ("attention.head_count", MetaValue::U32(4)),
                ("attention.head_count_kv", MetaValue::U32(1)),
                ("attention.key_length", MetaValue::U32(40)),
                ("attention.value_length", MetaValue::U32(32)),
                ("attention.key_length_mla", MetaValue::U32(24)),
                ("attention.value_length_mla", MetaValue::U32(16)),
                ("attention.q_lora_rank", MetaValue::U32(48)),
                ("attention.kv_lora_rank", MetaValue::U32(32)),
                ("attention.layer_norm_rms_epsilon", MetaValue::F32(1e-6)),
                ("rope.dimension_count", MetaValue::U32(8)),
                ("rope.freq_base", MetaValue::F32(10000.0)),
                ("rope.scaling.type", MetaValue::String("yarn".into())),
                ("rope.scaling.factor", MetaValue::F32(4.0)),
                ("rope.scaling.original_context_length", MetaValue::U32(1024)),
                ("rope.scaling.yarn_log_multiplier", MetaValue::F32(0.1)),
                ("expert_count", MetaValue::U32(8)),
                ("expert_used_count", MetaValue::U32(2)),
                ("expert_feed_forward_length", MetaValue::U32(32)),
                ("expert_shared_count", MetaValue::U32(1)),
                ("expert_group_count", MetaValue::U32(4)),
                ("expert_group_used_count", MetaValue::U32(2)),
                ("expert_gating_func", MetaValue::U32(2)),
                ("expert_weights_scale", MetaValue::F32(2.5)),
                ("expert_weights_norm", MetaValue::Bool(true)),
                ("leading_dense_block_count", MetaValue::U32(1)),
                ("vocab_size", MetaValue::U32(1024)),
            ],
            &[],
        )
    }

    fn load(m: &Metadata) -> Result<(Value, ModelConfig), ConfigError> {
        load_config(m, "/models/ds.gguf", &|name: &str| name == "output.weight")
    }

    #[test]
    fn llama_cpps_keys_become_the_folders_config() {
        let (c, cfg) = load(&meta()).unwrap();
        assert_eq!(c["model_type"], "deepseek_v3");
        let mla = cfg.mla.unwrap();
        assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim), (Some(48), 32, 16, 8, 16));
        assert!(mla.rope_interleave);
        assert_eq!((cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim), (3, 4, 4, 8));
        assert_eq!(cfg.moe_layers, [false, true, true]);
        assert_eq!(cfg.routing, RoutingKind::SigmoidGroupLimited { n_group: 4, topk_group: 2 });
        assert_eq!((cfg.routed_scaling_factor, cfg.norm_topk_prob, cfg.shared_intermediate_size), (2.5, true, 32));
        match cfg.rope.scaling {
            RopeScaling::Yarn { factor, original_max_position, mscale_all_dim, attention_factor, .. } => {
                assert_eq!((factor, original_max_position, attention_factor), (4.0, 1024, Some(1.0)));
                assert!((mscale_all_dim - 1.0).abs() < 1e-6, "yarn_log_multiplier 0.1 is mscale_all_dim 1: {mscale_all_dim}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn older_files_and_llama_cpp_defaults() {
        // Before the _mla keys, key/value_length held the per-head sizes.
        let mut m = meta();
        m.remove("deepseek2.attention.key_length_mla");
        m.remove("deepseek2.attention.value_length_mla");
        m.insert("deepseek2.attention.key_length".into(), MetaValue::U32(24));
        m.insert("deepseek2.attention.value_length".into(), MetaValue::U32(16));
        // expert_weights_norm is only written when true; no q_lora_rank means a plain q_proj;
        // MTP layers are counted in block_count.
        m.remove("deepseek2.expert_weights_norm");
        m.remove("deepseek2.attention.q_lora_rank");
        m.insert("deepseek2.block_count".into(), MetaValue::U32(4));
        m.insert("deepseek2.nextn_predict_layers".into(), MetaValue::U32(1));
        let (_, cfg) = load(&m).unwrap();
        let mla = cfg.mla.unwrap();
        assert_eq!((mla.q_lora_rank, mla.qk_nope_head_dim, mla.v_head_dim), (None, 16, 16));
        assert!(!cfg.norm_topk_prob);
        assert_eq!(cfg.num_layers, 3);
    }

    #[test]
    fn missing_or_unsupported_keys_are_named() {
        for key in ["attention.kv_lora_rank", "rope.dimension_count", "expert_shared_count", "leading_dense_block_count"] {
            let mut m = meta();
            m.remove(&format!("deepseek2.{key}"));
            let e = load(&m).unwrap_err().to_string();
            assert!(e.contains(&format!("deepseek2.{key}")) && e.contains("ds.gguf"), "{e}");
        }
        let mut m = meta();
        m.insert("deepseek2.expert_gating_func".into(), MetaValue::U32(1));
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains("expert_gating_func") && e.contains("softmax"), "{e}");
        m.remove("deepseek2.expert_gating_func");
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains("expert_gating_func") && e.contains("absent"), "{e}");
    }

    #[test]
    fn tensor_names_map_to_the_checkpoints() {
        let s = spec_for(&meta(), Path::new("x")).unwrap();
        assert_eq!(hf_name(s, "blk.1.exp_probs_b.bias").unwrap().0, "model.layers.1.mlp.gate.e_score_correction_bias");
        assert_eq!(hf_name(s, "blk.2.attn_kv_a_mqa.weight").unwrap().0, "model.layers.2.self_attn.kv_a_proj_with_mqa.weight");
        assert_eq!(hf_name(s, "blk.0.ffn_norm.weight").unwrap().0, "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(hf_name(s, "blk.1.ffn_up_shexp.weight").unwrap().0, "model.layers.1.mlp.shared_experts.up_proj.weight");
        assert_eq!(hf_name(s, "blk.1.ffn_gate_exps.weight"), Some(("model.layers.1.mlp.experts.{e}.gate_proj.weight".into(), true)));
        // Left to the extra hook.
        assert_eq!(hf_name(s, "blk.0.attn_k_b.weight"), None);
        assert_eq!(hf_name(s, "blk.0.attn_v_b.weight"), None);
    }

    #[test]
    fn k_b_and_v_b_merge_back_into_kv_b() {
        let (nh, nope, v, lora) = (3, 4, 5, 6);
        let kv_b: Vec<f32> = (0..nh * (nope + v) * lora).map(|x| x as f32).collect();
        // As the converter splits it: k_b[h][l][d] = kv_b[h·(nope+v)+d][l], v_b[h][j][l] = kv_b[h·(nope+v)+nope+j][l].
        let mut k_b = vec![0f32; nh * lora * nope];
        let mut v_b = vec![0f32; nh * v * lora];
        for h in 0..nh {
            for l in 0..lora {
                for d in 0..nope {
                    k_b[(h * lora + l) * nope + d] = kv_b[(h * (nope + v) + d) * lora + l];
                }
                for j in 0..v {
                    v_b[(h * v + j) * lora + l] = kv_b[(h * (nope + v) + nope + j) * lora + l];
                }
            }
        }
        assert_eq!(merge_kv_b(&k_b, &v_b, nh, nope, v, lora), kv_b);
    }
}
