//! Metadata → config for both families, and the head orders the converter writes.

use super::*;
use crate::model::arch::test_meta::{gguf_meta, load_config};
use crate::model::arch::{hf_name, spec_for};
use crate::model::config::ModelConfig;
use crate::model::gguf::{MetaValue, Metadata};
use std::path::Path;

/// Metadata as llama.cpp's converter writes it for the test fixtures.
fn meta(arch: &str) -> Metadata {
    gguf_meta(
        arch,
        &[
            ("block_count", MetaValue::U32(4)),
            ("context_length", MetaValue::U32(4096)),
            ("embedding_length", MetaValue::U32(64)),
            ("feed_forward_length", MetaValue::U32(128)),
            ("attention.head_count", MetaValue::U32(4)),
            ("attention.head_count_kv", MetaValue::U32(2)),
            ("attention.key_length", MetaValue::U32(32)),
            ("attention.value_length", MetaValue::U32(32)),
            ("attention.layer_norm_rms_epsilon", MetaValue::F32(1e-6)),
            ("rope.freq_base", MetaValue::F32(10000.0)),
            ("rope.dimension_count", MetaValue::U32(8)),
            ("expert_count", MetaValue::U32(8)),
            ("expert_used_count", MetaValue::U32(2)),
            ("expert_feed_forward_length", MetaValue::U32(32)),
            ("expert_shared_feed_forward_length", MetaValue::U32(48)),
            ("ssm.conv_kernel", MetaValue::U32(4)),
            ("ssm.state_size", MetaValue::U32(16)),
            ("ssm.group_count", MetaValue::U32(2)),
            ("ssm.time_step_rank", MetaValue::U32(4)),
            ("ssm.inner_size", MetaValue::U32(64)),
            ("full_attention_interval", MetaValue::U32(4)),
            ("vocab_size", MetaValue::U32(1024)),
        ],
        &[],
    )
}

fn load(m: &Metadata) -> Result<(Value, ModelConfig), ConfigError> {
    load_config(m, "/models/next.gguf", &|name: &str| name == "output.weight" || name.ends_with("ffn_gate_inp.weight") || name.ends_with("ffn_up_shexp.weight"))
}

#[test]
fn llama_cpps_keys_become_the_folders_config() {
    use LayerKind::{FullAttention as F, LinearAttention as L};
    for (arch, model_type, want) in [("qwen3next", "qwen3_next", Arch::Qwen3Next), ("qwen35moe", "qwen3_5_moe", Arch::Qwen35Moe)] {
        let (c, cfg) = load(&meta(arch)).unwrap();
        assert_eq!(c["model_type"], model_type);
        assert_eq!(cfg.arch, want);
        assert_eq!(cfg.layer_kinds, [L, L, L, F]);
        let l = cfg.linear_attn.unwrap();
        assert_eq!((l.num_k_heads, l.num_v_heads, l.k_head_dim, l.v_head_dim, l.conv_kernel), (2, 4, 16, 16, 4));
        assert_eq!((cfg.head_dim, cfg.rotary_dim(), cfg.shared_intermediate_size, cfg.moe_intermediate_size), (32, 8, 48, 32));
        assert!(cfg.norm_topk_prob && cfg.shared_expert_gated && cfg.attn_output_gate && cfg.norm_unit_offset && !cfg.qkv_bias);
        assert_eq!(cfg.moe_layers, [true; 4]);
    }
}

#[test]
fn interval_mtp_layers_and_missing_keys() {
    use LayerKind::{FullAttention as F, LinearAttention as L};
    let mut m = meta("qwen35moe");
    m.insert("qwen35moe.full_attention_interval".into(), MetaValue::U32(2));
    // Qwen3.5's MTP layer is counted in block_count.
    m.insert("qwen35moe.block_count".into(), MetaValue::U32(5));
    m.insert("qwen35moe.nextn_predict_layers".into(), MetaValue::U32(1));
    assert_eq!(load(&m).unwrap().1.layer_kinds, [L, F, L, F]);
    // llama.cpp's default interval.
    m.remove("qwen35moe.full_attention_interval");
    assert_eq!(load(&m).unwrap().1.layer_kinds, [L, L, L, F]);
    // A per-block list wins over the interval.
    let flags = [true, false, true, true, false].map(MetaValue::Bool).to_vec();
    m.insert("qwen35moe.attention.recurrent_layers".into(), MetaValue::Array(flags));
    assert_eq!(load(&m).unwrap().1.layer_kinds, [L, F, L, L]);
    m.insert("qwen35moe.attention.recurrent_layers".into(), MetaValue::Array(vec![MetaValue::Bool(true)]));
    assert!(load(&m).unwrap_err().to_string().contains("recurrent_layers"));
    for key in ["ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size", "expert_shared_feed_forward_length"] {
        let mut m = meta("qwen3next");
        m.remove(&format!("qwen3next.{key}"));
        let e = load(&m).unwrap_err().to_string();
        assert!(e.contains(&format!("qwen3next.{key}")) && e.contains("next.gguf"), "{e}");
    }
    let mut m = meta("qwen3next");
    m.insert("qwen3next.ssm.inner_size".into(), MetaValue::U32(66));
    assert!(load(&m).unwrap_err().to_string().contains("ssm.inner_size"));
    m = meta("qwen3next");
    m.insert("qwen3next.rope.dimension_count".into(), MetaValue::U32(33));
    assert!(load(&m).unwrap_err().to_string().contains("rope.dimension_count"));
}

#[test]
fn tensor_names_map_to_the_checkpoints() {
    let s = spec_for(&meta("qwen3next"), Path::new("x")).unwrap();
    assert_eq!(hf_name(s, "blk.0.ffn_gate_inp_shexp.weight").unwrap().0, "model.layers.0.mlp.shared_expert_gate.weight");
    assert_eq!(hf_name(s, "blk.2.ssm_norm.weight").unwrap().0, "model.layers.2.linear_attn.norm.weight");
    assert_eq!(hf_name(s, "blk.1.ffn_down_exps.weight"), Some(("model.layers.1.mlp.experts.{e}.down_proj.weight".into(), true)));
    // Left to the extra hook: offset norms and converted DeltaNet tensors.
    for name in ["blk.0.attn_norm.weight", "blk.0.post_attention_norm.weight", "output_norm.weight", "blk.0.ssm_a", "blk.0.ssm_ba.weight", "blk.0.attn_qkv.weight", "blk.0.ssm_conv1d.weight"] {
        assert_eq!(hf_name(s, name), None, "{name}");
    }
}

/// llama.cpp's `_reorder_v_heads`: heads `[Hk, r]` (grouped) transposed to `[r, Hk]` (tiled).
fn tiled(heads: &[usize], hk: usize, r: usize) -> Vec<usize> {
    (0..hk * r).map(|p| heads[(p % hk) * r + p / hk]).collect()
}

#[test]
fn tiled_value_heads_are_put_back_in_grouped_order() {
    let (hk, r) = (3, 4);
    let grouped: Vec<usize> = (0..hk * r).collect();
    let file = tiled(&grouped, hk, r);
    let v = VHeads { k_heads: hk, per_k: r, tiled: true };
    let back: Vec<usize> = (0..hk * r).map(|h| file[v.file_head(h)]).collect();
    assert_eq!(back, grouped);
    // Rows of two-row heads after a prefix of 5 rows that stay.
    let rows: Vec<usize> = (0..5 + 2 * hk * r).map(|row| v.file_row(row, 5, 2)).collect();
    assert_eq!(&rows[..5], &[0, 1, 2, 3, 4]);
    assert_eq!(&rows[5..9], &[5, 6, 5 + 2 * hk, 6 + 2 * hk], "grouped head 1 is tiled head Hk");
    let plain = VHeads { tiled: false, ..v };
    assert!((0..hk * r).all(|h| plain.file_head(h) == h));
}

#[test]
fn out_proj_columns_move_as_blocks_or_decoded() {
    use ft_backend::quant::{dequantize_matrix, quantize_matrix};
    let (rows, heads) = (3, 4);
    for (unit, want_dtype) in [(32, FileDType::Packed(DType::Q8_0)), (16, FileDType::Float(DType::F32))] {
        let cols = heads * unit;
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let t = GgufTensor {
            name: "blk.0.ssm_out.weight".into(),
            ggml_type: 8,
            dims: vec![cols, rows],
            bytes: HostBytes::from_vec(quantize_matrix(DType::Q8_0, &x, rows, cols)),
            file: "/models/next.gguf".into(),
        };
        let v = VHeads { k_heads: 2, per_k: 2, tiled: true };
        let (dtype, bytes) = gather_cols(&t, rows, heads, unit, |c| v.file_head(c)).unwrap();
        assert_eq!(dtype, want_dtype, "a head of {unit} values");
        let got = match dtype {
            FileDType::Packed(d) => dequantize_matrix(d, bytes.as_slice(), rows, cols).unwrap(),
            _ => bytemuck::cast_slice::<u8, f32>(bytes.as_slice()).to_vec(),
        };
        let file = dequantize_matrix(DType::Q8_0, t.bytes.as_slice(), rows, cols).unwrap();
        for r in 0..rows {
            for h in 0..heads {
                let s = v.file_head(h);
                assert_eq!(got[r * cols + h * unit..][..unit], file[r * cols + s * unit..][..unit], "row {r} head {h}");
            }
        }
    }
}
