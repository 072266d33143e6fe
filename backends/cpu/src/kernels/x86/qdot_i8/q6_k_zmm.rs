//! Q6_K on 512-bit registers ([`Isa::Avx512Vbmi`]): half a block (128 values) a step.
//!
//! The 256-bit kernel ([`super::q6_k_blk`]) builds 32 codes at a time, and for every 32
//! values permutes a weight scale, broadcasts an activation scale and multiplies the two: about
//! 80 instructions a block, compute-bound at ~22 GB/s of weights per core (one warm thread),
//! which on 2 cores kept the output head (Q6_K in a Q4_K_M file) at ~75 % of the read
//! bandwidth. Here one 64-byte load holds the low bits of a half block's four quarters, one
//! broadcast and one variable shift give the high bits of two quarters side by side, and
//! `vpdpbusd` sums 64 codes against the activations in their natural order: lanes `4i..4i+4`
//! of a step's sum belong to its sub-block `i` of 16. The weight scales `d·sc` are permuted
//! over those lanes once per row and block; the activation scales come laid out per lane from
//! [`extras`] (prepared once per token), so a step costs each token one conversion, one
//! multiply and one FMA. About half the instructions a block of the 256-bit kernel.
//!
//! The offset term `32·d·Σ sc_i·S_i` uses the exact activation sums `S_i` as every Q6_K
//! kernel does; the integer sums are exact, only the order of the f32 additions differs.

use super::*;

/// Bytes of one block.
const BB: usize = 210;
/// Values of one block.
const BE: usize = 256;
/// Prepared values per token and block in [`extras`]: 64 activation scales laid out per
/// lane of the four steps' sums, the 16 exact sub-block sums, then each sub-block's
/// activation scale.
pub(crate) const EXTRAS: usize = 96;

/// `vpermps` indices spreading sub-block scales `4s..4s+4` over the four lanes each of
/// step `s`'s sums.
static SPREAD: [[u32; 16]; 4] = {
    let mut t = [[0u32; 16]; 4];
    let mut s = 0;
    while s < 4 {
        let mut l = 0;
        while l < 16 {
            t[s][l] = (4 * s + l / 4) as u32;
            l += 1;
        }
        s += 1;
    }
    t
};

/// One token's per-block values ([`EXTRAS`] a block): for step `s` (values `64s..64s+64`),
/// lanes 0..8 hold the scale of activation group `2s` and lanes 8..16 that of group `2s + 1`;
/// then the block's 16 exact sub-block sums, then sub-block `i`'s activation scale (that of
/// group `i / 2`) in lane `i`. `d` holds the token's scales (one per 32 values), `sums` its
/// sub-block sums (16 per block).
pub(crate) fn extras(d: &[f32], sums: &[f32], out: &mut [f32]) {
    for ((o, dg), sg) in out.chunks_exact_mut(EXTRAS).zip(d.chunks_exact(BE / QK)).zip(sums.chunks_exact(16)) {
        for (s, lanes) in o[..64].chunks_exact_mut(16).enumerate() {
            lanes[..8].fill(dg[2 * s]);
            lanes[8..].fill(dg[2 * s + 1]);
        }
        o[64..80].copy_from_slice(sg);
        for (i, v) in o[80..].iter_mut().enumerate() {
            *v = dg[i / 2];
        }
    }
}

/// What every block of a row uses.
#[derive(Clone, Copy)]
struct Consts {
    spread: [__m512i; 4],
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

/// Block `b` of the row at `p0` against `N` tokens: two accumulators a token (the two
/// quarters' pairs of a half block), the offset term taken off the second.
#[inline(always)]
unsafe fn block<const G: bool, const N: usize>(j: &Job, p0: *const u8, b: usize, c: &Consts, acc: &mut [[__m512; 2]; N]) {
    let p = p0.add(b * BB);
    let ahead = prefetch_offset::<1>(j.rb, b * BB);
    for o in [0, 64, 128, 192] {
        super::super::prefetch(p.wrapping_add(ahead + o));
    }
    let d = _mm512_cvtph_ps(_mm256_set1_epi16((p.add(208) as *const i16).read_unaligned()));
    let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(192) as *const __m128i)));
    let ws = _mm512_mul_ps(sc, d);
    let off = _mm512_mul_ps(ws, _mm512_set1_ps(32.0));
    // One token: its activation scales folded into the weight scales once a block, so a step's
    // lane scales are a permute, not a permute and a multiply (one warm thread: 27.5 → 29.9
    // GB/s of weights). More tokens multiply the permuted weight scales by each one's.
    let scales = if N == 1 { _mm512_mul_ps(ws, _mm512_loadu_ps(j.aux.add(b * EXTRAS + 80))) } else { ws };
    for h in 0..2 {
        let ql = _mm512_loadu_si512(p.add(64 * h) as *const _);
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i));
        // Quarters 0 and 1: low nibbles, high bits 0–1 (2–3 in the upper half) at bits 4–5;
        // quarters 2 and 3: high nibbles, high bits 4–5 (6–7) at bits 4–5.
        let (lo, hi) = if G {
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
        let (sl, sh) = (
            _mm512_permutexvar_ps(c.spread[2 * h], scales),
            _mm512_permutexvar_ps(c.spread[2 * h + 1], scales),
        );
        for (t, a) in acc.iter_mut().enumerate() {
            let q = j.q.add(t * j.qs + b * BE + 128 * h);
            let x = j.aux.add(t * j.auxs + b * EXTRAS + 32 * h);
            let zero = _mm512_setzero_si512();
            let dl = _mm512_dpbusd_epi32(zero, lo, _mm512_loadu_si512(q as *const _));
            let dh = _mm512_dpbusd_epi32(zero, hi, _mm512_loadu_si512(q.add(64) as *const _));
            let (fl, fh) = if N == 1 {
                (sl, sh)
            } else {
                (_mm512_mul_ps(sl, _mm512_loadu_ps(x)), _mm512_mul_ps(sh, _mm512_loadu_ps(x.add(16))))
            };
            a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dl), fl, a[0]);
            a[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dh), fh, a[1]);
        }
    }
    for (t, a) in acc.iter_mut().enumerate() {
        let x = j.aux.add(t * j.auxs + b * EXTRAS + 64);
        a[1] = _mm512_fnmadd_ps(off, _mm512_loadu_ps(x), a[1]);
    }
}

/// Row `r0` (`R` = 1) against `N` tokens, the high bits placed by GFNI where `G`.
#[inline(always)]
unsafe fn rows_with<const G: bool, const N: usize>(j: &Job, r0: usize) {
    let p0 = j.w.add(r0 * j.rb);
    let c = Consts {
        spread: SPREAD.map(|s| _mm512_loadu_si512(s.as_ptr() as *const _)),
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
