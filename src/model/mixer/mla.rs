//! Multi-head latent attention (DeepSeek-V2/V3) with weight absorption.
//!
//! The cache holds, per token, the normalised KV latent `c` (`kv_lora_rank` wide) and the
//! rotated key part `k_pe` shared by all heads. Scores need no per-head keys:
//! `q_nopeᵀ (W_uk c) = (W_ukᵀ q_nope)ᵀ c`, so each head's query is mapped into latent space
//! ("absorbed") and attends to the cached rows `[c | k_pe]` with `[W_ukᵀ q_nope | q_pe]` as
//! one multi-query attention. Its values are the same rows; the first `kv_lora_rank` outputs
//! of each head are then mapped to the head's value space by `W_uv` (the trailing `k_pe`
//! outputs are ignored), which costs far less than expanding keys and values for the whole
//! context at every step.

use crate::model::reads;
use super::{gather_units, gcd, on_span_rows, store_rows, Span};
use crate::kv::pages::{self, PoolLayer};
use crate::model::forward::scratch;
use crate::model::weights::MlaWeights;
use crate::model::{Model, ModelError};
use ft_backend::{AttentionDesc, CopyDesc, DeviceBuffer, MatmulDesc, RmsNormDesc, StreamId};

impl Model {
    /// Latent attention of the step's new tokens (normed input `x`, `[t, hidden]`, the
    /// sequences' rows one after another as `spans` say, at `positions`) into `out`.
    pub(crate) fn mla(
        &self,
        w: &MlaWeights,
        spans: &mut [Span<'_>],
        positions: &[u32],
        x: &DeviceBuffer,
        out: &mut DeviceBuffer,
    ) -> Result<(), ModelError> {
        let cfg = self.config();
        let be = self.backend();
        let m = cfg.mla.ok_or_else(|| ModelError::Invalid("MLA layer without MLA settings".into()))?;
        let (t, nh, h) = (positions.len(), cfg.num_heads, cfg.hidden_size);
        let (nope, rope, lora, vd) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim);
        let (qk, width) = (nope + rope, m.cache_width());
        let norm = |rows, dim| RmsNormDesc { rows, dim, eps: cfg.rms_norm_eps, unit_offset: false };

        // Queries [t, nh, nope + rope], the rotary part rotated in place.
        let mut q = scratch(be, t * nh * qk)?;
        match (&w.q_a, &w.q_a_norm) {
            (Some(qa), Some(qa_norm)) => {
                let mut c = scratch(be, t * qa.out_dim)?;
                qa.forward(be, x, &mut c, t)?;
                let mut cn = scratch(be, t * qa.out_dim)?;
                be.rms_norm(&c, qa_norm, &mut cn, &norm(t, qa.out_dim))?;
                w.q_b.forward(be, &cn, &mut q, t)?;
            }
            _ => w.q_b.forward(be, x, &mut q, t)?,
        }
        be.rope(&mut q, &self.rope_desc(positions, nh, qk, nope, m.rope_interleave))?;

        // The new tokens' cache rows: kv_a_proj's latent rows and rotary rows, computed apart
        // (by weight offset) so each comes out contiguous.
        let mut c = scratch(be, t * lora)?;
        let mut k_pe = scratch(be, t * rope)?;
        w.kv_a.forward_desc(be, x, &mut c, &MatmulDesc::new(t, h, lora))?;
        // Rows of quantized weights are stored padded to whole blocks.
        let pe_desc = MatmulDesc { w_offset: lora * w.kv_a.w.dtype().padded(h), bias_offset: lora, ..MatmulDesc::new(t, h, rope) };
        w.kv_a.forward_desc(be, x, &mut k_pe, &pe_desc)?;
        let mut cn = scratch(be, t * lora)?;
        be.rms_norm(&c, &w.kv_a_norm, &mut cn, &norm(t, lora))?;
        be.rope(&mut k_pe, &self.rope_desc(positions, 1, rope, 0, m.rope_interleave))?;
        let rows = concat_rows(be, &[(&cn, lora), (&k_pe, rope)], t)?;

        // Absorbed queries: head by head, q_lat[h] = q_nope[h] · W_ukᵀ[h]ᵀ, laid out [nh, t, lora].
        let u = gcd(nope, rope);
        let q_nope = gather_units(
            be,
            &q,
            (0..nh).flat_map(|hh| (0..t).flat_map(move |tok| (0..nope / u).map(move |i| (tok * nh + hh) * (qk / u) + i))),
            u,
        )?;
        let mut q_lat = scratch(be, nh * t * lora)?;
        for hh in 0..nh {
            let d = MatmulDesc { x_offset: hh * t * nope, w_offset: hh * lora * nope, out_offset: hh * t * lora, ..MatmulDesc::new(t, nope, lora) };
            reads::matmul(be, &q_nope, &w.w_uk_t, None, &mut q_lat, &d)?;
        }
        // Full queries [t, nh, lora + rope] = [q_lat | q_pe], gathered from both at once.
        let u = gcd(gcd(lora, rope), nope);
        let both = concat_flat(be, &[(&q_lat, nh * t * lora), (&q, t * nh * qk)])?;
        let q_base = nh * t * lora / u;
        let ids = (0..t).flat_map(|tok| {
            (0..nh).flat_map(move |hh| {
                let lat = (0..lora / u).map(move |i| (hh * t + tok) * (lora / u) + i);
                let pe = (0..rope / u).map(move |i| q_base + (tok * nh + hh) * (qk / u) + (nope / u) + i);
                lat.chain(pe)
            })
        });
        let q_full = gather_units(be, &both, ids, u)?;

        let mut attn = scratch(be, t * nh * width)?;
        let single = spans.len() == 1;
        for sp in spans.iter_mut() {
            let pg = sp.pages.ok_or_else(|| ModelError::Invalid("MLA layer without pages".into()))?;
            let mut pool = pages::lock(pg.pool());
            let table = sp.page_table(pool.page_rows())?;
            let Some(PoolLayer::Latent { kv }) = pool.layer_mut(sp.layer) else {
                return Err(ModelError::Invalid(format!("layer {} has no latent pages in the pool", sp.layer)));
            };
            store_rows(be, &rows, kv, &table, sp, width)?;
            let desc = AttentionDesc {
                n_tokens: sp.len,
                n_heads: nh,
                n_kv_heads: 1,
                head_dim: width,
                v_head_dim: width,
                kv_len: sp.past + sp.len,
                scale: cfg.attention_scale,
                window: None,
            };
            on_span_rows(be, sp, single, &q_full, nh * width, &mut attn, nh * width, |qi, oi| {
                self.attend_paged(qi, kv, kv, &table, None, oi, &desc)
            })?;
        }

        // Values: each head's latent output through its W_uv, then back to [t, nh, vd].
        let u = gcd(lora, rope);
        let o_lat = gather_units(
            be,
            &attn,
            (0..nh).flat_map(|hh| (0..t).flat_map(move |tok| (0..lora / u).map(move |i| (tok * nh + hh) * (width / u) + i))),
            u,
        )?;
        let mut o_heads = scratch(be, nh * t * vd)?;
        for hh in 0..nh {
            let d = MatmulDesc { x_offset: hh * t * lora, w_offset: hh * vd * lora, out_offset: hh * t * vd, ..MatmulDesc::new(t, lora, vd) };
            reads::matmul(be, &o_lat, &w.w_uv, None, &mut o_heads, &d)?;
        }
        let o = gather_units(be, &o_heads, (0..t).flat_map(|tok| (0..nh).map(move |hh| hh * t + tok)), vd)?;
        w.o.forward(be, &o, out, t)
    }
}

/// Places whole buffers one after another: `[a | b | …]`, `len` values of each.
fn concat_flat(be: &dyn ft_backend::Backend, parts: &[(&DeviceBuffer, usize)]) -> Result<DeviceBuffer, ModelError> {
    let mut out = scratch(be, parts.iter().map(|p| p.1).sum())?;
    let mut at = 0;
    for (buf, len) in parts {
        be.copy(StreamId::COMPUTE, buf, &mut out, &CopyDesc { src_offset: 0, dst_offset: at, len: *len })?;
        at += len;
    }
    Ok(out)
}

/// Row-wise concatenation of `[rows, cols_i]` buffers into `[rows, Σ cols_i]`.
fn concat_rows(be: &dyn ft_backend::Backend, parts: &[(&DeviceBuffer, usize)], rows: usize) -> Result<DeviceBuffer, ModelError> {
    let u = parts.iter().fold(0, |g, p| gcd(g, p.1));
    let flat = concat_flat(be, &parts.iter().map(|(b, c)| (*b, rows * c)).collect::<Vec<_>>())?;
    let mut starts = Vec::with_capacity(parts.len());
    let mut at = 0;
    for (_, c) in parts {
        starts.push(at);
        at += rows * c / u;
    }
    let ids = (0..rows).flat_map(|r| {
        parts.iter().zip(&starts).flat_map(move |((_, c), s)| (0..c / u).map(move |i| s + r * (c / u) + i))
    });
    gather_units(be, &flat, ids.collect::<Vec<_>>().into_iter(), u)
}
