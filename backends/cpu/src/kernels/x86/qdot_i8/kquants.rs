//! The K types' int8 kernels (Q4_K, Q5_K, Q6_K): each block's code registers transposed by
//! dwords, so that each 32-bit lane of a token's sums holds one sub-block and the block meets
//! its scales in one conversion and one multiply-add per token (per half for Q6_K).

#[cfg(doc)]
use super::order::{q4_k_order, q6_k_order, Q4K_LANES};
use super::{cvt, f16_splat, permps, shl16, Acc, Dot};
use std::arch::x86_64::*;

/// Register `i` of the result: dword `i` of each of `c[0..4]`, then (upper 128-bit half)
/// dword `i + 4` of each.
#[inline(always)]
pub(super) unsafe fn dwords_4x4(c: [__m256i; 4]) -> [__m256i; 4] {
    let (lo01, lo23) = (_mm256_unpacklo_epi32(c[0], c[1]), _mm256_unpacklo_epi32(c[2], c[3]));
    let (hi01, hi23) = (_mm256_unpackhi_epi32(c[0], c[1]), _mm256_unpackhi_epi32(c[2], c[3]));
    [
        _mm256_unpacklo_epi64(lo01, lo23),
        _mm256_unpackhi_epi64(lo01, lo23),
        _mm256_unpacklo_epi64(hi01, hi23),
        _mm256_unpackhi_epi64(hi01, hi23),
    ]
}

/// Q4_K: `Σ_j (d·sc_j·d_j)·Σ q·a − Σ_j (dmin·m_j)·S_j` over the 8 sub-blocks of 32 ([`k4_blk`]).
#[inline(always)]
pub(super) unsafe fn q4_k_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    k4_blk::<D, R, N, false>(w, q, d, a, acc)
}

/// Q5_K: as Q4_K, the fifth bit of value `32s + l` being bit `s` of `qh[l]` ([`k4_blk`]).
#[inline(always)]
pub(super) unsafe fn q5_k_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    k4_blk::<D, R, N, true>(w, q, d, a, acc)
}

/// Q4_K, or Q5_K where `FIVE`. The four 32-byte runs of codes (run `c`: sub-block `2c` in the
/// low nibbles, `2c + 1` in the high) are transposed by dwords, so that each register holds
/// four codes of every sub-block and lane `l` of each product sums sub-block
/// [`Q4K_LANES`]`[l]`; the whole block's integer sums then meet their scales in one conversion
/// and one multiply-add per token, where the sub-block pairs took four of each and a scale
/// permute apiece. Q4_K transposes the packed bytes and splits the nibbles after; Q5_K builds
/// its 5-bit codes first and transposes the low and the high nibbles' apart.
#[inline(always)]
unsafe fn k4_blk<D: Dot, const R: usize, const N: usize, const FIVE: bool>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let (m4, b4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
    let lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for r in 0..R {
        let p = w[r];
        let (scd, mv) = D::k4_scaled(p);
        let scd = permps(scd, lanes);
        if D::CROSSED {
            let ab = k4_crossed::<FIVE>(p);
            for t in 0..N {
                let s = _mm256_mul_ps(scd, _mm256_loadu_ps(d[t]));
                // Two sums of four: one of eight lost 2 % at one token.
                let sums = _mm256_add_epi32(four::<D>(&ab, q[t], 0), four::<D>(&ab, q[t], 4));
                let v = _mm256_fmadd_ps(cvt(sums), s, acc[r][t][0]);
                acc[r][t][0] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(a[t]), v);
            }
            continue;
        }
        let (l, h) = if FIVE {
            let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
            let (mut lo, mut hi) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            for c in 0..4 {
                let v = _mm256_loadu_si256(p.add(48 + 32 * c) as *const __m256i);
                // Bit s of each qh byte moved to bit 4 (16-bit shifts, then a per-byte mask).
                let bl = _mm256_and_si256(shl16(qh, 4 - 2 * c as i32), b4);
                let bh = _mm256_and_si256(shl16(qh, 3 - 2 * c as i32), b4);
                lo[c] = _mm256_or_si256(_mm256_and_si256(v, m4), bl);
                hi[c] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), bh);
            }
            (dwords_4x4(lo), dwords_4x4(hi))
        } else {
            let ld = |c: usize| _mm256_loadu_si256(p.add(16 + 32 * c) as *const __m256i);
            let z = dwords_4x4([ld(0), ld(1), ld(2), ld(3)]);
            let lo = |v: __m256i| _mm256_and_si256(v, m4);
            let hi = |v: __m256i| _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            ([lo(z[0]), lo(z[1]), lo(z[2]), lo(z[3])], [hi(z[0]), hi(z[1]), hi(z[2]), hi(z[3])])
        };
        // One accumulator per token (the min term too): with two, four tokens' sums and the
        // eight code registers did not fit the sixteen registers, and the sums went to the
        // stack and back every block.
        for t in 0..N {
            let s = _mm256_mul_ps(scd, _mm256_loadu_ps(d[t]));
            let sums = if FIVE { D::q5_k_sums(&l, &h, q[t]) } else { D::q4_k_sums(&l, &h, q[t]) };
            let v = _mm256_fmadd_ps(cvt(sums), s, acc[r][t][0]);
            acc[r][t][0] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(a[t]), v);
        }
    }
}

/// The 32 bytes at `p + o`.
#[inline(always)]
unsafe fn ld32(p: *const u8, o: usize) -> __m256i {
    _mm256_loadu_si256(p.add(o) as *const __m256i)
}

/// `Σ` of crossed code registers `ab[i..i + 4]` against the token's codes at `q`, one chain.
#[inline(always)]
unsafe fn four<D: Dot>(ab: &[__m256i; 8], q: *const i8, i: usize) -> __m256i {
    let s = D::dot_u(ab[i], ld32(q as *const u8, 32 * i));
    let s = D::dot_u_acc(s, ab[i + 1], ld32(q as *const u8, 32 * i + 32));
    let s = D::dot_u_acc(s, ab[i + 2], ld32(q as *const u8, 32 * i + 64));
    D::dot_u_acc(s, ab[i + 3], ld32(q as *const u8, 32 * i + 96))
}

/// The crossed code registers of a Q4_K block (Q5_K's where `FIVE`) at `p`, for
/// [`super::Isa::k4_crossed`]'s variants (AVX-512 VL with GFNI): register `2i` (`A_i`) holds the
/// lower 128 bits of [`k4_blk`]'s `L_i` and the upper ones of its `H_i`, register `2i + 1`
/// (`B_i`) the other two, halves swapped. Lane `l` of both then holds sub-block
/// [`Q4K_LANES`]`[l]`, so a token's eight products add up in place, where `L_i` and `H_i` (the
/// even and the odd sub-blocks in both halves) took two more adds, a blend, a lane permute
/// and an add a token to meet; the crossing costs a swap per register, the nibbles one affine
/// byte transform each as the plain split's two. One warm thread, Q4_K at 1/2/4 tokens:
/// 75/110/140 → 79/122/151 GFLOP/s.
///
/// Q5_K's fifth bits are read the same way: dword `i` of `qh` (the bytes of the codes' byte
/// positions) in each lower 128 bits of `A_i` and dword `i + 4` in its upper ones (the other
/// way round for `B_i`), each lane's bit (the sub-block's: 0, 2, 4, 6 for the even ones, 1, 3,
/// 5, 7 for the odd) rotated to bit 4 of every byte.
#[inline(always)]
unsafe fn k4_crossed<const FIVE: bool>(p: *const u8) -> [__m256i; 8] {
    // `vgf2p8affineqb` matrices (output bit `i` the parity of the byte AND matrix byte `7 − i`):
    // bits 0–3 kept in the lower 128 bits, bits 4–7 moved down in the upper ones.
    const LOW: i64 = 0x0102_0408_0000_0000;
    const HIGH: i64 = 0x1020_4080_0000_0000;
    let sel = _mm256_setr_epi64x(LOW, LOW, HIGH, HIGH);
    let codes = if FIVE { 48 } else { 16 };
    let z = dwords_4x4([ld32(p, codes), ld32(p, codes + 32), ld32(p, codes + 64), ld32(p, codes + 96)]);
    // Closures here would not inherit the caller's target features, and intrinsics that are
    // not inlined cost a call each: macros instead.
    macro_rules! cross {
        ($v:expr) => {
            _mm256_gf2p8affine_epi64_epi8::<0>($v, sel)
        };
    }
    macro_rules! swap {
        ($v:expr) => {
            _mm256_permute4x64_epi64::<0x4E>($v)
        };
    }
    let mut ab = [cross!(z[0]), cross!(swap!(z[0])), cross!(z[1]), cross!(swap!(z[1])), cross!(z[2]), cross!(swap!(z[2])), cross!(z[3]), cross!(swap!(z[3]))];
    if FIVE {
        let (qh, b4) = (ld32(p, 16), _mm256_set1_epi8(0x10));
        let qs = swap!(qh);
        let rot = _mm256_setr_epi32(4, 2, 0, 30, 3, 1, 31, 29);
        macro_rules! each {
            ($($i:literal),*) => {$(
                // 0xF8: a | (b & c).
                ab[2 * $i] = _mm256_ternarylogic_epi32::<0xF8>(ab[2 * $i], _mm256_rolv_epi32(_mm256_shuffle_epi32::<{ 0x55 * $i }>(qh), rot), b4);
                ab[2 * $i + 1] = _mm256_ternarylogic_epi32::<0xF8>(ab[2 * $i + 1], _mm256_rolv_epi32(_mm256_shuffle_epi32::<{ 0x55 * $i }>(qs), rot), b4);
            )*};
        }
        each!(0, 1, 2, 3);
    }
    ab
}

/// Q6_K: `Σ_i d·sc_i·d_g·Σ q·a − 32·d·Σ_i sc_i·S_i` over the 16 sub-blocks of 16 (`q`
/// unsigned 6-bit), 128 values a step. Each half's four code registers (two sub-blocks
/// each) are transposed by dwords as in [`q4_k_blk`], so lane `l` of a token's sums is the
/// half's sub-block [`Q4K_LANES`]`[l]`, whose activation group is lane `l mod 4`'s: one
/// conversion and one multiply-add per half and token, where each pair of sub-blocks took
/// one of each and a scale multiply.
#[inline(always)]
pub(super) unsafe fn q6_k_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    let lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for r in 0..R {
        let p = w[r];
        let dd = f16_splat(p.add(208));
        // Each half's eight scales widened straight from memory (a byte shift of one 16-byte
        // load took a shuffle port).
        let sc0 = cvt(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(192) as *const __m128i)));
        let sc1 = cvt(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(200) as *const __m128i)));
        let m32 = _mm256_mul_ps(_mm256_set1_ps(32.0), dd);
        let (o0, o1) = (_mm256_mul_ps(sc0, m32), _mm256_mul_ps(sc1, m32));
        for t in 0..N {
            acc[r][t][1] = _mm256_fnmadd_ps(o0, _mm256_loadu_ps(a[t]), acc[r][t][1]);
            acc[r][t][1] = _mm256_fnmadd_ps(o1, _mm256_loadu_ps(a[t].add(8)), acc[r][t][1]);
        }
        // `d·sc_i` of each half's sub-blocks in the lane order of the sums.
        let f = [permps(_mm256_mul_ps(sc0, dd), lanes), permps(_mm256_mul_ps(sc1, dd), lanes)];
        for h in 0..2 {
            // Values 128h + 32·quarter + l: low 4 bits in ql byte 64h + 32·(quarter % 2) + l
            // (nibble quarter / 2), top 2 bits in qh byte 32h + l (bits 2·quarter).
            let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            let qv = [
                D::and_or(ql0, m4, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m2)),
                D::and_or(ql1, m4, _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m2)),
                D::and_or(_mm256_srli_epi16::<4>(ql0), m4, _mm256_and_si256(qh, m2)),
                D::and_or(_mm256_srli_epi16::<4>(ql1), m4, _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2)),
            ];
            let z = dwords_4x4(qv);
            for t in 0..N {
                let sums = cvt(D::q6_k_sums(&z, q[t].add(128 * h)));
                let s = _mm256_mul_ps(f[h], _mm256_broadcast_ps(&*(d[t].add(4 * h) as *const __m128)));
                acc[r][t][h] = _mm256_fmadd_ps(sums, s, acc[r][t][h]);
            }
        }
    }
}
