//! MXFP4 on 512-bit registers ([`Isa::Avx512Vbmi`]): four blocks (68 bytes) a step.
//!
//! The 256-bit kernel of its day (two blocks a step, since replaced by
//! [`super::fp4::mxfp4_oct`]) spent most of its instructions on work per block: two scalar E8M0
//! decodes, lane inserts, and sign moves for `vpmaddubsw`'s unsigned operand; it streamed ~14 GB/s of weights per core, about a core's memory bandwidth, so decode
//! was compute-bound. Here one `vpermi2b` gathers the 64 code bytes of four blocks out of their
//! 68, one masked `vpermb` places the four exponents one per 32-bit lane, the codes widen through
//! a table to the unsigned `2·e2m1 + 12` (0..24), and `vpdpbusd` meets the activations as they
//! are: the offset's `12·Σa` per block is taken off by starting each sum from `−12·Σa`, prepared
//! once per token ([`extras`]). The integer sums are exact, as in the 256-bit kernel; only the
//! order of the f32 additions differs.
//!
//! Activations are in [`order()`] (per four blocks: values 0..16 of each block, then 16..32); a
//! row's last `blocks % 4` blocks keep the natural order and the one-block kernel.

use super::*;

/// Values of one step (four blocks).
pub(crate) const GROUP: usize = 128;
/// Bytes of one step.
const GB: usize = 4 * 17;
/// Prepared values per token and step in [`extras`]: 16 i32 starting sums, 16 f32 scales.
pub(crate) const EXTRAS: usize = 32;

/// Twice the E2M1 values plus 12, by code: unsigned bytes for `vpdpbusd`.
const E2M1_X2_U: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (E2M1_X2[i] + 12) as u8;
        i += 1;
    }
    t
};

/// `vpermi2b` indices of the 64 code bytes of four blocks in their 68 bytes.
static GATHER: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = (1 + 17 * (i / 16) + i % 16) as u8;
        i += 1;
    }
    t
};

/// `vpermb` indices putting block `b`'s exponent byte in the bytes of lanes `4b..4b+4` (all
/// but byte 0 of each lane are masked off).
static EXPS: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = (17 * (i / 16)) as u8;
        i += 1;
    }
    t
};

/// Whether this CPU runs the kernel.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi")
}

/// Puts one token's int8 activations (natural order, `kp` of them) in the kernel's order:
/// in each whole group of four blocks, values 0..16 of every block, then values 16..32.
pub(crate) fn order(q: &mut [i8]) {
    let mut tmp = [0i8; GROUP];
    for c in q.chunks_exact_mut(GROUP) {
        for b in 0..4 {
            tmp[16 * b..][..16].copy_from_slice(&c[32 * b..][..16]);
            tmp[64 + 16 * b..][..16].copy_from_slice(&c[32 * b + 16..][..16]);
        }
        c.copy_from_slice(&tmp);
    }
}

/// One token's per-step values (`blocks / 4` steps of [`EXTRAS`]): lanes `4b` of the first 16
/// hold `−12·Σ q` over block `b` (an i32, stored as its bits), the others 0; lanes `4b..4b+4`
/// of the second 16 hold the block's activation scale `d`. `q` and `d` are the token's codes
/// (any order within a block) and scales, one per block.
pub(crate) fn extras(q: &[i8], d: &[f32], out: &mut [f32]) {
    for ((o, qg), dg) in out.chunks_exact_mut(EXTRAS).zip(q.chunks_exact(GROUP)).zip(d.chunks_exact(4)) {
        o.fill(0.0);
        for b in 0..4 {
            let s: i32 = qg[32 * b..][..32].iter().map(|&v| v as i32).sum();
            o[4 * b] = f32::from_bits((-12 * s) as u32);
            o[16 + 4 * b..][..4].fill(dg[b]);
        }
    }
}

/// What every step of a row uses: the byte indices, the code table (four times over) and the
/// special exponents' bit.
#[derive(Clone, Copy)]
struct Consts {
    gather: __m512i,
    exps: __m512i,
    table: __m512i,
    special: __m512i,
}

/// `vpermb` of `z` by `idx` keeping byte 0 of every 32-bit lane and zeroing the rest, in one
/// instruction: LLVM writes the zero-masked intrinsic as a `vpermb` and a `vpand`, and at one
/// token a step is ~15 instructions (one warm thread at 1/2/4 tokens: 17.4/13.7/9.0 →
/// 18.3/14.1/9.2 GB/s of weights).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn exponents(idx: __m512i, z: __m512i) -> __m512i {
    let out: __m512i;
    let keep: __mmask64 = 0x1111_1111_1111_1111;
    // SAFETY: one register-only AVX-512 VBMI instruction.
    std::arch::asm!(
        "vpermb {o} {{{k}}}{{z}}, {i}, {z}",
        k = in(kreg) keep,
        o = lateout(zmm_reg) out,
        i = in(zmm_reg) idx,
        z = in(zmm_reg) z,
        options(pure, nomem, nostack, preserves_flags),
    );
    out
}

/// Step `g` of the row at `p0` against `N` tokens, into `acc`.
#[inline(always)]
unsafe fn step<const N: usize>(j: &Job, p0: *const u8, g: usize, c: Consts, acc: &mut [__m512; N]) {
    let p = p0.add(g * GB);
    let ahead = prefetch_offset::<1>(j.rb, g * GB);
    super::super::prefetch(p.wrapping_add(ahead));
    super::super::prefetch(p.wrapping_add(ahead + 64));
    let z0 = _mm512_loadu_si512(p as *const _);
    // Bytes 64..68 only: a full load could read past the last row.
    let z1 = _mm512_maskz_loadu_epi8(0xf, p.add(64) as *const i8);
    let codes = _mm512_permutex2var_epi8(z0, c.gather, z1);
    // Each block's exponent in byte 0 of its four lanes, then as f32 bits (as `fp4::e8m0_x8`).
    let e = exponents(c.exps, z0);
    // Codes 0 and 255 are the two with `e − 1 ≥ 254` (unsigned): one compare, not two.
    let odd = _mm512_cmpge_epu32_mask(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), _mm512_set1_epi32(254));
    let e = _mm512_slli_epi32::<23>(e);
    let ev = _mm512_castsi512_ps(_mm512_mask_or_epi32(e, odd, e, c.special));
    // `vpermb` reads six index bits and the table repeats every 16 entries, so the bits above
    // a nibble need no mask: two instructions fewer a step than `vpshufb`, which reads bit 7
    // (one warm thread at 1/2/4 tokens: 17.0/13.5/8.75 → 18.2/14.0/9.1 GB/s of weights).
    let lo = _mm512_permutexvar_epi8(codes, c.table);
    let hi = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(codes), c.table);
    for (t, a) in acc.iter_mut().enumerate() {
        let q = j.q.add(t * j.qs + g * GROUP);
        let x = j.aux.add(t * j.auxs + g * EXTRAS);
        let dot = _mm512_dpbusd_epi32(_mm512_loadu_si512(x as *const _), lo, _mm512_loadu_si512(q as *const _));
        let dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(q.add(64) as *const _));
        let scale = _mm512_mul_ps(ev, _mm512_loadu_ps(x.add(16)));
        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *a);
    }
}

/// Row `r0` (`R` = 1) against `N` tokens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn rows<const R: usize, const N: usize>(j: &Job, r0: usize) {
    const { assert!(R == 1) };
    let p0 = j.w.add(r0 * j.rb);
    let groups = j.blocks / 4;
    let c = Consts {
        gather: _mm512_loadu_si512(GATHER.as_ptr() as *const _),
        exps: _mm512_loadu_si512(EXPS.as_ptr() as *const _),
        table: _mm512_broadcast_i32x4(_mm_loadu_si128(E2M1_X2_U.as_ptr() as *const __m128i)),
        special: _mm512_set1_epi32(1 << 22),
    };
    // Two accumulators a token, steps alternating between them (named, so they stay in
    // registers).
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
    let mut g = 0;
    while g + 2 <= groups {
        step::<N>(j, p0, g, c, &mut acc0);
        step::<N>(j, p0, g + 1, c, &mut acc1);
        g += 2;
    }
    if g < groups {
        step::<N>(j, p0, g, c, &mut acc0);
    }
    // The last blocks of the row, one at a time, in the natural activation order.
    let mut tail: Acc<1, N> = [[[_mm256_setzero_ps(); 2]; N]; 1];
    for i in groups * 4..j.blocks {
        let (mut q, mut d) = ([j.q; N], [j.d; N]);
        for t in 0..N {
            q[t] = j.q.add(t * j.qs + i * QK);
            d[t] = j.d.add(t * j.ds + i);
        }
        mxfp4_blk::<Avx512Vnni, 1, N>(&[p0.add(i * 17)], &q, &d, &[j.aux; N], &mut tail);
    }
    for t in 0..N {
        let wide = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
        *j.out.add(t * j.os + r0) = (wide + hsum(_mm256_add_ps(tail[0][t][0], tail[0][t][1]))) * 0.5;
    }
}

entry!(pub(crate) run, rows, 1);
