//! FP8 E4M3 weights times bf16-rounded activations (`QuantDot::Int8` on CPUs with AVX-512
//! BF16 and VBMI): the decode path of FP8 checkpoints at memory speed.
//!
//! Widening E4M3 codes to f32 (the exact kernel in [`super::qdot`]) costs about ten
//! instructions per 16 codes, which capped FP8 at ~14 GB/s of weights per core, below what
//! two cores stream. Every E4M3 value (subnormals included) is a normal bf16 number, so two
//! 128-entry byte tables (`vpermt2b`, indexed by the code's low seven bits) give each code's
//! bf16 high and low bytes exactly, the code's sign bit is merged into the high byte, and
//! `vdpbf16ps` multiplies pairs of them with pairs of bf16 activations: 64 codes in six
//! instructions plus two dot products per token. The activations are rounded to bf16 once
//! per product (relative error ≤ 2⁻⁹ each, as for bf16 weights) and stored in the lane order
//! the byte interleave leaves the weights in ([`permute_group`]).
//!
//! Block layout as [`super::qdot`]: per block of 128 codes, its f32 scale first; a block's
//! sum is multiplied by its scale. Safety contract of [`run`]: [`available`] returned true,
//! and the [`Job`] pointers cover `blocks` whole blocks per row and token.

use super::qdot::prefetch_offset;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Bytes of one block: the f32 scale, then 128 codes.
const BB: usize = 132;
/// Values of one block.
pub(crate) const BE: usize = 128;

/// Whether this CPU runs the kernel.
pub(crate) fn available() -> bool {
    super::dpbf16::available() && is_x86_feature_detected!("avx512vbmi")
}

/// One fused pass: rows `0..nrows` of `w` against `n` tokens of permuted bf16 activations.
#[derive(Clone, Copy)]
pub(crate) struct Job {
    /// Token `t`'s activations ([`prepare`]d, `blocks · 128` of them) at `x + t·xs`.
    pub x: *const u16,
    /// Elements between tokens in `x`.
    pub xs: usize,
    /// First weight row (any alignment).
    pub w: *const u8,
    /// Bytes per weight row.
    pub rb: usize,
    /// Blocks per row.
    pub blocks: usize,
    /// `out[t·os + r]` receives token `t` · row `r`.
    pub out: *mut f32,
    /// Elements between tokens in `out`.
    pub os: usize,
}

/// The bf16 bits of every non-negative E4M3 code, high bytes then low bytes.
fn tables() -> &'static [u8; 256] {
    static T: OnceLock<[u8; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0u8; 256];
        for c in 0..128u8 {
            // Exact: E4M3 has 3 mantissa bits and exponents 2⁻⁹..2⁸, all inside bf16's normals.
            let b = half::bf16::from_f32(ft_backend::quant::e4m3_to_f32(c)).to_bits();
            t[c as usize] = (b >> 8) as u8;
            t[128 + c as usize] = b as u8;
        }
        t
    })
}

/// Where value `i` (< 64) of a 64-value group sits in the kernel's order: the byte interleave
/// leaves codes 0–7, 16–23, 32–39, 48–55 in the first register and 8–15, 24–31, … in the
/// second.
pub(crate) fn permute_group(i: usize) -> usize {
    let (lane, k) = (i / 16, i % 16);
    if k < 8 {
        lane * 8 + k
    } else {
        32 + lane * 8 + (k - 8)
    }
}

/// Rounds `x` (a whole number of blocks) to bf16 into `out` in the kernel's order.
pub(crate) fn prepare(x: &[f32], out: &mut [u16]) {
    for (xg, og) in x.chunks_exact(64).zip(out.chunks_exact_mut(64)) {
        for (i, v) in xg.iter().enumerate() {
            og[permute_group(i)] = half::bf16::from_f32(*v).to_bits();
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
unsafe fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain lanes; the instruction reads them as bf16 pairs.
    std::mem::transmute::<__m512i, __m512bh>(v)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
unsafe fn fp8_rows<const R: usize, const N: usize>(j: &Job, r0: usize) {
    let t = tables().as_ptr();
    let (hi0, hi1) = (_mm512_loadu_si512(t as *const _), _mm512_loadu_si512(t.add(64) as *const _));
    let (lo0, lo1) = (_mm512_loadu_si512(t.add(128) as *const _), _mm512_loadu_si512(t.add(192) as *const _));
    let sign = _mm512_set1_epi8(0x80u8 as i8);
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    let mut w = [j.w; R];
    for (r, p) in w.iter_mut().enumerate() {
        *p = j.w.add((r0 + r) * j.rb);
    }
    for i in 0..j.blocks {
        let ahead = prefetch_offset::<R>(j.rb, i * BB);
        for p in w.iter() {
            let mut off = 0;
            while off < BB {
                super::prefetch(p.wrapping_add(ahead + off) as *const u8);
                off += 64;
            }
        }
        for r in 0..R {
            let p = w[r];
            let scale = _mm512_set1_ps((p as *const f32).read_unaligned());
            // Two partial sums per token (the interleave's first and second register): one
            // sum through all four products of a block was a chain of `vdpbf16ps` latencies
            // that held one token at ~18 GB/s of weights per core.
            let mut s = [[_mm512_setzero_ps(); 2]; N];
            for g in 0..BE / 64 {
                let c = _mm512_loadu_si512(p.add(4 + 64 * g) as *const _);
                let hi = _mm512_permutex2var_epi8(hi0, c, hi1);
                let lo = _mm512_permutex2var_epi8(lo0, c, lo1);
                // hi | (c & 0x80): the code's sign into the bf16 sign bit.
                let hi = _mm512_ternarylogic_epi32::<0xF8>(hi, c, sign);
                let (w0, w1) = (bh(_mm512_unpacklo_epi8(lo, hi)), bh(_mm512_unpackhi_epi8(lo, hi)));
                for (tk, st) in s.iter_mut().enumerate() {
                    let xp = j.x.add(tk * j.xs + i * BE + 64 * g);
                    st[0] = _mm512_dpbf16_ps(st[0], w0, bh(_mm512_loadu_si512(xp as *const _)));
                    st[1] = _mm512_dpbf16_ps(st[1], w1, bh(_mm512_loadu_si512(xp.add(32) as *const _)));
                }
            }
            for (a, st) in acc[r].iter_mut().zip(&s) {
                *a = _mm512_fmadd_ps(_mm512_add_ps(st[0], st[1]), scale, *a);
            }
        }
        for p in w.iter_mut() {
            *p = p.add(BB);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (tk, v) in row.iter().enumerate() {
            *j.out.add(tk * j.os + r0 + r) = _mm512_reduce_add_ps(*v);
        }
    }
}

entry!(pub(crate) run, fp8_rows, 1);
