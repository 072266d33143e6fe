//! AVX-512 kernels: 16 f32 lanes, masked loads for the tails (no scalar epilogue).
//!
//! Safety contract of every `pub(crate) unsafe fn` here: the CPU supports AVX-512 F/BW/VL,
//! AVX2, FMA and F16C (checked by `SimdLevel::effective`), and the pointers cover the ranges
//! the arguments describe.

use super::qdot::{prefetch_offset, PF};
use super::{esize, expc, store, Pv, Tile, BF16, F16, F32};
use std::arch::x86_64::*;

/// Token rows per tile; with `ROWS` weight rows this is 24 accumulators, leaving registers
/// for the four weight vectors and one activation vector (32 zmm in all). Measured ~4 %
/// faster for prefill than 4 tokens, and up to n = 6 tokens stream the weights only once.
pub(crate) const TOKENS: usize = 6;
/// Weight rows per tile.
pub(crate) const ROWS: usize = 4;

/// 16 weight elements at `p` widened to f32. bf16 is the upper half of an f32, so widening is
/// a zero-extend and a shift: exact, and activations stay f32 (no `vdpbf16ps` rounding).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn load<const D: u8>(p: *const u8) -> __m512 {
    match D {
        F32 => _mm512_loadu_ps(p as *const f32),
        F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
        _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256(p as *const __m256i),
        ))),
    }
}

/// Like [`load`] for the lanes set in `m`; masked-off lanes are zero and never touch memory,
/// so a tail may end at the last byte of a mapping.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn load_masked<const D: u8>(m: __mmask16, p: *const u8) -> __m512 {
    match D {
        F32 => _mm512_maskz_loadu_ps(m, p as *const f32),
        F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16)),
        _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
            _mm256_maskz_loadu_epi16(m, p as *const i16),
        ))),
    }
}

#[inline]
fn tail_mask(n: usize) -> __mmask16 {
    debug_assert!(n < 16);
    ((1u32 << n) - 1) as __mmask16
}

/// Stores a `T × R` tile of accumulators as `out[t*os + r]`. (A shuffle-tree reduction of
/// four rows at once measured no faster than separate `reduce_add`s here.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn store_tile<const T: usize, const R: usize>(acc: &[[__m512; R]; T], a: &Tile) {
    for (t, row) in acc.iter().enumerate() {
        for (r, s) in row.iter().enumerate() {
            store(
                a.out.add(t * a.os + r),
                _mm512_reduce_add_ps(*s),
                a.accumulate,
            );
        }
    }
}

/// GEMV of one row (one token): two accumulators so each iteration consumes a whole cache
/// line of bf16/f16 and the FMA chains overlap; prefetching [`PF`] bytes ahead runs on into
/// the next row, which is the one read next.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn gemv_row<const D: u8>(a: Tile) {
    let es = esize(D);
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut p = 0;
    while p + 32 <= a.k {
        let wp = a.w.add(p * es);
        if a.prefetch {
            super::prefetch(wp.wrapping_add(PF) as *const u8);
        }
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.x.add(p)), load::<D>(wp), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a.x.add(p + 16)), load::<D>(wp.add(16 * es)), acc1);
        p += 32;
    }
    while p < a.k {
        let m = if a.k - p >= 16 { 0xffff } else { tail_mask(a.k - p) };
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a.x.add(p)), load_masked::<D>(m, a.w.add(p * es)), acc0);
        p += 16;
    }
    store_tile::<1, 1>(&[[_mm512_add_ps(acc0, acc1)]], &a);
}

/// `T` tokens × `R` rows: each weight vector is loaded (and widened) once for all tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile_tr<const T: usize, const R: usize, const D: u8>(a: Tile) {
    let es = esize(D);
    let mut acc = [[_mm512_setzero_ps(); R]; T];
    let mut p = 0;
    while p + 16 <= a.k {
        let mut wv = [_mm512_setzero_ps(); R];
        for (r, v) in wv.iter_mut().enumerate() {
            let wp = a.w.add(r * a.wsb + p * es);
            if a.prefetch {
                super::prefetch(wp.wrapping_add(prefetch_offset::<R>(a.wsb, p * es)) as *const u8);
            }
            *v = load::<D>(wp);
        }
        for (t, row) in acc.iter_mut().enumerate() {
            let xv = _mm512_loadu_ps(a.x.add(t * a.xs + p));
            for (r, s) in row.iter_mut().enumerate() {
                *s = _mm512_fmadd_ps(xv, wv[r], *s);
            }
        }
        p += 16;
    }
    if p < a.k {
        let m = tail_mask(a.k - p);
        let mut wv = [_mm512_setzero_ps(); R];
        for (r, v) in wv.iter_mut().enumerate() {
            *v = load_masked::<D>(m, a.w.add(r * a.wsb + p * es));
        }
        for (t, row) in acc.iter_mut().enumerate() {
            let xv = _mm512_maskz_loadu_ps(m, a.x.add(t * a.xs + p));
            for (r, s) in row.iter_mut().enumerate() {
                *s = _mm512_fmadd_ps(xv, wv[r], *s);
            }
        }
    }
    store_tile::<T, R>(&acc, &a);
}

unsafe fn tile_d<const D: u8>(nt: usize, nr: usize, a: Tile) {
    match (nt, nr == ROWS) {
        // One row after another: each thread then reads one sequential stream, which the
        // prefetchers follow best (interleaving 4 rows streamed experts from memory at
        // 15–21 GB/s on 2 threads, row by row at 21–27). Each row's sums are the same
        // either way.
        (1, true) => {
            for r in 0..ROWS {
                gemv_row::<D>(Tile { w: a.w.add(r * a.wsb), out: a.out.add(r), ..a })
            }
        }
        (2, true) => tile_tr::<2, ROWS, D>(a),
        (3, true) => tile_tr::<3, ROWS, D>(a),
        (4, true) => tile_tr::<4, ROWS, D>(a),
        (5, true) => tile_tr::<5, ROWS, D>(a),
        (6, true) => tile_tr::<6, ROWS, D>(a),
        (1, false) => gemv_row::<D>(a),
        (2, false) => tile_tr::<2, 1, D>(a),
        (3, false) => tile_tr::<3, 1, D>(a),
        (4, false) => tile_tr::<4, 1, D>(a),
        (5, false) => tile_tr::<5, 1, D>(a),
        (6, false) => tile_tr::<6, 1, D>(a),
        _ => unreachable!("tile shape {nt}x{nr} is never requested"),
    }
}

/// Computes one `nt × nr` tile (`nt ≤ TOKENS`, `nr ∈ {1, ROWS}`) of weights of code `d`.
pub(crate) unsafe fn tile(d: u8, nt: usize, nr: usize, a: Tile) {
    match d {
        F32 => tile_d::<F32>(nt, nr, a),
        F16 => tile_d::<F16>(nt, nr, a),
        _ => tile_d::<BF16>(nt, nr, a),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn decode_d<const D: u8>(src: *const u8, dst: *mut f32, len: usize) {
    let es = esize(D);
    let mut p = 0;
    while p + 16 <= len {
        _mm512_storeu_ps(dst.add(p), load::<D>(src.add(p * es)));
        p += 16;
    }
    if p < len {
        let m = tail_mask(len - p);
        _mm512_mask_storeu_ps(dst.add(p), m, load_masked::<D>(m, src.add(p * es)));
    }
}

/// `dst[i] = w[i]` as f32 for `i < len`.
pub(crate) unsafe fn decode(d: u8, src: *const u8, dst: *mut f32, len: usize) {
    match d {
        F32 => decode_d::<F32>(src, dst, len),
        F16 => decode_d::<F16>(src, dst, len),
        _ => decode_d::<BF16>(src, dst, len),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn axpy_d<const D: u8>(alpha: f32, src: *const u8, out: *mut f32, len: usize) {
    let es = esize(D);
    let av = _mm512_set1_ps(alpha);
    let mut p = 0;
    while p + 16 <= len {
        let o = _mm512_loadu_ps(out.add(p));
        _mm512_storeu_ps(
            out.add(p),
            _mm512_fmadd_ps(av, load::<D>(src.add(p * es)), o),
        );
        p += 16;
    }
    if p < len {
        let m = tail_mask(len - p);
        let o = _mm512_maskz_loadu_ps(m, out.add(p));
        let v = _mm512_fmadd_ps(av, load_masked::<D>(m, src.add(p * es)), o);
        _mm512_mask_storeu_ps(out.add(p), m, v);
    }
}

/// `out[i] += alpha · w[i]` for `i < len`.
pub(crate) unsafe fn axpy(d: u8, alpha: f32, src: *const u8, out: *mut f32, len: usize) {
    match d {
        F32 => axpy_d::<F32>(alpha, src, out, len),
        F16 => axpy_d::<F16>(alpha, src, out, len),
        _ => axpy_d::<BF16>(alpha, src, out, len),
    }
}

/// Query heads per pass of [`pv`]: 8 heads × 2 vectors of values = 16 accumulators.
pub(crate) const PV_HEADS: usize = 8;

/// `out[g, c] = Σ_j p[g, j] · v[j, c]` for `g < G`, `c < vhd`, `j < len`: attention's
/// weighted sum of values, 32 value columns at a time so each V row slice is loaded and
/// widened once for all heads of the group. The first pass prefetches whole row slices
/// ([`super::prefetch_row_ahead`]), which the later passes then find in L2.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn pv_g<const G: usize, const D: u8>(a: Pv) {
    let es = esize(D);
    let slice = a.vhd * es;
    let mut c = 0;
    while c < a.vhd {
        let m0 = if a.vhd - c >= 16 {
            0xffff
        } else {
            tail_mask(a.vhd - c)
        };
        let left = (a.vhd - c).saturating_sub(16);
        let m1 = if left >= 16 { 0xffff } else { tail_mask(left) };
        let mut acc0 = [_mm512_setzero_ps(); G];
        let mut acc1 = [_mm512_setzero_ps(); G];
        if a.accumulate {
            for g in 0..G {
                let o = a.out.add(g * a.os + c);
                acc0[g] = _mm512_maskz_loadu_ps(m0, o);
                acc1[g] = _mm512_maskz_loadu_ps(m1, o.wrapping_add(16));
            }
        }
        for j in 0..a.len {
            let vp = a.v.add(j * a.vsb + c * es);
            if c == 0 {
                super::prefetch_row_ahead(a.v, a.vsb, j, slice);
            }
            let v0 = load_masked::<D>(m0, vp);
            let v1 = load_masked::<D>(m1, vp.wrapping_add(16 * es));
            for g in 0..G {
                let pb = _mm512_set1_ps(*a.p.add(g * a.ps + j));
                acc0[g] = _mm512_fmadd_ps(pb, v0, acc0[g]);
                acc1[g] = _mm512_fmadd_ps(pb, v1, acc1[g]);
            }
        }
        for g in 0..G {
            let o = a.out.add(g * a.os + c);
            _mm512_mask_storeu_ps(o, m0, acc0[g]);
            _mm512_mask_storeu_ps(o.wrapping_add(16), m1, acc1[g]);
        }
        c += 32;
    }
}

unsafe fn pv_d<const D: u8>(g: usize, a: Pv) {
    match g {
        1 => pv_g::<1, D>(a),
        2 => pv_g::<2, D>(a),
        3 => pv_g::<3, D>(a),
        4 => pv_g::<4, D>(a),
        5 => pv_g::<5, D>(a),
        6 => pv_g::<6, D>(a),
        7 => pv_g::<7, D>(a),
        8 => pv_g::<8, D>(a),
        _ => unreachable!("{g} heads per pv pass is never requested"),
    }
}

/// [`pv_g`] for `g ≤ PV_HEADS` heads of values with code `d`.
pub(crate) unsafe fn pv(d: u8, g: usize, a: Pv) {
    match d {
        F32 => pv_d::<F32>(g, a),
        F16 => pv_d::<F16>(g, a),
        _ => pv_d::<BF16>(g, a),
    }
}

/// Vector `expf`; see [`expc`]. The clamps take `x` as the second operand so NaN propagates.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn exp_ps(x: __m512) -> __m512 {
    let x = _mm512_max_ps(
        _mm512_set1_ps(expc::LO),
        _mm512_min_ps(_mm512_set1_ps(expc::HI), x),
    );
    let fx = _mm512_fmadd_ps(x, _mm512_set1_ps(expc::LOG2E), _mm512_set1_ps(0.5));
    // Round towards -inf (0x01) without raising exceptions (0x08).
    let fx = _mm512_roundscale_ps::<0x09>(fx);
    let r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(expc::C1), x);
    let r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(expc::C2), r);
    let mut y = _mm512_set1_ps(expc::P[0]);
    for c in &expc::P[1..] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(*c));
    }
    let y = _mm512_fmadd_ps(
        y,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    let n = _mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127));
    _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(n)))
}

/// `x[i] = exp(x[i] - sub)` for `i < len`; returns the sum of the results.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn exp_sub_sum(x: *mut f32, len: usize, sub: f32) -> f32 {
    let s = _mm512_set1_ps(sub);
    let mut sum = _mm512_setzero_ps();
    let mut p = 0;
    while p + 16 <= len {
        let v = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x.add(p)), s));
        _mm512_storeu_ps(x.add(p), v);
        sum = _mm512_add_ps(sum, v);
        p += 16;
    }
    if p < len {
        let m = tail_mask(len - p);
        let v = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x.add(p)), s));
        _mm512_mask_storeu_ps(x.add(p), m, v);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, v));
    }
    _mm512_reduce_add_ps(sum)
}
