//! gpt-oss (`gpt_oss`; GGUF `gpt-oss`, llama.cpp's `LLM_ARCH_OPENAI_MOE`): attention with
//! biases and learned sinks, alternating sliding/full layers, a biased router and biased
//! experts with a clamped SwiGLU.
//!
//! llama.cpp's converter splits the checkpoint's fused, transposed, gate/up-interleaved
//! `gate_up_proj [E, H, 2I]` into row-major `ffn_gate_exps`/`ffn_up_exps [E, I, H]` and
//! transposes `down_proj [E, I, H]` into `ffn_down_exps [E, H, I]` (MXFP4 checkpoints are
//! repacked block for block), so every expert is a plain `[out, in]` matrix here: they are
//! read per expert as views of the file (`mlp.experts.{e}.{gate,up,down}_proj.weight`), and
//! the biases, split the same way, as stacked f32 `[E, I]`/`[E, H]` tensors
//! (`mlp.experts.{gate,up,down}_proj_bias`).

use super::{Arch, ArchSpec, GgufKeys, HfNames, TensorPair, ATTN_PROJ, HF_NAMES, POST_NORM_LAYOUT, QKV_BIAS};
use crate::model::config::ConfigError;
use crate::model::gguf::MetaValue;
use serde_json::{json, Map, Value};

/// What gpt-oss adds to the shared tables: the output projection's bias, sinks, the router
/// under `mlp.router`, and the experts' biases.
const TENSORS: &[TensorPair] = &[
    ("blk.{i}.attn_output.bias", "model.layers.{i}.self_attn.o_proj.bias"),
    // The converter appends `.weight` to `self_attn.sinks` before mapping it.
    ("blk.{i}.attn_sinks.weight", "model.layers.{i}.self_attn.sinks"),
    ("blk.{i}.ffn_gate_inp.weight", "model.layers.{i}.mlp.router.weight"),
    ("blk.{i}.ffn_gate_inp.bias", "model.layers.{i}.mlp.router.bias"),
    // `gate_up_proj_bias [E, 2I]` split into its even (gate) and odd (up) columns.
    ("blk.{i}.ffn_gate_exps.bias", "model.layers.{i}.mlp.experts.gate_proj_bias"),
    ("blk.{i}.ffn_up_exps.bias", "model.layers.{i}.mlp.experts.up_proj_bias"),
    ("blk.{i}.ffn_down_exps.bias", "model.layers.{i}.mlp.experts.down_proj_bias"),
];

/// The experts, `[out, in]` per expert after the converter's split and transposes.
const EXPERTS: &[TensorPair] = &[
    ("blk.{i}.ffn_gate_exps.weight", "model.layers.{i}.mlp.experts.{e}.gate_proj.weight"),
    ("blk.{i}.ffn_up_exps.weight", "model.layers.{i}.mlp.experts.{e}.up_proj.weight"),
    ("blk.{i}.ffn_down_exps.weight", "model.layers.{i}.mlp.experts.{e}.down_proj.weight"),
];

/// gpt-oss as llama.cpp converts it.
pub const SPEC: ArchSpec = ArchSpec { arch: Arch::GptOss, hf: HfNames { router: "router", stacked_experts: true, ..HF_NAMES }, gguf: "gpt-oss", model_type: "gpt_oss", tensors: &[POST_NORM_LAYOUT, ATTN_PROJ, QKV_BIAS, TENSORS], experts: EXPERTS, permuted_qk: false, config, extra: None };

/// The clamp and slope of gpt-oss's SwiGLU, which llama.cpp compiles in
/// (`LLM_FFN_SWIGLU_OAI_MOE`: `ggml_swiglu_oai(…, 1.702, 7.0)`); its converter writes neither.
const SWIGLU_ALPHA: f64 = 1.702;
const SWIGLU_LIMIT: f64 = 7.0;

/// llama.cpp's `set_swa_pattern(n)`: with `n` = 0 every layer slides, otherwise the last of
/// every `n` layers is full attention. gpt-oss uses `n` = 2 (sliding first) unless the file's
/// `attention.sliding_window_pattern` says otherwise.
fn pattern_slides(n: u64, layer: usize) -> bool {
    n == 0 || (layer as u64 % n) < n - 1
}

fn config(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<(), ConfigError> {
    let layers = k.usize("block_count")?;
    // llama.cpp requires the window (`get_key`, no default).
    c.insert("sliding_window".into(), json!(k.usize("attention.sliding_window")?));
    c.insert("layer_types".into(), json!(layer_types(k, layers)?));
    c.insert("attention_bias".into(), json!(k.has_qkv_bias(0)));
    let limit = swiglu_clamp(k)?.unwrap_or(SWIGLU_LIMIT);
    c.insert("swiglu_limit".into(), json!(limit));
    c.insert("swiglu_alpha".into(), json!(SWIGLU_ALPHA));
    // The engine's gpt-oss intermediate_size is the expert width.
    if let Some(n) = k.usize_opt("expert_feed_forward_length")? {
        c.insert("intermediate_size".into(), json!(n));
    }
    // gpt-oss checkpoints ask for YaRN without rounding the correction range to whole
    // dimensions (`truncate: false`); the GGUF has no key for it (llama.cpp always rounds), so
    // the folder's setting is restored.
    if let Some(Value::Object(s)) = c.get_mut("rope_scaling") {
        if s.get("rope_type").and_then(Value::as_str) == Some("yarn") {
            s.insert("truncate".into(), json!(false));
        }
    }
    Ok(())
}

/// Each layer's attention: `attention.sliding_window_pattern` as a period (uint) or one flag
/// per layer (true = sliding), else llama.cpp's gpt-oss default, period 2.
fn layer_types(k: &GgufKeys, layers: usize) -> Result<Vec<&'static str>, ConfigError> {
    let key = format!("{}.attention.sliding_window_pattern", k.arch);
    let invalid = |problem: String| ConfigError::Invalid { path: k.path.into(), key: key.clone(), problem };
    let slides: Vec<bool> = match k.meta.get(&key) {
        None => (0..layers).map(|i| pattern_slides(2, i)).collect(),
        Some(MetaValue::Array(a)) => {
            if a.len() != layers {
                return Err(invalid(format!("lists {} layers, the model has {layers}", a.len())));
            }
            a.iter()
                .map(|v| v.as_bool().ok_or_else(|| invalid(format!("must hold booleans, found {}", v.type_name()))))
                .collect::<Result<_, _>>()?
        }
        Some(v) => {
            let n = v.as_u64().ok_or_else(|| invalid(format!("must be a period or per-layer flags, found {}", v.type_name())))?;
            (0..layers).map(|i| pattern_slides(n, i)).collect()
        }
    };
    Ok(slides.into_iter().map(|s| if s { "sliding_attention" } else { "full_attention" }).collect())
}

/// `swiglu_clamp_exp`: per-layer clamps of the experts' SwiGLU, which some llama.cpp families
/// write (gpt-oss files normally have none). One value must serve every layer.
fn swiglu_clamp(k: &GgufKeys) -> Result<Option<f64>, ConfigError> {
    let key = format!("{}.swiglu_clamp_exp", k.arch);
    let invalid = |problem: String| ConfigError::Invalid { path: k.path.into(), key: key.clone(), problem };
    let values: Vec<f64> = match k.meta.get(&key) {
        None => return Ok(None),
        Some(MetaValue::Array(a)) => a
            .iter()
            .map(|v| v.as_f64().ok_or_else(|| invalid(format!("must hold numbers, found {}", v.type_name()))))
            .collect::<Result<_, _>>()?,
        Some(v) => vec![v.as_f64().ok_or_else(|| invalid(format!("must be a number, found {}", v.type_name())))?],
    };
    match values.as_slice() {
        [] => Ok(None),
        [first, rest @ ..] if rest.iter().all(|x| x == first) && *first > 0.0 => Ok(Some(*first)),
        _ => Err(invalid("must be one positive clamp for every layer, which this engine requires".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::test_meta::{gguf_meta, load_config};
    use crate::model::config::{LayerKind, ModelConfig, RopeScaling};
    use crate::model::gguf::Metadata;

    fn meta(extra: &[(&str, MetaValue)]) -> Metadata {
        gguf_meta(
            "gpt-oss",
            &[
                ("block_count", MetaValue::U32(4)),
                ("context_length", MetaValue::U32(131072)),
                ("embedding_length", MetaValue::U32(64)),
                ("feed_forward_length", MetaValue::U32(32)),
                ("expert_feed_forward_length", MetaValue::U32(32)),
                ("attention.head_count", MetaValue::U32(4)),
                ("attention.head_count_kv", MetaValue::U32(2)),
                ("attention.key_length", MetaValue::U32(16)),
                ("attention.value_length", MetaValue::U32(16)),
                ("attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5)),
                ("attention.sliding_window", MetaValue::U32(128)),
                ("expert_count", MetaValue::U32(8)),
                ("expert_used_count", MetaValue::U32(2)),
                ("rope.freq_base", MetaValue::F32(150000.0)),
                ("rope.scaling.type", MetaValue::String("yarn".into())),
                ("rope.scaling.factor", MetaValue::F32(32.0)),
                ("rope.scaling.original_context_length", MetaValue::U32(4096)),
                ("vocab_size", MetaValue::U32(1024)),
            ],
            extra,
        )
    }

    fn load(m: &Metadata) -> Result<(Value, ModelConfig), ConfigError> {
        load_config(m, "/models/gpt-oss.gguf", &|name: &str| name.ends_with("attn_q.bias") || name == "output.weight")
    }

    #[test]
    fn llama_cpps_keys_become_the_folders_config() {
        let (c, cfg) = load(&meta(&[])).unwrap();
        assert_eq!(c["model_type"], "gpt_oss");
        assert_eq!(cfg.sliding_window, Some(128));
        use LayerKind::{FullAttention as F, SlidingAttention as S};
        assert_eq!(cfg.layer_kinds, [S, F, S, F]);
        assert!(cfg.qkv_bias && cfg.attention_sinks && cfg.router_bias && cfg.expert_bias);
        assert_eq!((cfg.moe_intermediate_size, cfg.head_dim, cfg.max_position_embeddings), (32, 16, 131072));
        match cfg.rope.scaling {
            RopeScaling::Yarn { factor, original_max_position, truncate, .. } => {
                assert_eq!((factor, original_max_position, truncate), (32.0, 4096, false));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((c["swiglu_limit"].as_f64(), c["swiglu_alpha"].as_f64()), (Some(7.0), Some(1.702)));
    }

    #[test]
    fn a_sliding_window_pattern_key_wins() {
        use LayerKind::{FullAttention as F, SlidingAttention as S};
        let period = meta(&[("gpt-oss.attention.sliding_window_pattern", MetaValue::U32(4))]);
        assert_eq!(load(&period).unwrap().1.layer_kinds, [S, S, S, F]);
        let flags = [false, true, true, false].map(MetaValue::Bool).to_vec();
        let listed = meta(&[("gpt-oss.attention.sliding_window_pattern", MetaValue::Array(flags))]);
        assert_eq!(load(&listed).unwrap().1.layer_kinds, [F, S, S, F]);
        let short = meta(&[("gpt-oss.attention.sliding_window_pattern", MetaValue::Array(vec![MetaValue::Bool(true)]))]);
        assert!(load(&short).unwrap_err().to_string().contains("sliding_window_pattern"));
        let clamp = meta(&[("gpt-oss.swiglu_clamp_exp", MetaValue::Array(vec![MetaValue::F32(10.0); 4]))]);
        assert_eq!(load(&clamp).unwrap().0["swiglu_limit"].as_f64(), Some(10.0));
    }

    #[test]
    fn the_window_is_required() {
        let mut m = meta(&[]);
        m.remove("gpt-oss.attention.sliding_window");
        assert!(load(&m).unwrap_err().to_string().contains("gpt-oss.attention.sliding_window"));
    }
}
