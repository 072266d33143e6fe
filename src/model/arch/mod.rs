//! What each architecture calls its tensors and settings in a Hugging Face folder and in a
//! GGUF file, one file per family, so that a GGUF is read as the folder it was converted from:
//! its metadata becomes the `config.json` the folder would have, its tensors the names and
//! orientation the folder's loader asks for.

mod deepseek2;
mod deepseek_v4;
mod glm4_moe;
mod gpt_oss;
mod mixtral;
mod qwen2_moe;
mod qwen3_moe;
mod qwen3_next;

use super::config::{Arch, ConfigError};
use super::gguf::{MetaValue, Metadata};
use serde_json::{json, Map, Value};
use std::path::Path;

/// One GGUF tensor name and the Hugging Face name it becomes. `{i}` stands for the layer and,
/// in stacked expert tensors (`ffn_*_exps`), `{e}` for the expert.
pub type TensorPair = (&'static str, &'static str);

/// How a family's shared expert is stored, under its MoE block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedExpert {
    /// No shared expert.
    None,
    /// A shared expert MLP whose output a one-row sigmoid gate scales (Qwen2-MoE, Qwen3-Next,
    /// Qwen3.5/3.6-MoE): the MLP's and the gate's names.
    Gated { mlp: &'static str, gate: &'static str },
    /// Shared experts summed as they are (DeepSeek-V3, GLM-4.5): the MLP's name.
    Plain(&'static str),
}

/// The names a family's Hugging Face checkpoint gives the parts of a decoder layer that
/// differ between families. The folder loader (`model::load`) asks for these, and a GGUF
/// file's tensors become them through the family's tables (`arch::tests` checks that every
/// table agrees with them).
#[derive(Clone, Copy, Debug)]
pub struct HfNames {
    /// The MoE block under `model.layers.{i}`: `mlp`, or `block_sparse_moe` (Mixtral).
    pub moe_block: &'static str,
    /// The router under the MoE block: `gate`, or `router` (gpt-oss).
    pub router: &'static str,
    /// Each expert's gate, up and down projections under `experts.{e}`.
    pub expert_proj: [&'static str; 3],
    /// Experts stacked in one `gate_up_proj [E, H, 2I]` and one `down_proj` with biases
    /// (gpt-oss's checkpoints) instead of one tensor per expert and projection.
    pub stacked_experts: bool,
    /// The shared expert, if any.
    pub shared: SharedExpert,
    /// The router's `e_score_correction_bias` (DeepSeek-V3, GLM-4.5).
    pub correction_bias: bool,
}

/// The names most families use.
pub const HF_NAMES: HfNames = HfNames {
    moe_block: "mlp",
    router: "gate",
    expert_proj: ["gate_proj", "up_proj", "down_proj"],
    stacked_experts: false,
    shared: SharedExpert::None,
    correction_bias: false,
};

/// How one architecture's checkpoints are named, in a Hugging Face folder and in a GGUF file.
pub struct ArchSpec {
    /// The architecture.
    pub arch: Arch,
    /// `general.architecture` in GGUF.
    pub gguf: &'static str,
    /// `model_type` of the Hugging Face config.
    pub model_type: &'static str,
    /// Names in the Hugging Face checkpoint.
    pub hf: HfNames,
    /// GGUF → Hugging Face tensor names, in tables shared between families.
    pub tensors: &'static [&'static [TensorPair]],
    /// Stacked expert tensors `[E, rows, cols]` → the per-expert names.
    pub experts: &'static [TensorPair],
    /// llama.cpp's converter reorders the rows of `attn_q`/`attn_k` of this family for its
    /// interleaved RoPE; the loader undoes it.
    pub permuted_qk: bool,
    /// The architecture's own config keys, added to the common ones.
    pub config: fn(&GgufKeys, &mut Map<String, Value>) -> Result<(), ConfigError>,
    /// Tensors the family stores in another form than its checkpoint (split, fused or
    /// reordered by llama.cpp's converter), converted back; `None` when the tables suffice.
    /// GGUF tensors absent from both tables are left to this hook.
    pub extra: Option<fn(&super::gguf::load::GgufModel) -> Result<Vec<super::weights_file::ExternalTensor>, super::ModelError>>,
}

/// The llama layout most families keep: embedding, head, attention and the two norms.
pub const LLAMA: &[TensorPair] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
];

/// Embedding, head and the two norms of the families that call the second one
/// `post_attention_norm` (GLM, gpt-oss).
pub const POST_NORM_LAYOUT: &[TensorPair] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("blk.{i}.post_attention_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
];

/// The four attention projections' weights.
pub const ATTN_PROJ: &[TensorPair] = &[
    ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
];

/// Biases on the query, key and value projections (Qwen, GLM, gpt-oss).
pub const QKV_BIAS: &[TensorPair] = &[
    ("blk.{i}.attn_q.bias", "model.layers.{i}.self_attn.q_proj.bias"),
    ("blk.{i}.attn_k.bias", "model.layers.{i}.self_attn.k_proj.bias"),
    ("blk.{i}.attn_v.bias", "model.layers.{i}.self_attn.v_proj.bias"),
];

/// Per-head RMS norms of queries and keys (Qwen3, GLM).
pub const QK_NORM: &[TensorPair] = &[
    ("blk.{i}.attn_q_norm.weight", "model.layers.{i}.self_attn.q_norm.weight"),
    ("blk.{i}.attn_k_norm.weight", "model.layers.{i}.self_attn.k_norm.weight"),
];

/// Every architecture a GGUF file may hold.
pub const SPECS: &[&ArchSpec] = &[&qwen3_moe::SPEC, &qwen2_moe::SPEC, &mixtral::SPEC, &gpt_oss::SPEC, &deepseek2::SPEC, &glm4_moe::SPEC, &qwen3_next::QWEN3_NEXT, &qwen3_next::QWEN35_MOE];

/// The names of `arch`'s checkpoints.
pub fn spec(arch: Arch) -> &'static ArchSpec {
    match arch {
        Arch::Qwen3Moe => &qwen3_moe::SPEC,
        Arch::Qwen2Moe => &qwen2_moe::SPEC,
        Arch::Mixtral => &mixtral::SPEC,
        Arch::GptOss => &gpt_oss::SPEC,
        Arch::DeepseekV3 => &deepseek2::SPEC,
        Arch::Glm4Moe => &glm4_moe::SPEC,
        Arch::Qwen3Next => &qwen3_next::QWEN3_NEXT,
        Arch::Qwen35Moe => &qwen3_next::QWEN35_MOE,
        Arch::DeepseekV4 => &deepseek_v4::SPEC,
    }
}

/// Typed access to GGUF metadata, with errors naming the file and key.
pub struct GgufKeys<'a> {
    /// The metadata.
    pub meta: &'a Metadata,
    /// `general.architecture`: the prefix of the model's keys.
    pub arch: &'a str,
    /// The file, for messages.
    pub path: &'a Path,
    /// Names of the tensors in the file (settings such as biases and dense layers are read
    /// from which tensors exist).
    pub tensors: &'a dyn Fn(&str) -> bool,
}

impl GgufKeys<'_> {
    fn full(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    fn invalid(&self, key: &str, problem: String) -> ConfigError {
        ConfigError::Invalid { path: self.path.into(), key: key.into(), problem }
    }

    /// A model key (`{arch}.key`) as a non-negative integer; a per-layer array must be uniform.
    pub fn usize_opt(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        let full = self.full(key);
        match self.meta.get(&full) {
            None => Ok(None),
            Some(MetaValue::Array(a)) => {
                let v: Option<Vec<u64>> = a.iter().map(MetaValue::as_u64).collect();
                match v.as_deref() {
                    Some([first, rest @ ..]) if rest.iter().all(|x| x == first) => Ok(Some(*first as usize)),
                    Some(_) => Err(self.invalid(&full, "differs between layers, which this engine does not support".into())),
                    None => Err(self.invalid(&full, "must hold non-negative integers".into())),
                }
            }
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| self.invalid(&full, format!("must be a non-negative integer, found {}", v.type_name()))),
        }
    }

    /// A required model key.
    pub fn usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.usize_opt(key)?.ok_or_else(|| ConfigError::Missing { path: self.path.into(), key: self.full(key) })
    }

    /// A model key as a number.
    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        let full = self.full(key);
        match self.meta.get(&full) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.invalid(&full, format!("must be a number, found {}", v.type_name()))),
        }
    }

    /// A model key as a boolean.
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        let full = self.full(key);
        match self.meta.get(&full) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.invalid(&full, format!("must be true or false, found {}", v.type_name()))),
        }
    }

    /// A model key as a string.
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>, ConfigError> {
        let full = self.full(key);
        match self.meta.get(&full) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.invalid(&full, format!("must be a string, found {}", v.type_name()))),
        }
    }

    /// Whether the file has a tensor.
    pub fn has(&self, name: &str) -> bool {
        (self.tensors)(name)
    }

    /// Whether layer `i`'s attention has query/key/value biases (`attn_q.bias`, or
    /// `attn_qkv.bias` in a file converted with llama.cpp's `--fuse-qkv`).
    pub fn has_qkv_bias(&self, i: usize) -> bool {
        self.has(&format!("blk.{i}.attn_q.bias")) || self.has(&format!("blk.{i}.attn_qkv.bias"))
    }

    /// Layers without a router (`blk.N.ffn_gate_inp.weight`): dense MLP layers.
    pub fn dense_layers(&self, layers: usize) -> Vec<usize> {
        (0..layers).filter(|i| !self.has(&format!("blk.{i}.ffn_gate_inp.weight"))).collect()
    }
}

/// The architecture of a GGUF file, by its `general.architecture`.
pub fn spec_for(meta: &Metadata, path: &Path) -> Result<&'static ArchSpec, ConfigError> {
    let arch = match meta.get("general.architecture") {
        Some(v) => v.as_str().ok_or_else(|| ConfigError::Invalid {
            path: path.into(),
            key: "general.architecture".into(),
            problem: format!("must be a string, found {}", v.type_name()),
        })?,
        None => return Err(ConfigError::Missing { path: path.into(), key: "general.architecture".into() }),
    };
    SPECS.iter().copied().find(|s| s.gguf == arch).ok_or_else(|| {
        let known: Vec<&str> = SPECS.iter().map(|s| s.gguf).collect();
        ConfigError::UnsupportedArch { path: path.into(), model_type: format!("{arch} (GGUF general.architecture; supported: {})", known.join(", ")) }
    })
}

/// The `config.json` a Hugging Face folder of this model would have, from GGUF metadata.
pub fn config_json(spec: &ArchSpec, k: &GgufKeys) -> Result<Value, ConfigError> {
    let mut c = Map::new();
    c.insert("model_type".into(), json!(spec.model_type));
    let layers = k.usize("block_count")?;
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("hidden_size".into(), json!(k.usize("embedding_length")?));
    c.insert("num_attention_heads".into(), json!(k.usize("attention.head_count")?));
    if let Some(kv) = k.usize_opt("attention.head_count_kv")? {
        c.insert("num_key_value_heads".into(), json!(kv));
    }
    if let Some(hd) = k.usize_opt("attention.key_length")? {
        c.insert("head_dim".into(), json!(hd));
    }
    if let Some(ff) = k.usize_opt("feed_forward_length")? {
        c.insert("intermediate_size".into(), json!(ff));
    }
    if let Some(ff) = k.usize_opt("expert_feed_forward_length")? {
        c.insert("moe_intermediate_size".into(), json!(ff));
    }
    c.insert("num_experts".into(), json!(k.usize("expert_count")?));
    c.insert("num_experts_per_tok".into(), json!(k.usize("expert_used_count")?));
    if let Some(eps) = k.f64_opt("attention.layer_norm_rms_epsilon")? {
        c.insert("rms_norm_eps".into(), json!(eps));
    }
    c.insert("rope_theta".into(), json!(k.f64_opt("rope.freq_base")?.unwrap_or(10_000.0)));
    if let Some(ctx) = k.usize_opt("context_length")? {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    if let Some(scaling) = rope_scaling(k)? {
        c.insert("rope_scaling".into(), scaling);
    }
    if let Some(v) = k.usize_opt("vocab_size")? {
        c.insert("vocab_size".into(), json!(v));
    }
    c.insert("tie_word_embeddings".into(), json!(!k.has("output.weight")));
    c.insert("mlp_only_layers".into(), json!(k.dense_layers(layers)));
    // End of turn (`eot`) and of message (`eom`, gpt-oss's tool call) end generation too, as
    // in llama.cpp.
    let mut eos: Vec<u64> = vec![];
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = k.meta.get(key).and_then(MetaValue::as_u64) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    if !eos.is_empty() {
        c.insert("eos_token_id".into(), json!(eos));
    }
    if let Some(id) = k.meta.get("tokenizer.ggml.bos_token_id").and_then(MetaValue::as_u64) {
        c.insert("bos_token_id".into(), json!(id));
    }
    (spec.config)(k, &mut c)?;
    Ok(Value::Object(c))
}

/// `rope.scaling.*` as the `rope_scaling` object of a Hugging Face config.
fn rope_scaling(k: &GgufKeys) -> Result<Option<Value>, ConfigError> {
    let Some(kind) = k.str_opt("rope.scaling.type")? else { return Ok(None) };
    let factor = k.f64_opt("rope.scaling.factor")?.unwrap_or(1.0);
    Ok(match kind {
        "none" => None,
        "linear" => Some(json!({"rope_type": "linear", "factor": factor})),
        "yarn" => {
            let mut m = Map::new();
            m.insert("rope_type".into(), json!("yarn"));
            m.insert("factor".into(), json!(factor));
            if let Some(orig) = k.usize_opt("rope.scaling.original_context_length")? {
                m.insert("original_max_position_embeddings".into(), json!(orig));
            }
            for (gguf_key, hf_key) in [("rope.scaling.yarn_beta_fast", "beta_fast"), ("rope.scaling.yarn_beta_slow", "beta_slow")] {
                if let Some(v) = k.f64_opt(gguf_key)? {
                    m.insert(hf_key.into(), json!(v));
                }
            }
            if let Some(v) = k.f64_opt("rope.scaling.yarn_log_multiplier")? {
                m.insert("mscale_all_dim".into(), json!(v / 0.1));
            }
            Some(Value::Object(m))
        }
        other => return Err(k.invalid(&k.full("rope.scaling.type"), format!("`{other}` is not supported (none, linear, yarn)"))),
    })
}

/// The Hugging Face name of GGUF tensor `name` (`None` when the family does not use it);
/// `Some((hf, true))` when it is a stacked expert tensor whose HF name still holds `{e}`.
pub fn hf_name(spec: &ArchSpec, name: &str) -> Option<(String, bool)> {
    let (layer, rest) = match name.strip_prefix("blk.") {
        Some(r) => {
            let (n, rest) = r.split_once('.')?;
            (Some(n.parse::<usize>().ok()?), rest)
        }
        None => (None, name),
    };
    let lookup = |table: &[TensorPair], stacked: bool| {
        table.iter().find_map(|(g, h)| {
            let g_rest = match layer {
                Some(_) => g.strip_prefix("blk.{i}.")?,
                None if g.starts_with("blk.") => return None,
                None => g,
            };
            (g_rest == rest).then(|| (layer.map_or_else(|| h.to_string(), |i| h.replace("{i}", &i.to_string())), stacked))
        })
    };
    spec.tensors.iter().find_map(|t| lookup(t, false)).or_else(|| lookup(spec.experts, true))
}

/// The GGUF name of Hugging Face tensor `hf` (the reverse of [`hf_name`]), for messages.
pub fn gguf_name(spec: &ArchSpec, hf: &str) -> Option<String> {
    // Layer and expert numbers are the only digits-only path segments of the HF names.
    let (mut layer, mut expert) = (None, None);
    let template: Vec<String> = hf
        .split('.')
        .map(|seg| match seg.parse::<usize>() {
            Ok(n) if layer.is_none() => {
                layer = Some(n);
                "{i}".to_string()
            }
            Ok(n) => {
                expert = Some(n);
                "{e}".to_string()
            }
            Err(_) => seg.to_string(),
        })
        .collect();
    let template = template.join(".");
    let mut tables = if expert.is_some() { vec![spec.experts] } else { spec.tensors.to_vec() }.into_iter();
    let (g, _) = tables.find_map(|t| t.iter().find(|(_, h)| *h == template))?;
    let g = layer.map_or_else(|| g.to_string(), |i| g.replace("{i}", &i.to_string()));
    Some(match expert {
        Some(e) => format!("{g}[{e}]"),
        None => g,
    })
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
#[cfg(test)]
mod test_meta;
