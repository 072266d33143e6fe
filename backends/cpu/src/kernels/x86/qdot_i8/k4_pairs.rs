//! Q4_K and Q5_K products of several tokens on 512-bit registers, two tokens a register: the
//! lower 256 bits of each register hold one token's lanes of [`super::kquants::q4_k_blk`]
//! ([`super::kquants::q5_k_blk`]), the upper bits the next token's, against the block's codes
//! loaded into both halves.
//!
//! Every lane takes the operations of the 256-bit kernel in the same order (integer sums,
//! which are exact in any order; then one conversion, the scale multiply, the multiply-add
//! and the min term, then the same horizontal sum), so a token's products are the bits it
//! gets alone or in groups of four: prefills stay batch-invariant and a prompt restored from
//! the prefix store continues as one prefilled whole.
//!
//! The 256-bit kernel spends ~25 vector operations a token and block on its sums and their
//! scaling, and with its codes' unpacking shared by four tokens ~34 in all (one warm Xeon
//! thread: 140 GFLOP/s from 4 tokens on). Here those per-token operations serve two tokens,
//! and the unpacking eight pairs. `vpdpbusd` on 512 bits issues twice a cycle on the Xeon
//! here, as often as on 256 (a register-only loop: 1.7 against 1.8 a cycle).

use super::super::qdot::{hsum, prefetch_offset};
use super::{permps, Dot};
use std::arch::x86_64::*;

/// Most token pairs one pass over a row serves: eight accumulators and eight code registers
/// leave room for the sums in the 32 vector registers.
pub(crate) const MAX_PAIRS: usize = 8;

/// Fewest tokens a product hands the pair kernel. With one or two pairs the unpacking on
/// 512-bit registers, where port 1 takes no vector work, costs more than it saves; one warm
/// thread, `2048 × 768`, GFLOP/s of the 256-bit kernel → this one: 2 tokens 115 → 92, 4 tokens
/// 142 → 135, 8 tokens 140 → 190, 16 140 → 205, 512 132 → 170–178.
pub(crate) const MIN_TOKENS: usize = 8;

/// Whether this CPU runs the pair kernel (AVX-512 F/BW/VL with VNNI).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Token pairs' activations, interleaved per 32 bytes (codes) and per 8 values (scales,
/// sub-block sums) so that one 512-bit load takes both tokens' part.
pub(crate) struct Pairs {
    /// Per pair, per 256-value block: eight 64-byte chunks, the first token's 32 codes then the
    /// second's, chunk `2i` meeting [`row`]'s `A_i`, chunk `2i + 1` its `B_i`.
    q: crate::kernels::quant::Aligned<i8>,
    /// Per pair, per block: the first token's eight scales (in the order of the sums), then
    /// the second's.
    d: crate::kernels::quant::Aligned<f32>,
    /// Per pair, per block: the two tokens' eight exact sub-block sums, likewise.
    a: crate::kernels::quant::Aligned<f32>,
    /// Pairs held.
    pairs: usize,
    /// Blocks per token.
    blocks: usize,
}

impl Pairs {
    /// The first `2·(n / 2)` of `n` tokens' Q4_K or Q5_K activations: codes `q` (in
    /// [`super::q4_k_order`], crossed where `crossed`, `kp` a token), scales `d` (`kp / 32` a
    /// token, in the order of the sums) and sub-block sums `aux` (`kp / 32` a token).
    pub(crate) fn new(q: &[i8], d: &[f32], aux: &[f32], n: usize, kp: usize, crossed: bool) -> Pairs {
        let (pairs, blocks) = (n / 2, kp / 256);
        let mut pq = crate::kernels::quant::Aligned::zeroed(pairs * 2 * kp);
        let mut pd = crate::kernels::quant::Aligned::zeroed(pairs * blocks * 16);
        let mut pa = crate::kernels::quant::Aligned::zeroed(pairs * blocks * 16);
        for p in 0..pairs {
            for h in 0..2 {
                let t = 2 * p + h;
                for b in 0..blocks {
                    let src = &q[t * kp + b * 256..][..256];
                    let dst = (p * blocks + b) * 512 + 32 * h;
                    if crossed {
                        for c in 0..8 {
                            pq[dst + 64 * c..][..32].copy_from_slice(&src[32 * c..][..32]);
                        }
                    } else {
                        for i in 0..4 {
                            // `L_i` and `H_i` at `64i` and `64i + 32`: `A_i` and `B_i` of [`row`]
                            // take their 16-byte halves crossed.
                            let (l, hh) = (&src[64 * i..][..32], &src[64 * i + 32..][..32]);
                            for (c, (lo, hi)) in [(&l[..16], &hh[16..]), (&l[16..], &hh[..16])].into_iter().enumerate() {
                                let at = dst + 64 * (2 * i + c);
                                pq[at..at + 16].copy_from_slice(lo);
                                pq[at + 16..at + 32].copy_from_slice(hi);
                            }
                        }
                    }
                    let dst = (p * blocks + b) * 16 + 8 * h;
                    pd[dst..dst + 8].copy_from_slice(&d[t * blocks * 8 + b * 8..][..8]);
                    pa[dst..dst + 8].copy_from_slice(&aux[t * blocks * 8 + b * 8..][..8]);
                }
            }
        }
        Pairs { q: pq, d: pd, a: pa, pairs, blocks }
    }

    /// Pairs held (tokens `0..2·pairs`).
    pub(crate) fn pairs(&self) -> usize {
        self.pairs
    }

    /// `out[t·os + r] = x_t · row(r)` for tokens `0..2·pairs` and rows `0..nrows` of `w`
    /// (`rb` bytes a row) of Q5_K where `five`, else Q4_K, `MAX_PAIRS` pairs a pass over the
    /// rows, on the sums of `gfni`'s scale unpacking ([`super::Isa::Avx512Gfni`]) or the
    /// plain one.
    ///
    /// # Safety
    /// [`available`] (and AVX-512 VBMI where `gfni`); `w` holds `nrows` rows of `blocks`
    /// whole blocks; `out` holds `(2·pairs − 1)·os + nrows` values nothing else touches.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn run(&self, five: bool, gfni: bool, w: *const u8, rb: usize, nrows: usize, out: *mut f32, os: usize) {
        for p0 in (0..self.pairs).step_by(MAX_PAIRS) {
            let job = Job {
                q: self.q.as_ptr().add(p0 * self.blocks * 512),
                d: self.d.as_ptr().add(p0 * self.blocks * 16),
                a: self.a.as_ptr().add(p0 * self.blocks * 16),
                w,
                rb,
                blocks: self.blocks,
                out: out.add(2 * p0 * os),
                os,
            };
            let cnt = MAX_PAIRS.min(self.pairs - p0);
            match (five, gfni) {
                (false, false) => plain_rows::<false>(&job, cnt, nrows),
                (false, true) => gfni_rows::<false>(&job, cnt, nrows),
                (true, false) => plain_rows::<true>(&job, cnt, nrows),
                (true, true) => gfni_rows::<true>(&job, cnt, nrows),
            }
        }
    }
}

/// One pass: up to [`MAX_PAIRS`] pairs over rows of `w`.
struct Job {
    q: *const i8,
    d: *const f32,
    a: *const f32,
    w: *const u8,
    rb: usize,
    blocks: usize,
    out: *mut f32,
    os: usize,
}

macro_rules! driver {
    ($name:ident, $d:ty, $gfni:expr, $feat:tt) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name<const FIVE: bool>(j: &Job, pairs: usize, nrows: usize) {
            for r in 0..nrows {
                match pairs {
                    1 => row::<$d, 1, FIVE, $gfni>(j, r),
                    2 => row::<$d, 2, FIVE, $gfni>(j, r),
                    3 => row::<$d, 3, FIVE, $gfni>(j, r),
                    4 => row::<$d, 4, FIVE, $gfni>(j, r),
                    5 => row::<$d, 5, FIVE, $gfni>(j, r),
                    6 => row::<$d, 6, FIVE, $gfni>(j, r),
                    7 => row::<$d, 7, FIVE, $gfni>(j, r),
                    _ => row::<$d, 8, FIVE, $gfni>(j, r),
                }
            }
        }
    };
}

driver!(plain_rows, super::Avx512Vnni, false, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
driver!(gfni_rows, super::Avx512Gfni, true, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,gfni");

/// [`super::kquants::dwords_4x4`] in each 256-bit half (each 128-bit piece: also
/// [`super::q6_k_zmm`]'s transpose).
#[inline(always)]
pub(super) unsafe fn dwords_4x4(c: [__m512i; 4]) -> [__m512i; 4] {
    let (lo01, lo23) = (_mm512_unpacklo_epi32(c[0], c[1]), _mm512_unpacklo_epi32(c[2], c[3]));
    let (hi01, hi23) = (_mm512_unpackhi_epi32(c[0], c[1]), _mm512_unpackhi_epi32(c[2], c[3]));
    [
        _mm512_unpacklo_epi64(lo01, lo23),
        _mm512_unpackhi_epi64(lo01, lo23),
        _mm512_unpacklo_epi64(hi01, hi23),
        _mm512_unpackhi_epi64(hi01, hi23),
    ]
}

/// Both halves of a 512-bit register set to `v`.
#[inline(always)]
unsafe fn twice(v: __m256) -> __m512 {
    // The 64-bit-lane forms: the 32-bit ones need AVX-512 DQ.
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(v)), _mm256_castps_pd(v)))
}

/// Per 256-bit half, the low nibbles of the lower 128 bits' bytes and the high nibbles of the
/// upper 128 bits' bytes, each in the low four bits of its byte: one affine byte transform
/// with a matrix per 64-bit lane where `GFNI` ([`super::isa`]'s `nibbles_gfni`), else a shift
/// per 16-bit lane and a mask.
#[inline(always)]
unsafe fn crossed_nibbles<const GFNI: bool>(v: __m512i) -> __m512i {
    if GFNI {
        const LOW: i64 = 0x0102_0408_0000_0000;
        const HIGH: i64 = 0x1020_4080_0000_0000;
        _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_setr_epi64(LOW, LOW, HIGH, HIGH, LOW, LOW, HIGH, HIGH))
    } else {
        let by = _mm512_setr_epi64(0, 0, 0x0004_0004_0004_0004, 0x0004_0004_0004_0004, 0, 0, 0x0004_0004_0004_0004, 0x0004_0004_0004_0004);
        _mm512_and_si512(_mm512_srlv_epi16(v, by), _mm512_set1_epi8(0x0f))
    }
}

/// Row `r` against `P` pairs ([`super::kquants::q4_k_blk`], or `q5_k_blk` where `FIVE`, lane
/// for lane).
///
/// The 256-bit kernel's code registers `L_i` (low nibbles) and `H_i` (high) hold, in lanes
/// 0..4 and 4..8 alike, four values of the even (odd) sub-blocks, so each token's products
/// took two sums and a blend, a permute and an add to meet in the lanes of
/// [`super::Q4K_LANES`]. Here `A_i` takes `L_i`'s lower 128 bits and `H_i`'s upper ones and
/// `B_i` the other two, halves swapped: both already hold sub-block [`super::Q4K_LANES`]`[l]`
/// in lane `l`, so a token's eight products run as one sum, and the crossing is paid once a
/// block for all the pairs ([`Pairs::new`] lays the activations out to meet them). The
/// integer sums are exact in any order, so the lanes keep their bits. One warm thread,
/// `2048 × 768`, GFLOP/s at 8/16/32/64/512 tokens, Q4_K: 178/189/190/171/162 →
/// 195/225/226/207/180; Q5_K: 157/184/184/181/158 → 162/203/204/200/165 (one sum per token,
/// where two sums of four and an add lost 4 %).
#[inline(always)]
unsafe fn row<D: Dot, const P: usize, const FIVE: bool, const GFNI: bool>(j: &Job, r: usize) {
    let bb = if FIVE { 176 } else { 144 };
    let mut acc = [_mm512_setzero_ps(); P];
    let w = j.w.add(r * j.rb);
    let b4 = _mm512_set1_epi8(0x10);
    let lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for b in 0..j.blocks {
        let p = w.add(b * bb);
        let ahead = prefetch_offset::<1>(j.rb, b * bb);
        for off in [0, 64, 128] {
            super::super::prefetch(p.wrapping_add(ahead + off));
        }
        let (scd, mv) = D::k4_scaled(p);
        let (scd, mv) = (twice(permps(scd, lanes)), twice(mv));
        let ld = |o: usize| _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(o) as *const __m256i));
        let z = dwords_4x4([ld(16 + 32 * FIVE as usize), ld(48 + 32 * FIVE as usize), ld(80 + 32 * FIVE as usize), ld(112 + 32 * FIVE as usize)]);
        let mut ab = [_mm512_setzero_si512(); 8];
        for i in 0..4 {
            ab[2 * i] = crossed_nibbles::<GFNI>(z[i]);
            // 128-bit halves swapped in each 256-bit half.
            ab[2 * i + 1] = crossed_nibbles::<GFNI>(_mm512_shuffle_i64x2::<0xB1>(z[i], z[i]));
        }
        if FIVE {
            // Q5_K's fifth bits: the `qh` byte of each code's byte position, transposed as the
            // codes were (dword `i` of `qh` in each lower 128 bits of `A_i`, dword `i + 4` in
            // the upper; the other way round for `B_i`), then each lane's bit, the
            // sub-block's, rotated to bit 4 of every byte: lanes 0..4 hold the even
            // sub-blocks (bits 0, 2, 4, 6), lanes 4..8 the odd ones.
            let qh = ld(16);
            let qs = _mm512_shuffle_i64x2::<0xB1>(qh, qh);
            let rot = _mm512_setr_epi32(4, 2, 0, 30, 3, 1, 31, 29, 4, 2, 0, 30, 3, 1, 31, 29);
            // A macro, not a closure: closures do not inherit the driver's target features
            // (as in `kquants::k4_crossed`).
            macro_rules! each {
                ($($i:literal),*) => {$(
                    // 0xF8: a | (b & c).
                    ab[2 * $i] = _mm512_ternarylogic_epi32::<0xF8>(ab[2 * $i], _mm512_rolv_epi32(_mm512_shuffle_epi32::<{ 0x55 * $i }>(qh), rot), b4);
                    ab[2 * $i + 1] = _mm512_ternarylogic_epi32::<0xF8>(ab[2 * $i + 1], _mm512_rolv_epi32(_mm512_shuffle_epi32::<{ 0x55 * $i }>(qs), rot), b4);
                )*};
            }
            each!(0, 1, 2, 3);
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let pb = (t * j.blocks + b) * 512;
            let a = |i: usize| _mm512_loadu_si512(j.q.add(pb + 64 * i) as *const _);
            let mut sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ab[0], a(0));
            for (i, &u) in ab.iter().enumerate().skip(1) {
                sums = _mm512_dpbusd_epi32(sums, u, a(i));
            }
            let sb = (t * j.blocks + b) * 16;
            let s = _mm512_mul_ps(scd, _mm512_loadu_ps(j.d.add(sb)));
            let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), s, *acc);
            *acc = _mm512_fnmadd_ps(mv, _mm512_loadu_ps(j.a.add(sb)), v);
        }
    }
    for (t, v) in acc.iter().enumerate() {
        // As the 256-bit kernel ends: its unused second accumulator added, the sum scaled by 1.
        let zero = _mm256_setzero_ps();
        let (t0, t1) = (_mm512_castps512_ps256(*v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*v))));
        *j.out.add(2 * t * j.os + r) = hsum(_mm256_add_ps(t0, zero)) * 1.0;
        *j.out.add((2 * t + 1) * j.os + r) = hsum(_mm256_add_ps(t1, zero)) * 1.0;
    }
}
