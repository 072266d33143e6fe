//! Attention against the KV cache, and the recurrent ops of Gated DeltaNet layers.

use super::rows::words;
use super::{by_dtype, BLOCK};
use crate::device::{Arg, CudaBackend};
use crate::error::driver;
use crate::memory::{expect, f32_at, need, ptr_at, u32_of};
use cudarc::driver::result;
use ft_backend::{AttentionDesc, BackendError, ConvDesc, DeltaRuleDesc, DeltaRuleInputs, DeviceBuffer, KvPages, Op, Result, StreamId};

/// Threads (4 warps) per attention block.
const ATTN_BLOCK: u32 = 128;
/// Query tokens per attention launch (the grid's y limit).
const MAX_TOKENS: usize = 65_535;
/// Value heads up to 16 accumulators per lane of a warp (`attention_*_v16`).
const MAX_V_HEAD_DIM: usize = 512;
/// Query/key heads whose staged query, with the warps' partial outputs, fits the 48 KiB of
/// shared memory a launch may take without opting in to more.
const MAX_HEAD_DIM: usize = 8192;

/// Whether the attention kernels take these head sizes.
pub(crate) fn attention_fits(d: &AttentionDesc) -> bool {
    d.head_dim <= MAX_HEAD_DIM && d.v_head_dim <= MAX_V_HEAD_DIM
}

/// See [`ft_backend::Backend::attention`] and, with `pages`, [`ft_backend::Backend::attention_paged`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    b: &CudaBackend,
    q: &DeviceBuffer,
    k_cache: &DeviceBuffer,
    v_cache: &DeviceBuffer,
    pages: Option<&KvPages<'_>>,
    sinks: Option<&DeviceBuffer>,
    out: &mut DeviceBuffer,
    d: &AttentionDesc,
) -> Result<()> {
    if d.n_tokens == 0 {
        return Ok(());
    }
    if d.n_kv_heads == 0 || d.n_heads == 0 || !d.n_heads.is_multiple_of(d.n_kv_heads) {
        return Err(BackendError::Shape(format!("{} query heads cannot share {} KV heads", d.n_heads, d.n_kv_heads)));
    }
    if d.kv_len < d.n_tokens {
        return Err(BackendError::Shape(format!("kv_len {} is less than the {} new tokens", d.kv_len, d.n_tokens)));
    }
    expect(v_cache, k_cache.dtype(), "attention v cache")?;
    let rows_q = need(d.n_tokens, d.n_heads, "query rows")?;
    let cache_rows = KvPages::cache_rows(pages, d.kv_len)?;
    let kv_rows = need(cache_rows, d.n_kv_heads, "kv rows")?;
    let qp = f32_at(q, 0, need(rows_q, d.head_dim, "query values")?, "attention q")?;
    let kp = ptr_at(k_cache, 0, need(kv_rows, d.head_dim, "k values")?, "attention k cache")?;
    let vp = ptr_at(v_cache, 0, need(kv_rows, d.v_head_dim, "v values")?, "attention v cache")?;
    let out_len = need(rows_q, d.v_head_dim, "output values")?;
    let op = f32_at(out, 0, out_len, "attention out")?;
    let sp = sinks.map(|s| f32_at(s, 0, d.n_heads, "attention sinks")).transpose()?.unwrap_or(0);
    if d.v_head_dim == 0 {
        return Ok(());
    }
    if d.window == Some(0) {
        // No key is visible: the reference's output is all zeros.
        let stream = b.stream(StreamId::COMPUTE)?;
        b.bind()?;
        // SAFETY: the range was checked by f32_at above.
        return unsafe { result::memset_d8_async(op, 0, out_len * 4, stream.cu_stream()) }.map_err(|e| driver(e, "attention"));
    }
    if !attention_fits(d) {
        return Err(BackendError::Unsupported { backend: "cuda".into(), op: Op::Attention, dtype: k_cache.dtype() });
    }
    let names = match d.v_head_dim {
        0..=128 => ["attention_f32_v4", "attention_f16_v4", "attention_bf16_v4"],
        129..=256 => ["attention_f32_v8", "attention_f16_v8", "attention_bf16_v8"],
        257..=512 => ["attention_f32_v16", "attention_f16_v16", "attention_bf16_v16"],
        _ => {
            return Err(BackendError::Unsupported { backend: "cuda".into(), op: Op::Attention, dtype: k_cache.dtype() });
        }
    };
    let kernel = by_dtype(k_cache.dtype(), names);
    let warps = (ATTN_BLOCK / 32) as usize;
    let smem = (d.head_dim + 2 * warps + warps * d.v_head_dim) * 4;
    let window = u32_of(d.window.unwrap_or(0).min(u32::MAX as usize), "attention window")?;
    let page_rows = u32_of(pages.map_or(0, |pg| pg.page_rows), "attention page rows")?;
    let stream = b.stream(StreamId::COMPUTE)?;
    let mut arena = b.arena()?;
    let table = match pages {
        Some(pg) => arena.put(&b.ctx, &stream, &[&words(pg.table.iter().copied())], 0)?[0],
        None => 0,
    };
    for t0 in (0..d.n_tokens).step_by(MAX_TOKENS) {
        let count = (d.n_tokens - t0).min(MAX_TOKENS);
        // This chunk's queries are the last `count` tokens of a cache of `kv_len` entries.
        let kv_len = d.kv_len - d.n_tokens + t0 + count;
        let args = [
            Arg::Ptr(qp + (t0 * d.n_heads * d.head_dim * 4) as u64),
            Arg::Ptr(kp),
            Arg::Ptr(vp),
            Arg::Ptr(sp),
            Arg::Ptr(op + (t0 * d.n_heads * d.v_head_dim * 4) as u64),
            Arg::U32(count as u32),
            Arg::U32(u32_of(d.n_heads, "attention heads")?),
            Arg::U32(u32_of(d.n_kv_heads, "attention kv heads")?),
            Arg::U32(u32_of(d.head_dim, "attention head_dim")?),
            Arg::U32(u32_of(d.v_head_dim, "attention v_head_dim")?),
            Arg::U32(u32_of(kv_len, "attention kv_len")?),
            Arg::F32(d.scale),
            Arg::U32(window),
            Arg::Ptr(table),
            Arg::U32(page_rows),
        ];
        let grid = (u32_of(d.n_heads, "attention heads")?, count as u32, 1);
        b.launch(kernel, grid, ATTN_BLOCK, u32_of(smem, "attention shared memory")?, &args)?;
    }
    Ok(())
}

/// See [`ft_backend::Backend::causal_conv1d`]: outputs first (reading the old state), then
/// the state update, in stream order.
pub(crate) fn causal_conv1d(
    b: &CudaBackend,
    x: &DeviceBuffer,
    w: &DeviceBuffer,
    state: &mut DeviceBuffer,
    out: &mut DeviceBuffer,
    d: &ConvDesc,
) -> Result<()> {
    if d.kernel == 0 {
        return Err(BackendError::Shape("causal_conv1d with a zero-length filter".into()));
    }
    let hist = d.kernel - 1;
    let len = need(d.n_tokens, d.channels, "conv tokens")?;
    let xp = f32_at(x, 0, len, "conv x")?;
    let wp = ptr_at(w, 0, need(d.channels, d.kernel, "conv filter")?, "conv w")?;
    let sp = f32_at(state, 0, need(hist, d.channels, "conv state")?, "conv state")?;
    let op = f32_at(out, 0, len, "conv out")?;
    if len == 0 {
        return Ok(());
    }
    let (n, c, k) = (u32_of(d.n_tokens, "conv tokens")?, u32_of(d.channels, "conv channels")?, u32_of(d.kernel, "conv kernel")?);
    let kernel = by_dtype(w.dtype(), ["causal_conv1d_f32", "causal_conv1d_f16", "causal_conv1d_bf16"]);
    let args = [Arg::Ptr(xp), Arg::Ptr(wp), Arg::Ptr(sp), Arg::Ptr(op), Arg::U32(n), Arg::U32(c), Arg::U32(k), Arg::U32(d.silu as u32)];
    b.launch(kernel, (u32_of(len.div_ceil(BLOCK as usize), "conv grid")?, 1, 1), BLOCK, 0, &args)?;
    if hist == 0 {
        return Ok(());
    }
    let args = [Arg::Ptr(xp), Arg::Ptr(sp), Arg::U32(n), Arg::U32(c), Arg::U32(k)];
    b.launch("conv_state_update_f32", (c.div_ceil(BLOCK), 1, 1), BLOCK, 0, &args)
}

/// See [`ft_backend::Backend::gated_delta_rule`]: one block per value head walks the steps
/// in order, the state staying in device memory between calls.
pub(crate) fn gated_delta_rule(
    b: &CudaBackend,
    i: &DeltaRuleInputs<'_>,
    state: &mut DeviceBuffer,
    out: &mut DeviceBuffer,
    d: &DeltaRuleDesc,
) -> Result<()> {
    let (n, hk, hv, dk, dv) = (d.n_tokens, d.n_k_heads, d.n_v_heads, d.k_head_dim, d.v_head_dim);
    if hk == 0 || hv == 0 || !hv.is_multiple_of(hk) {
        return Err(BackendError::Shape(format!("{hv} value heads cannot share {hk} key heads")));
    }
    let row = need(2, need(hk, dk, "key width")?, "qk width")?
        .checked_add(need(hv, dv, "value width")?)
        .ok_or_else(|| BackendError::Shape("delta rule row overflows".into()))?;
    let gates = need(n, hv, "gates")?;
    let qkv = f32_at(i.qkv, 0, need(n, row, "qkv")?, "delta rule qkv")?;
    let beta = f32_at(i.beta_logits, 0, gates, "delta rule beta")?;
    let decay = f32_at(i.decay_in, 0, gates, "delta rule decay")?;
    let a_log = f32_at(i.a_log, 0, hv, "delta rule a_log")?;
    let dt_bias = f32_at(i.dt_bias, 0, hv, "delta rule dt_bias")?;
    let sp = f32_at(state, 0, need(hv, need(dk, dv, "state per head")?, "state")?, "delta rule state")?;
    let op = f32_at(out, 0, need(gates, dv, "out")?, "delta rule out")?;
    if n == 0 || dk == 0 || dv == 0 {
        return Ok(());
    }
    let block = u32_of(dv.div_ceil(32) * 32, "delta rule block")?.clamp(32, BLOCK);
    let args = [
        Arg::Ptr(qkv),
        Arg::Ptr(beta),
        Arg::Ptr(decay),
        Arg::Ptr(a_log),
        Arg::Ptr(dt_bias),
        Arg::Ptr(sp),
        Arg::Ptr(op),
        Arg::U32(u32_of(n, "delta rule tokens")?),
        Arg::U32(u32_of(hk, "delta rule k heads")?),
        Arg::U32(u32_of(hv, "delta rule v heads")?),
        Arg::U32(u32_of(dk, "delta rule k dim")?),
        Arg::U32(u32_of(dv, "delta rule v dim")?),
        Arg::F32(d.l2norm_eps),
        Arg::F32(d.scale),
    ];
    b.launch("gated_delta_rule_f32", (u32_of(hv, "delta rule heads")?, 1, 1), block, u32_of(2 * dk * 4, "delta rule shared memory")?, &args)
}
