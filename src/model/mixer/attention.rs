//! Softmax attention over a KV cache: GQA, optional biases, q/k norms, partial rotary,
//! sliding windows with learned sinks (gpt-oss) and the per-head output gate of Qwen3-Next.

use super::{gather_units, on_span_rows, store_rows, Span};
use crate::kv::pages::{self, PoolLayer};
use crate::model::config::LayerKind;
use crate::model::forward::scratch;
use crate::model::weights::{AttentionWeights, Linear};
use crate::model::{Model, ModelError};
use ft_backend::{AttentionDesc, BinaryOp, DeviceBuffer, RmsNormDesc, RopeDesc};

impl Model {
    /// The rotary embedding of `heads` heads of `head_stride` values per token, rotating
    /// `rotary_dim` values from `rot_offset` inside each head.
    pub(crate) fn rope_desc(&self, positions: &[u32], heads: usize, head_stride: usize, rot_offset: usize, interleaved: bool) -> RopeDesc {
        RopeDesc {
            n_tokens: positions.len(),
            n_heads: heads,
            head_stride,
            row_stride: heads * head_stride,
            rot_offset,
            rotary_dim: self.rotary_dim,
            interleaved,
            positions: positions.to_vec(),
            inv_freq: self.inv_freq.clone(),
            scaling: self.rope_scaling,
        }
    }

    /// Attention of the step's new tokens (normed input `x`, `[t, hidden]`, the sequences'
    /// rows one after another as `spans` say, at `positions`) into `out`.
    pub(crate) fn attention(
        &self,
        w: &AttentionWeights,
        kind: LayerKind,
        spans: &mut [Span<'_>],
        positions: &[u32],
        x: &DeviceBuffer,
        out: &mut DeviceBuffer,
    ) -> Result<(), ModelError> {
        let cfg = self.config();
        let be = self.backend();
        let t = positions.len();
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        // With the Qwen3-Next output gate, q_proj rows are [head][query | gate], each
        // head_dim wide, split apart below.
        let q_width = if cfg.attn_output_gate { 2 * nh * hd } else { nh * hd };
        let mut qg = scratch(be, t * q_width)?;
        let mut k = scratch(be, t * nkv * hd)?;
        let mut v = scratch(be, t * nkv * hd)?;
        // One piece of work for the three products of `x` (on the CPU, one pass of the pool).
        Linear::forward_same_x(be, x, t, &mut [(&w.q, &mut qg), (&w.k, &mut k), (&w.v, &mut v)])?;
        let (mut q, gate) = if cfg.attn_output_gate {
            let q = gather_units(be, &qg, (0..t * nh).map(|r| 2 * r), hd)?;
            let g = gather_units(be, &qg, (0..t * nh).map(|r| 2 * r + 1), hd)?;
            (q, Some(g))
        } else {
            (qg, None)
        };
        if let (Some(qn), Some(kn)) = (&w.q_norm, &w.k_norm) {
            let norm = |rows| RmsNormDesc { rows, dim: hd, eps: cfg.rms_norm_eps, unit_offset: cfg.norm_unit_offset };
            let mut tmp = scratch(be, t * nh * hd)?;
            be.rms_norm(&q, qn, &mut tmp, &norm(t * nh))?;
            q = tmp;
            let mut tmp = scratch(be, t * nkv * hd)?;
            be.rms_norm(&k, kn, &mut tmp, &norm(t * nkv))?;
            k = tmp;
        }
        be.rope(&mut q, &self.rope_desc(positions, nh, hd, 0, false))?;
        be.rope(&mut k, &self.rope_desc(positions, nkv, hd, 0, false))?;
        let mut attn = scratch(be, t * nh * hd)?;
        let single = spans.len() == 1;
        for sp in spans.iter_mut() {
            let pg = sp.pages.ok_or_else(|| ModelError::Invalid("attention layer without pages".into()))?;
            let mut pool = pages::lock(pg.pool());
            let table = sp.page_table(pool.page_rows())?;
            let Some(PoolLayer::Kv { k: kc, v: vc }) = pool.layer_mut(sp.layer) else {
                return Err(ModelError::Invalid(format!("layer {} has no key/value pages in the pool", sp.layer)));
            };
            // Into the cache's dtype (a narrower KV cache rounds here).
            store_rows(be, &k, kc, &table, sp, nkv * hd)?;
            store_rows(be, &v, vc, &table, sp, nkv * hd)?;
            let desc = AttentionDesc {
                n_tokens: sp.len,
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                v_head_dim: hd,
                kv_len: sp.past + sp.len,
                scale: cfg.attention_scale,
                window: if kind == LayerKind::SlidingAttention { cfg.sliding_window } else { None },
            };
            on_span_rows(be, sp, single, &q, nh * hd, &mut attn, nh * hd, |qi, oi| {
                self.attend_paged(qi, kc, vc, &table, w.sinks.as_ref(), oi, &desc)
            })?;
        }
        if let Some(g) = gate {
            be.binary(BinaryOp::MulSigmoid, &mut attn, &g, t * nh * hd)?;
        }
        w.o.forward(be, &attn, out, t)
    }
}
