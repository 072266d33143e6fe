//! AVX2 + FMA + F16C kernels: 8 f32 lanes, scalar epilogues for the tails (AVX2 has no
//! masked 16-bit loads).
//!
//! Safety contract of every `pub(crate) unsafe fn` here: the CPU supports AVX2, FMA and F16C
//! (checked by `SimdLevel::effective`), and the pointers cover the ranges the arguments
//! describe.

use super::qdot::prefetch_offset;
use super::{esize, expc, scalar_at, store, Pv, Tile, BF16, F16, F32};
use std::arch::x86_64::*;

/// Token rows per tile: 2 × 4 accumulators plus 4 weight vectors and one activation vector
/// fit the 16 ymm registers without spilling.
pub(crate) const TOKENS: usize = 2;
/// Weight rows per tile.
pub(crate) const ROWS: usize = 4;
/// Weight rows per one-token tile of f16/bf16 weights: eight rows' loads in flight rather
/// than four. A decode step's products of 2-byte weights are memory-bound, yet they streamed
/// well below f32's rate (28 against 37 GB/s, 16 cold experts a call, two threads): widening
/// puts two more instructions on every 16 bytes, and the loads that the out-of-order window
/// holds cover fewer bytes. Alternated call by call in one process over 16 cold k=2048 × 768
/// experts a call, two threads: bf16 1.04–1.05× the rate of four rows, f16 1.08×; six rows
/// 1.01×, twelve 0.98×, sixteen 0.82×; f32 lost 4 % and keeps four.
const ONE_TOKEN_ROWS_2B: usize = 8;

/// Rows a one-token tile of code `d` takes: [`ONE_TOKEN_ROWS_2B`] for f16/bf16, else [`ROWS`].
pub(crate) fn one_token_rows(d: u8) -> usize {
    if d == F32 {
        ROWS
    } else {
        ONE_TOKEN_ROWS_2B
    }
}

/// 8 weight elements at `p` widened to f32 (bf16: zero-extend and shift, exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load<const D: u8>(p: *const u8) -> __m256 {
    match D {
        F32 => _mm256_loadu_ps(p as *const f32),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(p as *const __m128i),
        ))),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// One 8-value step of [`tile_tr`] at position `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_step<const T: usize, const R: usize, const D: u8>(a: &Tile, acc: &mut [[__m256; R]; T], p: usize) {
    let es = esize(D);
    let mut wv = [_mm256_setzero_ps(); R];
    for (r, v) in wv.iter_mut().enumerate() {
        *v = load::<D>(a.w.add(r * a.wsb + p * es));
    }
    for (t, row) in acc.iter_mut().enumerate() {
        let xv = _mm256_loadu_ps(a.x.add(t * a.xs + p));
        for (r, s) in row.iter_mut().enumerate() {
            *s = _mm256_fmadd_ps(xv, wv[r], *s);
        }
    }
}

/// `T` tokens × `R` rows, each row summed in one accumulator front to back (so a token's
/// sums do not depend on how many tokens share the pass). A step reads one cache line of
/// bf16/f16 per row (32 values, four vectors) and prefetches one line per row: prefetching
/// every 8 values asked for each line four times.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_tr<const T: usize, const R: usize, const D: u8>(a: Tile) {
    let es = esize(D);
    let mut acc = [[_mm256_setzero_ps(); R]; T];
    let mut p = 0;
    while p + 32 <= a.k {
        if a.prefetch {
            for r in 0..R {
                // See the AVX-512 kernels: hardware prefetch alone under-uses the memory bus.
                let wp = a.w.add(r * a.wsb + p * es);
                for line in (0..32 * es).step_by(64) {
                    super::prefetch(wp.wrapping_add(prefetch_offset::<R>(a.wsb, p * es) + line));
                }
            }
        }
        for q in (p..p + 32).step_by(8) {
            tile_step::<T, R, D>(&a, &mut acc, q);
        }
        p += 32;
    }
    while p + 8 <= a.k {
        tile_step::<T, R, D>(&a, &mut acc, p);
        p += 8;
    }
    for (t, row) in acc.iter().enumerate() {
        for (r, s) in row.iter().enumerate() {
            let w = a.w.add(r * a.wsb);
            let mut tail = 0f32;
            for q in p..a.k {
                tail += *a.x.add(t * a.xs + q) * scalar_at::<D>(w, q);
            }
            store(a.out.add(t * a.os + r), hsum(*s) + tail, a.accumulate);
        }
    }
}

unsafe fn tile_d<const D: u8>(nt: usize, nr: usize, a: Tile) {
    match (nt, nr == ROWS) {
        (1, false) if nr == ONE_TOKEN_ROWS_2B => tile_tr::<1, ONE_TOKEN_ROWS_2B, D>(a),
        (1, true) => tile_tr::<1, ROWS, D>(a),
        (2, true) => tile_tr::<2, ROWS, D>(a),
        (1, false) => tile_tr::<1, 1, D>(a),
        (2, false) => tile_tr::<2, 1, D>(a),
        _ => unreachable!("tile shape {nt}x{nr} is never requested"),
    }
}

/// Computes one `nt × nr` tile (`nt ≤ TOKENS`, `nr ∈ {1, ROWS}`, or [`one_token_rows`]`(d)`
/// for one token) of weights of code `d`.
pub(crate) unsafe fn tile(d: u8, nt: usize, nr: usize, a: Tile) {
    match d {
        F32 => tile_d::<F32>(nt, nr, a),
        F16 => tile_d::<F16>(nt, nr, a),
        _ => tile_d::<BF16>(nt, nr, a),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_d<const D: u8>(src: *const u8, dst: *mut f32, len: usize) {
    let es = esize(D);
    let mut p = 0;
    while p + 8 <= len {
        _mm256_storeu_ps(dst.add(p), load::<D>(src.add(p * es)));
        p += 8;
    }
    for q in p..len {
        *dst.add(q) = scalar_at::<D>(src, q);
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_d<const D: u8>(alpha: f32, src: *const u8, out: *mut f32, len: usize) {
    let es = esize(D);
    let av = _mm256_set1_ps(alpha);
    let mut p = 0;
    while p + 8 <= len {
        let o = _mm256_loadu_ps(out.add(p));
        _mm256_storeu_ps(
            out.add(p),
            _mm256_fmadd_ps(av, load::<D>(src.add(p * es)), o),
        );
        p += 8;
    }
    for q in p..len {
        *out.add(q) = alpha.mul_add(scalar_at::<D>(src, q), *out.add(q));
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

/// Query heads per pass of [`pv`]: 4 heads × 2 vectors of values = 8 accumulators.
pub(crate) const PV_HEADS: usize = 4;

/// `out[g, c] = Σ_j p[g, j] · v[j, c]`, 16 value columns at a time (see the AVX-512 twin);
/// ragged columns at the end run in scalar code.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_g<const G: usize, const D: u8>(a: Pv) {
    let es = esize(D);
    let slice = a.vhd * es;
    let mut c = 0;
    while c + 16 <= a.vhd {
        let mut acc0 = [_mm256_setzero_ps(); G];
        let mut acc1 = [_mm256_setzero_ps(); G];
        if a.accumulate {
            for g in 0..G {
                let o = a.out.add(g * a.os + c);
                acc0[g] = _mm256_loadu_ps(o);
                acc1[g] = _mm256_loadu_ps(o.add(8));
            }
        }
        // A pass reads half of each row's line of f16 values; where it starts a line, the
        // line the pass after next reads goes to L1 now, and the same line of the row a block
        // ahead to L2. The whole row slice asked for at the first pass (four lines a row, one
        // every four multiply-adds) stalled the loads behind the prefetches: decode attention
        // over 4,096 cached f16 tokens (kernel bench part 5, 2 threads, alternating builds)
        // 0.81 → 0.73 ms a call, decode steps of 12-layer Q4_K_M at 4.1–4.3k tokens 2.5–3.9 %
        // shorter (alternate steps of a run, two runs).
        let line_start = (c * es).is_multiple_of(64);
        let next_line = line_start && c * es + 64 < slice;
        for j in 0..a.len {
            let vp = a.v.add(j * a.vsb + c * es);
            if line_start {
                super::prefetch_line_ahead(a.v, a.vsb, j, c * es);
            }
            if next_line {
                super::prefetch_l1(vp.wrapping_add(64));
            }
            let (v0, v1) = (load::<D>(vp), load::<D>(vp.add(8 * es)));
            for g in 0..G {
                let pb = _mm256_set1_ps(*a.p.add(g * a.ps + j));
                acc0[g] = _mm256_fmadd_ps(pb, v0, acc0[g]);
                acc1[g] = _mm256_fmadd_ps(pb, v1, acc1[g]);
            }
        }
        for g in 0..G {
            let o = a.out.add(g * a.os + c);
            _mm256_storeu_ps(o, acc0[g]);
            _mm256_storeu_ps(o.add(8), acc1[g]);
        }
        c += 16;
    }
    for c in c..a.vhd {
        for g in 0..G {
            let mut s = if a.accumulate { *a.out.add(g * a.os + c) } else { 0.0 };
            for j in 0..a.len {
                s += *a.p.add(g * a.ps + j) * scalar_at::<D>(a.v.add(j * a.vsb), c);
            }
            *a.out.add(g * a.os + c) = s;
        }
    }
}

unsafe fn pv_d<const D: u8>(g: usize, a: Pv) {
    match g {
        1 => pv_g::<1, D>(a),
        2 => pv_g::<2, D>(a),
        3 => pv_g::<3, D>(a),
        4 => pv_g::<4, D>(a),
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
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp_ps(x: __m256) -> __m256 {
    let x = _mm256_max_ps(
        _mm256_set1_ps(expc::LO),
        _mm256_min_ps(_mm256_set1_ps(expc::HI), x),
    );
    let fx = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(expc::LOG2E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(expc::C1), x);
    let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(expc::C2), r);
    let mut y = _mm256_set1_ps(expc::P[0]);
    for c in &expc::P[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(*c));
    }
    let y = _mm256_fmadd_ps(
        y,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
    _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(n)))
}

/// `x[i] = exp(x[i] - sub)` for `i < len`; returns the sum of the results.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp_sub_sum(x: *mut f32, len: usize, sub: f32) -> f32 {
    let s = _mm256_set1_ps(sub);
    let mut sum = _mm256_setzero_ps();
    let mut p = 0;
    while p + 8 <= len {
        let v = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x.add(p)), s));
        _mm256_storeu_ps(x.add(p), v);
        sum = _mm256_add_ps(sum, v);
        p += 8;
    }
    let mut total = hsum(sum);
    if p < len {
        // Run the short tail through the same polynomial so every element has the same error.
        let mut buf = [0f32; 8];
        let n = len - p;
        std::ptr::copy_nonoverlapping(x.add(p), buf.as_mut_ptr(), n);
        let v = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), s));
        _mm256_storeu_ps(buf.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(buf.as_ptr(), x.add(p), n);
        total += buf[..n].iter().sum::<f32>();
    }
    total
}
