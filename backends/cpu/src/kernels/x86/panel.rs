//! AVX2 prefill products over packed weight panels: the register tile of a BLAS-style GEMM.
//!
//! The general tiles ([`super::avx2::tile`]) take dot products along `k`: every 8-value step
//! loads `T` activation vectors and `R` weight vectors for `T·R` FMAs, and with 2 tokens × 4
//! rows (what sixteen registers hold) twelve loads fed eight FMAs, so a prefill ran at about
//! half the FMA rate. Here a chunk of [`NR`] weight rows is widened once into a panel laid
//! out `[k][NR]`, and each step of `k` loads two weight vectors (16 rows) and broadcasts one
//! activation per token for [`MR`] tokens: eight loads for twelve FMAs, the FMA units the
//! limit. A bf16 panel stays bf16 ([`pack_half`]): each step loads its 16 values in one vector
//! and widens them in registers, a shift and a mask, where packing them as f32 took twice the
//! stores and the tiles twice the reads.
//!
//! Each output is one FMA chain over `k` in order, kept in a register within a `k` block and
//! stored and reloaded across blocks (exact), so a token's sums do not depend on which tokens
//! share its tile, how many there are, or the block length.
//!
//! Safety contract of every `pub(crate) unsafe fn` here: the CPU has AVX2, FMA and F16C, and
//! the pointers cover the extents the arguments describe.

use super::{esize, BF16, F16, F32};
use std::arch::x86_64::*;

/// Weight rows per panel: two 8-lane vectors.
pub(crate) const NR: usize = 16;
/// Tokens per tile: 6 × 2 accumulators, two weight vectors and one broadcast use 15 of the
/// 16 ymm registers.
pub(crate) const MR: usize = 6;
/// `k` values per block: the panel's slice (32 KiB) and a tile's activations (12 KiB) stay
/// in L1/L2 while every tile of tokens sweeps them (512 ran 1–3 % faster than 256 at 16–64
/// tokens).
const KB: usize = 512;
/// [`KB`] for bf16 panels (64 KiB, in L2): fewer blocks, so fewer passes that store a tile's
/// sums and load them back. Alternated call by call with the f32 panels at [`KB`] in one
/// process, cold experts (k=2048 × 768), the median time ratio at 16/32/64/128/512 tokens was
/// 1.10/1.09/1.08/1.06/1.07 on one thread and 1.15/1.12/1.05/1.06/1.06 on two; at 1024,
/// 1.04–1.11.
const KB_HALF: usize = 2048;
/// Fewest tokens whose f32 or f16 products take the panels: packing as f32 costs about what
/// one token's products do, so at 5 tokens the general tiles ran faster (33 against 45
/// GFLOP/s, bf16 rows when they too were packed as f32, one thread), at 16 the panels as fast
/// or faster (58–62 against 44–63).
const MIN_TOKENS: usize = 16;
/// [`MIN_TOKENS`] for bf16 weights, whose panels cost half as much to pack ([`pack_half`]):
/// from 4 tokens (the fewest the streaming tiles leave, see `gemv::drive`) they beat the
/// general tiles over rows widened into scratch. Alternated call by call in one process, cold
/// experts (k=2048 × 768), the median time ratio at 4/5/6/8/10/12/14 tokens was
/// 1.26/1.20/1.12/1.23/1.30/1.36/1.37 on two threads, 1.10–1.31 on one; at 2 and 3 tokens
/// (4 and 6 FMA chains a tile) the panels were 30–50 % slower than the streaming tiles.
const MIN_TOKENS_HALF: usize = 4;

/// The fewest tokens whose products of code `d` take the panels.
pub(crate) const fn min_tokens(d: u8) -> usize {
    if d == BF16 {
        MIN_TOKENS_HALF
    } else {
        MIN_TOKENS
    }
}

/// The 8×8 transpose of `r` (row `i` of the result is lane `i` of every input).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xee>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xee>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xee>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xee>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// Packs `rows` (≤ [`NR`]) rows of `k` values of code `D`, row `r` at `src + r·sb` bytes,
/// into `panel` (`k · NR` values) as f32 `[k][NR]`, widening and transposing eight rows by
/// eight values at a time; rows past `rows` are zeros.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack<const D: u8>(src: *const u8, sb: usize, rows: usize, k: usize, panel: *mut f32) {
    let es = esize(D);
    let mut kk = 0;
    if rows == NR {
        while kk + 8 <= k {
            for h in 0..2 {
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, v) in r.iter_mut().enumerate() {
                    *v = super::avx2::load::<D>(src.add((8 * h + i) * sb + kk * es));
                }
                for (i, v) in transpose8(r).into_iter().enumerate() {
                    _mm256_store_ps(panel.add((kk + i) * NR + 8 * h), v);
                }
            }
            kk += 8;
        }
    }
    for kk in kk..k {
        for r in 0..NR {
            *panel.add(kk * NR + r) = if r < rows { super::scalar_at::<D>(src.add(r * sb), kk) } else { 0.0 };
        }
    }
}

/// Where row `r` of a bf16 panel's step sits among its [`NR`] 16-bit values: rows `i` and
/// `i + 8` share 32-bit lane `i`, low and high half, so that a shift widens the first eight
/// and a mask the last eight, each in row order.
const fn half_lane(r: usize) -> usize {
    if r < 8 {
        2 * r
    } else {
        2 * (r - 8) + 1
    }
}

/// [`pack`] for bf16 rows, kept bf16: `[k][NR]` 16-bit values in [`half_lane`] order. Sixteen
/// steps at a time, rows `i` and `i + 8` are interleaved into 32-bit pairs and the pairs
/// transposed eight by eight ([`transpose8`]).
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_half(src: *const u8, sb: usize, rows: usize, k: usize, panel: *mut u16) {
    let mut kk = 0;
    if rows == NR {
        while kk + 16 <= k {
            let ld = |i: usize| _mm256_loadu_si256(src.add(i * sb + kk * 2) as *const __m256i);
            let (mut lo, mut hi) = ([_mm256_setzero_ps(); 8], [_mm256_setzero_ps(); 8]);
            for i in 0..8 {
                let (a, b) = (ld(i), ld(i + 8));
                // Pair e of `lo[i]`: rows i and i + 8 at step [0, 1, 2, 3, 8, 9, 10, 11][e];
                // of `hi[i]`, at [4, 5, 6, 7, 12, 13, 14, 15][e].
                lo[i] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(a, b));
                hi[i] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(a, b));
            }
            for (e, v) in transpose8(lo).into_iter().enumerate() {
                _mm256_store_ps(panel.add((kk + e + if e < 4 { 0 } else { 4 }) * NR) as *mut f32, v);
            }
            for (e, v) in transpose8(hi).into_iter().enumerate() {
                _mm256_store_ps(panel.add((kk + e + if e < 4 { 4 } else { 8 }) * NR) as *mut f32, v);
            }
            kk += 16;
        }
    }
    for kk in kk..k {
        for r in 0..NR {
            let v = if r < rows { (src.add(r * sb + kk * 2) as *const u16).read_unaligned() } else { 0 };
            *panel.add(kk * NR + half_lane(r)) = v;
        }
    }
}

/// Step `j`'s 16 weights of a panel: f32 values ([`pack`]), or bf16 ones ([`pack_half`])
/// where `HALF`, widened exactly.
#[inline(always)]
unsafe fn step<const HALF: bool>(panel: *const u8, j: usize) -> (__m256, __m256) {
    if HALF {
        let v = _mm256_load_si256(panel.add(j * NR * 2) as *const __m256i);
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
            _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536))),
        )
    } else {
        let p = panel.add(j * NR * 4) as *const f32;
        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
}

/// `out[t·os + r] (+)= Σ_j x[t·xs + j] · w(j, r)` for `t < M`, `r < nr` (≤ [`NR`]), `j < k`,
/// `w(j, ·)` the panel's step `j` ([`step`]), each sum one FMA chain in `j` order, added to
/// what `out` holds where `accumulate`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const M: usize, const HALF: bool>(x: *const f32, xs: usize, panel: *const u8, k: usize, out: *mut f32, os: usize, nr: usize, accumulate: bool) {
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    // A ragged panel's outputs go through a whole-width buffer.
    let mut part = [[0f32; NR]; M];
    if accumulate {
        for (t, a) in acc.iter_mut().enumerate() {
            let o = if nr == NR {
                out.add(t * os)
            } else {
                part[t][..nr].copy_from_slice(std::slice::from_raw_parts(out.add(t * os), nr));
                part[t].as_ptr()
            };
            *a = [_mm256_loadu_ps(o), _mm256_loadu_ps(o.add(8))];
        }
    }
    for j in 0..k {
        let (w0, w1) = step::<HALF>(panel, j);
        for (t, a) in acc.iter_mut().enumerate() {
            let xb = _mm256_broadcast_ss(&*x.add(t * xs + j));
            a[0] = _mm256_fmadd_ps(xb, w0, a[0]);
            a[1] = _mm256_fmadd_ps(xb, w1, a[1]);
        }
    }
    for (t, a) in acc.iter().enumerate() {
        if nr == NR {
            _mm256_storeu_ps(out.add(t * os), a[0]);
            _mm256_storeu_ps(out.add(t * os + 8), a[1]);
        } else {
            _mm256_storeu_ps(part[t].as_mut_ptr(), a[0]);
            _mm256_storeu_ps(part[t].as_mut_ptr().add(8), a[1]);
            std::slice::from_raw_parts_mut(out.add(t * os), nr).copy_from_slice(&part[t][..nr]);
        }
    }
}

/// One [`tile`] of `m` (1..=[`MR`]) tokens.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_m<const HALF: bool>(m: usize, x: *const f32, xs: usize, panel: *const u8, k: usize, out: *mut f32, os: usize, nr: usize, accumulate: bool) {
    match m {
        1 => tile::<1, HALF>(x, xs, panel, k, out, os, nr, accumulate),
        2 => tile::<2, HALF>(x, xs, panel, k, out, os, nr, accumulate),
        3 => tile::<3, HALF>(x, xs, panel, k, out, os, nr, accumulate),
        4 => tile::<4, HALF>(x, xs, panel, k, out, os, nr, accumulate),
        5 => tile::<5, HALF>(x, xs, panel, k, out, os, nr, accumulate),
        _ => tile::<MR, HALF>(x, xs, panel, k, out, os, nr, accumulate),
    }
}

/// `out[t·os + r] = x[t·xs..][..k] · w_row(r)` for `t < n`, `r < nrows`, weight row `r` of code
/// `d` starting at element `r·ws` of `w`: each [`NR`] rows packed a [`KB`] ([`KB_HALF`] for
/// bf16) block of `k` at a time, every token swept over the block in tiles of at most [`MR`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(x: *const f32, xs: usize, n: usize, k: usize, w: *const u8, d: u8, ws: usize, nrows: usize, out: *mut f32, os: usize) {
    thread_local! {
        // Reused: the exact path of the block types calls this once per 16 rows, where zeroing
        // a fresh panel of the whole `k` (128 KiB, ~4 µs) was a sixth of a 32-token chunk's
        // products (~25 µs).
        static STORE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    STORE.with(|store| {
        let mut store = store.borrow_mut();
        // Values of either panel: f32 at `KB` steps, or bf16 at `KB_HALF`.
        let len = (NR * KB).max(NR * KB_HALF / 2) + 8;
        if store.len() < len {
            store.resize(len, 0.0);
        }
        // 32-byte aligned, so no weight load splits a cache line; `pack` writes all of it.
        let panel = store.as_mut_ptr().add(store.as_ptr().align_offset(32).min(8));
        rows_in(x, xs, n, k, w, d, ws, nrows, out, os, panel);
    })
}

/// [`rows`] with `panel` (32-byte aligned, room for either panel's block) to pack into.
///
/// Each block of a panel is packed just before the tiles read it, so they find it in L1 (an
/// f32 block of [`KB`] steps) or L2 (a bf16 one of [`KB_HALF`]) rather than farther out, and
/// the tokens go in tiles of as even a size as [`MR`] allows ([`tile_sizes`]).
#[allow(clippy::too_many_arguments)]
unsafe fn rows_in(x: *const f32, xs: usize, n: usize, k: usize, w: *const u8, d: u8, ws: usize, nrows: usize, out: *mut f32, os: usize, panel: *mut f32) {
    let es = esize(d);
    let half = d == BF16;
    let block = if half { KB_HALF } else { KB };
    for c0 in (0..nrows).step_by(NR) {
        let cr = NR.min(nrows - c0);
        let sb = ws * es;
        for kb in (0..k).step_by(block) {
            let kl = block.min(k - kb);
            let first = w.add(c0 * sb + kb * es);
            match d {
                F32 => pack::<F32>(first, sb, cr, kl, panel),
                F16 => pack::<F16>(first, sb, cr, kl, panel),
                _ => pack_half(first, sb, cr, kl, panel as *mut u16),
            }
            let mut t0 = 0;
            for m in tile_sizes(n) {
                let (xt, ot, p) = (x.add(t0 * xs + kb), out.add(t0 * os + c0), panel as *const u8);
                if half {
                    tile_m::<true>(m, xt, xs, p, kl, ot, os, cr, kb > 0);
                } else {
                    tile_m::<false>(m, xt, xs, p, kl, ot, os, cr, kb > 0);
                }
                t0 += m;
            }
        }
    }
}

/// `n` tokens split into the fewest tiles of at most [`MR`], their sizes differing by at most
/// one: a tile of one to three tokens holds two to six FMA chains, fewer than the eight that
/// keep both FMA units busy through their 4-cycle latency, so 32 tokens as 6+6+5+5+5+5 ran
/// faster than as 6+6+6+6+6+2.
fn tile_sizes(n: usize) -> impl Iterator<Item = usize> {
    let tiles = n.div_ceil(MR);
    let (base, extra) = (n.checked_div(tiles).unwrap_or(0), n.checked_rem(tiles).unwrap_or(0));
    (0..tiles).map(move |i| base + usize::from(i < extra))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_backend::conformance::Rng;

    /// The fewest tiles, none over `MR`, sizes within one of each other, all tokens once.
    #[test]
    fn tiles_split_tokens_evenly() {
        for n in 0..200 {
            let sizes: Vec<usize> = tile_sizes(n).collect();
            assert_eq!(sizes.iter().sum::<usize>(), n, "n={n}");
            assert_eq!(sizes.len(), n.div_ceil(MR), "n={n}");
            let (lo, hi) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
            assert!(hi <= MR && hi - lo <= 1, "n={n}: {sizes:?}");
        }
        assert_eq!(tile_sizes(32).collect::<Vec<_>>(), [6, 6, 5, 5, 5, 5]);
    }

    /// Every shape edge (ragged panels, 1..=MR+1 tokens, k across and off block and vector
    /// bounds, strided rows and outputs, f32/f16/bf16 rows): each output equals one FMA chain
    /// over `k` in order, computed in scalar code, bit for bit.
    #[test]
    fn panels_give_one_fma_chain_per_output() {
        if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("f16c")) {
            eprintln!("skipped: this CPU has no AVX2/FMA/F16C");
            return;
        }
        let mut rng = Rng::new(0x9a2);
        for &(n, nrows, k) in &[(1, 16, 8), (7, 16, 256), (6, 33, 300), (13, 5, 517), (4, 48, 1024), (2, 17, 3), (12, 31, 2048), (7, 32, 2100)] {
            for d in [F32, super::super::F16, super::super::BF16] {
                let (xs, ws, os) = (k + 3, k + 5, nrows + 2);
                let x = rng.vec(n * xs, 1.0);
                let wf = rng.vec(nrows * ws, 1.0);
                let wb: Vec<u8> = match d {
                    F32 => wf.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    super::super::F16 => wf.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
                    _ => wf.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
                };
                let wv = |i: usize| match d {
                    F32 => wf[i],
                    super::super::F16 => half::f16::from_f32(wf[i]).to_f32(),
                    _ => half::bf16::from_f32(wf[i]).to_f32(),
                };
                let mut out = vec![f32::NAN; n * os];
                // SAFETY: AVX2/FMA/F16C checked above; the buffers cover the strided extents.
                unsafe { rows(x.as_ptr(), xs, n, k, wb.as_ptr(), d, ws, nrows, out.as_mut_ptr(), os) };
                for t in 0..n {
                    for r in 0..nrows {
                        let want = (0..k).fold(0f32, |s, j| x[t * xs + j].mul_add(wv(r * ws + j), s));
                        assert_eq!(out[t * os + r].to_bits(), want.to_bits(), "n={n} rows={nrows} k={k} d={d}: ({t}, {r})");
                    }
                }
            }
        }
    }
}
