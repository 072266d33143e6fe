//! DeepSeek-V4's own settings: hyper-connections, the three attention kinds with their
//! compressors and indexer, hash-routed MoE layers and the two RoPE settings. Both the
//! current transformers keys (`layer_types`, `mlp_layer_types`, nested `rope_parameters`) and
//! the legacy keys the published checkpoints ship (`compress_ratios`, `num_hash_layers`,
//! `qk_rope_head_dim`, flat `rope_scaling` + `compress_rope_theta`) are read.

use super::keys::Keys;
use super::rope::rope_config;
use super::{ConfigError, RopeConfig};
use serde_json::{Map, Value};

/// What a DeepSeek-V4 layer attends over besides its sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum V4Attention {
    /// The last `sliding_window` tokens only.
    Sliding,
    /// Plus compressed entries (one per `rate` tokens, overlapping windows) that a lightning
    /// indexer picks per query (CSA).
    CompressedSparse,
    /// Plus every compressed entry (one per `rate` tokens, disjoint windows; HCA).
    HeavilyCompressed,
}

/// DeepSeek-V4 settings beyond the common [`super::ModelConfig`] ones.
#[derive(Clone, Debug, PartialEq)]
pub struct V4Config {
    /// Residual streams per token (`hc_mult`).
    pub hc_mult: usize,
    /// Sinkhorn iterations that make the stream-mixing matrix doubly stochastic.
    pub hc_sinkhorn_iters: usize,
    /// Added to the hyper-connection weights and Sinkhorn denominators.
    pub hc_eps: f32,
    /// Each layer's attention kind.
    pub attention: Vec<V4Attention>,
    /// Each layer routes by the token-id table (`hash_moe`) rather than by score.
    pub hash_routed: Vec<bool>,
    /// Tokens per compressed entry in CSA layers.
    pub csa_rate: usize,
    /// Tokens per compressed entry in HCA layers.
    pub hca_rate: usize,
    /// Keys of the sliding window, the query's own included.
    pub sliding_window: usize,
    /// Rank of the query compression (`q_lora_rank`).
    pub q_lora_rank: usize,
    /// Groups of heads of the grouped output projection.
    pub o_groups: usize,
    /// Width each group is projected to before `o_b_proj`.
    pub o_lora_rank: usize,
    /// Indexer query heads.
    pub index_heads: usize,
    /// Indexer head size.
    pub index_head_dim: usize,
    /// Compressed entries the indexer keeps per query.
    pub index_topk: usize,
    /// Clamp of the SwiGLU inputs of every expert and the shared expert.
    pub swiglu_limit: f32,
    /// RoPE of sliding-only layers (`main`).
    pub rope_main: RopeConfig,
    /// RoPE of compressed layers, their compressors and indexer (`compress`).
    pub rope_compress: RopeConfig,
}

impl V4Config {
    /// Tokens per compressed entry of a layer kind (0 for sliding layers).
    pub fn rate(&self, kind: V4Attention) -> usize {
        match kind {
            V4Attention::Sliding => 0,
            V4Attention::CompressedSparse => self.csa_rate,
            V4Attention::HeavilyCompressed => self.hca_rate,
        }
    }
}

const CSA: &str = "compressed_sparse_attention";
const HCA: &str = "heavily_compressed_attention";

/// Reads the V4 settings of a config object whose `head_dim` is `head_dim`.
pub(super) fn v4_config(k: &Keys, num_layers: usize, head_dim: usize) -> Result<V4Config, ConfigError> {
    let rates = k.find(&["compress_rates"]).and_then(|(_, v)| v.as_object());
    let rate_of = |name: &str, legacy: &str, default: usize| -> Result<usize, ConfigError> {
        let from_dict = match rates {
            Some(r) => Keys { obj: r, path: k.path }.usize_opt(&[name])?,
            None => None,
        };
        let rate = from_dict.or(k.usize_opt(&[legacy])?).unwrap_or(default);
        if rate == 0 {
            return Err(k.invalid("compress_rates", format!("`{name}` must be at least 1")));
        }
        Ok(rate)
    };
    let csa_rate = rate_of(CSA, "compress_rate_csa", 4)?;
    let hca_rate = rate_of(HCA, "compress_rate_hca", 128)?;

    let attention = match per_layer(k, "layer_types", num_layers, |n| match n {
        "sliding_attention" => Some(V4Attention::Sliding),
        CSA => Some(V4Attention::CompressedSparse),
        HCA => Some(V4Attention::HeavilyCompressed),
        _ => None,
    }, "a DeepSeek-V4 layer type (sliding_attention, compressed_sparse_attention, heavily_compressed_attention)")? {
        Some(kinds) => kinds,
        None => match k.find(&["compress_ratios"]) {
            Some((_, Value::Array(ratios))) => ratios
                .iter()
                .take(num_layers)
                .map(|r| match r.as_u64() {
                    Some(0) => Ok(V4Attention::Sliding),
                    Some(r) if r as usize == csa_rate => Ok(V4Attention::CompressedSparse),
                    Some(r) if r as usize == hca_rate => Ok(V4Attention::HeavilyCompressed),
                    _ => Err(k.invalid("compress_ratios", format!("entry {r} is neither 0, the CSA rate {csa_rate} nor the HCA rate {hca_rate}"))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(k.invalid("compress_ratios", "must be a list of integers")),
            // transformers' default: two HCA layers, then CSA and HCA alternating.
            None => (0..num_layers)
                .map(|i| if i < 2 || i % 2 == 0 { V4Attention::HeavilyCompressed } else { V4Attention::CompressedSparse })
                .collect(),
        },
    };
    if attention.len() != num_layers {
        return Err(k.invalid("compress_ratios", format!("lists {} layers, num_hidden_layers is {num_layers}", attention.len())));
    }

    let hash_routed = match per_layer(k, "mlp_layer_types", num_layers, |n| match n {
        "hash_moe" => Some(true),
        "moe" => Some(false),
        _ => None,
    }, "a DeepSeek-V4 MLP type (hash_moe, moe)")? {
        Some(hashed) => hashed,
        None => {
            let n_hash = k.usize_opt(&["num_hash_layers"])?.unwrap_or(3);
            (0..num_layers).map(|i| i < n_hash).collect()
        }
    };

    if let Some((key, v)) = k.find(&["scoring_func"]) {
        if v.as_str() != Some("sqrtsoftplus") {
            return Err(k.invalid(key, format!("{v} is not supported for DeepSeek-V4 (sqrtsoftplus)")));
        }
    }
    let (rope_main, rope_compress) = v4_rope(k, head_dim)?;
    let positive = |key: &str, default: usize| -> Result<usize, ConfigError> {
        let v = k.usize_opt(&[key])?.unwrap_or(default);
        if v == 0 {
            return Err(k.invalid(key, "must be at least 1"));
        }
        Ok(v)
    };
    let cfg = V4Config {
        hc_mult: positive("hc_mult", 4)?,
        hc_sinkhorn_iters: positive("hc_sinkhorn_iters", 20)?,
        hc_eps: k.f32_opt(&["hc_eps"])?.unwrap_or(1e-6),
        attention,
        hash_routed,
        csa_rate,
        hca_rate,
        sliding_window: positive("sliding_window", 128)?,
        q_lora_rank: positive("q_lora_rank", 1024)?,
        o_groups: positive("o_groups", 8)?,
        o_lora_rank: positive("o_lora_rank", 1024)?,
        index_heads: positive("index_n_heads", 64)?,
        index_head_dim: positive("index_head_dim", 128)?,
        index_topk: positive("index_topk", 512)?,
        swiglu_limit: k.f32_opt(&["swiglu_limit"])?.unwrap_or(10.0),
        rope_main,
        rope_compress,
    };
    if cfg.swiglu_limit.is_nan() || cfg.swiglu_limit < 0.0 {
        return Err(k.invalid("swiglu_limit", "must be a number >= 0"));
    }
    Ok(cfg)
}

/// A per-layer list of names (`layer_types`, `mlp_layer_types`) read by `parse`, `None` when
/// absent; its length must be the layer count, each name one `parse` knows (`what` says which).
fn per_layer<T>(k: &Keys, key: &str, num_layers: usize, parse: impl Fn(&str) -> Option<T>, what: &str) -> Result<Option<Vec<T>>, ConfigError> {
    let Some(names) = k.strings(key)? else { return Ok(None) };
    if names.len() != num_layers {
        return Err(k.invalid(key, format!("lists {} layers, num_hidden_layers is {num_layers}", names.len())));
    }
    names.iter().map(|n| parse(n).ok_or_else(|| k.invalid(key, format!("`{n}` is not {what}")))).collect::<Result<Vec<_>, _>>().map(Some)
}

/// The `main` and `compress` RoPE settings: nested `rope_parameters`, or built from the legacy
/// flat keys the way transformers' config does (yarn only on the compressed branch, with
/// `attention_factor` 1).
fn v4_rope(k: &Keys, head_dim: usize) -> Result<(RopeConfig, RopeConfig), ConfigError> {
    let partial = match k.usize_opt(&["qk_rope_head_dim"])? {
        Some(r) if k.find(&["partial_rotary_factor"]).is_none() => r as f64 / head_dim.max(1) as f64,
        _ => k.f32_opt(&["partial_rotary_factor"])?.map_or(64.0 / 512.0, f64::from),
    };
    let params = k.find(&["rope_parameters"]).and_then(|(_, v)| v.as_object());
    let nested = params.and_then(|p| Some((p.get("main")?.as_object()?, p.get("compress")?.as_object()?)));
    let max_pos = k.find(&["max_position_embeddings"]).map(|(_, v)| v.clone());
    // `rope_config` reads a config object; give it one holding just this branch.
    let branch = |sub: Map<String, Value>| -> Result<RopeConfig, ConfigError> {
        let mut obj = Map::new();
        obj.insert("rope_parameters".into(), Value::Object(sub));
        if let Some(m) = &max_pos {
            obj.insert("max_position_embeddings".into(), m.clone());
        }
        rope_config(&obj, k.path, head_dim)
    };
    if let Some((main, compress)) = nested {
        let mut main = main.clone();
        let mut compress = compress.clone();
        for m in [&mut main, &mut compress] {
            m.entry("partial_rotary_factor").or_insert(Value::from(partial));
        }
        return Ok((branch(main)?, branch(compress)?));
    }
    let theta = k.f32_opt(&["rope_theta"])?.unwrap_or(10000.0);
    let compress_theta = k.f32_opt(&["compress_rope_theta"])?.unwrap_or(160000.0);
    let mut main = Map::new();
    main.insert("rope_type".into(), "default".into());
    main.insert("rope_theta".into(), Value::from(theta));
    main.insert("partial_rotary_factor".into(), Value::from(partial));
    let flat = k.find(&["rope_scaling"]).or(k.find(&["rope_parameters"])).and_then(|(_, v)| v.as_object().cloned());
    let mut compress: Map<String, Value> = flat.unwrap_or_default();
    if let Some(t) = compress.remove("type") {
        compress.entry("rope_type").or_insert(t);
    }
    compress.insert("rope_theta".into(), Value::from(compress_theta));
    compress.insert("partial_rotary_factor".into(), Value::from(partial));
    compress.entry("rope_type").or_insert("default".into());
    if compress.get("rope_type").and_then(Value::as_str) == Some("yarn") {
        compress.entry("attention_factor").or_insert(Value::from(1.0));
    }
    Ok((branch(main)?, branch(compress)?))
}

/// Checks the V4 settings against the common ones they depend on.
pub(super) fn check(k: &Keys, v4: &V4Config, num_heads: usize, head_dim: usize) -> Result<(), ConfigError> {
    if !(num_heads * head_dim).is_multiple_of(v4.o_groups) {
        return Err(k.invalid("o_groups", format!("({}) must divide num_attention_heads × head_dim ({})", v4.o_groups, num_heads * head_dim)));
    }
    let rope = |r: &RopeConfig| ((head_dim as f32 * r.partial_rotary_factor) as usize) & !1;
    if rope(&v4.rope_compress) > v4.index_head_dim || rope(&v4.rope_main) > head_dim {
        return Err(k.invalid("partial_rotary_factor", "rotates more channels than a head (or an indexer head) has"));
    }
    Ok(())
}
