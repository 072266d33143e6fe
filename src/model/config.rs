//! `config.json` of a Hugging Face checkpoint, normalised into one [`ModelConfig`].
//!
//! Hub configs name the same thing differently across families (`num_experts` vs
//! `num_local_experts` vs `n_routed_experts`, top-level `rope_theta`/`rope_scaling` vs
//! transformers 5's `rope_parameters`), so parsing goes through a tolerant key lookup and
//! every architecture-specific default is decided here, once.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A problem with `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    /// A required key is absent.
    #[error("{path}: missing key `{key}`")]
    Missing { path: PathBuf, key: String },
    /// A key has the wrong type or an impossible value.
    #[error("{path}: key `{key}` {problem}")]
    Invalid { path: PathBuf, key: String, problem: String },
    /// The `model_type` is not one this build can run.
    #[error("{path}: model_type `{model_type}` is not supported (supported: {})", Arch::SUPPORTED.join(", "))]
    UnsupportedArch { path: PathBuf, model_type: String },
}

/// The model families the engine implements, chosen by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Qwen3-MoE (q/k RMSNorm, softmax top-k routing).
    Qwen3Moe,
    /// Qwen1.5/Qwen2-MoE (q/k/v bias, sigmoid-gated shared expert).
    Qwen2Moe,
    /// Mixtral (softmax top-k, always renormalised).
    Mixtral,
    /// GLM-4.5 MoE (sigmoid routing with correction bias, partial rotary, shared expert).
    Glm4Moe,
}

impl Arch {
    /// `model_type` strings accepted, in the order they are listed to users.
    pub const SUPPORTED: [&'static str; 4] = ["qwen3_moe", "qwen2_moe", "mixtral", "glm4_moe"];

    /// The architecture for a `model_type`.
    pub fn from_model_type(s: &str) -> Option<Arch> {
        match s {
            "qwen3_moe" => Some(Arch::Qwen3Moe),
            "qwen2_moe" => Some(Arch::Qwen2Moe),
            "mixtral" => Some(Arch::Mixtral),
            "glm4_moe" => Some(Arch::Glm4Moe),
            _ => None,
        }
    }

    /// The `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen2Moe => "qwen2_moe",
            Arch::Mixtral => "mixtral",
            Arch::Glm4Moe => "glm4_moe",
        }
    }
}

/// How RoPE frequencies are derived from the base ones.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain `theta^(-2i/d)`.
    None,
    /// Positions divided by `factor` (frequencies scaled by `1/factor`).
    Linear { factor: f32 },
    /// YaRN: blend of interpolated and extrapolated frequencies plus attention scaling.
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
        mscale: f32,
        mscale_all_dim: f32,
        attention_factor: Option<f32>,
        truncate: bool,
    },
    /// Llama-3 style wavelength-dependent scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position: usize },
}

/// Rotary embedding settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base `theta`.
    pub theta: f32,
    /// Fraction of the head dimension that is rotated.
    pub partial_rotary_factor: f32,
    /// Frequency scaling.
    pub scaling: RopeScaling,
}

/// How router logits become expert choices and combine weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RoutingKind {
    /// Softmax over all experts, then top-k (Qwen, Mixtral).
    SoftmaxTopK,
    /// Sigmoid scores; top-k on `score + e_score_correction_bias` within the best
    /// `topk_group` of `n_group` groups; weights are the unbiased scores (GLM, DeepSeek-V3).
    SigmoidGroupLimited { n_group: usize, topk_group: usize },
}

/// Everything the engine needs from `config.json`, with architecture defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Family.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding and lm_head).
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Intermediate size of dense MLP layers.
    pub intermediate_size: usize,
    /// Intermediate size of each routed expert.
    pub moe_intermediate_size: usize,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Renormalise the chosen weights to sum to one.
    pub norm_topk_prob: bool,
    /// Multiplies the final routed weights.
    pub routed_scaling_factor: f32,
    /// Router scoring.
    pub routing: RoutingKind,
    /// Intermediate size of the shared expert(s), 0 when there is none.
    pub shared_intermediate_size: usize,
    /// Whether the shared expert output is gated by `sigmoid(x · w_gate)` (Qwen2-MoE).
    pub shared_expert_gated: bool,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE.
    pub qk_norm: bool,
    /// Which layers are MoE (true) or dense MLP (false).
    pub moe_layers: Vec<bool>,
    /// Token ids that end generation, from config.json (generation_config.json adds more).
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence id, if the model has one.
    pub bos_token_id: Option<u32>,
}

/// Tolerant typed access to a JSON object, with errors naming the file and key.
struct Keys<'a> {
    obj: &'a Map<String, Value>,
    path: &'a Path,
}

impl<'a> Keys<'a> {
    fn invalid(&self, key: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { path: self.path.to_path_buf(), key: key.into(), problem: problem.into() }
    }
    /// The first of `keys` that is present and not null.
    fn find(&self, keys: &[&str]) -> Option<(&'a str, &'a Value)> {
        keys.iter().find_map(|k| {
            self.obj.get_key_value(*k).filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.as_str(), v))
        })
    }
    fn usize_opt(&self, keys: &[&str]) -> Result<Option<usize>, ConfigError> {
        match self.find(keys) {
            None => Ok(None),
            Some((k, v)) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| self.invalid(k, format!("must be a non-negative integer, found {v}"))),
        }
    }
    fn usize(&self, keys: &[&str]) -> Result<usize, ConfigError> {
        self.usize_opt(keys)?
            .ok_or_else(|| ConfigError::Missing { path: self.path.to_path_buf(), key: keys.join("` or `") })
    }
    fn f32_opt(&self, keys: &[&str]) -> Result<Option<f32>, ConfigError> {
        match self.find(keys) {
            None => Ok(None),
            Some((k, v)) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.invalid(k, format!("must be a number, found {v}"))),
        }
    }
    fn bool_opt(&self, keys: &[&str]) -> Result<Option<bool>, ConfigError> {
        match self.find(keys) {
            None => Ok(None),
            Some((k, v)) => v.as_bool().map(Some).ok_or_else(|| self.invalid(k, format!("must be true or false, found {v}"))),
        }
    }
    /// An id or list of ids (`eos_token_id` may be either).
    fn ids(&self, key: &str) -> Result<Vec<u32>, ConfigError> {
        match self.find(&[key]) {
            None => Ok(vec![]),
            Some((_, Value::Array(a))) => a
                .iter()
                .map(|v| v.as_u64().map(|x| x as u32).ok_or_else(|| self.invalid(key, "must hold integers")))
                .collect(),
            Some((_, v)) => v.as_u64().map(|x| vec![x as u32]).ok_or_else(|| self.invalid(key, "must be an integer or a list")),
        }
    }
}

impl ModelConfig {
    /// Reads and normalises `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<ModelConfig, ConfigError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io { path: path.clone(), source })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| ConfigError::Json { path: path.clone(), source })?;
        Self::from_json(&value, &path)
    }

    /// Normalises a parsed config; `path` is only used in error messages.
    pub fn from_json(value: &Value, path: &Path) -> Result<ModelConfig, ConfigError> {
        let root = value.as_object().ok_or_else(|| ConfigError::Invalid {
            path: path.into(),
            key: "<root>".into(),
            problem: "must be a JSON object".into(),
        })?;
        // Multimodal wrappers keep the language model's settings under `text_config`.
        let obj = match root.get("text_config") {
            Some(Value::Object(t)) => t,
            _ => root,
        };
        let k = Keys { obj, path };
        let model_type = Keys { obj: root, path }
            .find(&["model_type"])
            .and_then(|(_, v)| v.as_str())
            .or_else(|| k.find(&["model_type"]).and_then(|(_, v)| v.as_str()))
            .ok_or_else(|| ConfigError::Missing { path: path.into(), key: "model_type".into() })?;
        let arch = Arch::from_model_type(model_type)
            .ok_or_else(|| ConfigError::UnsupportedArch { path: path.into(), model_type: model_type.into() })?;

        let hidden_size = k.usize(&["hidden_size"])?;
        let num_layers = k.usize(&["num_hidden_layers"])?;
        let num_heads = k.usize(&["num_attention_heads"])?;
        let num_kv_heads = k.usize_opt(&["num_key_value_heads"])?.unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(k.invalid(
                "num_key_value_heads",
                format!("({num_kv_heads}) must divide num_attention_heads ({num_heads})"),
            ));
        }
        let head_dim = k.usize_opt(&["head_dim"])?.unwrap_or(hidden_size / num_heads);
        let intermediate_size = k.usize(&["intermediate_size"])?;
        let num_experts = k.usize(&["num_experts", "num_local_experts", "n_routed_experts"])?;
        let top_k = k.usize(&["num_experts_per_tok"])?;
        if top_k == 0 || top_k > num_experts {
            return Err(k.invalid("num_experts_per_tok", format!("({top_k}) must be in 1..={num_experts}")));
        }
        let moe_intermediate_size = match arch {
            Arch::Mixtral => intermediate_size,
            _ => k.usize(&["moe_intermediate_size"])?,
        };

        let (norm_topk_prob, routing, shared_intermediate_size, shared_expert_gated) = match arch {
            Arch::Qwen3Moe => (k.bool_opt(&["norm_topk_prob"])?.unwrap_or(false), RoutingKind::SoftmaxTopK, 0, false),
            Arch::Qwen2Moe => (
                k.bool_opt(&["norm_topk_prob"])?.unwrap_or(false),
                RoutingKind::SoftmaxTopK,
                k.usize_opt(&["shared_expert_intermediate_size"])?.unwrap_or(0),
                true,
            ),
            Arch::Mixtral => (true, RoutingKind::SoftmaxTopK, 0, false),
            Arch::Glm4Moe => {
                let n_group = k.usize_opt(&["n_group"])?.unwrap_or(1).max(1);
                let topk_group = k.usize_opt(&["topk_group"])?.unwrap_or(1).max(1);
                if num_experts % n_group != 0 || topk_group > n_group {
                    return Err(k.invalid("n_group", format!("{n_group} groups / {topk_group} chosen do not fit {num_experts} experts")));
                }
                let shared = k.usize_opt(&["n_shared_experts"])?.unwrap_or(0) * moe_intermediate_size;
                (k.bool_opt(&["norm_topk_prob"])?.unwrap_or(true), RoutingKind::SigmoidGroupLimited { n_group, topk_group }, shared, false)
            }
        };

        let moe_layers = moe_layer_map(arch, &k, num_layers)?;
        let rope = rope_config(obj, path, head_dim)?;
        let qkv_bias = match arch {
            Arch::Qwen2Moe => k.bool_opt(&["qkv_bias"])?.unwrap_or(true),
            Arch::Glm4Moe | Arch::Qwen3Moe => k.bool_opt(&["attention_bias"])?.unwrap_or(false),
            Arch::Mixtral => false,
        };
        let qk_norm = match arch {
            Arch::Qwen3Moe => true,
            Arch::Glm4Moe => k.bool_opt(&["use_qk_norm"])?.unwrap_or(false),
            _ => false,
        };
        let mut eos_token_ids = k.ids("eos_token_id")?;
        if eos_token_ids.is_empty() {
            eos_token_ids = Keys { obj: root, path }.ids("eos_token_id")?;
        }
        let bos_token_id = k.ids("bos_token_id")?.first().copied();

        Ok(ModelConfig {
            arch,
            vocab_size: k.usize(&["vocab_size"])?,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            moe_intermediate_size,
            num_experts,
            top_k,
            norm_topk_prob,
            routed_scaling_factor: k.f32_opt(&["routed_scaling_factor"])?.unwrap_or(1.0),
            routing,
            shared_intermediate_size,
            shared_expert_gated,
            rms_norm_eps: k.f32_opt(&["rms_norm_eps"])?.unwrap_or(1e-6),
            rope,
            max_position_embeddings: k.usize_opt(&["max_position_embeddings"])?.unwrap_or(4096),
            tie_word_embeddings: k
                .bool_opt(&["tie_word_embeddings"])?
                .or(Keys { obj: root, path }.bool_opt(&["tie_word_embeddings"])?)
                .unwrap_or(false),
            qkv_bias,
            qk_norm,
            moe_layers,
            eos_token_ids,
            bos_token_id,
        })
    }

    /// Number of rotated dimensions per head (even).
    pub fn rotary_dim(&self) -> usize {
        ((self.head_dim as f32 * self.rope.partial_rotary_factor) as usize) & !1
    }

    /// Number of MoE layers.
    pub fn num_moe_layers(&self) -> usize {
        self.moe_layers.iter().filter(|m| **m).count()
    }
}

/// Which layers are sparse, honouring `mlp_only_layers`, `decoder_sparse_step` and
/// `first_k_dense_replace`.
fn moe_layer_map(arch: Arch, k: &Keys, num_layers: usize) -> Result<Vec<bool>, ConfigError> {
    Ok(match arch {
        Arch::Qwen3Moe | Arch::Qwen2Moe => {
            let step = k.usize_opt(&["decoder_sparse_step"])?.unwrap_or(1);
            let dense: Vec<usize> = match k.find(&["mlp_only_layers"]) {
                None => vec![],
                Some((key, Value::Array(a))) => a
                    .iter()
                    .map(|v| v.as_u64().map(|x| x as usize).ok_or_else(|| k.invalid(key, "must hold layer indices")))
                    .collect::<Result<_, _>>()?,
                Some((key, _)) => return Err(k.invalid(key, "must be a list of layer indices")),
            };
            (0..num_layers).map(|i| !dense.contains(&i) && step > 0 && (i + 1) % step == 0).collect()
        }
        Arch::Mixtral => vec![true; num_layers],
        Arch::Glm4Moe => {
            let first_dense = k.usize_opt(&["first_k_dense_replace"])?.unwrap_or(0);
            (0..num_layers).map(|i| i >= first_dense).collect()
        }
    })
}

/// Reads RoPE settings from transformers 5's `rope_parameters` or the older top-level
/// `rope_theta` + `rope_scaling` keys.
fn rope_config(obj: &Map<String, Value>, path: &Path, head_dim: usize) -> Result<RopeConfig, ConfigError> {
    let empty = Map::new();
    let params = match obj.get("rope_parameters") {
        Some(Value::Object(p)) => p,
        _ => &empty,
    };
    let scaling = match obj.get("rope_scaling") {
        Some(Value::Object(s)) => s,
        _ => params,
    };
    let p = Keys { obj: params, path };
    let top = Keys { obj, path };
    let s = Keys { obj: scaling, path };
    let theta = p.f32_opt(&["rope_theta"])?.or(top.f32_opt(&["rope_theta"])?).unwrap_or(10000.0);
    let partial_rotary_factor =
        p.f32_opt(&["partial_rotary_factor"])?.or(top.f32_opt(&["partial_rotary_factor"])?).unwrap_or(1.0);
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) || head_dim == 0 {
        return Err(top.invalid("partial_rotary_factor", format!("must be in (0, 1], found {partial_rotary_factor}")));
    }
    let rope_type = s
        .find(&["rope_type", "type"])
        .and_then(|(_, v)| v.as_str())
        .unwrap_or("default")
        .to_string();
    let factor = s.f32_opt(&["factor"])?.unwrap_or(1.0);
    let original = s
        .usize_opt(&["original_max_position_embeddings"])?
        .or(top.usize_opt(&["original_max_position_embeddings"])?);
    let scaling = match rope_type.as_str() {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor },
        "yarn" => RopeScaling::Yarn {
            factor,
            original_max_position: original
                .or(top.usize_opt(&["max_position_embeddings"])?.map(|m| (m as f32 / factor) as usize))
                .unwrap_or(4096),
            beta_fast: s.f32_opt(&["beta_fast"])?.unwrap_or(32.0),
            beta_slow: s.f32_opt(&["beta_slow"])?.unwrap_or(1.0),
            mscale: s.f32_opt(&["mscale"])?.unwrap_or(1.0),
            mscale_all_dim: s.f32_opt(&["mscale_all_dim"])?.unwrap_or(0.0),
            attention_factor: s.f32_opt(&["attention_factor"])?,
            truncate: s.bool_opt(&["truncate"])?.unwrap_or(true),
        },
        "llama3" => RopeScaling::Llama3 {
            factor,
            low_freq_factor: s.f32_opt(&["low_freq_factor"])?.unwrap_or(1.0),
            high_freq_factor: s.f32_opt(&["high_freq_factor"])?.unwrap_or(4.0),
            original_max_position: original.unwrap_or(8192),
        },
        other => {
            return Err(ConfigError::Invalid {
                path: path.into(),
                key: "rope_type".into(),
                problem: format!("`{other}` is not supported (supported: default, linear, yarn, llama3)"),
            })
        }
    };
    Ok(RopeConfig { theta, partial_rotary_factor, scaling })
}

#[cfg(test)]
mod tests {
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
}
