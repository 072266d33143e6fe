//! Fused AVX2 dot products of block-quantized weight rows with a few (≤ [`MAX_TOKENS`]) f32
//! activation rows: the decode path, which must stream weights at memory speed.
//!
//! Each row's blocks are read once; codes are widened to exact integer-valued f32 in
//! registers (`vpmovzxbd` + `vcvtdq2ps`, or a byte table for E2M1, or read as f32 bits for E4M3)
//! and multiply-accumulated with the activations by FMA into a per-(sub-)block partial sum,
//! which is then scaled by that (sub-)block's f32 scale:
//!
//! * Q8_0, Q4_0, MXFP4, NVFP4, FP8: `Σ_b s_b · Σ_{p∈b} q_p·x_p` (Q4_0's `−8` offset and the
//!   doubled E2M1 table are folded in exactly: `−8·Σx` per block, a final `× ½`);
//! * Q4_K, Q5_K: `Σ_j (d·sc_j)·Σ q·x − Σ_j (dmin·m_j)·S_j` with `S_j` the sum of `x` over
//!   sub-block `j`, computed once per token and shared by every row;
//! * Q6_K: `Σ_i (d·sc_i)·(Σ q·x − 32·S_i)` over the 16 sub-blocks of 16.
//!
//! The scale products are the ones [`ft_backend::quant::decode_block`] forms (`d·sc`, `dmin·m`,
//! `e4m3(sc)·global`, …), so results equal the f32 product of the dequantized weights up to
//! summation order. Activations are read zero-padded to whole blocks (the caller pads the last
//! partial block), so padded weight values contribute nothing.
//!
//! Safety contract of [`run`]: the CPU has AVX2, FMA and F16C, and the [`Job`] pointers cover
//! `blocks` whole blocks per row for every row and token asked for.

use ft_backend::quant::{e4m3_to_f32, e8m0_to_f32};
use ft_backend::DType;
use std::arch::x86_64::*;

/// Most tokens one fused pass serves; more go through the decode-to-scratch path.
pub(crate) const MAX_TOKENS: usize = 4;
/// Software prefetch distance ahead of each row's read pointer, in bytes. Streaming 192+ MiB
/// of experts on 2 threads (A/B in one process, 7 alternating passes),
/// 2048 beat 1024 by 10–20 % for Q8_0, Q4_K, Q6_K and NVFP4; 512 lost and 3072–6144 were
/// no better.
pub(crate) const PF: usize = 2048;

/// Where, relative to the read position `pos` of a row, a driver interleaving `R` rows
/// prefetches: [`PF`] bytes ahead in the same row, or, once that passes the row's end (`rb`
/// bytes), the same distance into the row this lane reads next (`R` rows on). Running on
/// into the adjacent row instead would fetch what the neighbouring lane is reading already
/// and leave the start of the next pass's rows to demand misses: with rows shorter than
/// `PF` (a down projection's 816-byte Q8_0 rows) that was every row of every other lane.
#[inline(always)]
pub(super) fn prefetch_offset<const R: usize>(rb: usize, pos: usize) -> usize {
    if pos + PF < rb {
        PF
    } else {
        PF + (R - 1) * rb
    }
}
/// Twice the E2M1 values, by code (bit 3 is the sign): integers, so the table is exact.
pub(super) const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Whether `dtype` has a fused kernel.
pub(crate) fn supported(dtype: DType) -> bool {
    !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Activation sums per block per token the kernel of `dtype` reads (sub-block sums of `x`).
pub(crate) fn aux_per_block(dtype: DType) -> usize {
    match dtype {
        DType::Q4_0 => 1,
        DType::Q4K | DType::Q5K => 8,
        DType::Q6K => 16,
        _ => 0,
    }
}

/// One fused pass: rows `0..nrows` of `w` against `n` tokens.
#[derive(Clone, Copy)]
pub(crate) struct Job {
    /// Token `t`'s activations, zero-padded to `blocks` whole blocks, at `x + t·xs`.
    pub x: *const f32,
    /// Elements between tokens in `x`.
    pub xs: usize,
    /// Token `t`'s sub-block sums ([`aux_per_block`] per block) at `aux + t·auxs`.
    pub aux: *const f32,
    /// Elements between tokens in `aux`.
    pub auxs: usize,
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

/// Runs `job` for `n` (1..=[`MAX_TOKENS`]) tokens and `nrows` rows of `dtype`.
///
/// # Safety
/// See the module docs.
pub(crate) unsafe fn run(dtype: DType, job: &Job, n: usize, nrows: usize) {
    debug_assert!((1..=MAX_TOKENS).contains(&n));
    match dtype {
        DType::Q8_0 => q8_0(job, n, nrows),
        DType::Q4_0 => q4_0(job, n, nrows),
        DType::Q4K => q4_k(job, n, nrows),
        DType::Q5K => q5_k(job, n, nrows),
        DType::Q6K => q6_k(job, n, nrows),
        DType::Mxfp4 => mxfp4(job, n, nrows),
        DType::Nvfp4 => nvfp4(job, n, nrows),
        DType::F8E4M3 => fp8(job, n, nrows),
        DType::F32 | DType::F16 | DType::BF16 => unreachable!("plain dtypes have no fused kernel"),
    }
}

type Acc<const R: usize, const N: usize> = [[__m256; N]; R];

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 8 bytes at `p`, zero-extended to 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn u8x8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// 8 activations at `x + i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ldx(x: *const f32, i: usize) -> __m256 {
    _mm256_loadu_ps(x.add(i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cvt(v: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(v)
}

/// The two little-endian f16 values at `p`, widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The little-endian f16 at `p`, widened into all eight lanes. Kept a full-width broadcast
/// on purpose: when only lane 0 of a scalar conversion is used, LLVM inserts the f16 into
/// whatever register is free (`vpinsrw`), often the accumulator, chaining every block's scale
/// behind the previous block's FMA (that capped the 32-value types at ~10 values/ns).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_splat(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
}

/// Shifts each 32-bit lane left by `n` (right by `−n`); `n` is a constant once unrolled.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shl(v: __m256i, n: i32) -> __m256i {
    if n >= 0 {
        _mm256_sll_epi32(v, _mm_cvtsi32_si128(n))
    } else {
        _mm256_srl_epi32(v, _mm_cvtsi32_si128(-n))
    }
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block from its 12 packed bytes at `p`
/// (ggml's `get_scale_min_k4` for all `j` at once), as integer-valued f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_scales(p: *const u8) -> (__m256, __m256) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let u = p as *const u32;
    let (u0, u1, u2) = (
        u.read_unaligned(),
        u.add(1).read_unaligned(),
        u.add(2).read_unaligned(),
    );
    let sc = (u0 & K1) as u64 | (((u2 & K2) | (((u0 >> 6) & K3) << 4)) as u64) << 32;
    let mn = (u1 & K1) as u64 | ((((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4)) as u64) << 32;
    (
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64))),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64))),
    )
}

/// Defines the row driver `$rows::<R, N>` (R rows × N tokens per pass over the blocks) and the
/// entry `$entry` for a block kernel `$blk`, whose blocks hold `$be` values in `$bb` bytes and
/// read `$apb` activation sums; `$fin` scales every result at the end. One token interleaves
/// `$r1` rows (2 for the small-block types, whose per-block scale work then overlaps; the
/// 256-value kernels already have enough independent partial sums, and more rows make LLVM
/// spill); 2..=4 tokens take one row at a time, their partial sums being the parallelism.
macro_rules! kernel {
    ($entry:ident, $rows:ident, $blk:ident, $be:expr, $bb:expr, $apb:expr, $fin:expr, $r1:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $rows<const R: usize, const N: usize>(j: &Job, r0: usize) {
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            let mut w = [j.w; R];
            for (r, p) in w.iter_mut().enumerate() {
                *p = j.w.add((r0 + r) * j.rb);
            }
            let (mut x, mut a) = ([j.x; N], [j.aux; N]);
            for t in 0..N {
                x[t] = j.x.add(t * j.xs);
                a[t] = j.aux.add(t * j.auxs);
            }
            for i in 0..j.blocks {
                let ahead = prefetch_offset::<R>(j.rb, i * $bb);
                for p in w.iter() {
                    let mut off = 0;
                    while off < $bb {
                        // Hardware prefetch alone leaves the memory bus under-used.
                        super::prefetch(p.wrapping_add(ahead + off) as *const u8);
                        off += 64;
                    }
                }
                $blk::<R, N>(&w, &x, &a, &mut acc);
                for p in w.iter_mut() {
                    *p = p.add($bb);
                }
                for t in 0..N {
                    x[t] = x[t].add($be);
                    a[t] = a[t].add($apb);
                }
            }
            for (r, row) in acc.iter().enumerate() {
                for (t, v) in row.iter().enumerate() {
                    *j.out.add(t * j.os + r0 + r) = hsum(*v) * $fin;
                }
            }
        }

        entry!($entry, $rows, $r1);
    };
}

kernel!(q8_0, q8_0_rows, q8_0_blk, 32, 34, 0, 1.0, 2);
kernel!(q4_0, q4_0_rows, q4_0_blk, 32, 18, 1, 1.0, 2);
kernel!(q4_k, q4_k_rows, q4_k_blk, 256, 144, 8, 1.0, 1);
kernel!(q5_k, q5_k_rows, q5_k_blk, 256, 176, 8, 1.0, 1);
kernel!(q6_k, q6_k_rows, q6_k_blk, 256, 210, 16, 1.0, 1);
kernel!(mxfp4, mxfp4_rows, mxfp4_blk, 32, 17, 0, 0.5, 2);
kernel!(nvfp4, nvfp4_rows, nvfp4_blk, 256, 148, 0, 0.5, 1);
kernel!(fp8, fp8_rows, fp8_blk, 128, 132, 0, 1.0, 1);

/// Q8_0: `d · Σ q·x` per block of 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    _a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    for r in 0..R {
        let p = w[r];
        let d = f16_splat(p);
        let mut q = [_mm256_setzero_ps(); 4];
        for (i, v) in q.iter_mut().enumerate() {
            *v = cvt(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                p.add(2 + 8 * i) as *const __m128i
            )));
        }
        for t in 0..N {
            let mut s0 = _mm256_mul_ps(q[0], ldx(x[t], 0));
            let mut s1 = _mm256_mul_ps(q[1], ldx(x[t], 8));
            s0 = _mm256_fmadd_ps(q[2], ldx(x[t], 16), s0);
            s1 = _mm256_fmadd_ps(q[3], ldx(x[t], 24), s1);
            acc[r][t] = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), d, acc[r][t]);
        }
    }
}

/// Q4_0: `d · (Σ q·x − 8·Σx)` per block of 32 (`q` the unsigned nibble).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let low = _mm256_set1_epi32(0x0f);
    for r in 0..R {
        let p = w[r];
        let d = f16_splat(p);
        // Byte j holds value j (low nibble) and value j + 16 (high nibble).
        let (v0, v1) = (u8x8(p.add(2)), u8x8(p.add(10)));
        let q = [
            cvt(_mm256_and_si256(v0, low)),
            cvt(_mm256_and_si256(v1, low)),
            cvt(_mm256_srli_epi32::<4>(v0)),
            cvt(_mm256_srli_epi32::<4>(v1)),
        ];
        for t in 0..N {
            let mut s0 = _mm256_mul_ps(q[0], ldx(x[t], 0));
            let mut s1 = _mm256_mul_ps(q[1], ldx(x[t], 8));
            s0 = _mm256_fmadd_ps(q[2], ldx(x[t], 16), s0);
            s1 = _mm256_fmadd_ps(q[3], ldx(x[t], 24), s1);
            // Subtracting Σx from all 8 lanes takes 8·Σx off their sum.
            let s = _mm256_sub_ps(_mm256_add_ps(s0, s1), _mm256_broadcast_ss(&*a[t]));
            acc[r][t] = _mm256_fmadd_ps(s, d, acc[r][t]);
        }
    }
}

/// Q4_K: `Σ_j (d·sc_j)·Σ q·x − Σ_j (dmin·m_j)·S_j` over the 8 sub-blocks of 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let low = _mm256_set1_epi32(0x0f);
    for r in 0..R {
        let p = w[r];
        let (d, dmin) = f16x2(p);
        let (sc, mn) = k4_scales(p.add(4));
        let mut s = [0f32; 8];
        _mm256_storeu_ps(s.as_mut_ptr(), _mm256_mul_ps(sc, _mm256_set1_ps(d)));
        let mv = _mm256_mul_ps(mn, _mm256_set1_ps(dmin));
        for t in 0..N {
            acc[r][t] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(a[t]), acc[r][t]);
        }
        for c in 0..4 {
            let (mut lo, mut hi) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
            for h in 0..4 {
                // Bytes 32c + l hold values 64c + l (low nibbles) and 64c + 32 + l (high).
                let v = u8x8(p.add(16 + 32 * c + 8 * h));
                let (ql, qh) = (
                    cvt(_mm256_and_si256(v, low)),
                    cvt(_mm256_srli_epi32::<4>(v)),
                );
                for t in 0..N {
                    lo[t] = _mm256_fmadd_ps(ql, ldx(x[t], 64 * c + 8 * h), lo[t]);
                    hi[t] = _mm256_fmadd_ps(qh, ldx(x[t], 64 * c + 32 + 8 * h), hi[t]);
                }
            }
            for t in 0..N {
                acc[r][t] = _mm256_fmadd_ps(lo[t], _mm256_set1_ps(s[2 * c]), acc[r][t]);
                acc[r][t] = _mm256_fmadd_ps(hi[t], _mm256_set1_ps(s[2 * c + 1]), acc[r][t]);
            }
        }
    }
}

/// Q5_K: as Q4_K, the fifth bit of value `32s + l` being bit `s` of `qh[l]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let (low, bit4) = (_mm256_set1_epi32(0x0f), _mm256_set1_epi32(0x10));
    for r in 0..R {
        let p = w[r];
        let (d, dmin) = f16x2(p);
        let (sc, mn) = k4_scales(p.add(4));
        let mut s = [0f32; 8];
        _mm256_storeu_ps(s.as_mut_ptr(), _mm256_mul_ps(sc, _mm256_set1_ps(d)));
        let mv = _mm256_mul_ps(mn, _mm256_set1_ps(dmin));
        for t in 0..N {
            acc[r][t] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(a[t]), acc[r][t]);
        }
        for c in 0..4 {
            let (mut lo, mut hi) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
            for h in 0..4 {
                let v = u8x8(p.add(48 + 32 * c + 8 * h));
                // Bit s of qh byte l moved to bit 4 for s = 2c (low nibbles), 2c + 1 (high).
                let qh = u8x8(p.add(16 + 8 * h));
                let bl = _mm256_and_si256(shl(qh, 4 - 2 * c as i32), bit4);
                let bh = _mm256_and_si256(shl(qh, 3 - 2 * c as i32), bit4);
                let ql = cvt(_mm256_or_si256(_mm256_and_si256(v, low), bl));
                let qhv = cvt(_mm256_or_si256(_mm256_srli_epi32::<4>(v), bh));
                for t in 0..N {
                    lo[t] = _mm256_fmadd_ps(ql, ldx(x[t], 64 * c + 8 * h), lo[t]);
                    hi[t] = _mm256_fmadd_ps(qhv, ldx(x[t], 64 * c + 32 + 8 * h), hi[t]);
                }
            }
            for t in 0..N {
                acc[r][t] = _mm256_fmadd_ps(lo[t], _mm256_set1_ps(s[2 * c]), acc[r][t]);
                acc[r][t] = _mm256_fmadd_ps(hi[t], _mm256_set1_ps(s[2 * c + 1]), acc[r][t]);
            }
        }
    }
}

/// Q6_K: `Σ_i (d·sc_i)·(Σ q·x − 32·S_i)` over the 16 sub-blocks of 16 (`q` unsigned 6-bit).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let (low, top) = (_mm256_set1_epi32(0x0f), _mm256_set1_epi32(0x30));
    for r in 0..R {
        let p = w[r];
        let d = f16_splat(p.add(208));
        let sc0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
            p.add(192) as *const __m128i
        )));
        let sc1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
            p.add(200) as *const __m128i
        )));
        let (ds0, ds1) = (_mm256_mul_ps(sc0, d), _mm256_mul_ps(sc1, d));
        let mut s = [0f32; 16];
        _mm256_storeu_ps(s.as_mut_ptr(), ds0);
        _mm256_storeu_ps(s.as_mut_ptr().add(8), ds1);
        let m32 = _mm256_set1_ps(32.0);
        let (o0, o1) = (_mm256_mul_ps(ds0, m32), _mm256_mul_ps(ds1, m32));
        for t in 0..N {
            acc[r][t] = _mm256_fnmadd_ps(o0, _mm256_loadu_ps(a[t]), acc[r][t]);
            acc[r][t] = _mm256_fnmadd_ps(o1, _mm256_loadu_ps(a[t].add(8)), acc[r][t]);
        }
        for half in 0..2 {
            // Values 128·half + 32·quarter + l: low 4 bits in ql byte 64·half +
            // 32·(quarter % 2) + l (nibble quarter / 2), top 2 bits in qh byte 32·half + l
            // (bits 2·quarter). Each ql load serves two quarters, each qh load all four.
            for i in 0..2 {
                let mut ps = [[_mm256_setzero_ps(); N]; 4];
                for l in 0..2 {
                    let l0 = 16 * i + 8 * l;
                    let ql0 = u8x8(p.add(64 * half + l0));
                    let ql1 = u8x8(p.add(64 * half + 32 + l0));
                    let qh = u8x8(p.add(128 + 32 * half + l0));
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(ql0, low),
                            _mm256_and_si256(_mm256_slli_epi32::<4>(qh), top),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(ql1, low),
                            _mm256_and_si256(_mm256_slli_epi32::<2>(qh), top),
                        ),
                        _mm256_or_si256(_mm256_srli_epi32::<4>(ql0), _mm256_and_si256(qh, top)),
                        _mm256_or_si256(
                            _mm256_srli_epi32::<4>(ql1),
                            _mm256_and_si256(_mm256_srli_epi32::<2>(qh), top),
                        ),
                    ];
                    for (quarter, qv) in q.iter().enumerate() {
                        let qf = cvt(*qv);
                        for t in 0..N {
                            let xo = 128 * half + 32 * quarter + l0;
                            ps[quarter][t] = _mm256_fmadd_ps(qf, ldx(x[t], xo), ps[quarter][t]);
                        }
                    }
                }
                for (quarter, pq) in ps.iter().enumerate() {
                    let sv = _mm256_set1_ps(s[8 * half + 2 * quarter + i]);
                    for t in 0..N {
                        acc[r][t] = _mm256_fmadd_ps(pq[t], sv, acc[r][t]);
                    }
                }
            }
        }
    }
}

/// 8 signed bytes (the low 8 of `v`) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i8lo(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// MXFP4: `2^e · Σ (2·e2m1)·x` per block of 32 (the final `× ½` undoes the doubling).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    _a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let table = _mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i);
    let low = _mm_set1_epi8(0x0f);
    for r in 0..R {
        let p = w[r];
        let sv = _mm256_set1_ps(e8m0_to_f32(*p));
        // Byte j holds value j (low nibble) and value j + 16 (high nibble).
        let packed = _mm_loadu_si128(p.add(1) as *const __m128i);
        let lv = _mm_shuffle_epi8(table, _mm_and_si128(packed, low));
        let hv = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(packed), low));
        let q = [
            i8lo(lv),
            i8lo(_mm_srli_si128::<8>(lv)),
            i8lo(hv),
            i8lo(_mm_srli_si128::<8>(hv)),
        ];
        for t in 0..N {
            let mut s0 = _mm256_mul_ps(q[0], ldx(x[t], 0));
            let mut s1 = _mm256_mul_ps(q[1], ldx(x[t], 8));
            s0 = _mm256_fmadd_ps(q[2], ldx(x[t], 16), s0);
            s1 = _mm256_fmadd_ps(q[3], ldx(x[t], 24), s1);
            acc[r][t] = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), sv, acc[r][t]);
        }
    }
}

/// NVFP4: `(e4m3(sc_g)·global) · Σ (2·e2m1)·x` per group of 16 (final `× ½`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    _a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let table = _mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i);
    let low = _mm_set1_epi8(0x0f);
    for r in 0..R {
        let p = w[r];
        let global = (p as *const f32).read_unaligned();
        for g in 0..16 {
            // The two scales multiply in f32 first, as the reference dequantization does.
            let sv = _mm256_set1_ps(e4m3_to_f32(*p.add(4 + g)) * global);
            let packed = _mm_loadl_epi64(p.add(20 + 8 * g) as *const __m128i);
            let lo = _mm_and_si128(packed, low);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), low);
            // Low nibble is the even value: interleave to value order.
            let v = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));
            let (q0, q1) = (i8lo(v), i8lo(_mm_srli_si128::<8>(v)));
            for t in 0..N {
                let s = _mm256_mul_ps(q0, ldx(x[t], 16 * g));
                let s = _mm256_fmadd_ps(q1, ldx(x[t], 16 * g + 8), s);
                acc[r][t] = _mm256_fmadd_ps(s, sv, acc[r][t]);
            }
        }
    }
}

/// FP8 E4M3 activations are scaled by `2^FP8_X_EXP` ([`fp8_prepare`]) and the block scales
/// by `2^(120 − FP8_X_EXP)`: with codes read as f32 bits worth `e4m3·2⁻¹²⁰`, a product of the
/// smallest subnormal code (2⁻⁹) and an activation down to 2⁻⁵⁰ still lands in f32's normal
/// range, and activations up to 2⁶⁴ stay finite. Powers of two, so every product is exact.
pub(crate) const FP8_X_EXP: i32 = 64;

/// Where [`fp8_blk`] reads activation `j` of each run of 32: the codes widen as even and odd
/// 16-bit halves of the unpacked bytes, so the four vectors hold codes 0,2,…,6,16,…,22 ·
/// 1,3,…,23 · 8,10,…,30 · 9,11,…,31.
const fn fp8_order() -> [usize; 32] {
    let mut o = [0; 32];
    let mut v = 0;
    while v < 4 {
        let (base, odd) = (8 * (v / 2), v % 2);
        let mut l = 0;
        while l < 8 {
            o[8 * v + l] = base + 16 * (l / 4) + 2 * (l % 4) + odd;
            l += 1;
        }
        v += 1;
    }
    o
}
const FP8_ORDER: [usize; 32] = fp8_order();

/// One token's activations (whole blocks of 128) as [`fp8_blk`] reads them: each run of 32 in
/// [`FP8_ORDER`], times `2^FP8_X_EXP`.
pub(crate) fn fp8_prepare(x: &[f32], out: &mut [f32]) {
    let up = f32::from_bits(((127 + FP8_X_EXP) as u32) << 23);
    for (o, x) in out.chunks_exact_mut(32).zip(x.chunks_exact(32)) {
        for (o, &j) in o.iter_mut().zip(FP8_ORDER.iter()) {
            *o = x[j] * up;
        }
    }
}

/// FP8 E4M3: `scale · Σ e4m3·x` per block of 128. A code `s.eeee.mmm` placed as the f32 bits
/// `s.0000eeee.mmm0…` is its value times 2⁻¹²⁰, subnormals included (as f32 denormals, which
/// Zen 3's FMA takes at full speed): one arithmetic shift and a mask per 16 codes and a shift
/// more for the even ones, all in whole registers, where the f16 route spent a `vcvtph2ps`
/// (two shuffle-port µops) per 8 codes and capped the kernel at ~4 codes a cycle.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp8_blk<const R: usize, const N: usize>(
    w: &[*const u8; R],
    x: &[*const f32; N],
    _a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let (zero, keep) = (_mm256_setzero_si256(), _mm256_set1_epi32(0x87F0_0000u32 as i32));
    let up = f32::from_bits(((127 + 120 - FP8_X_EXP) as u32) << 23);
    for r in 0..R {
        let p = w[r];
        let sv = _mm256_set1_ps((p as *const f32).read_unaligned() * up);
        let (mut s0, mut s1) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
        for i in 0..4 {
            let c = _mm256_loadu_si256(p.add(4 + 32 * i) as *const __m256i);
            // Each code in the high byte of a 16-bit lane, shifted right arithmetically by 4:
            // the sign fills bits 15..11, the exponent and mantissa land in 10..4; the mask
            // keeps bit 15 and 10..4 of the upper halves of the 32-bit lanes.
            let lo = _mm256_srai_epi16::<4>(_mm256_unpacklo_epi8(zero, c));
            let hi = _mm256_srai_epi16::<4>(_mm256_unpackhi_epi8(zero, c));
            let f = [
                _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32::<16>(lo), keep)),
                _mm256_castsi256_ps(_mm256_and_si256(lo, keep)),
                _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32::<16>(hi), keep)),
                _mm256_castsi256_ps(_mm256_and_si256(hi, keep)),
            ];
            for t in 0..N {
                s0[t] = _mm256_fmadd_ps(f[0], ldx(x[t], 32 * i), s0[t]);
                s1[t] = _mm256_fmadd_ps(f[1], ldx(x[t], 32 * i + 8), s1[t]);
                s0[t] = _mm256_fmadd_ps(f[2], ldx(x[t], 32 * i + 16), s0[t]);
                s1[t] = _mm256_fmadd_ps(f[3], ldx(x[t], 32 * i + 24), s1[t]);
            }
        }
        for t in 0..N {
            acc[r][t] = _mm256_fmadd_ps(_mm256_add_ps(s0[t], s1[t]), sv, acc[r][t]);
        }
    }
}
