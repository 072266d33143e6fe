//! Reading one decoder layer at a time; the names that differ between families come from
//! their [`arch::HfNames`].

mod experts;

use super::arch::{self, SharedExpert};
use super::config::{LayerKind, ModelConfig};
use super::routing::RouterParams;
use super::weights::{
    AttentionWeights, DeltaNetProjections, DeltaNetWeights, FeedForward, LayerWeights, Loader, MlaWeights,
    Mixer, MoeWeights,
};
use super::weights_file::WeightsError;
use super::ModelError;
use ft_backend::BufferUsage;

/// Where the text model's tensors live: `model.` normally, `model.language_model.` in
/// vision-language checkpoints (Qwen3.5-MoE), whose `model.visual.*` tower is never loaded.
pub(super) fn weight_prefix(files: &super::WeightFiles) -> &'static str {
    if files.contains("model.language_model.embed_tokens.weight") {
        "model.language_model."
    } else {
        "model."
    }
}

impl Loader<'_> {
    /// Decoder layer `i` of `cfg`'s architecture; `prefix` is [`weight_prefix`].
    pub fn layer(&mut self, cfg: &ModelConfig, prefix: &str, i: usize) -> Result<LayerWeights, ModelError> {
        let p = format!("{prefix}layers.{i}");
        let h = cfg.hidden_size;
        let mixer = match cfg.layer_kinds[i] {
            LayerKind::LinearAttention => Mixer::DeltaNet(self.delta_net(cfg, &format!("{p}.linear_attn"))?),
            _ if cfg.mla.is_some() => Mixer::Mla(self.mla(cfg, &format!("{p}.self_attn"))?),
            _ => Mixer::Attention(self.attention(cfg, &format!("{p}.self_attn"))?),
        };
        let ffn = if cfg.moe_layers[i] {
            FeedForward::Moe(self.moe(cfg, &p)?)
        } else {
            FeedForward::Dense(self.mlp(&format!("{p}.mlp"), h, cfg.intermediate_size)?)
        };
        Ok(LayerWeights {
            input_norm: self.vector(&format!("{p}.input_layernorm.weight"), h)?,
            post_attention_norm: self.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
            mixer,
            ffn,
        })
    }

    fn attention(&mut self, cfg: &ModelConfig, p: &str) -> Result<AttentionWeights, ModelError> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        // With an output gate, q_proj yields query and gate for each head.
        let q_rows = cfg.num_heads * hd * if cfg.attn_output_gate { 2 } else { 1 };
        let o_bias = self.files.contains(&format!("{p}.o_proj.bias"));
        Ok(AttentionWeights {
            q: self.linear(&format!("{p}.q_proj"), q_rows, h, cfg.qkv_bias)?,
            k: self.linear(&format!("{p}.k_proj"), cfg.num_kv_heads * hd, h, cfg.qkv_bias)?,
            v: self.linear(&format!("{p}.v_proj"), cfg.num_kv_heads * hd, h, cfg.qkv_bias)?,
            o: self.linear(&format!("{p}.o_proj"), h, cfg.num_heads * hd, o_bias)?,
            q_norm: if cfg.qk_norm { Some(self.vector(&format!("{p}.q_norm.weight"), hd)?) } else { None },
            k_norm: if cfg.qk_norm { Some(self.vector(&format!("{p}.k_norm.weight"), hd)?) } else { None },
            sinks: if cfg.attention_sinks { Some(self.vector(&format!("{p}.sinks"), cfg.num_heads)?) } else { None },
        })
    }

    fn mla(&mut self, cfg: &ModelConfig, p: &str) -> Result<MlaWeights, ModelError> {
        let m = cfg.mla.ok_or_else(|| ModelError::Invalid("MLA layer without MLA settings".into()))?;
        let (h, nh, bias) = (cfg.hidden_size, cfg.num_heads, cfg.qkv_bias);
        let (nope, rope, lora, vd) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim);
        let q_rows = nh * (nope + rope);
        let (q_a, q_a_norm, q_b) = match m.q_lora_rank {
            Some(r) => (
                Some(self.linear(&format!("{p}.q_a_proj"), r, h, bias)?),
                Some(self.vector(&format!("{p}.q_a_layernorm.weight"), r)?),
                self.linear(&format!("{p}.q_b_proj"), q_rows, r, false)?,
            ),
            None => (None, None, self.linear(&format!("{p}.q_proj"), q_rows, h, false)?),
        };
        // kv_b_proj rows are, per head, `nope` key rows then `vd` value rows, each `lora` wide.
        let kv_b = self.dense(&format!("{p}.kv_b_proj.weight"), nh * (nope + vd), lora)?;
        let es = kv_b.dtype.size();
        let src = kv_b.bytes.as_slice();
        let mut uk_t = vec![0u8; nh * lora * nope * es];
        let mut uv = vec![0u8; nh * vd * lora * es];
        for head in 0..nh {
            let base = head * (nope + vd);
            for d in 0..nope {
                for l in 0..lora {
                    let from = ((base + d) * lora + l) * es;
                    let to = ((head * lora + l) * nope + d) * es;
                    uk_t[to..to + es].copy_from_slice(&src[from..from + es]);
                }
            }
            let from = (base + nope) * lora * es;
            let to = head * vd * lora * es;
            uv[to..to + vd * lora * es].copy_from_slice(&src[from..from + vd * lora * es]);
        }
        Ok(MlaWeights {
            q_a,
            q_a_norm,
            q_b,
            kv_a: self.linear(&format!("{p}.kv_a_proj_with_mqa"), lora + rope, h, bias)?,
            kv_a_norm: self.vector(&format!("{p}.kv_a_layernorm.weight"), lora)?,
            w_uk_t: self.owned(uk_t, kv_b.dtype)?,
            w_uv: self.owned(uv, kv_b.dtype)?,
            o: self.linear(&format!("{p}.o_proj"), h, nh * vd, bias)?,
        })
    }

    fn delta_net(&mut self, cfg: &ModelConfig, p: &str) -> Result<DeltaNetWeights, ModelError> {
        let l = cfg.linear_attn.ok_or_else(|| ModelError::Invalid("linear-attention layer without its settings".into()))?;
        let h = cfg.hidden_size;
        let (hk, hv, dk, dv) = (l.num_k_heads, l.num_v_heads, l.k_head_dim, l.v_head_dim);
        let proj = if self.files.contains(&format!("{p}.in_proj_qkvz.weight")) {
            DeltaNetProjections::Grouped {
                qkvz: self.linear(&format!("{p}.in_proj_qkvz"), 2 * hk * dk + 2 * hv * dv, h, false)?,
                ba: self.linear(&format!("{p}.in_proj_ba"), 2 * hv, h, false)?,
            }
        } else {
            DeltaNetProjections::Split {
                qkv: self.linear(&format!("{p}.in_proj_qkv"), l.conv_dim(), h, false)?,
                z: self.linear(&format!("{p}.in_proj_z"), l.value_dim(), h, false)?,
                b: self.linear(&format!("{p}.in_proj_b"), hv, h, false)?,
                a: self.linear(&format!("{p}.in_proj_a"), hv, h, false)?,
            }
        };
        let conv = self.tensor(&format!("{p}.conv1d.weight"), &[l.conv_dim(), 1, l.conv_kernel])?;
        Ok(DeltaNetWeights {
            proj,
            conv: self.backend.import_host(conv.bytes, conv.dtype, BufferUsage::Weights)?,
            a_log: self.vector(&format!("{p}.A_log"), hv)?,
            dt_bias: self.vector(&format!("{p}.dt_bias"), hv)?,
            norm: self.vector(&format!("{p}.norm.weight"), dv)?,
            out: self.linear(&format!("{p}.out_proj"), h, l.value_dim(), false)?,
        })
    }

    /// The MoE block of layer prefix `p`, named as [`arch::spec`] says for `cfg`'s family.
    fn moe(&mut self, cfg: &ModelConfig, p: &str) -> Result<MoeWeights, ModelError> {
        let h = cfg.hidden_size;
        let names = arch::spec(cfg.arch).hf;
        let m = format!("{p}.{}", names.moe_block);
        let router = format!("{m}.{}", names.router);
        let correction_bias = if names.correction_bias {
            Some(self.host_vector(&format!("{router}.e_score_correction_bias"), cfg.num_experts)?)
        } else {
            None
        };
        let (shared, shared_gate) = match names.shared {
            _ if cfg.shared_intermediate_size == 0 => (None, None),
            SharedExpert::Gated { mlp, gate } => (
                Some(self.mlp(&format!("{m}.{mlp}"), h, cfg.shared_intermediate_size)?),
                Some(self.linear(&format!("{m}.{gate}"), 1, h, false)?),
            ),
            SharedExpert::Plain(mlp) => (Some(self.mlp(&format!("{m}.{mlp}"), h, cfg.shared_intermediate_size)?), None),
            SharedExpert::None => (None, None),
        };
        Ok(MoeWeights {
            router: self.linear(&router, cfg.num_experts, h, cfg.router_bias)?,
            params: RouterParams {
                kind: cfg.routing,
                top_k: cfg.top_k,
                norm_topk_prob: cfg.norm_topk_prob,
                routed_scaling_factor: cfg.routed_scaling_factor,
                correction_bias,
            },
            experts: self.experts(&format!("{m}.experts"), cfg)?,
            shared,
            shared_gate,
        })
    }
}

/// A shape error for a tensor that could not be viewed as `expected`.
pub(super) fn shape_error(name: &str, found: &[usize], expected: Vec<usize>) -> ModelError {
    ModelError::Weights(WeightsError::Shape { name: name.into(), found: found.to_vec(), expected })
}
