//! AVX2 dot products of block-quantized weight rows with int8-quantized activations, the
//! integer route llama.cpp takes: the 4-bit types are compute-bound when every code is widened
//! to f32 ([`super::qdot`] streams Q4_K at about 9 GB/s per core), while `vpmaddubsw` multiplies
//! 32 codes by 32 activations in one instruction.
//!
//! Activations are quantized per group of [`QK`] values: `a = round(x / d)`, `d = max|x| / 127`
//! ([`quantize`]). A weight block then contributes, per group `g` of 32 values (16 for the
//! NVFP4 and Q6_K scales, applied per half of the group's lanes):
//!
//! * Q8_0, MXFP4, NVFP4 (signed codes, the sign moved onto the activation so `vpmaddubsw` sees
//!   an unsigned operand; the E2M1 codes of MXFP4's eight-block steps and of NVFP4 instead
//!   offset by 12 to unsigned, the offset times the activations' integer sum taken back from
//!   each lane; Q8_0's codes where `vpdpbusd` runs offset by 128 to unsigned, `128·Σa` taken
//!   back through the lanes' start values, [`q8_0u_oct`]): `s_w · d_g · Σ q·a`;
//! * Q4_0, Q4_K, Q5_K, Q6_K (unsigned codes with an offset or a min): `s · d_g · Σ q·a` minus
//!   `offset · S`, where `S` is the **exact** f32 sum of `x` over the sub-block (as in
//!   [`super::qdot`]), so only the code term carries the activation rounding.
//!
//! Integer sums cannot overflow: `|q| ≤ 63` (Q6_K) or `≤ 128` against `|a| ≤ 127` keeps each
//! `vpmaddubsw` pair below 2¹⁵ (MXFP4's 512-bit kernel, on `vpdpbusd` alone, has no pairs);
//! codes of at most 31 keep two pairs' sum below it too, so [`Dot::dot_u2`] adds them in 16
//! bits before widening.
//!
//! Safety contract of [`run`]: the CPU has AVX2, FMA and F16C, and the [`Job`] pointers cover
//! `blocks` whole blocks per row for every row and token asked for.

use super::qdot::{f16_splat, hsum, prefetch_offset, E2M1_X2};

mod fp4;
mod isa;
mod kquants;
pub(crate) mod k4_pairs;
mod order;
pub(crate) mod mxfp4_zmm;
pub(crate) mod q6_k_zmm;
use fp4::{mxfp4_blk, mxfp4_oct, nvfp4_blk};
use kquants::{dwords_4x4, q4_k_blk, q5_k_blk, q6_k_blk};
pub(crate) use order::{blocks8_order, q4_k_order, q6_k_order};
#[cfg(doc)]
use order::Q4K_LANES;
pub(crate) use isa::Isa;
use isa::{Avx512Gfni, Avx512Vnni, AvxVnni, Dot, Madd};
pub(crate) use fp4::nvfp4_order;
#[cfg(test)]
pub(crate) use fp4::e8m0_x8;
use ft_backend::quant::e8m0_to_f32;
use ft_backend::DType;
use std::arch::x86_64::*;

/// Activation values per int8 scale.
pub(crate) const QK: usize = 32;

/// Whether `dtype` has an int8 kernel (FP8's E4M3 codes are not integers).
pub(crate) fn supported(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q8_0
            | DType::Q4_0
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::Mxfp4
            | DType::Nvfp4
    )
}

/// One pass: rows `0..nrows` of `w` against `n` int8-quantized tokens.
#[derive(Clone, Copy)]
pub(crate) struct Job {
    /// Token `t`'s int8 activations, `blocks` whole blocks, at `q + t·qs`.
    pub q: *const i8,
    /// Bytes between tokens in `q`.
    pub qs: usize,
    /// Token `t`'s scales (one per [`QK`] values) at `d + t·ds`.
    pub d: *const f32,
    /// Elements between tokens in `d`.
    pub ds: usize,
    /// Token `t`'s exact sub-block sums ([`super::qdot::aux_per_block`] per block), or where
    /// the kernel reads extras ([`Isa::has_extras`]) its extras.
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

/// Quantizes `x` (whole groups of [`QK`]) into `q` with one scale per group into `d`.
///
/// # Safety
/// The CPU has AVX2/FMA/F16C; `q.len() == x.len()`, `d.len() == x.len() / QK`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    debug_assert!(x.len() % QK == 0 && q.len() == x.len() && d.len() == x.len() / QK);
    let sign = _mm256_set1_ps(-0.0);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for ((xc, qc), dg) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).zip(d.iter_mut()) {
        let v = [
            _mm256_loadu_ps(xc.as_ptr()),
            _mm256_loadu_ps(xc.as_ptr().add(8)),
            _mm256_loadu_ps(xc.as_ptr().add(16)),
            _mm256_loadu_ps(xc.as_ptr().add(24)),
        ];
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        *dg = amax / 127.0;
        let inv = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        let i = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, inv)));
        // The packs interleave 128-bit lanes; the permute puts the four dwords back in order.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        _mm256_storeu_si256(
            qc.as_mut_ptr() as *mut __m256i,
            _mm256_permutevar8x32_epi32(p, order),
        );
    }
}

/// Runs `job` for `n` (1..=4) tokens and `nrows` rows of `dtype` (one [`supported`]) with the
/// sums of `isa`.
///
/// # Safety
/// See the module docs; `isa` is [`Isa::available`]; where [`Isa::own_sums`], the activations
/// are in that kernel's order and `aux` holds its extras ([`mxfp4_zmm::extras`],
/// [`q8_0u_extras`]).
pub(crate) unsafe fn run(isa: Isa, dtype: DType, job: &Job, n: usize, nrows: usize) {
    debug_assert!((1..=4).contains(&n) && isa.available());
    match isa {
        Isa::Madd => madd::run(dtype, job, n, nrows),
        Isa::AvxVnni if dtype == DType::Q8_0 => q8_0u::run_vex(job, n, nrows),
        Isa::AvxVnni => avxvnni::run(dtype, job, n, nrows),
        Isa::Avx512Vnni | Isa::Avx512Vbmi | Isa::Avx512Gfni if dtype == DType::Q8_0 => q8_0u::run(job, n, nrows),
        Isa::Avx512Vnni => avx512vnni::run(dtype, job, n, nrows),
        Isa::Avx512Vbmi | Isa::Avx512Gfni if dtype == DType::Mxfp4 => mxfp4_zmm::run(job, n, nrows),
        Isa::Avx512Vbmi if dtype == DType::Q6K => q6_k_zmm::run(job, n, nrows),
        Isa::Avx512Gfni if dtype == DType::Q6K => q6_k_zmm::run_gfni(job, n, nrows),
        Isa::Avx512Vbmi => avx512vnni::run(dtype, job, n, nrows),
        Isa::Avx512Gfni => avx512gfni::run(dtype, job, n, nrows),
    }
}

/// Two accumulators per (row, token), so a block's scaled partial sums form two dependency
/// chains instead of one.
type Acc<const R: usize, const N: usize> = [[[__m256; 2]; N]; R];

/// `Σ w·a` of 32 signed weight bytes and 32 signed activations: the sign of `w` moves onto
/// `a`, so the unsigned operand is `|w|` (128 for −128, still exact).
///
/// This and every function between a row driver and [`Dot::dot_u`] is `inline(always)`
/// without target features of its own, so it is compiled inside the driver with that
/// driver's instruction set.
#[inline(always)]
unsafe fn dot_s<D: Dot>(w: __m256i, a: __m256i) -> __m256i {
    D::dot_u(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lda(q: *const i8, i: usize) -> __m256i {
    _mm256_loadu_si256(q.add(i) as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cvt(v: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(v)
}

/// `v`, through an empty instruction LLVM cannot see into. Scales read one by one and
/// gathered into a word in general registers stay there: on seeing the loads, LLVM builds the
/// word by inserting them into a vector one at a time, a load and a shuffle each, on the
/// shuffle ports the one-token kernels are bound by.
#[inline(always)]
fn opaque(mut v: u64) -> u64 {
    // SAFETY: an empty asm block on one register: it reads and writes nothing else.
    unsafe { std::arch::asm!("/* {0} */", inout(reg) v, options(pure, nomem, nostack, preserves_flags)) };
    v
}

/// `vpermps` as written. Given a constant index, LLVM rewrites the intrinsic as `vshufps` and
/// `vpermpd`, two instructions where one does; the index, a loop constant, stays in a register.
/// One warm thread at 1/2/4 tokens: Q4_K 25.3/16.5/9.5 → 26.5/17.8/10.2 GB/s of weights, Q5_K
/// 20.2/13.1/7.5 → 22.2/14.2/8.7. NVFP4 keeps the intrinsic: with its indices held in
/// registers, 4 tokens ran 6.9 → 5.3.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn permps(v: __m256, idx: __m256i) -> __m256 {
    let out: __m256;
    // SAFETY: one register-to-register AVX2 instruction, no memory or flags touched; every
    // caller runs with AVX2 enabled.
    std::arch::asm!("vpermps {o}, {i}, {v}", o = lateout(ymm_reg) out, i = in(ymm_reg) idx, v = in(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    out
}

/// Each 16-bit lane shifted left by `n` (right by `−n`); `n` is a constant once unrolled.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shl16(v: __m256i, n: i32) -> __m256i {
    if n >= 0 {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128(n))
    } else {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(-n))
    }
}

/// Defines the row body `$rows::<D, R, N>` for a block kernel `$blk` (blocks of `$be` values
/// in `$bb` bytes, `$apb` exact sums per block, `$fin` a final scale), as [`super::qdot`]
/// does for f32 activations; [`isa_kernels!`] compiles it once per [`Isa`].
///
/// The long form takes `$step` blocks a call of `$blk` and a last incomplete step one block at
/// a time through `$tail`.
macro_rules! kernel {
    ($rows:ident, $blk:ident, $be:expr, $bb:expr, $apb:expr, $fin:expr) => {
        kernel!($rows, $blk, $be, $bb, $apb, $fin, 1, $blk);
    };
    ($rows:ident, $blk:ident, $be:expr, $bb:expr, $apb:expr, $fin:expr, $step:expr, $tail:ident) => {
        #[inline(always)]
        unsafe fn $rows<D: Dot, const R: usize, const N: usize>(j: &Job, r0: usize) {
            let mut acc = [[[_mm256_setzero_ps(); 2]; N]; R];
            let mut w = [j.w; R];
            for (r, p) in w.iter_mut().enumerate() {
                *p = j.w.add((r0 + r) * j.rb);
            }
            let (mut q, mut d, mut a) = ([j.q; N], [j.d; N], [j.aux; N]);
            for t in 0..N {
                q[t] = j.q.add(t * j.qs);
                d[t] = j.d.add(t * j.ds);
                a[t] = j.aux.add(t * j.auxs);
            }
            // Pointers are recomputed from the block index, one induction variable: advancing
            // arrays of pointers kept them in memory and capped the 32-value types at ~10
            // values/ns.
            // One step of `$n` blocks from block `i` through `$f`.
            macro_rules! step {
                ($f:ident, $i:expr, $n:expr) => {{
                    let i = $i;
                    let wb = w.map(|p| p.add(i * $bb));
                    let ahead = prefetch_offset::<R>(j.rb, i * $bb);
                    for p in wb.iter() {
                        let mut off = 0;
                        while off < $n * $bb {
                            super::prefetch(p.wrapping_add(ahead + off) as *const u8);
                            off += 64;
                        }
                    }
                    let (qb, db, ab) = (
                        q.map(|p| p.add(i * $be)),
                        d.map(|p| p.add(i * ($be / QK))),
                        a.map(|p| p.add(i * $apb)),
                    );
                    $f::<D, R, N>(&wb, &qb, &db, &ab, &mut acc);
                }};
            }
            for s in 0..j.blocks / $step {
                step!($blk, s * $step, $step);
            }
            for i in j.blocks / $step * $step..j.blocks {
                step!($tail, i, 1);
            }
            for (r, row) in acc.iter().enumerate() {
                for (t, v) in row.iter().enumerate() {
                    *j.out.add(t * j.os + r0 + r) = hsum(_mm256_add_ps(v[0], v[1])) * $fin;
                }
            }
        }
    };
}

kernel!(q8_0_rows, q8_0_pair, 32, 34, 0, 1.0, 2, q8_0_blk);
kernel!(q8_0u_rows, q8_0u_oct, 32, 34, 1, 1.0, 8, q8_0u_blk);
kernel!(q4_0_rows, q4_0_oct, 32, 18, 1, 1.0, 8, q4_0_blk);
kernel!(q4_k_rows, q4_k_blk, 256, 144, 8, 1.0);
kernel!(q5_k_rows, q5_k_blk, 256, 176, 8, 1.0);
kernel!(q6_k_rows, q6_k_blk, 256, 210, 16, 1.0);
kernel!(mxfp4_rows, mxfp4_oct, 32, 17, 1, 0.5, 8, mxfp4_blk);
kernel!(nvfp4_rows, nvfp4_blk, 256, 148, 64, 0.5);

/// A module `$m` holding, for the sums `$d` and target features `$feat`, one compiled driver
/// and entry per type (`$r1` rows interleaved for one token: 1 for Q8_0, whose rows stream from
/// memory 1.7× faster one after another — one sequential stream per thread, 22–25 GB/s instead
/// of 13–15 on 2 threads here — and for the types read 256 values a step, whose eight code
/// registers a row leave no room for a second) and its `run`.
macro_rules! isa_kernels {
    ($m:ident, $d:ty, $feat:tt) => {
        mod $m {
            use super::*;

            macro_rules! driver {
                ($ty:ident, $rows:ident, $r1:expr) => {
                    mod $ty {
                        use super::super::*;

                        #[target_feature(enable = $feat)]
                        unsafe fn rows<const R: usize, const N: usize>(j: &Job, r0: usize) {
                            $rows::<$d, R, N>(j, r0)
                        }

                        entry!(pub(super) entry, rows, $r1);
                    }
                };
            }

            driver!(q8_0, q8_0_rows, 1);
            driver!(q4_0, q4_0_rows, 1);
            driver!(q4_k, q4_k_rows, 1);
            driver!(q5_k, q5_k_rows, 1);
            driver!(q6_k, q6_k_rows, 1);
            driver!(mxfp4, mxfp4_rows, 1);
            driver!(nvfp4, nvfp4_rows, 1);

            /// [`super::run`] for this module's sums.
            pub(super) unsafe fn run(dtype: DType, job: &Job, n: usize, nrows: usize) {
                match dtype {
                    DType::Q8_0 => q8_0::entry(job, n, nrows),
                    DType::Q4_0 => q4_0::entry(job, n, nrows),
                    DType::Q4K => q4_k::entry(job, n, nrows),
                    DType::Q5K => q5_k::entry(job, n, nrows),
                    DType::Q6K => q6_k::entry(job, n, nrows),
                    DType::Mxfp4 => mxfp4::entry(job, n, nrows),
                    DType::Nvfp4 => nvfp4::entry(job, n, nrows),
                    other => unreachable!("{other} has no int8 kernel"),
                }
            }
        }
    };
}

/// The drivers of [`q8_0u_oct`], on `vpdpbusd` only (every variant but [`Isa::Madd`]):
/// `vpmaddubsw` would saturate on its unsigned codes.
mod q8_0u {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    unsafe fn rows<const R: usize, const N: usize>(j: &Job, r0: usize) {
        q8_0u_rows::<Avx512Vnni, R, N>(j, r0)
    }

    /// [`rows`] in the VEX form of AVX-VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn rows_vex<const R: usize, const N: usize>(j: &Job, r0: usize) {
        q8_0u_rows::<AvxVnni, R, N>(j, r0)
    }

    entry!(pub(super) run, rows, 1);
    entry!(pub(super) run_vex, rows_vex, 1);
}

isa_kernels!(madd, Madd, "avx2,fma,f16c");
isa_kernels!(avxvnni, AvxVnni, "avx2,fma,f16c,avxvnni");
isa_kernels!(avx512vnni, Avx512Vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni");
isa_kernels!(avx512gfni, Avx512Gfni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni");

/// Q8_0: `d_w · d_g · Σ q·a`.
#[inline(always)]
unsafe fn q8_0_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    _a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    for r in 0..R {
        let p = w[r];
        let wv = _mm256_loadu_si256(p.add(2) as *const __m256i);
        let dw = f16_splat(p);
        for t in 0..N {
            let s = cvt(dot_s::<D>(wv, lda(q[t], 0)));
            let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*d[t]));
            acc[r][t][0] = _mm256_fmadd_ps(s, sc, acc[r][t][0]);
        }
    }
}

/// Q8_0, two blocks a step, each into its own accumulator: one row's blocks all added into
/// one register made a chain of multiply-adds, four cycles a block, that capped a core at
/// about 25 GB/s with the data in cache.
#[inline(always)]
unsafe fn q8_0_pair<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    _a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    for r in 0..R {
        let p = w[r];
        let (w0, w1) = (_mm256_loadu_si256(p.add(2) as *const __m256i), _mm256_loadu_si256(p.add(36) as *const __m256i));
        let (d0, d1) = (f16_splat(p), f16_splat(p.add(34)));
        for t in 0..N {
            let s0 = cvt(dot_s::<D>(w0, lda(q[t], 0)));
            let s1 = cvt(dot_s::<D>(w1, lda(q[t], QK)));
            acc[r][t][0] = _mm256_fmadd_ps(s0, _mm256_mul_ps(d0, _mm256_broadcast_ss(&*d[t])), acc[r][t][0]);
            acc[r][t][1] = _mm256_fmadd_ps(s1, _mm256_mul_ps(d1, _mm256_broadcast_ss(&*d[t].add(1))), acc[r][t][1]);
        }
    }
}

/// One token's extras for [`q8_0u_oct`] and [`q8_0u_blk`]: per block of its int8 activations
/// `q`, what the block's lanes start from (an i32 stored as its bits), so that they take off
/// `128·Σq` in all: `−128·Σq` in the one lane of a block in a whole run of eight
/// ([`q8_0u_oct`]), `−16·Σq` in each of the eight lanes of a block after the last run
/// ([`q8_0u_blk`]).
fn q8_0u_extras(q: &[i8], out: &mut [f32]) {
    let whole = q.len() / 256 * 8;
    for (i, (o, b)) in out.iter_mut().zip(q.chunks_exact(QK)).enumerate() {
        let per_lane = if i < whole { -128 } else { -16 };
        *o = f32::from_bits((per_lane * b.iter().map(|&v| v as i32).sum::<i32>()) as u32);
    }
}

/// Q8_0 with its codes made unsigned (`q + 128`, one `vpxor` a block for every token) so that
/// `vpdpbusd` takes the activations as they are, each lane starting from `−16·Σa` of the block
/// ([`q8_0u_extras`]; eight lanes take off `128·Σa`): no sign moves per token, which were a
/// fifth of [`q8_0_pair`]'s instructions for one token.
#[inline(always)]
unsafe fn q8_0u_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let flip = _mm256_set1_epi8(-128);
    for r in 0..R {
        let p = w[r];
        let u = _mm256_xor_si256(_mm256_loadu_si256(p.add(2) as *const __m256i), flip);
        let dw = f16_splat(p);
        for t in 0..N {
            let start = _mm256_set1_epi32(*(a[t] as *const i32));
            let s = cvt(D::dot_u_acc(start, u, lda(q[t], 0)));
            acc[r][t][0] = _mm256_fmadd_ps(s, _mm256_mul_ps(dw, _mm256_broadcast_ss(&*d[t])), acc[r][t][0]);
        }
    }
}

/// [`q8_0u_blk`] eight blocks a step, their codes transposed by 32-bit words (an 8 × 8
/// transpose: 24 in-lane and lane-crossing shuffles shared by every token) so that lane `l` of
/// every code register holds block `l`: a token's 256 products add up in eight lanes, one a
/// block, against its codes in [`order::q8_0_oct_order`], and meet the eight blocks' scales in
/// one conversion and one multiply-add, where four blocks took a token four conversions, four
/// scale permutes and four multiply-adds. One warm Xeon thread, GFLOP/s at 1/2/4/8 tokens:
/// 53–55/77–83/91–95/92–94 → 60–61/99–102/145–146/146–148 (AVX-512); on AVX-VNNI
/// 47–48/62–64/76/77–79 → 60/101/135–136/136–137.
#[inline(always)]
unsafe fn q8_0u_oct<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let flip = _mm256_set1_epi8(-128);
    for r in 0..R {
        let p = w[r];
        // A macro: a closure would not inherit the driver's target features.
        macro_rules! c {
            ($b:expr) => {
                _mm256_xor_si256(_mm256_loadu_si256(p.add(34 * $b + 2) as *const __m256i), flip)
            };
        }
        let v = dwords_8x8([c!(0), c!(1), c!(2), c!(3), c!(4), c!(5), c!(6), c!(7)]);
        // The eight f16 scales gathered in general registers, as `q4_0_oct` gathers its (see
        // `opaque`).
        let f16 = |o: usize| opaque((p.add(o) as *const u16).read_unaligned() as u64) as i32;
        let ws = _mm256_cvtph_ps(_mm_setr_epi32(f16(0) | f16(34) << 16, f16(68) | f16(102) << 16, f16(136) | f16(170) << 16, f16(204) | f16(238) << 16));
        for t in 0..N {
            let start = _mm256_loadu_si256(a[t] as *const __m256i);
            // Two chains of four (exact i32 sums in any order).
            let s0 = D::dot_u_acc(D::dot_u_acc(D::dot_u_acc(D::dot_u_acc(start, v[0], lda(q[t], 0)), v[1], lda(q[t], 32)), v[2], lda(q[t], 64)), v[3], lda(q[t], 96));
            let s1 = D::dot_u_acc(D::dot_u_acc(D::dot_u_acc(D::dot_u(v[4], lda(q[t], 128)), v[5], lda(q[t], 160)), v[6], lda(q[t], 192)), v[7], lda(q[t], 224));
            let sc = _mm256_mul_ps(ws, _mm256_loadu_ps(d[t]));
            acc[r][t][0] = _mm256_fmadd_ps(cvt(_mm256_add_epi32(s0, s1)), sc, acc[r][t][0]);
        }
    }
}

/// Register `i` of the result: dword `i` of each of `c[0..8]`, in that order (an 8 × 8
/// transpose of 32-bit words): [`dwords_4x4`] of each four, then their 128-bit halves paired.
#[inline(always)]
unsafe fn dwords_8x8(c: [__m256i; 8]) -> [__m256i; 8] {
    let a = dwords_4x4([c[0], c[1], c[2], c[3]]);
    let b = dwords_4x4([c[4], c[5], c[6], c[7]]);
    [
        _mm256_permute2x128_si256::<0x20>(a[0], b[0]),
        _mm256_permute2x128_si256::<0x20>(a[1], b[1]),
        _mm256_permute2x128_si256::<0x20>(a[2], b[2]),
        _mm256_permute2x128_si256::<0x20>(a[3], b[3]),
        _mm256_permute2x128_si256::<0x31>(a[0], b[0]),
        _mm256_permute2x128_si256::<0x31>(a[1], b[1]),
        _mm256_permute2x128_si256::<0x31>(a[2], b[2]),
        _mm256_permute2x128_si256::<0x31>(a[3], b[3]),
    ]
}

/// Q4_0, eight blocks a step in [`blocks8_order`], as [`fp4::mxfp4_oct`] takes MXFP4's: lane
/// `l` of every code register is block `l`, the codes unsigned nibbles, so one token's eight
/// products add into one i32 vector ([`Dot::blocks8_sums`]) and meet the blocks' scales in one
/// conversion and one multiply-add; the offset's `8·d_w·S` of each block comes off its lane.
#[inline(always)]
unsafe fn q4_0_oct<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    for r in 0..R {
        let p = w[r];
        // Blocks b and b + 4 side by side (codes after each block's f16 scale). Written out:
        // array maps can cost a call each.
        let (mut y, mut lo, mut hi, mut h) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4], [0u64; 2]);
        for b in 0..4 {
            // Two whole-register loads and a blend, as for MXFP4 ([`fp4::mxfp4_oct`]).
            let (l, u) = (_mm256_loadu_si256(p.add(18 * b + 2) as *const __m256i), _mm256_loadu_si256(p.add(18 * b + 58) as *const __m256i));
            y[b] = _mm256_blend_epi32::<0xF0>(l, u);
        }
        let z = dwords_4x4(y);
        for i in 0..4 {
            lo[i] = _mm256_and_si256(z[i], m4);
            hi[i] = _mm256_and_si256(_mm256_srli_epi16::<4>(z[i]), m4);
        }
        // The eight f16 scales, four to a word in general registers.
        for b in 0..8 {
            h[b / 4] |= opaque((p.add(18 * b) as *const u16).read_unaligned() as u64) << (16 * (b % 4));
        }
        let dw = _mm256_cvtph_ps(_mm_set_epi64x(h[1] as i64, h[0] as i64));
        let dw8 = _mm256_mul_ps(dw, _mm256_set1_ps(8.0));
        for t in 0..N {
            let v = _mm256_fmadd_ps(cvt(D::blocks8_sums(&lo, &hi, q[t])), _mm256_mul_ps(dw, _mm256_loadu_ps(d[t])), acc[r][t][0]);
            acc[r][t][0] = _mm256_fnmadd_ps(dw8, _mm256_loadu_ps(a[t]), v);
        }
    }
}

/// Q4_0: `d_w · (d_g · Σ q·a − 8·S)` with `q` the unsigned nibble.
#[inline(always)]
unsafe fn q4_0_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    for r in 0..R {
        let p = w[r];
        let dw = f16_splat(p);
        // Byte j holds value j (low nibble) and value j + 16 (high nibble).
        let qv = D::nibbles(p.add(2));
        for t in 0..N {
            let s = cvt(D::dot_u(qv, lda(q[t], 0)));
            let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*d[t]));
            acc[r][t][0] = _mm256_fmadd_ps(s, sc, acc[r][t][0]);
            // Taking d_w·S off all 8 lanes takes 8·d_w·S off their sum.
            acc[r][t][1] = _mm256_fnmadd_ps(dw, _mm256_broadcast_ss(&*a[t]), acc[r][t][1]);
        }
    }
}
