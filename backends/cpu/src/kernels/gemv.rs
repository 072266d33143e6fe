//! Matrix products against f32/bf16/f16 weight rows: the decode (GEMV) and prefill hot path.
//!
//! Weights are `[rows, k]` little-endian bytes at any alignment; activations and outputs are
//! f32. Narrow weights are widened to f32 exactly before the multiply, so all three weight
//! types give the f32 result of the decoded values.

use super::many::ManyItem;
use super::quant::{Prepared, QuantDot};
use super::{elementwise::decode_scalar, need, shape_err, SimdLevel};
use ft_backend::{DType, Result};
use rayon::ThreadPool;
use std::ops::Range;

/// Below this many multiply-adds a matmul runs on the calling thread: waking the pool costs
/// a few microseconds, more than the work itself.
const PARALLEL_MIN_WORK: usize = 1 << 17;
/// Prefill chunk: this many weight rows are widened once into an f32 scratch and reused by
/// every token (16 rows × k=4096 × 4 B = 256 KiB, resident in L2).
const CHUNK_ROWS: usize = 16;
/// Prefill k block: one chunk's k-slice (16 rows × 1024 × 4 B = 64 KiB) stays in L1/L2 while
/// every token tile sweeps it; 1024 measured ~25 % faster than 256 and no
/// slower than unblocked.
const KC: usize = 1024;
/// Most weight bytes one pool task of a prefill-sized product reads. Tasks are also the unit
/// a free thread can take over, so this bounds how long one thread can wait at the end of a
/// product for the other: the output head of a 150k vocabulary in bf16 is 622 MB, and its
/// former quarter-matrix pieces left one of two threads idle for milliseconds per token.
const TASK_BYTES: usize = 512 << 10;
/// Fewest weight bytes in one task of a decode-sized product (at most [`DECODE_TOKENS`]
/// tokens): these stream, and how evenly the threads finish decides their rate. A 4.7 MB
/// Q4_K attention projection in 9 tasks of ≤ 512 KiB on 2 threads left one thread a whole
/// task alone at the end and ran at 13.5–14.6 GB/s; in 32 KiB tasks, 18.4–20.4 (a chain of
/// cold products, huge pages, alternating in one process). Each thread still reads a
/// contiguous run of tasks ([`super::ranges`]): claiming 16–128 KiB chunks in turn from a
/// shared counter instead cost a third of the rate of a long matrix. With the tails shared
/// from the back, 128 KiB tasks were no faster in the engine.
const DECODE_TASK_BYTES: usize = 32 << 10;
/// Most tasks of a decode-sized product: the output head would otherwise make ~8,000
/// (rayon's join per task then costs a few percent); 512 kept long matrices at their rate.
const DECODE_TASKS: usize = 512;
/// Most tokens a product has to count as decode-sized (memory-bound) in [`task_rows`].
pub(super) const DECODE_TOKENS: usize = 4;

/// `out[i, r - rows.start] = x[i, :] · w[r, :]` for `i < n` and `r` in `rows`, on the calling
/// thread.
///
/// `x` is `[n, k]` f32, `w` the bytes of a `[≥ rows.end, k]` matrix of `dtype` (any
/// alignment), `out` is `[n, rows.len()]`. With `n > 1` weights are read once per tile of
/// tokens (or widened once per chunk), so prefill costs far less than `n` GEMVs.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(
    level: SimdLevel,
    x: &[f32],
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    if rows.start > rows.end {
        return Err(shape_err(format!("row range {rows:?} is reversed")));
    }
    // Whole blocks per row (a block is one element of a plain dtype).
    let row_bytes = need(k.div_ceil(dtype.block_elems()), dtype.size(), "weight row bytes")?;
    let start = need(rows.start, row_bytes, "weight offset")?;
    let w = w
        .get(start..)
        .ok_or_else(|| shape_err(format!("weights end before row {}", rows.start)))?;
    let nrows = rows.len();
    if out.len() < need(n, nrows, "output size")? {
        return Err(shape_err(format!(
            "output holds {} values, need {n}×{nrows}",
            out.len()
        )));
    }
    if dtype.is_quantized() {
        return super::quant::block(level, QuantDot::Exact, x, k, n, k, w, dtype, nrows, out, nrows);
    }
    block(level, x, k, n, k, w, dtype, k, nrows, out, nrows)
}

/// GEMV: `out[r - rows.start] = x · w[r, :]` for `r` in `rows` (one token), on the calling
/// thread. Parallelise by giving each thread its own row range.
pub fn gemv_rows(
    level: SimdLevel,
    x: &[f32],
    w: &[u8],
    dtype: DType,
    k: usize,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    matmul_rows(level, x, 1, k, w, dtype, rows, out)
}

/// `out[n, m] = x[n, k] · w[m, k]ᵀ` split over the rows of `w` on `pool` (inline when small),
/// or on the calling thread alone with no pool (products that run side by side, one per pool
/// thread, such as a layer's decode experts: the same kernels, so the same bits).
/// `dot` chooses how decode-sized products meet block-quantized weights; the rows of
/// [`matmul_rows`] are always [`QuantDot::Exact`].
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    pool: Option<&ThreadPool>,
    level: SimdLevel,
    dot: QuantDot,
    x: &[f32],
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    m: usize,
    out: &mut [f32],
) -> Result<()> {
    product_into(pool, level, dot, ManyItem { x, n, k, w, dtype, m, out }, &mut None)
}

/// [`matmul`] of `item`, with the prepared activations of the last product made from its `x`
/// in `made`: reused where this product's weights are of the same type, else made here and
/// left there ([`super::many::matmul_same_x`]). Decode-sized products split over the pool
/// prepare their own ([`super::many::matmul_many`]).
pub(super) fn product_into<'a>(pool: Option<&ThreadPool>, level: SimdLevel, dot: QuantDot, item: ManyItem<'a>, made: &mut Option<Product<'a>>) -> Result<()> {
    let ManyItem { x, n, k, w, dtype, m, out } = item;
    let work = need(need(n, k, "n·k")?, m, "n·k·m")?;
    let pool = pool.filter(|p| p.current_num_threads() > 1 && work >= PARALLEL_MIN_WORK && m >= 2 * CHUNK_ROWS);
    if let Some(pool) = pool.filter(|_| n <= DECODE_TOKENS) {
        return super::many::matmul_many(pool, level, dot, &mut [ManyItem { x, n, k, w, dtype, m, out }]);
    }
    let p = match made {
        Some(p) if p.dtype == dtype => p,
        _ => made.insert(Product::new(level, dot, x, n, k, dtype)?),
    };
    let w = whole_rows(w, out.len(), n, m, k, dtype)?;
    match pool {
        None => p.rows(w, 0..m, out),
        Some(pool) if p.in_place() => {
            // SAFETY: each task writes only its own columns `r` of the `[n, m]` output.
            prefill_tasks(pool, n, m, dtype.row_bytes(k), out, |r, dst| unsafe { p.rows_in_place(w, r, dst, m) })
        }
        Some(pool) => prefill_rows(pool, n, m, dtype.row_bytes(k), out, |r, o| p.rows(w, r, o)),
    }
}

/// Runs `f(rows, out_rows)` over the row tasks of a prefill-sized `[n, m]` product on `pool`
/// as rayon shares them out, each into a buffer of its own (`[n, rows.len()]`: a task's
/// columns are strided in `out`) that the task then copies into `out` itself, while the
/// buffer is in its cache. Copied afterwards on the calling thread, the buffers (~900 MB by
/// the products' shapes in a 512-token prefill of the 12-layer Qwen3-30B-A3B shape) kept the
/// other worker waiting: the bf16 prefill ran ~1.5 % faster without that (6 alternating
/// pairs). Compute-bound, these gained nothing from the contiguous runs of one-token
/// products ([`super::ranges`]): in them MXFP4 and Q8_0 512-token prefills ran 3–5 % slower.
fn prefill_rows(
    pool: &ThreadPool,
    n: usize,
    m: usize,
    row_bytes: usize,
    out: &mut [f32],
    f: impl Fn(Range<usize>, &mut [f32]) -> Result<()> + Sync,
) -> Result<()> {
    prefill_tasks(pool, n, m, row_bytes, out, |r, dst| {
        let mut buf = vec![0f32; n * r.len()];
        f(r.clone(), &mut buf)?;
        for (t, src) in buf.chunks_exact(r.len()).enumerate() {
            // SAFETY: `prefill_tasks` checked that `out` holds `n·m` values, and row `t`'s
            // columns `r` belong to this task alone.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.at(t * m + r.start), r.len()) };
        }
        Ok(())
    })
}

/// Runs `f(rows, dst)` over the row tasks of a prefill-sized `[n, m]` product on `pool`, with
/// `dst` the start of `out`; `f` must write only columns `rows` of its `n` rows. Nothing else
/// reads or writes `out` until every task is done.
fn prefill_tasks(
    pool: &ThreadPool,
    n: usize,
    m: usize,
    row_bytes: usize,
    out: &mut [f32],
    f: impl Fn(Range<usize>, super::Out) -> Result<()> + Sync,
) -> Result<()> {
    use rayon::prelude::*;
    if out.len() < need(n, m, "n·m")? {
        return Err(shape_err(format!("matmul output holds {}, need {n}×{m}", out.len())));
    }
    let per_task = task_rows(pool.current_num_threads(), n, m, row_bytes);
    let dst = super::Out(out.as_mut_ptr());
    pool.install(|| {
        (0..m.div_ceil(per_task)).into_par_iter().with_max_len(1).try_for_each(|i| f(i * per_task..((i + 1) * per_task).min(m), dst))
    })
}

/// A task's `[n, len]` buffer of output rows `r0..r0 + len` into the `[n, m]` output.
pub(super) fn put_rows(out: &mut [f32], m: usize, r0: usize, buf: &[f32], n: usize) {
    let len = buf.len() / n;
    for (t, src) in buf.chunks_exact(len).enumerate() {
        out[t * m + r0..][..len].copy_from_slice(src);
    }
}

/// One product's activations, prepared once for whichever kernel its weights' type and its
/// size take (the weights are checked by the caller, [`whole_rows`], so that the per-chunk
/// calls of [`Product::rows`] cannot fail half-way through on a shape).
pub(super) struct Product<'a> {
    kind: Kind<'a>,
    level: SimdLevel,
    x: &'a [f32],
    n: usize,
    k: usize,
    dtype: DType,
}

/// Which kernel family a [`Product`] runs.
enum Kind<'a> {
    /// bf16 activations ([`bf16_activations`]).
    Bf16(Bf16X),
    /// The fused block-quantized kernels.
    Fused(Prepared<'a>),
    /// [`matmul_rows`].
    Rows,
}

impl<'a> Product<'a> {
    pub(super) fn new(level: SimdLevel, dot: QuantDot, x: &'a [f32], n: usize, k: usize, dtype: DType) -> Result<Self> {
        let kind = if let Some(xb) = bf16_activations(level, dot, x, n, k, dtype)? {
            Kind::Bf16(xb)
        } else if let Some(prep) = dtype.is_quantized().then(|| Prepared::new(level, dot, x, k, n, k, dtype)).transpose()?.flatten() {
            // Padding, sub-block sums and int8 codes are made once, not once per row chunk.
            Kind::Fused(prep)
        } else {
            if x.len() < need(n, k, "n·k")? {
                return Err(shape_err(format!("matmul of {n} tokens × k={k}: x has {}", x.len())));
            }
            Kind::Rows
        };
        Ok(Self { kind, level, x, n, k, dtype })
    }

    /// Whether [`Product::rows_in_place`] serves this product: plain dtypes on the x86 tiles
    /// and the fused block-quantized kernels, which take an output row stride. A 512-token
    /// prefill otherwise zeroes and copies ~900 MB of task buffers (memset and memmove held
    /// ~3 % of a bf16 one's samples, ~4 % of a Q4_K_M one's).
    pub(super) fn in_place(&self) -> bool {
        match self.kind {
            Kind::Rows => !self.dtype.is_quantized() && in_place_level(self.level),
            Kind::Fused(_) => true,
            Kind::Bf16(_) => false,
        }
    }

    /// Rows `r` of weights `w` (checked by [`whole_rows`]) straight into columns `r` of the
    /// `[n, os]` output at `dst`, where [`Product::in_place`] says so.
    ///
    /// # Safety
    /// `dst` holds `n·os` values, `r.end ≤ os`, and nothing else reads or writes columns `r`
    /// of them while this runs.
    pub(super) unsafe fn rows_in_place(&self, w: &[u8], r: Range<usize>, dst: super::Out, os: usize) -> Result<()> {
        let (n, k) = (self.n, self.k);
        let w = &w[r.start * self.dtype.row_bytes(k)..];
        match &self.kind {
            Kind::Fused(prep) => prep.run_into(w, r.len(), dst.at(r.start), os),
            _ => block_in_place(self.level, self.x, k, n, k, w, self.dtype, k, r.len(), dst.at(r.start), os),
        }
    }

    /// Rows `r` of weights `w` (checked by [`whole_rows`]) into `o` (`[n, r.len()]`).
    pub(super) fn rows(&self, w: &[u8], r: Range<usize>, o: &mut [f32]) -> Result<()> {
        let (n, k, dtype) = (self.n, self.k, self.dtype);
        let rb = dtype.row_bytes(k);
        match &self.kind {
            Kind::Bf16(xb) if dtype.is_quantized() => {
                super::quant::block_bf16(self.level, xb, n, k, &w[r.start * rb..], dtype, r.len(), o, r.len())
            }
            Kind::Bf16(xb) => {
                bf16_rows(xb, n, k, w, r.clone(), o, r.len());
                Ok(())
            }
            Kind::Fused(prep) => prep.run(&w[r.start * rb..], r.len(), o, r.len()),
            Kind::Rows => matmul_rows(self.level, self.x, n, k, w, dtype, r, o),
        }
    }
}

/// The `m` rows of `w` after checking that they and the `[n, m]` output are there: checked
/// once, so that the per-chunk kernels taking row ranges cannot fail half-way through.
pub(super) fn whole_rows(w: &[u8], out_len: usize, n: usize, m: usize, k: usize, dtype: DType) -> Result<&[u8]> {
    if out_len < need(n, m, "n·m")? {
        return Err(shape_err(format!("matmul output holds {out_len}, need {n}×{m}")));
    }
    w.get(..need(m, dtype.row_bytes(k), "weight bytes")?)
        .ok_or_else(|| shape_err(format!("{dtype} matmul of {m} rows × k={k}: weights hold {} bytes", w.len())))
}

/// `x` rounded to bf16 when this product runs on `vdpbf16ps` (reduced-precision activations
/// allowed by `dot`, a CPU with AVX-512 BF16, and bf16 weights or a prefill-sized product of
/// integer block-quantized ones); `None` otherwise.
///
/// bf16 weights take it at every token count, decode too: prefill is compute-bound and gains
/// 1.7× from it, decode streams the same bytes either way, and rounding each token's
/// activations whatever else shares the product keeps a sequence's numbers the same alone and
/// in a batch. Quantized weights keep their int8 kernels up to 4 tokens; beyond, their rows are
/// dequantized and rounded to bf16 (no coarser than the int8 activations the mode already
/// accepts), where the f32 tiles ran at half the rate. The types that run their int8 kernels at
/// every token count ([`super::quant::in_groups`]) skip it, except in products that take the
/// AMX tiles. FP8 comes here only for the tiles, which take its codes unscaled: rounded to bf16
/// with their block scales its weights moved the FP8 fixture's logits by 0.36 between a
/// sequence alone and in a batch; elsewhere it meets bf16 activations in its own kernel, or
/// stays exact.
///
/// Products of at least [`super::x86::amx::MIN_TOKENS`] tokens also get the activations in
/// AMX tile order where the CPU has the tiles (and `k` is whole tile steps).
fn bf16_activations(level: SimdLevel, dot: QuantDot, x: &[f32], n: usize, k: usize, dtype: DType) -> Result<Option<Bf16X>> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::dpbf16;
        let quantized_prefill = dtype.is_quantized()
            && n > super::x86::qdot::MAX_TOKENS
            && !super::quant::in_groups(level, dot, dtype, n, k)
            && (dtype != DType::F8E4M3 || widened_on_tiles(level, dot, n, k));
        if n > 0 && dot == QuantDot::Int8 && (dtype == DType::BF16 || quantized_prefill) && level.effective() == SimdLevel::Avx512 && dpbf16::available() {
            let len = need(n, k, "n·k")?;
            let x = x.get(..len).ok_or_else(|| shape_err(format!("matmul of {n} tokens × k={k}: x holds {} values", x.len())))?;
            let mut xb = vec![0u16; len];
            round_bf16(x, &mut xb);
            let tiles = amx_tiles(level, dot, n, k).then(|| super::x86::amx::prepare(&xb, n, k));
            return Ok(Some(Bf16X { rows: xb, tiles }));
        }
    }
    let _ = (level, dot, x, n, k, dtype);
    Ok(None)
}

/// Whether a product of `n` tokens of `k` whose rows are widened to bf16 for the tiles (FP8's;
/// the integer types' under `FT_AMX_QUANT_PREFILL=1`) runs on them (from
/// [`super::x86::amx::WIDENED_MIN_TOKENS`]).
pub(crate) fn widened_on_tiles(level: SimdLevel, dot: QuantDot, n: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n >= super::x86::amx::WIDENED_MIN_TOKENS && amx_tiles(level, dot, n, k)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, dot, n, k);
        false
    }
}

/// Whether a product of `n` tokens of `k` in the bf16 path takes the AMX tiles: reduced
/// precision allowed by `dot`, AVX-512 BF16 in use, the tiles granted, at least
/// [`super::x86::amx::MIN_TOKENS`] tokens and `k` in whole tile steps.
pub(crate) fn amx_tiles(level: SimdLevel, dot: QuantDot, n: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::{amx, dpbf16};
        dot == QuantDot::Int8
            && level.effective() == SimdLevel::Avx512
            && n >= amx::MIN_TOKENS
            && k.is_multiple_of(amx::KSTEP)
            && dpbf16::available()
            && amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, dot, n, k);
        false
    }
}

/// A product's activations rounded to bf16 ([`bf16_activations`]).
pub(crate) struct Bf16X {
    /// `[n, k]`, row-major.
    pub rows: Vec<u16>,
    /// The same in AMX tile order ([`super::x86::amx::prepare`]), where the tiles run this
    /// product.
    pub tiles: Option<Vec<u32>>,
}

/// `src` rounded to bf16 (nearest even) into `dst` (as long as `src`).
pub(crate) fn round_bf16(src: &[f32], dst: &mut [u16]) {
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if super::x86::dpbf16::available() {
        // SAFETY: the instructions are there; both slices hold `src.len()` values.
        unsafe { super::x86::dpbf16::round_row(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
        return;
    }
    for (d, v) in dst.iter_mut().zip(src) {
        *d = half::bf16::from_f32(*v).to_bits();
    }
}

/// `out[t*os + r - rows.start] = xb[t, :] · w[r, :]` with bf16 activations `xb` (`[n, k]`)
/// and bf16 weight rows (`k` elements each, contiguous); `w` and `out` were checked to cover
/// `rows` by the caller, and `xb` is only ever made by [`bf16_activations`], on a CPU that has
/// the instructions. Whole tiles of 16 rows take the AMX tiles where `xb` has their order.
pub(crate) fn bf16_rows(xb: &Bf16X, n: usize, k: usize, w: &[u8], rows: Range<usize>, out: &mut [f32], os: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::dpbf16::{self, tile, Ahead, ROWS, TOKENS};
        use super::x86::{amx, Tile};
        let nrows = rows.len();
        let xt = &xb.tiles;
        let xb = &xb.rows;
        // A violated contract panics here rather than running the intrinsics out of bounds or
        // on a CPU without them.
        assert!(dpbf16::available(), "bf16 products need AVX-512 BF16");
        assert!(n > 0 && xb.len() >= n * k && w.len() >= rows.end * k * 2 && out.len() >= (n - 1) * os + nrows, "bf16 product extents");
        let wp = w.as_ptr().wrapping_add(rows.start * k * 2);
        let tiles = n.div_ceil(TOKENS);
        let mut r = 0;
        if let Some(xt) = xt {
            assert!(amx::available() && xt.len() * 2 >= n.div_ceil(amx::TILE) * amx::TILE * k, "AMX product extents");
            let row_tiles = nrows / amx::TILE;
            // SAFETY: the tiles were granted (`xt` exists only then), the extents were checked
            // above and `xt` is `amx::prepare`'s output for these `n` tokens of `k`.
            unsafe { amx::rows(xt, n, k, wp, row_tiles, out.as_mut_ptr(), os, None) };
            r = row_tiles * amx::TILE;
        }
        while r < nrows {
            let nr = if nrows - r >= ROWS { ROWS } else { 1 };
            // The next row block's bytes, shared out among this block's token tiles.
            let next = (nrows - r - nr).min(ROWS) * k * 2;
            let share = next.div_ceil(tiles).next_multiple_of(64);
            for (j, t0) in (0..n).step_by(TOKENS).enumerate() {
                let pf_start = (j * share).min(next);
                let a = Tile {
                    x: xb.as_ptr().wrapping_add(t0 * k),
                    xs: k,
                    w: wp.wrapping_add(r * k * 2),
                    wsb: k * 2,
                    k,
                    out: out.as_mut_ptr().wrapping_add(t0 * os + r),
                    os,
                    accumulate: false,
                    prefetch: false,
                };
                let ahead = Ahead { at: wp.wrapping_add((r + nr) * k * 2 + pf_start), len: share.min(next - pf_start) };
                // SAFETY: the extents were asserted above and `xb` exists only where the
                // instructions do.
                unsafe { tile(TOKENS.min(n - t0), nr, a, ahead) };
            }
            r += nr;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (xb, n, k, w, rows, out, os);
}

/// Rows of one pool task of an `n`-token product, a multiple of the prefill chunk so that no
/// thread gets a ragged tile in the middle of its range. Decode-sized products: tasks of
/// [`DECODE_TASK_BYTES`] (at most [`DECODE_TASKS`] of them); prefill: at least four tasks per
/// thread (uneven progress evens out), at most [`TASK_BYTES`] of weights.
pub(super) fn task_rows(threads: usize, n: usize, m: usize, row_bytes: usize) -> usize {
    let rows = if n <= DECODE_TOKENS {
        let bytes = DECODE_TASK_BYTES.max(m.saturating_mul(row_bytes) / DECODE_TASKS);
        bytes / row_bytes.max(1)
    } else {
        let even = m.div_ceil(threads.max(1) * 4);
        let cap = (TASK_BYTES / row_bytes.max(1)).max(1);
        even.min(cap)
    };
    rows.max(1).next_multiple_of(CHUNK_ROWS)
}

/// Strided core: `out[t*os + r] = x[t*xs..][..k] · w_row(r)` for `t < n`, `r < nrows`, where
/// weight row `r` starts at element `r * ws` of `w`. Attention uses the strides to walk the
/// heads of a KV cache in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    level: SimdLevel,
    x: &[f32],
    xs: usize,
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    ws: usize,
    nrows: usize,
    out: &mut [f32],
    os: usize,
) -> Result<()> {
    if n == 0 || nrows == 0 {
        return Ok(());
    }
    if dtype.is_quantized() {
        // Quantized rows are whole blocks, contiguous; no caller strides over them.
        return Err(shape_err(format!(
            "strided {dtype} rows are not supported (matmul reads them whole)"
        )));
    }
    check_block(x, xs, n, k, w, dtype, ws, nrows, out.len(), os)?;
    if in_place_level(level) {
        // SAFETY: the check above covers every output the kernels write, and `out` is
        // borrowed whole for the call.
        return unsafe { block_in_place(level, x, xs, n, k, w, dtype, ws, nrows, out.as_mut_ptr(), os) };
    }
    // With `k = 0` every dot product is empty: zeros.
    scalar_block(x, xs, n, k, w, dtype, ws, nrows, out, os);
    Ok(())
}

/// The extents of a strided [`block`] against what its views hold, in checked arithmetic so
/// absurd strides fail cleanly.
#[allow(clippy::too_many_arguments)]
fn check_block(x: &[f32], xs: usize, n: usize, k: usize, w: &[u8], dtype: DType, ws: usize, nrows: usize, out_len: usize, os: usize) -> Result<()> {
    let x_need = (n - 1).checked_mul(xs).and_then(|v| v.checked_add(k));
    let w_need = (nrows - 1).checked_mul(ws).and_then(|v| v.checked_add(k)).and_then(|v| v.checked_mul(dtype.size()));
    let out_need = (n - 1).checked_mul(os).and_then(|v| v.checked_add(nrows));
    let fits = |need: Option<usize>, have: usize| need.is_some_and(|v| v <= have);
    if !fits(x_need, x.len()) || !fits(w_need, w.len()) || !fits(out_need, out_len) {
        return Err(shape_err(format!(
            "matmul block of {n} tokens × {nrows} rows × k={k}: x has {} values, w {} bytes, out {out_len} values",
            x.len(),
            w.len(),
        )));
    }
    Ok(())
}

/// Whether [`block_in_place`] runs at `level`: the x86 tiles, which write through pointers.
fn in_place_level(level: SimdLevel) -> bool {
    cfg!(target_arch = "x86_64") && matches!(level.effective(), SimdLevel::Avx2 | SimdLevel::Avx512)
}

/// [`block`] of plain-dtype rows into `n` output rows of stride `os` at `out` on the x86
/// tiles; prefill tasks call it directly, sharing one output (each writing columns of its
/// own), so no `&mut` slice covers them.
///
/// # Safety
/// `out` holds `(n - 1)·os + nrows` values that nothing else reads or writes while this runs,
/// and [`in_place_level`] holds for `level`.
#[allow(clippy::too_many_arguments)]
unsafe fn block_in_place(level: SimdLevel, x: &[f32], xs: usize, n: usize, k: usize, w: &[u8], dtype: DType, ws: usize, nrows: usize, out: *mut f32, os: usize) -> Result<()> {
    if n == 0 || nrows == 0 {
        return Ok(());
    }
    if dtype.is_quantized() {
        return Err(shape_err(format!("{dtype} rows do not take the in-place kernels")));
    }
    check_block(x, xs, n, k, w, dtype, ws, nrows, (n - 1) * os + nrows, os)?;
    if k == 0 {
        for t in 0..n {
            std::ptr::write_bytes(out.add(t * os), 0, nrows);
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let d = super::x86::code(dtype);
        // `effective` confirms the instruction set; `check_block` covered what the driver reads.
        match level.effective() {
            SimdLevel::Avx512 => return drive::<Avx512>(x, xs, n, k, w, d, ws, nrows, out, os),
            SimdLevel::Avx2 => return drive::<Avx2>(x, xs, n, k, w, d, ws, nrows, out, os),
            _ => {}
        }
    }
    let _ = (level, x, xs, w, ws, out);
    Err(shape_err("the in-place kernels need AVX2 or AVX-512"))
}

#[allow(clippy::too_many_arguments)]
fn scalar_block(
    x: &[f32],
    xs: usize,
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    ws: usize,
    nrows: usize,
    out: &mut [f32],
    os: usize,
) {
    let es = dtype.size();
    let mut row = vec![0f32; k];
    for r in 0..nrows {
        decode_scalar(&w[r * ws * es..][..k * es], dtype, &mut row);
        for t in 0..n {
            out[t * os + r] = dot(&x[t * xs..][..k], &row);
        }
    }
}

/// Dot product with eight independent partial sums (lane-shaped, so the compiler can keep
/// them in one vector register and the adds do not wait on each other).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(p, q)| p * q)
        .sum();
    for (pa, pb) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += pa[i] * pb[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The per-ISA pieces the shared tiling driver needs.
#[cfg(target_arch = "x86_64")]
trait Isa {
    const TOKENS: usize;
    const ROWS: usize;
    /// Rows a one-token tile of code `d` streams at once ([`Isa::ROWS`] unless the ISA has a
    /// wider one-token tile for it).
    fn one_token_rows(_d: u8) -> usize {
        Self::ROWS
    }
    /// Whether many-token products take the packed panels ([`super::x86::panel`]).
    const PANELS: bool;
    unsafe fn tile(d: u8, nt: usize, nr: usize, a: super::x86::Tile);
    unsafe fn decode(d: u8, src: *const u8, dst: *mut f32, len: usize);
}

#[cfg(target_arch = "x86_64")]
struct Avx512;
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Isa for Avx512 {
    const TOKENS: usize = super::x86::avx512::TOKENS;
    const ROWS: usize = super::x86::avx512::ROWS;
    const PANELS: bool = false;
    unsafe fn tile(d: u8, nt: usize, nr: usize, a: super::x86::Tile) {
        super::x86::avx512::tile(d, nt, nr, a)
    }
    unsafe fn decode(d: u8, src: *const u8, dst: *mut f32, len: usize) {
        super::x86::avx512::decode(d, src, dst, len)
    }
}

#[cfg(target_arch = "x86_64")]
impl Isa for Avx2 {
    const TOKENS: usize = super::x86::avx2::TOKENS;
    const ROWS: usize = super::x86::avx2::ROWS;
    fn one_token_rows(d: u8) -> usize {
        super::x86::avx2::one_token_rows(d)
    }
    const PANELS: bool = true;
    unsafe fn tile(d: u8, nt: usize, nr: usize, a: super::x86::Tile) {
        super::x86::avx2::tile(d, nt, nr, a)
    }
    unsafe fn decode(d: u8, src: *const u8, dst: *mut f32, len: usize) {
        super::x86::avx2::decode(d, src, dst, len)
    }
}

/// Tiles `n × nrows` into `TOKENS × ROWS` blocks (single rows at the ragged end).
///
/// # Safety
/// The ISA is available, and the slices and `op` cover the strided extents (checked by
/// [`check_block`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn drive<I: Isa>(
    x: &[f32],
    xs: usize,
    n: usize,
    k: usize,
    w: &[u8],
    d: u8,
    ws: usize,
    nrows: usize,
    op: *mut f32,
    os: usize,
) -> Result<()> {
    use super::x86::{esize, Tile, F32};
    let es = esize(d);
    let xp = x.as_ptr();
    let rows_of = |left: usize| if left >= I::ROWS { I::ROWS } else { 1 };
    if n < 2 * I::TOKENS {
        // Few tokens: stream each weight row once per token tile, widening in registers.
        for t0 in (0..n).step_by(I::TOKENS) {
            let nt = I::TOKENS.min(n - t0);
            let wide = if nt == 1 { I::one_token_rows(d) } else { I::ROWS };
            let mut r = 0;
            while r < nrows {
                let nr = if nrows - r >= wide { wide } else { rows_of(nrows - r) };
                let a = Tile {
                    x: xp.add(t0 * xs),
                    xs,
                    w: w.as_ptr().add(r * ws * es),
                    wsb: ws * es,
                    k,
                    out: op.add(t0 * os + r),
                    os,
                    accumulate: false,
                    prefetch: true,
                };
                I::tile(d, nt, nr, a);
                r += nr;
            }
        }
        return Ok(());
    }
    if I::PANELS && n >= super::x86::panel::min_tokens(d) {
        super::x86::panel::rows(xp, xs, n, k, w.as_ptr(), d, ws, nrows, op, os);
        return Ok(());
    }
    // Many tokens where the panels do not serve (AVX-512; f32 and f16 at 4..16 tokens): widen
    // a chunk of rows once into contiguous f32 scratch (a plain copy for f32, which still buys
    // contiguous, cache-resident rows), then sweep every token over it in k blocks so the
    // chunk's k-slice and the current activation tile stay in L1.
    let mut scratch = vec![0f32; CHUNK_ROWS * k];
    for c0 in (0..nrows).step_by(CHUNK_ROWS) {
        let cr = CHUNK_ROWS.min(nrows - c0);
        for r in 0..cr {
            I::decode(
                d,
                w.as_ptr().add((c0 + r) * ws * es),
                scratch.as_mut_ptr().add(r * k),
                k,
            );
        }
        let (wp, wsb) = (scratch.as_ptr() as *const u8, k * 4);
        for kb in (0..k).step_by(KC) {
            let kl = KC.min(k - kb);
            for t0 in (0..n).step_by(I::TOKENS) {
                let nt = I::TOKENS.min(n - t0);
                let mut r = 0;
                while r < cr {
                    let nr = rows_of(cr - r);
                    let a = Tile {
                        x: xp.add(t0 * xs + kb),
                        xs,
                        w: wp.add(r * wsb + kb * 4),
                        wsb,
                        k: kl,
                        out: op.add(t0 * os + c0 + r),
                        os,
                        accumulate: kb > 0,
                        prefetch: false,
                    };
                    I::tile(F32, nt, nr, a);
                    r += nr;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "gemv_bf16_tests.rs"]
mod bf16_tests;
