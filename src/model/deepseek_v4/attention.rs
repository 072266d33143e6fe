//! One sequence's attention in a DeepSeek-V4 layer: a single shared key/value head over the
//! last `sliding_window` tokens plus compressed entries (in CSA layers those the lightning
//! indexer chooses per query, in HCA layers every one the query may see); per-head sinks; the
//! value rows carry RoPE, so the output's rotated channels are turned back at the query's
//! position before the grouped output projection.

use super::compress::{Carry, Compressor};
use super::hyper::{rms_rows, unweighted_rms};
use super::rope::Rotary;
use super::V4Layer;
use crate::kv::LayerState;
use crate::model::config::{ModelConfig, V4Attention, V4Config};
use crate::model::forward::{download_f32, scratch};
use crate::model::weights::Linear;
use crate::model::ModelError;
use ft_backend::{Backend, DeviceBuffer, MatmulDesc, StreamId};
use rayon::prelude::*;

/// `a · b` in eight independent lanes, so that the compiler vectorises it.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// What every layer of one forward pass shares.
pub(super) struct Ctx<'a> {
    pub model: &'a crate::model::Model,
    pub be: &'a dyn Backend,
    pub cfg: &'a ModelConfig,
    pub v4: &'a V4Config,
    pub main: Rotary,
    pub compress: Rotary,
}

/// `x [n, in] · Wᵀ` on the backend, from an uploaded `x` to host values.
pub(super) fn lin(be: &dyn Backend, l: &Linear, x: &DeviceBuffer, n: usize) -> Result<Vec<f32>, ModelError> {
    let mut out = scratch(be, n * l.out_dim)?;
    l.forward(be, x, &mut out, n)?;
    download_f32(be, &out, n * l.out_dim)
}

/// [`lin`] of host values read by this one product only.
pub(super) fn lin_host(be: &dyn Backend, l: &Linear, x: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
    lin(be, l, &upload(be, x)?, n)
}

pub(super) fn upload(be: &dyn Backend, x: &[f32]) -> Result<DeviceBuffer, ModelError> {
    let mut xd = scratch(be, x.len())?;
    be.upload(StreamId::COMPUTE, bytemuck::cast_slice(x), &mut xd, 0)?;
    Ok(xd)
}

/// `n` f32 values of `buf` from element `at`.
fn read(be: &dyn Backend, buf: &DeviceBuffer, at: usize, n: usize) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0f32; n];
    if n > 0 {
        be.download(StreamId::COMPUTE, buf, at * 4, bytemuck::cast_slice_mut(&mut out))?;
    }
    Ok(out)
}

fn write(be: &dyn Backend, buf: &mut DeviceBuffer, at: usize, v: &[f32]) -> Result<(), ModelError> {
    if !v.is_empty() {
        be.upload(StreamId::COMPUTE, bytemuck::cast_slice(v), buf, at * 4)?;
    }
    Ok(())
}

/// Runs `c` over the `t` new tokens `x` (uploaded) after `past` tokens: reads its carry at
/// `carry_at` in `carry`, writes the new entries into `entries` and the carry back.
#[allow(clippy::too_many_arguments)]
fn compress_into(
    ctx: &Ctx,
    c: &Compressor,
    x: &DeviceBuffer,
    t: usize,
    past: usize,
    carry: &mut DeviceBuffer,
    carry_at: usize,
    entries: &mut DeviceBuffer,
) -> Result<(), ModelError> {
    let be = ctx.be;
    let row = c.pending_row();
    let before = past / c.rate;
    let state = Carry {
        pending: read(be, carry, carry_at, (past % c.rate) * row)?,
        overlap: if c.overlap && before > 0 { Some(read(be, carry, carry_at + c.overlap_offset(), c.rate * 2 * c.dim)?) } else { None },
    };
    let kv = lin(be, &c.kv, x, t)?;
    let gate = lin(be, &c.gate, x, t)?;
    let out = c.compress(state, &kv, &gate, past, &ctx.compress, ctx.cfg.rms_norm_eps);
    write(be, entries, before * c.dim, &out.entries)?;
    write(be, carry, carry_at, &out.carry.pending)?;
    if let Some(o) = &out.carry.overlap {
        write(be, carry, carry_at + c.overlap_offset(), o)?;
    }
    Ok(())
}

/// What a layer's attention compressed and chose, for [`crate::model::Trace`].
#[derive(Default)]
pub(super) struct Seen {
    /// Every compressed entry so far (read back only for a trace).
    pub entries: Option<Vec<f32>>,
    /// Every indexer key so far.
    pub keys: Vec<f32>,
    /// Per new token, the entries the indexer chose.
    pub chosen: Option<Vec<Vec<usize>>>,
}

/// Attention of the new tokens `x` (`[t, hidden]`, normalised) of one sequence after `past`
/// tokens; returns `[t, hidden]` and what was compressed and chosen (the entries only when
/// `trace`).
pub(super) fn attention(ctx: &Ctx, w: &V4Layer, ls: &mut LayerState, past: usize, x: &[f32], trace: bool) -> Result<(Vec<f32>, Seen), ModelError> {
    let (be, cfg) = (ctx.be, ctx.cfg);
    let (h, nh, hd, eps) = (cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.rms_norm_eps);
    let t = x.len() / h;
    let LayerState::Compressed { kv: kv_rows, entries, index_keys, carry } = ls else {
        return Err(ModelError::Invalid("a DeepSeek-V4 layer needs its compressed-attention state".into()));
    };
    let rope = if w.kind == V4Attention::Sliding { &ctx.main } else { &ctx.compress };

    // The layer's input and the query residual are read by several products: uploaded once.
    let xd = upload(be, x)?;
    let q_res = upload(be, &rms_rows(&lin(be, &w.q_a, &xd, t)?, &w.q_a_norm, eps))?;
    let mut q = lin(be, &w.q_b, &q_res, t)?;
    for (i, tok) in q.chunks_mut(nh * hd).enumerate() {
        for head in tok.chunks_mut(hd) {
            let n = unweighted_rms(head, eps);
            head.copy_from_slice(&n);
        }
        rope.rotate_heads(tok, hd, past + i, 1.0);
    }
    let mut kv = rms_rows(&lin(be, &w.kv, &xd, t)?, &w.kv_norm, eps);
    for (i, row) in kv.chunks_mut(hd).enumerate() {
        rope.rotate(row, past + i, 1.0);
    }
    write(be, kv_rows, past * hd, &kv)?;

    // Compressed entries, and for CSA the indexer's choice of them per query.
    let mut index_keys_seen = vec![];
    let mut chosen: Option<Vec<Vec<usize>>> = None;
    if let Some(c) = &w.compressor {
        let (Some(entries), Some(carry)) = (entries.as_mut(), carry.as_mut()) else {
            return Err(ModelError::Invalid("a compressed layer's state has no entries".into()));
        };
        compress_into(ctx, c, &xd, t, past, carry, 0, entries)?;
        if let Some(ix) = &w.indexer {
            let Some(keys_buf) = index_keys.as_mut() else {
                return Err(ModelError::Invalid("a CSA layer's state has no indexer keys".into()));
            };
            let at = super::carry_len(c.rate, c.dim, c.overlap);
            compress_into(ctx, &ix.compressor, &xd, t, past, carry, at, keys_buf)?;
            let keys = read(be, keys_buf, 0, ((past + t) / c.rate) * ix.compressor.dim)?;
            chosen = Some(select(ctx, ix, &q_res, &xd, t, &keys, past)?);
            index_keys_seen = keys;
        }
    }
    // Each new token attends on the backend over its own keys.
    let sinks = upload(be, &w.sinks)?;
    let mut out = Vec::with_capacity(t * nh * hd);
    for i in 0..t {
        let sel = chosen.as_ref().map(|c| &c[i]);
        out.extend(query_attention(ctx, w, kv_rows, entries.as_ref(), sel, &sinks, past + i, &q[i * nh * hd..(i + 1) * nh * hd])?);
    }
    let entries_seen = match (trace, &w.compressor, entries.as_ref()) {
        (true, Some(c), Some(e)) => Some(read(be, e, 0, ((past + t) / c.rate) * hd)?),
        _ => None,
    };
    let seen = Seen { entries: entries_seen, keys: index_keys_seen, chosen };
    Ok((output(ctx, w, &out, t)?, seen))
}

/// One query's attention on the backend: its keys (the window's rows, then the chosen or
/// visible compressed entries) gathered into one buffer, which the query follows, so the
/// causal mask admits them all; the output's rotated channels turned back on the host.
#[allow(clippy::too_many_arguments)]
fn query_attention(
    ctx: &Ctx,
    w: &V4Layer,
    kv_rows: &DeviceBuffer,
    entries: Option<&DeviceBuffer>,
    chosen: Option<&Vec<usize>>,
    sinks: &DeviceBuffer,
    p: usize,
    q: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let (be, cfg) = (ctx.be, ctx.cfg);
    let (nh, hd) = (cfg.num_heads, cfg.head_dim);
    let first = (p + 1).saturating_sub(ctx.v4.sliding_window);
    let n_win = p + 1 - first;
    let ids: Vec<u32> = match (&w.compressor, chosen) {
        (None, _) => vec![],
        (Some(_), Some(sel)) => sel.iter().map(|&e| e as u32).collect(),
        (Some(c), None) => (0..((p + 1) / c.rate) as u32).collect(),
    };
    let n = n_win + ids.len();
    let mut keys = scratch(be, n * hd)?;
    be.copy(StreamId::COMPUTE, kv_rows, &mut keys, &ft_backend::CopyDesc { src_offset: first * hd, dst_offset: 0, len: n_win * hd })?;
    if let (Some(e), false) = (entries, ids.is_empty()) {
        let mut picked = scratch(be, ids.len() * hd)?;
        be.gather_rows(e, &ids, hd, &mut picked)?;
        be.copy(StreamId::COMPUTE, &picked, &mut keys, &ft_backend::CopyDesc { src_offset: 0, dst_offset: n_win * hd, len: ids.len() * hd })?;
    }
    let qd = upload(be, q)?;
    let mut od = scratch(be, nh * hd)?;
    let desc = ft_backend::AttentionDesc { n_tokens: 1, n_heads: nh, n_kv_heads: 1, head_dim: hd, v_head_dim: hd, kv_len: n, scale: cfg.attention_scale, window: None };
    ctx.model.attend(&qd, &keys, &keys, Some(sinks), &mut od, &desc)?;
    let mut out = download_f32(be, &od, nh * hd)?;
    let rope = if w.kind == V4Attention::Sliding { &ctx.main } else { &ctx.compress };
    rope.rotate_heads(&mut out, hd, p, -1.0);
    Ok(out)
}

/// The grouped output projection: each group of heads through its own block of `wo_a`, then
/// `wo_b`; `[t, hidden]`.
fn output(ctx: &Ctx, w: &V4Layer, out: &[f32], t: usize) -> Result<Vec<f32>, ModelError> {
    let (be, v4) = (ctx.be, ctx.v4);
    let (nh, hd) = (ctx.cfg.num_heads, ctx.cfg.head_dim);

    // Grouped output projection: each group of heads through its own block of `wo_a`.
    let (groups, rank) = (v4.o_groups, v4.o_lora_rank);
    let gin = nh * hd / groups;
    // Offsets count stored elements: a quantized row is padded to whole blocks.
    let block = w.o_a.w.dtype().block_elems();
    let stored_row = gin.div_ceil(block) * block;
    let mut grouped = vec![0f32; t * groups * rank];
    for g in 0..groups {
        let xg: Vec<f32> = (0..t).flat_map(|i| out[i * nh * hd + g * gin..i * nh * hd + (g + 1) * gin].iter().copied()).collect();
        let xd = upload(be, &xg)?;
        let mut yd = scratch(be, t * rank)?;
        let desc = MatmulDesc { n: t, k: gin, m: rank, w_offset: g * rank * stored_row, ..Default::default() };
        w.o_a.forward_desc(be, &xd, &mut yd, &desc)?;
        let y = download_f32(be, &yd, t * rank)?;
        for i in 0..t {
            grouped[i * groups * rank + g * rank..i * groups * rank + (g + 1) * rank].copy_from_slice(&y[i * rank..(i + 1) * rank]);
        }
    }
    lin_host(be, &w.o_b, &grouped, t)
}

/// The lightning indexer: per new token, the compressed entries it may see with the best
/// `Σ_h w_h · relu(q_h · k) / sqrt(d)` scores, at most `index_topk` of them, best first.
fn select(ctx: &Ctx, ix: &super::Indexer, q_res: &DeviceBuffer, x: &DeviceBuffer, t: usize, keys: &[f32], past: usize) -> Result<Vec<Vec<usize>>, ModelError> {
    let (be, v4) = (ctx.be, ctx.v4);
    let (heads, d) = (v4.index_heads, v4.index_head_dim);
    let mut q = lin(be, &ix.q_b, q_res, t)?;
    for (i, tok) in q.chunks_mut(heads * d).enumerate() {
        ctx.compress.rotate_heads(tok, d, past + i, 1.0);
    }
    let weights = lin(be, &ix.weights, x, t)?;
    let (softmax_scale, weight_scale) = (1.0 / (d as f32).sqrt(), 1.0 / (heads as f32).sqrt());
    let rate = ix.compressor.rate;
    Ok((0..t)
        .into_par_iter()
        .map(|i| {
            let visible = (past + i + 1) / rate;
            let scores: Vec<f32> = (0..visible)
                .map(|e| {
                    let k = &keys[e * d..(e + 1) * d];
                    (0..heads)
                        .map(|hh| {
                            let qh = &q[(i * heads + hh) * d..(i * heads + hh + 1) * d];
                            dot(qh, k).max(0.0) * softmax_scale * (weights[i * heads + hh] * weight_scale)
                        })
                        .sum()
                })
                .collect();
            let mut idx: Vec<usize> = (0..visible).collect();
            idx.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
            idx.truncate(v4.index_topk);
            idx
        })
        .collect())
}
