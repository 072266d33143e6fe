//! AVX-512 BF16 products (`vdpbf16ps`): bf16 weight rows times activations rounded to bf16,
//! accumulated in f32.
//!
//! Prefill with bf16 weights is compute-bound (three quarters of a 512-token prefill went to
//! the widening f32 tiles), and one `vdpbf16ps` does the multiply-adds of two f32 FMAs with no
//! widening step at all: the weights are used as they lie in the checkpoint, pairs of
//! neighbouring elements in each 32-bit lane. The price is rounding the activations to bf16
//! (relative error 2⁻⁹ per element), which is what llama.cpp does for bf16 weights too.
//! Decode takes the same products (one row after another, [`gemv_seq4`]), so a token's numbers
//! do not depend on what else shares its step.
//!
//! Safety contract of every `pub(crate) unsafe fn` here: [`available`] returned true, and the
//! pointers cover the ranges the arguments describe.

use super::qdot::PF;
use super::{store, Tile};
use std::arch::x86_64::*;

/// Token rows per tile: 6 × 4 = 24 accumulators, 4 weight vectors and one activation vector.
pub(crate) const TOKENS: usize = 6;
/// Weight rows per tile.
pub(crate) const ROWS: usize = 4;

/// Whether this CPU runs the kernels of this module.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bf16")
}

/// Bytes to pull towards the cache while a tile computes (the next rows' weights): without
/// it the first token tile of each row block waits on memory.
#[derive(Clone, Copy)]
pub(crate) struct Ahead {
    /// Start of the range.
    pub at: *const u8,
    /// Its length in bytes.
    pub len: usize,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain lanes; the instruction reads them as bf16 pairs.
    std::mem::transmute::<__m512i, __m512bh>(v)
}

/// Rounds `len` f32 values at `src` to bf16 (nearest even) at `dst`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn round_row(src: *const f32, dst: *mut u16, len: usize) {
    let mut p = 0;
    while p + 32 <= len {
        let lo = _mm512_loadu_ps(src.add(p));
        let hi = _mm512_loadu_ps(src.add(p + 16));
        // The second operand fills the low half.
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dst.add(p) as *mut __m512i, v);
        p += 32;
    }
    while p < len {
        let n = (len - p).min(16);
        let m = ((1u32 << n) - 1) as __mmask16;
        let v: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src.add(p))));
        _mm256_mask_storeu_epi16(dst.add(p) as *mut i16, m, v);
        p += n;
    }
}

/// Sums the four rows' accumulators of one token and stores them at `out[0..4]`: a shuffle
/// tree that leaves the four sums in one register (8 shuffles, 5 adds instead of 4 × 8 for
/// separate reductions).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn store4(v: &[__m512; 4], out: *mut f32, accumulate: bool) {
    // 128-bit chunks: [A0 A1 B0 B1] + [A2 A3 B2 B3].
    let ab = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(v[0], v[1]),
        _mm512_shuffle_f32x4::<0xEE>(v[0], v[1]),
    );
    let cd = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(v[2], v[3]),
        _mm512_shuffle_f32x4::<0xEE>(v[2], v[3]),
    );
    // Chunk r now holds four partial sums of row r.
    let s = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x88>(ab, cd),
        _mm512_shuffle_f32x4::<0xDD>(ab, cd),
    );
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0b01_00_11_10>(s));
    // Lane 0 of each chunk.
    let r = _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
    let r = if accumulate { _mm_add_ps(r, _mm_loadu_ps(out)) } else { r };
    _mm_storeu_ps(out, r);
}

/// One 32-element step of [`tile_tr`], lanes outside `m` zero.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn step<const T: usize, const R: usize>(a: &Tile<u16>, ahead: Ahead, p: usize, m: __mmask32, acc: &mut [[__m512; R]; T]) {
    // Step i prefetches lines R·i .. R·i + R of the range: as many as the step reads, so a
    // lone token tile (decode) keeps pace with its own consumption one row block ahead.
    let line = p / 32 * 64 * R;
    for j in 0..R {
        if line + j * 64 < ahead.len {
            super::prefetch(ahead.at.wrapping_add(line + j * 64) as *const u8);
        }
    }
    let mut wv = [_mm512_setzero_si512(); R];
    for (r, v) in wv.iter_mut().enumerate() {
        *v = _mm512_maskz_loadu_epi16(m, a.w.add(r * a.wsb + p * 2) as *const i16);
    }
    for (t, row) in acc.iter_mut().enumerate() {
        let xv = bh(_mm512_maskz_loadu_epi16(m, a.x.add(t * a.xs + p) as *const i16));
        for (s, w) in row.iter_mut().zip(wv) {
            *s = _mm512_dpbf16_ps(*s, xv, bh(w));
        }
    }
}

/// `T` tokens × `R` rows, 32 elements per step; the tail is loaded masked (zero lanes add 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn tile_tr<const T: usize, const R: usize>(a: Tile<u16>, ahead: Ahead) {
    let mut acc = [[_mm512_setzero_ps(); R]; T];
    let mut p = 0;
    while p + 32 <= a.k {
        step::<T, R>(&a, ahead, p, !0, &mut acc);
        p += 32;
    }
    if p < a.k {
        step::<T, R>(&a, ahead, p, ((1u64 << (a.k - p)) - 1) as __mmask32, &mut acc);
    }
    for (t, row) in acc.iter().enumerate() {
        if R == 4 {
            store4(&[row[0], row[1], row[2], row[3]], a.out.add(t * a.os), a.accumulate);
        } else {
            for (r, s) in row.iter().enumerate() {
                store(a.out.add(t * a.os + r), _mm512_reduce_add_ps(*s), a.accumulate);
            }
        }
    }
}

/// One token, four rows read one after another (one sequential stream per thread, which the
/// prefetchers follow best; see `avx512::tile_d`), prefetching [`PF`] bytes ahead. The sums are
/// those of `tile_tr::<1, 4>`, step for step, so a token gets the same bits alone as in a batch.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn gemv_seq4(a: Tile<u16>) {
    let mut acc = [_mm512_setzero_ps(); ROWS];
    for (r, s) in acc.iter_mut().enumerate() {
        let w = a.w.add(r * a.wsb);
        let mut p = 0;
        while p + 32 <= a.k {
            super::prefetch(w.wrapping_add(p * 2 + PF) as *const u8);
            let xv = bh(_mm512_loadu_si512(a.x.add(p) as *const __m512i));
            *s = _mm512_dpbf16_ps(*s, xv, bh(_mm512_loadu_si512(w.add(p * 2) as *const __m512i)));
            p += 32;
        }
        if p < a.k {
            let m = ((1u64 << (a.k - p)) - 1) as __mmask32;
            let xv = bh(_mm512_maskz_loadu_epi16(m, a.x.add(p) as *const i16));
            *s = _mm512_dpbf16_ps(*s, xv, bh(_mm512_maskz_loadu_epi16(m, w.add(p * 2) as *const i16)));
        }
    }
    store4(&acc, a.out, a.accumulate);
}

/// Computes one `nt × nr` tile (`nt ≤ TOKENS`, `nr ∈ {1, ROWS}`).
pub(crate) unsafe fn tile(nt: usize, nr: usize, a: Tile<u16>, ahead: Ahead) {
    match (nt, nr == ROWS) {
        (1, true) => gemv_seq4(a),
        (2, true) => tile_tr::<2, ROWS>(a, ahead),
        (3, true) => tile_tr::<3, ROWS>(a, ahead),
        (4, true) => tile_tr::<4, ROWS>(a, ahead),
        (5, true) => tile_tr::<5, ROWS>(a, ahead),
        (6, true) => tile_tr::<6, ROWS>(a, ahead),
        (1, false) => tile_tr::<1, 1>(a, ahead),
        (2, false) => tile_tr::<2, 1>(a, ahead),
        (3, false) => tile_tr::<3, 1>(a, ahead),
        (4, false) => tile_tr::<4, 1>(a, ahead),
        (5, false) => tile_tr::<5, 1>(a, ahead),
        (6, false) => tile_tr::<6, 1>(a, ahead),
        _ => unreachable!("tile shape {nt}x{nr} is never requested"),
    }
}
