//! The small files around the weights: index, `config.json`, tokenizer, `synth.json`,
//! and the output-directory checks.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::{Arch, ArchSpec, ShapeSpec, SynthDtype, SynthError, SynthOptions, SynthPlan, YarnSpec};

/// The test tokenizer shipped with every synthetic checkpoint. Its ids are far below the
/// real vocab sizes; embedding rows past them are simply never looked up.
const TOKENIZER_FILES: [(&str, &[u8]); 5] = [
    (
        "tokenizer.json",
        include_bytes!("../../tests/fixtures/tokenizer/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../../tests/fixtures/tokenizer/tokenizer_config.json"),
    ),
    (
        "chat_template.jinja",
        include_bytes!("../../tests/fixtures/tokenizer/chat_template.jinja"),
    ),
    (
        "special_tokens_map.json",
        include_bytes!("../../tests/fixtures/tokenizer/special_tokens_map.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../tests/fixtures/tokenizer/generation_config.json"),
    ),
];

/// `<|endoftext|>` of the bundled tokenizer (the real models' BOS/pad role).
const BOS_ID: u32 = 1011;
/// `<|im_end|>` of the bundled tokenizer (the chat EOS).
const EOS_ID: u32 = 1013;

/// Writes every file except the shards; returns their paths.
pub(super) fn write_side_files(
    opts: &SynthOptions,
    plan: &SynthPlan,
) -> Result<Vec<PathBuf>, SynthError> {
    let mut files = Vec::new();
    if plan.shards.len() > 1 {
        files.push(write_json(
            &opts.out,
            "model.safetensors.index.json",
            &index_json(plan),
        )?);
    }
    files.push(write_json(
        &opts.out,
        "config.json",
        &config_json(&plan.shape, plan.dtype),
    )?);
    for (name, bytes) in TOKENIZER_FILES {
        let path = opts.out.join(name);
        std::fs::write(&path, bytes).map_err(|source| SynthError::Io {
            path: path.clone(),
            source,
        })?;
        files.push(path);
    }
    let note = json!({
        "synthetic": true,
        "note": "random weights with a real model's shape, for speed measurements only",
        "like": plan.shape.name,
        "dtype": plan.dtype.torch_name(),
        "seed": opts.seed,
        "overrides": { "layers": opts.layers, "experts": opts.experts,
                       "hidden": opts.hidden, "vocab": opts.vocab },
        "total_params": plan.total_params,
        "active_params": plan.active_params,
    });
    files.push(write_json(&opts.out, "synth.json", &note)?);

    Ok(files)
}

/// True for file names this module writes as weights or index.
fn is_weight_file(name: &str) -> bool {
    name == "model.safetensors.index.json"
        || (name.starts_with("model") && name.ends_with(".safetensors"))
}

/// Creates `out`, refusing (or, with `overwrite`, clearing) an existing checkpoint so
/// stale shards from an earlier run cannot mix with the new ones.
pub(super) fn prepare_out_dir(out: &Path, overwrite: bool) -> Result<(), SynthError> {
    std::fs::create_dir_all(out).map_err(|source| SynthError::OutDir {
        path: out.to_path_buf(),
        source,
    })?;
    let entries = std::fs::read_dir(out).map_err(|source| SynthError::OutDir {
        path: out.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_weight_file(&name) {
            continue;
        }
        if !overwrite {
            return Err(SynthError::OutputExists {
                path: out.to_path_buf(),
                file: name,
            });
        }
        let path = entry.path();
        std::fs::remove_file(&path).map_err(|source| SynthError::Io { path, source })?;
    }
    Ok(())
}

/// Pretty-prints `value` into `dir/name`.
fn write_json(dir: &Path, name: &str, value: &Value) -> Result<PathBuf, SynthError> {
    let path = dir.join(name);
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| SynthError::Internal(format!("cannot serialise {name}: {e}")))?;
    text.push('\n');
    std::fs::write(&path, text).map_err(|source| SynthError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// `model.safetensors.index.json`: total size and the shard of every tensor.
fn index_json(plan: &SynthPlan) -> Value {
    let mut map = Map::new();
    for (file, indices) in &plan.shards {
        for &i in indices {
            map.insert(plan.tensors[i].name.clone(), Value::String(file.clone()));
        }
    }
    json!({ "metadata": { "total_size": plan.total_bytes }, "weight_map": map })
}

/// `config.json` with the key set of the real hub config of `s.arch`.
fn config_json(s: &ShapeSpec, dtype: SynthDtype) -> Value {
    let mut c = json!({
        "architectures": [s.arch.architecture()],
        "model_type": s.arch.model_type(),
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "initializer_range": 0.02,
        "intermediate_size": s.intermediate,
        "max_position_embeddings": s.max_position_embeddings,
        "num_attention_heads": s.heads,
        "num_hidden_layers": s.layers,
        "num_key_value_heads": s.kv_heads,
        "num_experts_per_tok": s.top_k,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope_theta,
        "tie_word_embeddings": false,
        "torch_dtype": dtype.torch_name(),
        "transformers_version": s.transformers_version,
        "use_cache": true,
        "vocab_size": s.vocab,
    });
    let extra = match s.arch {
        Arch::Qwen3Moe => json!({
            "attention_bias": false,
            "decoder_sparse_step": 1,
            "head_dim": s.head_dim,
            "max_window_layers": s.max_window_layers,
            "mlp_only_layers": [],
            "moe_intermediate_size": s.moe_intermediate,
            "norm_topk_prob": s.norm_topk_prob,
            "num_experts": s.experts,
            "output_router_logits": false,
            "rope_scaling": null,
            "router_aux_loss_coef": 0.001,
            "sliding_window": null,
            "use_sliding_window": false,
        }),
        Arch::Qwen2Moe => json!({
            "decoder_sparse_step": 1,
            "max_window_layers": s.max_window_layers,
            "mlp_only_layers": [],
            "moe_intermediate_size": s.moe_intermediate,
            "norm_topk_prob": s.norm_topk_prob,
            "num_experts": s.experts,
            "output_router_logits": false,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": s.shared_intermediate,
            "sliding_window": s.max_position_embeddings,
            "use_sliding_window": false,
        }),
        Arch::Mixtral => json!({
            // Mixtral names its expert width `intermediate_size` (no moe_ key).
            "intermediate_size": s.moe_intermediate,
            "num_local_experts": s.experts,
            "output_router_logits": false,
            "router_aux_loss_coef": 0.02,
            "sliding_window": null,
        }),
        Arch::Glm4Moe => json!({
            "attention_bias": s.qkv_bias,
            "first_k_dense_replace": s.first_dense_layers,
            "head_dim": s.head_dim,
            "moe_intermediate_size": s.moe_intermediate,
            "n_group": 1,
            "n_routed_experts": s.experts,
            "n_shared_experts": if s.shared_intermediate > 0 { 1 } else { 0 },
            "norm_topk_prob": s.norm_topk_prob,
            // The real checkpoint ships one multi-token-prediction layer; none is
            // synthesised, so the config must not announce it.
            "num_nextn_predict_layers": 0,
            "partial_rotary_factor": 0.5,
            "rope_scaling": null,
            "routed_scaling_factor": 1.0,
            "topk_group": 1,
            "use_qk_norm": s.qk_norm,
            "eos_token_id": [EOS_ID, BOS_ID],
            "pad_token_id": BOS_ID,
        }),
        Arch::Qwen3Next | Arch::Qwen35Moe => hybrid_json(s),
        Arch::DeepseekV3 => match s.spec {
            ArchSpec::Mla(m) => json!({
                "attention_bias": false,
                "first_k_dense_replace": s.first_dense_layers,
                "kv_lora_rank": m.kv_lora_rank,
                "moe_intermediate_size": s.moe_intermediate,
                "moe_layer_freq": 1,
                "n_group": m.n_group,
                "n_routed_experts": s.experts,
                "n_shared_experts": if s.shared_intermediate > 0 { 1 } else { 0 },
                "norm_topk_prob": s.norm_topk_prob,
                // The real checkpoint ships one multi-token-prediction layer; none is
                // synthesised, so the config must not announce it.
                "num_nextn_predict_layers": 0,
                "q_lora_rank": m.q_lora_rank,
                "qk_nope_head_dim": m.qk_nope_head_dim,
                "qk_rope_head_dim": m.qk_rope_head_dim,
                "rope_scaling": yarn_json(&m.yarn),
                "routed_scaling_factor": m.routed_scaling_factor,
                "scoring_func": "sigmoid",
                "topk_group": m.topk_group,
                "topk_method": "noaux_tc",
                "v_head_dim": m.v_head_dim,
            }),
            _ => json!({}),
        },
        Arch::DeepseekV4 => match s.spec {
            // The published config's keys (transformers reads them as legacy aliases).
            ArchSpec::V4(v) => json!({
                "attention_bias": false,
                "compress_rates": { "compressed_sparse_attention": v.csa_rate, "heavily_compressed_attention": v.hca_rate },
                "compress_ratios": (0..s.layers).map(|i| v.rate(i)).collect::<Vec<_>>(),
                "compress_rope_theta": v.compress_rope_theta,
                "hc_eps": 1e-6,
                "hc_mult": v.hc_mult,
                "hc_sinkhorn_iters": 20,
                "head_dim": s.head_dim,
                "index_head_dim": v.index_head_dim,
                "index_n_heads": v.index_heads,
                "index_topk": v.index_topk,
                "moe_intermediate_size": s.moe_intermediate,
                "n_routed_experts": s.experts,
                "n_shared_experts": if s.shared_intermediate > 0 { 1 } else { 0 },
                "norm_topk_prob": true,
                "num_hash_layers": v.hash_layers,
                // No multi-token-prediction block is synthesised.
                "num_nextn_predict_layers": 0,
                "o_groups": v.o_groups,
                "o_lora_rank": v.o_lora_rank,
                "q_lora_rank": v.q_lora_rank,
                "qk_rope_head_dim": v.qk_rope_head_dim,
                "rope_scaling": yarn_json(&v.yarn),
                "routed_scaling_factor": v.routed_scaling_factor,
                "scoring_func": "sqrtsoftplus",
                "sliding_window": v.sliding_window,
                "swiglu_limit": v.swiglu_limit,
            }),
            _ => json!({}),
        },
        Arch::GptOss => match s.spec {
            ArchSpec::GptOss(g) => json!({
                "attention_bias": true,
                "experts_per_token": s.top_k,
                "head_dim": s.head_dim,
                "initial_context_length": g.yarn.original_max_position,
                "layer_types": (0..s.layers)
                    .map(|i| if i.is_multiple_of(2) { "sliding_attention" } else { "full_attention" })
                    .collect::<Vec<_>>(),
                "num_local_experts": s.experts,
                "output_router_logits": false,
                "rope_scaling": yarn_json(&g.yarn),
                "router_aux_loss_coef": 0.9,
                "sliding_window": g.sliding_window,
                "swiglu_limit": g.swiglu_limit,
            }),
            _ => json!({}),
        },
    };
    if let (Some(base), Value::Object(extra)) = (c.as_object_mut(), extra) {
        base.extend(extra);
    }
    if s.arch == Arch::Qwen35Moe {
        return vl_wrapper(c, s, dtype);
    }
    c
}

/// A `rope_scaling` block of type YaRN.
fn yarn_json(y: &YarnSpec) -> Value {
    let mut v = json!({
        "rope_type": "yarn",
        "factor": y.factor,
        "original_max_position_embeddings": y.original_max_position,
        "beta_fast": y.beta_fast,
        "beta_slow": y.beta_slow,
    });
    if let Some((m, all)) = y.mscale {
        v["mscale"] = json!(m);
        v["mscale_all_dim"] = json!(all);
    }
    if let Some(t) = y.truncate {
        v["truncate"] = json!(t);
    }
    v
}

/// The Qwen3-Next family's keys (also the text config of Qwen3.5-MoE).
fn hybrid_json(s: &ShapeSpec) -> Value {
    let ArchSpec::Hybrid(l) = s.spec else {
        return json!({});
    };
    let interval = l.full_attention_interval.max(1);
    let layer_types: Vec<&str> = (0..s.layers)
        .map(|i| {
            if (i + 1).is_multiple_of(interval) {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    json!({
        "attention_bias": false,
        "decoder_sparse_step": 1,
        "full_attention_interval": interval,
        "head_dim": s.head_dim,
        "layer_types": layer_types,
        "linear_conv_kernel_dim": l.conv_kernel,
        "linear_key_head_dim": l.k_head_dim,
        "linear_num_key_heads": l.k_heads,
        "linear_num_value_heads": l.v_heads,
        "linear_value_head_dim": l.v_head_dim,
        "mlp_only_layers": [],
        "moe_intermediate_size": s.moe_intermediate,
        "norm_topk_prob": s.norm_topk_prob,
        "num_experts": s.experts,
        "output_router_logits": false,
        "partial_rotary_factor": l.partial_rotary,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": s.shared_intermediate,
    })
}

/// Qwen3.5-MoE checkpoints are vision-language models: the text settings live under
/// `text_config` (with `rope_parameters`, as the release writes them) and the top level
/// names the wrapper. No `vision_config` is written; there is no vision tower to describe.
fn vl_wrapper(mut text: Value, s: &ShapeSpec, dtype: SynthDtype) -> Value {
    let partial = match s.spec {
        ArchSpec::Hybrid(l) => l.partial_rotary,
        _ => 1.0,
    };
    if let Some(t) = text.as_object_mut() {
        t.insert("model_type".into(), json!("qwen3_5_moe_text"));
        // The release's text config has neither (no dense FFN, no sparse step).
        t.remove("intermediate_size");
        t.remove("decoder_sparse_step");
        t.remove("architectures");
        t.remove("rope_theta");
        t.remove("partial_rotary_factor");
        t.insert(
            "rope_parameters".into(),
            json!({
                "rope_type": "default",
                "rope_theta": s.rope_theta,
                "partial_rotary_factor": partial,
                "mrope_interleaved": true,
                "mrope_section": [11, 11, 10],
            }),
        );
    }
    json!({
        "architectures": [s.arch.architecture()],
        "model_type": s.arch.model_type(),
        "text_config": text,
        "tie_word_embeddings": false,
        "torch_dtype": dtype.torch_name(),
        "transformers_version": s.transformers_version,
    })
}
