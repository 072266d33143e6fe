//! Q6_K on 512-bit registers ([`Isa::Avx512Vbmi`]): a whole block (256 values) a step, one
//! sub-block of 16 per lane.
//!
//! The 256-bit kernel ([`super::q6_k_blk`]) builds 32 codes at a time, and for every 32
//! values permutes a weight scale, broadcasts an activation scale and multiplies the two: about
//! 80 instructions a block, compute-bound at ~22 GB/s of weights per core (one warm thread),
//! which on 2 cores kept the output head (Q6_K in a Q4_K_M file) at ~75 % of the read
//! bandwidth. Here one 64-byte load holds the low bits of a half block's four quarters, one
//! broadcast and two affine byte transforms (a variable shift without GFNI) give the high bits
//! of two quarters side by side: four registers hold the block's 6-bit codes in order, 128-bit
//! piece `c` of register `s` being sub-block `4s + c`. An in-lane 4 × 4 transpose of 32-bit
//! words (eight unpacks, shared by every token of the step) then puts word `k` of each
//! sub-block in lane [`SUB_OF_LANE`] of register `k`, so a token's four `vpdpbusd` against its
//! activations in [`super::order::q6_k_zmm_order`] add up its 16 sub-block sums in 16 lanes,
//! which meet the lanes' scales (`d·sc`, permuted once per row and block, times the token's
//! activation scales laid out per lane in [`extras`]) in one conversion, one multiply and one
//! multiply-add. The kernel that summed a step's 64 codes in their natural order (four lanes a
//! sub-block) took each token four conversions, four multiplies and four multiply-adds a block;
//! one warm thread, GFLOP/s at 1/2/4/16/512 tokens, alternating runs:
//! 68–74/87–92/108–112/106–112/100–105 → 65–71/110–118/149–153/152–156/135–145. One token
//! pays the eight unpacks on the shuffle port about what it saves in conversions and
//! multiply-adds (within a few per cent, either way between runs).
//!
//! The offset term `32·d·Σ sc_i·S_i` uses the exact activation sums `S_i` as every Q6_K
//! kernel does, one multiply-add a token and block (the lanes' `32·S_i` from [`extras`]); the
//! integer sums are exact, and a token's additions are the same whatever the number of tokens
//! beside it, so decode, batches and prefills keep the same bits.

use super::*;

/// Bytes of one block.
const BB: usize = 210;
/// Values of one block.
const BE: usize = 256;
/// Prepared values per token and block in [`extras`]: each sum lane's activation scale,
/// then 32 times its sub-block's exact sum.
pub(crate) const EXTRAS: usize = 32;

/// The sub-block whose sum lane `l` holds: lane `4c + r` is sub-block `4r + c`, where the
/// in-lane 4 × 4 transpose of the four code registers puts it (its own inverse).
pub(crate) const SUB_OF_LANE: [usize; 16] = {
    let mut t = [0usize; 16];
    let mut l = 0;
    while l < 16 {
        t[l] = 4 * (l % 4) + l / 4;
        l += 1;
    }
    t
};

/// One token's per-block values ([`EXTRAS`] a block) in the lane order of the sums
/// ([`SUB_OF_LANE`]): lane `l`'s activation scale (that of the group of 32 its sub-block
/// lies in), then 32 times its sub-block's exact sum (the offset of the codes). `d` holds
/// the token's scales (one per 32 values), `sums` its sub-block sums (16 per block).
pub(crate) fn extras(d: &[f32], sums: &[f32], out: &mut [f32]) {
    for ((o, dg), sg) in out.chunks_exact_mut(EXTRAS).zip(d.chunks_exact(BE / QK)).zip(sums.chunks_exact(16)) {
        for (l, &sub) in SUB_OF_LANE.iter().enumerate() {
            o[l] = dg[sub / 2];
            o[16 + l] = 32.0 * sg[sub];
        }
    }
}

/// What every block of a row uses.
#[derive(Clone, Copy)]
struct Consts {
    /// `vpshufb` indices putting a block's 16 scale bytes in the lane order of the sums.
    sub_of_lane: __m128i,
    /// Per 64-bit lane: 0 in the lower half, 2 in the upper (the high bits of quarters 0/2
    /// and 1/3 of a half block).
    shift: __m512i,
    m4: __m512i,
    m30: __m512i,
    /// `vgf2p8affineqb` matrices moving two bits of each high-bits byte to bits 4–5 (output bit
    /// `i` is the parity of the byte AND matrix byte `7 − i`): bits 0–1 in the lower half and
    /// 2–3 in the upper (`bits_lo`), bits 4–5 and 6–7 (`bits_hi`): five instructions a half
    /// block instead of seven. One warm thread at 1/2/4 tokens: 26.8/18.9/11.7 →
    /// 27.7/19.5/11.9 GB/s of weights.
    bits_lo: __m512i,
    bits_hi: __m512i,
}

/// The [`Consts::bits_lo`]/[`Consts::bits_hi`] matrix taking bits `s` and `s + 1` to 4 and 5.
const fn to_bits_4_5(s: u32) -> i64 {
    ((1i64 << s) << 24) | ((1i64 << (s + 1)) << 16)
}

/// Block `b` of the row at `p0` against `N` tokens: two accumulators a token, the code term
/// and the offset term.
#[inline(always)]
unsafe fn block<const G: bool, const N: usize>(j: &Job, p0: *const u8, b: usize, c: &Consts, acc: &mut [[__m512; 2]; N]) {
    let p = p0.add(b * BB);
    let ahead = prefetch_offset::<1>(j.rb, b * BB);
    for o in [0, 64, 128, 192] {
        super::super::prefetch(p.wrapping_add(ahead + o));
    }
    let d = _mm512_cvtph_ps(_mm256_set1_epi16((p.add(208) as *const i16).read_unaligned()));
    let sc = _mm_shuffle_epi8(_mm_loadu_si128(p.add(192) as *const __m128i), c.sub_of_lane);
    let ws = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), d);
    // Register `2h` holds values 128h..128h + 64 in order, `2h + 1` the next 64: 128-bit
    // piece `c` of register `s` is sub-block `4s + c`.
    let mut r = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        let ql = _mm512_loadu_si512(p.add(64 * h) as *const _);
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i));
        // Quarters 0 and 1: low nibbles, high bits 0–1 (2–3 in the upper half) at bits 4–5;
        // quarters 2 and 3: high nibbles, high bits 4–5 (6–7) at bits 4–5.
        (r[2 * h], r[2 * h + 1]) = if G {
            let bl = _mm512_gf2p8affine_epi64_epi8::<0>(qh, c.bits_lo);
            let bh = _mm512_gf2p8affine_epi64_epi8::<0>(qh, c.bits_hi);
            // 0xEA: (A & B) | C.
            (
                _mm512_ternarylogic_epi32::<0xEA>(ql, c.m4, bl),
                _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16::<4>(ql), c.m4, bh),
            )
        } else {
            let qh = _mm512_srlv_epi64(qh, c.shift);
            (
                _mm512_ternarylogic_epi32::<0xF8>(_mm512_and_si512(ql, c.m4), _mm512_slli_epi64::<4>(qh), c.m30),
                _mm512_ternarylogic_epi32::<0xEC>(_mm512_srli_epi16::<4>(ql), _mm512_and_si512(qh, c.m30), c.m4),
            )
        };
    }
    // The 4 × 4 transpose of 32-bit words in each 128-bit piece: lane `4c + r` of `z[k]` is
    // word `k` of sub-block `4r + c` ([`SUB_OF_LANE`]).
    let z = super::k4_pairs::dwords_4x4(r);
    for (t, a) in acc.iter_mut().enumerate() {
        let q = j.q.add(t * j.qs + b * BE);
        let x = j.aux.add(t * j.auxs + b * EXTRAS);
        // A macro: a closure would not inherit the driver's target features.
        macro_rules! ld {
            ($i:expr) => {
                _mm512_loadu_si512(q.add(64 * $i) as *const _)
            };
        }
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z[0], ld!(0));
        let s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s, z[1], ld!(1)), z[2], ld!(2)), z[3], ld!(3));
        let f = _mm512_mul_ps(ws, _mm512_loadu_ps(x));
        a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), f, a[0]);
        // `32·S` (exact: a power of two) against `d·sc`.
        a[1] = _mm512_fnmadd_ps(ws, _mm512_loadu_ps(x.add(16)), a[1]);
    }
}

/// Row `r0` (`R` = 1) against `N` tokens, the high bits placed by GFNI where `G`.
#[inline(always)]
unsafe fn rows_with<const G: bool, const N: usize>(j: &Job, r0: usize) {
    let p0 = j.w.add(r0 * j.rb);
    let c = Consts {
        sub_of_lane: _mm_loadu_si128(SUB_OF_LANE.map(|s| s as u8).as_ptr() as *const _),
        shift: _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2),
        m4: _mm512_set1_epi8(0x0f),
        m30: _mm512_set1_epi8(0x30),
        bits_lo: _mm512_setr_epi64(
            to_bits_4_5(0), to_bits_4_5(0), to_bits_4_5(0), to_bits_4_5(0),
            to_bits_4_5(2), to_bits_4_5(2), to_bits_4_5(2), to_bits_4_5(2),
        ),
        bits_hi: _mm512_setr_epi64(
            to_bits_4_5(4), to_bits_4_5(4), to_bits_4_5(4), to_bits_4_5(4),
            to_bits_4_5(6), to_bits_4_5(6), to_bits_4_5(6), to_bits_4_5(6),
        ),
    };
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    for b in 0..j.blocks {
        block::<G, N>(j, p0, b, &c, &mut acc);
    }
    for (t, a) in acc.iter().enumerate() {
        *j.out.add(t * j.os + r0) = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
    }
}

/// Row `r0` (`R` = 1) against `N` tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn rows<const R: usize, const N: usize>(j: &Job, r0: usize) {
    const { assert!(R == 1) };
    rows_with::<false, N>(j, r0)
}

/// [`rows`] on a CPU with GFNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni")]
unsafe fn rows_gfni<const R: usize, const N: usize>(j: &Job, r0: usize) {
    const { assert!(R == 1) };
    rows_with::<true, N>(j, r0)
}

entry!(pub(crate) run, rows, 1);
entry!(pub(crate) run_gfni, rows_gfni, 1);
