//! The tensor list of a shape: names, shapes, dtypes and value distributions, in module
//! order, as each family's hub checkpoint names them.

use super::{
    Arch, ArchSpec, HybridSpec, Init, MlaSpec, ShapeSpec, SynthDtype, TensorKind, TensorPlan, BIAS,
    NORM, WEIGHT, ZERO_NORM,
};

/// Collects tensors in module order (embeddings, layer by layer, final norm, head).
pub(super) struct Builder {
    pub(super) dtype: SynthDtype,
    pub(super) out: Vec<TensorPlan>,
}

impl Builder {
    pub(super) fn add(&mut self, name: String, shape: &[usize], init: Init) {
        self.add_as(name, shape, init, self.dtype, TensorKind::Dense);
    }

    pub(super) fn add_as(
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

    /// A linear layer `prefix.weight` (+ `prefix.bias`).
    pub(super) fn linear(&mut self, prefix: &str, out: usize, inp: usize, bias: bool) {
        self.add(format!("{prefix}.weight"), &[out, inp], WEIGHT);
        if bias {
            self.add(format!("{prefix}.bias"), &[out], BIAS);
        }
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

    /// Softmax attention: q/k/v/o with optional biases, q/k norms, the Qwen3-Next output
    /// gate (q_proj twice as tall) and gpt-oss's sinks.
    fn attention(&mut self, p: &str, s: &ShapeSpec, norm: Init) {
        let (h, hd) = (s.hidden, s.head_dim);
        let gated = matches!(s.arch, Arch::Qwen3Next | Arch::Qwen35Moe);
        let gpt_oss = s.arch == Arch::GptOss;
        self.linear(
            &format!("{p}.q_proj"),
            s.heads * hd * if gated { 2 } else { 1 },
            h,
            s.qkv_bias,
        );
        self.linear(&format!("{p}.k_proj"), s.kv_heads * hd, h, s.qkv_bias);
        self.linear(&format!("{p}.v_proj"), s.kv_heads * hd, h, s.qkv_bias);
        self.linear(&format!("{p}.o_proj"), h, s.heads * hd, gpt_oss);
        if s.qk_norm {
            self.add(format!("{p}.q_norm.weight"), &[hd], norm);
            self.add(format!("{p}.k_norm.weight"), &[hd], norm);
        }
        if gpt_oss {
            self.add_as(
                format!("{p}.sinks"),
                &[s.heads],
                BIAS,
                SynthDtype::F32,
                TensorKind::Dense,
            );
        }
    }

    /// DeepSeek's multi-head latent attention.
    fn mla(&mut self, p: &str, h: usize, heads: usize, m: &MlaSpec) {
        let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
        match m.q_lora_rank {
            Some(r) => {
                self.linear(&format!("{p}.q_a_proj"), r, h, false);
                self.add(format!("{p}.q_a_layernorm.weight"), &[r], NORM);
                self.linear(&format!("{p}.q_b_proj"), heads * qk, r, false);
            }
            None => self.linear(&format!("{p}.q_proj"), heads * qk, h, false),
        }
        self.linear(
            &format!("{p}.kv_a_proj_with_mqa"),
            m.kv_lora_rank + m.qk_rope_head_dim,
            h,
            false,
        );
        self.add(
            format!("{p}.kv_a_layernorm.weight"),
            &[m.kv_lora_rank],
            NORM,
        );
        self.linear(
            &format!("{p}.kv_b_proj"),
            heads * (m.qk_nope_head_dim + m.v_head_dim),
            m.kv_lora_rank,
            false,
        );
        self.linear(&format!("{p}.o_proj"), h, heads * m.v_head_dim, false);
    }

    /// A Gated DeltaNet layer: Qwen3-Next's fused, per-key-head grouped projections or
    /// Qwen3.5's split ones.
    fn delta_net(&mut self, p: &str, h: usize, l: &HybridSpec, fused: bool) {
        let (kd, vd) = (l.k_heads * l.k_head_dim, l.v_heads * l.v_head_dim);
        if fused {
            self.linear(&format!("{p}.in_proj_qkvz"), 2 * kd + 2 * vd, h, false);
            self.linear(&format!("{p}.in_proj_ba"), 2 * l.v_heads, h, false);
        } else {
            self.linear(&format!("{p}.in_proj_qkv"), 2 * kd + vd, h, false);
            self.linear(&format!("{p}.in_proj_z"), vd, h, false);
            self.linear(&format!("{p}.in_proj_b"), l.v_heads, h, false);
            self.linear(&format!("{p}.in_proj_a"), l.v_heads, h, false);
        }
        self.add(
            format!("{p}.conv1d.weight"),
            &[2 * kd + vd, 1, l.conv_kernel],
            WEIGHT,
        );
        // A = exp(A_log) around e; the decay gate stays well inside (0, 1).
        self.add_as(
            format!("{p}.A_log"),
            &[l.v_heads],
            Init {
                mean: 1.0,
                std: 0.5,
            },
            SynthDtype::F32,
            TensorKind::Dense,
        );
        self.add(format!("{p}.dt_bias"), &[l.v_heads], NORM);
        self.add(format!("{p}.norm.weight"), &[l.v_head_dim], NORM);
        self.linear(&format!("{p}.out_proj"), h, vd, false);
    }

    /// gpt-oss's fused experts: `[E, H, 2I]` (`[in, out]`, gate/up interleaved) and
    /// `[E, I, H]`, with biases.
    fn gpt_oss_experts(&mut self, m: &str, s: &ShapeSpec) {
        let (dt, e, h, i) = (self.dtype, s.experts, s.hidden, s.moe_intermediate);
        let kind = TensorKind::RoutedExpert;
        self.add_as(
            format!("{m}.experts.gate_up_proj"),
            &[e, h, 2 * i],
            WEIGHT,
            dt,
            kind,
        );
        self.add_as(
            format!("{m}.experts.gate_up_proj_bias"),
            &[e, 2 * i],
            BIAS,
            dt,
            kind,
        );
        self.add_as(
            format!("{m}.experts.down_proj"),
            &[e, i, h],
            WEIGHT,
            dt,
            kind,
        );
        self.add_as(
            format!("{m}.experts.down_proj_bias"),
            &[e, h],
            BIAS,
            dt,
            kind,
        );
    }
}

/// Every tensor of `shape` (after overrides) in the hub naming, in module order.
pub fn tensor_plan(shape: &ShapeSpec, dtype: SynthDtype) -> Vec<TensorPlan> {
    if let ArchSpec::V4(v) = &shape.spec {
        return super::plan_v4::v4_plan(shape, v, dtype);
    }
    let s = shape;
    let h = s.hidden;
    // Router logits get unit-ish spread whatever the hidden size, so routing varies
    // across tokens instead of collapsing on a few experts.
    let router = Init {
        mean: 0.0,
        std: 1.0 / (h as f32).sqrt(),
    };
    // The Qwen3-Next family multiplies by `1 + w`, so its norm weights sit near 0.
    let norm = if matches!(s.arch, Arch::Qwen3Next | Arch::Qwen35Moe) {
        ZERO_NORM
    } else {
        NORM
    };
    let mut b = Builder {
        dtype,
        out: Vec::new(),
    };
    let root = s.arch.weight_prefix();

    b.add_as(
        format!("{root}embed_tokens.weight"),
        &[s.vocab, h],
        WEIGHT,
        dtype,
        TensorKind::Embedding,
    );
    for i in 0..s.layers {
        let p = format!("{root}layers.{i}");
        b.add(format!("{p}.input_layernorm.weight"), &[h], norm);
        match &s.spec {
            ArchSpec::Hybrid(l) if !(i + 1).is_multiple_of(l.full_attention_interval.max(1)) => {
                b.delta_net(&format!("{p}.linear_attn"), h, l, s.arch == Arch::Qwen3Next)
            }
            ArchSpec::Mla(m) => b.mla(&format!("{p}.self_attn"), h, s.heads, m),
            _ => b.attention(&format!("{p}.self_attn"), s, norm),
        }
        b.add(format!("{p}.post_attention_layernorm.weight"), &[h], norm);

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
            Arch::GptOss => {
                let m = format!("{p}.mlp");
                b.add(format!("{m}.router.weight"), &[s.experts, h], router);
                b.add(format!("{m}.router.bias"), &[s.experts], BIAS);
                b.gpt_oss_experts(&m, s);
            }
            _ => {
                let m = format!("{p}.mlp");
                b.add(format!("{m}.gate.weight"), &[s.experts, h], router);
                if matches!(s.arch, Arch::Glm4Moe | Arch::DeepseekV3) {
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
                    _ if s.shared_intermediate == 0 => {}
                    Arch::Qwen2Moe | Arch::Qwen3Next | Arch::Qwen35Moe => {
                        b.mlp(
                            &format!("{m}.shared_expert"),
                            h,
                            s.shared_intermediate,
                            TensorKind::Dense,
                        );
                        b.add(format!("{m}.shared_expert_gate.weight"), &[1, h], WEIGHT);
                    }
                    Arch::Glm4Moe | Arch::DeepseekV3 => b.mlp(
                        &format!("{m}.shared_experts"),
                        h,
                        s.shared_intermediate,
                        TensorKind::Dense,
                    ),
                    _ => {}
                }
            }
        }
    }
    b.add(format!("{root}norm.weight"), &[h], norm);
    b.add("lm_head.weight".into(), &[s.vocab, h], WEIGHT);
    b.out
}
