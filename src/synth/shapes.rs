//! The real model shapes `synth` can imitate, and the list of tensors each one has.
//!
//! Values are those of the published Hugging Face `config.json` files; tensor names and
//! layouts are the original hub layout (per-expert weights, row-major `[out, in]`), as
//! transformers' modeling files name them.

use super::{SynthDtype, SynthError};

/// Model family; decides tensor names and the `config.json` key set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `qwen3_moe`: QK-norm, softmax top-k routing, no shared expert.
    Qwen3Moe,
    /// `qwen2_moe`: q/k/v bias, routed experts plus a sigmoid-gated shared expert.
    Qwen2Moe,
    /// `mixtral`: `block_sparse_moe` with `w1/w2/w3` experts.
    Mixtral,
    /// `glm4_moe`: sigmoid routing with `e_score_correction_bias`, shared experts, dense
    /// first layers, attention bias, partial rotary.
    Glm4Moe,
}

impl Arch {
    /// The `model_type` string of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen2Moe => "qwen2_moe",
            Arch::Mixtral => "mixtral",
            Arch::Glm4Moe => "glm4_moe",
        }
    }

    /// The `architectures[0]` class name of `config.json`.
    pub fn architecture(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
            Arch::Qwen2Moe => "Qwen2MoeForCausalLM",
            Arch::Mixtral => "MixtralForCausalLM",
            Arch::Glm4Moe => "Glm4MoeForCausalLM",
        }
    }

    /// Whether the real `config.json` carries `head_dim` (otherwise it is
    /// `hidden_size / num_attention_heads`).
    pub fn head_dim_in_config(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Glm4Moe)
    }
}

/// Dimensions of one known model (or of a scaled-down variant after overrides).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeSpec {
    /// Canonical short name accepted by `SynthOptions::like`.
    pub name: &'static str,
    /// Other accepted names (lower case, without the `org/` prefix).
    pub aliases: &'static [&'static str],
    /// Model family.
    pub arch: Arch,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// Routed expert FFN width (`moe_intermediate_size`; Mixtral's `intermediate_size`).
    pub moe_intermediate: usize,
    /// Dense FFN width (`intermediate_size`), used by dense layers.
    pub intermediate: usize,
    /// Shared expert FFN width, 0 when the model has none.
    pub shared_intermediate: usize,
    /// Number of leading dense (non-MoE) layers.
    pub first_dense_layers: usize,
    /// `vocab_size`.
    pub vocab: usize,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k.
    pub qk_norm: bool,
    /// `max_window_layers` of the Qwen configs (unused unless sliding window is on).
    pub max_window_layers: usize,
    /// `transformers_version` the real config was written with.
    pub transformers_version: &'static str,
}

/// The shapes `synth` knows, with the values of their hub `config.json`.
pub fn known_shapes() -> &'static [ShapeSpec] {
    &SHAPES
}

static SHAPES: [ShapeSpec; 5] = [
    ShapeSpec {
        name: "qwen3-30b-a3b",
        aliases: &["qwen3-30b-a3b-instruct-2507", "qwen3-30b-a3b-thinking-2507"],
        arch: Arch::Qwen3Moe,
        hidden: 2048,
        layers: 48,
        heads: 32,
        kv_heads: 4,
        head_dim: 128,
        experts: 128,
        top_k: 8,
        moe_intermediate: 768,
        intermediate: 6144,
        shared_intermediate: 0,
        first_dense_layers: 0,
        vocab: 151936,
        max_position_embeddings: 40960,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        norm_topk_prob: true,
        qkv_bias: false,
        qk_norm: true,
        max_window_layers: 48,
        transformers_version: "4.51.0",
    },
    ShapeSpec {
        name: "qwen3-235b-a22b",
        aliases: &[
            "qwen3-235b-a22b-instruct-2507",
            "qwen3-235b-a22b-thinking-2507",
        ],
        arch: Arch::Qwen3Moe,
        hidden: 4096,
        layers: 94,
        heads: 64,
        kv_heads: 4,
        head_dim: 128,
        experts: 128,
        top_k: 8,
        moe_intermediate: 1536,
        intermediate: 12288,
        shared_intermediate: 0,
        first_dense_layers: 0,
        vocab: 151936,
        max_position_embeddings: 40960,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        norm_topk_prob: true,
        qkv_bias: false,
        qk_norm: true,
        max_window_layers: 94,
        transformers_version: "4.51.0",
    },
    ShapeSpec {
        name: "qwen2-57b-a14b",
        aliases: &["qwen2-57b-a14b-instruct"],
        arch: Arch::Qwen2Moe,
        hidden: 3584,
        layers: 28,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
        experts: 64,
        top_k: 8,
        moe_intermediate: 2560,
        intermediate: 18944,
        shared_intermediate: 20480,
        first_dense_layers: 0,
        vocab: 151936,
        // Assumption: the base model's config value (the instruct card quotes 65536 usable).
        max_position_embeddings: 131072,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        norm_topk_prob: false,
        qkv_bias: true,
        qk_norm: false,
        max_window_layers: 28,
        transformers_version: "4.40.1",
    },
    ShapeSpec {
        name: "mixtral-8x7b",
        aliases: &["mixtral-8x7b-v0.1", "mixtral-8x7b-instruct-v0.1"],
        arch: Arch::Mixtral,
        hidden: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        experts: 8,
        top_k: 2,
        moe_intermediate: 14336,
        intermediate: 14336,
        shared_intermediate: 0,
        first_dense_layers: 0,
        vocab: 32000,
        max_position_embeddings: 32768,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-5,
        norm_topk_prob: true,
        qkv_bias: false,
        qk_norm: false,
        max_window_layers: 0,
        transformers_version: "4.36.0.dev0",
    },
    ShapeSpec {
        name: "glm-4.5-air",
        aliases: &["glm4.5-air", "glm-4.5-air-base"],
        arch: Arch::Glm4Moe,
        hidden: 4096,
        layers: 46,
        heads: 96,
        kv_heads: 8,
        head_dim: 128,
        experts: 128,
        top_k: 8,
        moe_intermediate: 1408,
        intermediate: 10944,
        // One shared expert of moe_intermediate_size (n_shared_experts = 1).
        shared_intermediate: 1408,
        first_dense_layers: 1,
        vocab: 151552,
        max_position_embeddings: 131072,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-5,
        norm_topk_prob: true,
        qkv_bias: true,
        qk_norm: false,
        max_window_layers: 0,
        transformers_version: "4.54.0",
    },
];

/// Looks a shape up by name (case-insensitive, `org/` prefix ignored, aliases accepted).
pub fn find_shape(like: &str) -> Result<&'static ShapeSpec, SynthError> {
    let lower = like.trim().to_ascii_lowercase();
    let key = lower.rsplit('/').next().unwrap_or(&lower);
    SHAPES
        .iter()
        .find(|s| s.name == key || s.aliases.contains(&key))
        .ok_or_else(|| SynthError::UnknownShape {
            like: like.to_string(),
            known: SHAPES.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        })
}

/// How a tensor's random values are drawn: approximately normal with this mean and std.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Init {
    /// Mean of the values.
    pub mean: f32,
    /// Standard deviation of the values.
    pub std: f32,
}

/// Linear weights: the usual `initializer_range`.
const WEIGHT: Init = Init {
    mean: 0.0,
    std: 0.02,
};
/// RMSNorm weights hover around 1 (noise so a loader that drops them is detectable).
const NORM: Init = Init {
    mean: 1.0,
    std: 0.02,
};
/// Biases and GLM's routing correction bias: small, non-zero.
const BIAS: Init = Init {
    mean: 0.0,
    std: 0.02,
};

/// Role of a tensor in the per-token cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// Read in full for every token.
    Dense,
    /// A routed expert's weight: only `top_k / experts` of these are read per token.
    RoutedExpert,
    /// The token embedding table: one row is read per token.
    Embedding,
}

/// One tensor of the synthetic checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPlan {
    /// Hugging Face tensor name.
    pub name: String,
    /// Row-major shape (`[out, in]` for linear weights).
    pub shape: Vec<usize>,
    /// Stored dtype.
    pub dtype: SynthDtype,
    /// Value distribution.
    pub init: Init,
    /// How much of the tensor one token reads (for the active-parameter count).
    pub kind: TensorKind,
}

impl TensorPlan {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// Size of the raw data in bytes.
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size() as u64
    }
}

/// Collects tensors in module order (embeddings, layer by layer, final norm, head).
struct Builder {
    dtype: SynthDtype,
    out: Vec<TensorPlan>,
}

impl Builder {
    fn add(&mut self, name: String, shape: &[usize], init: Init) {
        self.add_as(name, shape, init, self.dtype, TensorKind::Dense);
    }

    fn add_as(
        &mut self,
        name: String,
        shape: &[usize],
        init: Init,
        dtype: SynthDtype,
        kind: TensorKind,
    ) {
        self.out.push(TensorPlan {
            name,
            shape: shape.to_vec(),
            dtype,
            init,
            kind,
        });
    }

    /// A SwiGLU MLP with HF's `gate_proj/up_proj/down_proj` names.
    fn mlp(&mut self, prefix: &str, hidden: usize, inter: usize, kind: TensorKind) {
        let dt = self.dtype;
        self.add_as(
            format!("{prefix}.gate_proj.weight"),
            &[inter, hidden],
            WEIGHT,
            dt,
            kind,
        );
        self.add_as(
            format!("{prefix}.up_proj.weight"),
            &[inter, hidden],
            WEIGHT,
            dt,
            kind,
        );
        self.add_as(
            format!("{prefix}.down_proj.weight"),
            &[hidden, inter],
            WEIGHT,
            dt,
            kind,
        );
    }
}

/// Every tensor of `shape` (after overrides) in the hub naming, in module order.
pub fn tensor_plan(shape: &ShapeSpec, dtype: SynthDtype) -> Vec<TensorPlan> {
    let s = shape;
    let h = s.hidden;
    let q_out = s.heads * s.head_dim;
    let kv_out = s.kv_heads * s.head_dim;
    // Router logits get unit-ish spread whatever the hidden size, so routing varies
    // across tokens instead of collapsing on a few experts.
    let router = Init {
        mean: 0.0,
        std: 1.0 / (h as f32).sqrt(),
    };
    let mut b = Builder {
        dtype,
        out: Vec::new(),
    };

    let embed = "model.embed_tokens.weight".to_string();
    b.add_as(embed, &[s.vocab, h], WEIGHT, dtype, TensorKind::Embedding);
    for i in 0..s.layers {
        let p = format!("model.layers.{i}");
        b.add(format!("{p}.input_layernorm.weight"), &[h], NORM);
        for (proj, out) in [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)] {
            b.add(format!("{p}.self_attn.{proj}.weight"), &[out, h], WEIGHT);
            if s.qkv_bias {
                b.add(format!("{p}.self_attn.{proj}.bias"), &[out], BIAS);
            }
        }
        b.add(format!("{p}.self_attn.o_proj.weight"), &[h, q_out], WEIGHT);
        if s.qk_norm {
            b.add(format!("{p}.self_attn.q_norm.weight"), &[s.head_dim], NORM);
            b.add(format!("{p}.self_attn.k_norm.weight"), &[s.head_dim], NORM);
        }
        b.add(format!("{p}.post_attention_layernorm.weight"), &[h], NORM);

        if i < s.first_dense_layers {
            b.mlp(&format!("{p}.mlp"), h, s.intermediate, TensorKind::Dense);
            continue;
        }
        match s.arch {
            Arch::Mixtral => {
                let m = format!("{p}.block_sparse_moe");
                b.add(format!("{m}.gate.weight"), &[s.experts, h], router);
                let (dt, inter) = (dtype, s.moe_intermediate);
                for e in 0..s.experts {
                    // w1 = gate, w2 = down, w3 = up.
                    let x = format!("{m}.experts.{e}");
                    b.add_as(
                        format!("{x}.w1.weight"),
                        &[inter, h],
                        WEIGHT,
                        dt,
                        TensorKind::RoutedExpert,
                    );
                    b.add_as(
                        format!("{x}.w2.weight"),
                        &[h, inter],
                        WEIGHT,
                        dt,
                        TensorKind::RoutedExpert,
                    );
                    b.add_as(
                        format!("{x}.w3.weight"),
                        &[inter, h],
                        WEIGHT,
                        dt,
                        TensorKind::RoutedExpert,
                    );
                }
            }
            Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Glm4Moe => {
                let m = format!("{p}.mlp");
                b.add(format!("{m}.gate.weight"), &[s.experts, h], router);
                if s.arch == Arch::Glm4Moe {
                    // Kept in float32 as in the released checkpoints: it only shifts the
                    // top-k choice and bf16 would quantise the small offsets away.
                    let name = format!("{m}.gate.e_score_correction_bias");
                    b.add_as(name, &[s.experts], BIAS, SynthDtype::F32, TensorKind::Dense);
                }
                for e in 0..s.experts {
                    b.mlp(
                        &format!("{m}.experts.{e}"),
                        h,
                        s.moe_intermediate,
                        TensorKind::RoutedExpert,
                    );
                }
                match s.arch {
                    Arch::Qwen2Moe if s.shared_intermediate > 0 => {
                        b.mlp(
                            &format!("{m}.shared_expert"),
                            h,
                            s.shared_intermediate,
                            TensorKind::Dense,
                        );
                        b.add(format!("{m}.shared_expert_gate.weight"), &[1, h], WEIGHT);
                    }
                    Arch::Glm4Moe if s.shared_intermediate > 0 => {
                        b.mlp(
                            &format!("{m}.shared_experts"),
                            h,
                            s.shared_intermediate,
                            TensorKind::Dense,
                        );
                    }
                    _ => {}
                }
            }
        }
    }
    b.add("model.norm.weight".into(), &[h], NORM);
    b.add("lm_head.weight".into(), &[s.vocab, h], WEIGHT);
    b.out
}

/// Total parameters, and parameters read per token: every dense weight (including
/// `lm_head`), `top_k` of the routed experts, and not the embedding table, of which one
/// row is looked up. This is the count that sets decode bandwidth (bytes per token =
/// active x dtype size); model cards often add the embedding (Qwen, Mixtral) or leave out
/// the head as well (GLM).
pub fn param_counts(shape: &ShapeSpec, tensors: &[TensorPlan]) -> (u64, u64) {
    let (mut dense, mut expert, mut embed) = (0u64, 0u64, 0u64);
    for t in tensors {
        match t.kind {
            TensorKind::Dense => dense += t.numel(),
            TensorKind::RoutedExpert => expert += t.numel(),
            TensorKind::Embedding => embed += t.numel(),
        }
    }
    let active_experts = if shape.experts == 0 {
        0
    } else {
        expert / shape.experts as u64 * shape.top_k.min(shape.experts) as u64
    };
    (dense + expert + embed, dense + active_experts)
}
