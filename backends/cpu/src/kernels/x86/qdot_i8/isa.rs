//! The integer instruction variants of the int8 kernels ([`Isa`]) and the operations that differ
//! between them ([`Dot`]): the sums of byte products, the unpacking of packed nibbles and of
//! Q4_K/Q5_K block scales.

use super::super::qdot::k4_scales;
use super::{mxfp4_zmm, q6_k_zmm, q8_0u_extras, QK};
use ft_backend::DType;
use std::arch::x86_64::*;

/// The instruction that sums 32 byte products into eight i32 lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// `vpmaddubsw` then `vpmaddwd` by ones (AVX2).
    Madd,
    /// `vpdpbusd` in its VEX form (AVX-VNNI: Intel client cores from Alder Lake, Zen 5), and
    /// Q8_0's kernel of its own ([`Isa::own_sums`]).
    AvxVnni,
    /// `vpdpbusd` in its EVEX form on 256-bit registers (AVX512-VNNI with VL: Cascade Lake
    /// and later Xeons, Zen 4), and Q8_0's kernel of its own.
    Avx512Vnni,
    /// As [`Isa::Avx512Vnni`] (with BW and VBMI: Ice Lake and later, Zen 4), and kernels of
    /// its own where a type has one ([`Isa::own_sums`]), whose f32 sums add in another order.
    Avx512Vbmi,
    /// As [`Isa::Avx512Vbmi`], with GFNI (Ice Lake and later, Zen 4): codes unpacked by affine
    /// byte transforms ([`nibbles_gfni`], [`q6_k_zmm`]), one instruction where shifts and masks
    /// took two, and Q4_K/Q5_K scales by byte permutes ([`k4_scaled_vbmi`]); the sums are
    /// those of [`Isa::Avx512Vbmi`], bit for bit.
    Avx512Gfni,
}

impl Isa {
    /// Every variant, plainest first.
    #[cfg(test)]
    pub(crate) const ALL: [Isa; 5] =
        [Isa::Madd, Isa::AvxVnni, Isa::Avx512Vnni, Isa::Avx512Vbmi, Isa::Avx512Gfni];

    /// Whether this CPU runs `self` (AVX2/FMA/F16C assumed, as for every kernel here).
    pub(crate) fn available(self) -> bool {
        match self {
            Isa::Madd => true,
            Isa::AvxVnni => std::arch::is_x86_feature_detected!("avxvnni"),
            Isa::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx512vnni")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            Isa::Avx512Vbmi => mxfp4_zmm::available(),
            Isa::Avx512Gfni => mxfp4_zmm::available() && std::arch::is_x86_feature_detected!("gfni"),
        }
    }

    /// Whether this variant's Q4_K/Q5_K kernels read crossed code registers ([`Dot::CROSSED`]),
    /// so the activations are laid out for them ([`super::q4_k_order`]): where one affine byte
    /// transform selects the crossed nibbles, the crossing costs no more than the plain split.
    pub(crate) fn k4_crossed(self) -> bool {
        self == Isa::Avx512Gfni
    }

    /// Whether `dtype`'s products run a kernel of this variant's own, with its own activation
    /// order and per-token extras: MXFP4 and Q6_K on 512-bit registers ([`mxfp4_zmm`],
    /// [`q6_k_zmm`], with VBMI), Q8_0 with unsigned codes, eight blocks transposed
    /// ([`super::q8_0u_oct`], wherever `vpdpbusd` takes them: `vpmaddubsw` would saturate).
    pub(crate) fn own_sums(self, dtype: DType) -> bool {
        match dtype {
            DType::Q8_0 => self != Isa::Madd,
            DType::Mxfp4 | DType::Q6K => matches!(self, Isa::Avx512Vbmi | Isa::Avx512Gfni),
            _ => false,
        }
    }

    /// Whether `dtype`'s kernel reads per-token extras made with its activations
    /// ([`Isa::make_extras`]): the kernels of a variant's own ([`Isa::own_sums`]), and the E2M1
    /// types on every variant (the offsets of their unsigned codes,
    /// [`super::fp4::nvfp4_extras`], [`super::fp4::mxfp4_extras`]).
    pub(crate) fn has_extras(self, dtype: DType) -> bool {
        self.own_sums(dtype) || matches!(dtype, DType::Nvfp4 | DType::Mxfp4)
    }

    /// Extras per token of `kp` values that `dtype`'s kernel reads ([`Isa::has_extras`]).
    pub(crate) fn extras_len(self, dtype: DType, kp: usize) -> usize {
        debug_assert!(self.has_extras(dtype));
        match dtype {
            DType::Nvfp4 => super::fp4::nvfp4_extras_len(kp),
            DType::Mxfp4 if !self.own_sums(dtype) => kp / QK,
            DType::Mxfp4 => kp / mxfp4_zmm::GROUP * mxfp4_zmm::EXTRAS,
            DType::Q6K => kp / dtype.block_elems() * q6_k_zmm::EXTRAS,
            _ => kp / QK,
        }
    }

    /// One token's extras for `dtype`'s kernel into `out` ([`Isa::extras_len`] values), from
    /// its codes `q` (natural order), scales `d` and exact sub-block sums `sums`
    /// ([`crate::kernels::x86::qdot::aux_per_block`] a block); `q` is left in that kernel's
    /// order.
    pub(crate) fn make_extras(self, dtype: DType, q: &mut [i8], d: &[f32], sums: &[f32], out: &mut [f32]) {
        debug_assert!(self.has_extras(dtype));
        match dtype {
            DType::Nvfp4 => {
                super::nvfp4_order(q);
                super::fp4::nvfp4_extras(q, d, out);
            }
            DType::Mxfp4 if !self.own_sums(dtype) => {
                super::fp4::mxfp4_extras(q, out);
                super::blocks8_order(q);
            }
            DType::Mxfp4 => {
                mxfp4_zmm::extras(q, d, out);
                mxfp4_zmm::order(q);
            }
            DType::Q6K => {
                q6_k_zmm::extras(d, sums, out);
                super::order::q6_k_zmm_order(q);
            }
            // Q8_0: the extras from the blocks in their own order, then the runs transposed.
            _ => {
                q8_0u_extras(q, out);
                super::order::q8_0_oct_order(q);
            }
        }
    }

    /// The best variant for kernels running at `level`: the EVEX form only where AVX-512 is
    /// in use, so that forcing `Avx2` keeps to VEX-encoded instructions.
    pub(crate) fn best(level: crate::kernels::SimdLevel) -> Isa {
        use crate::kernels::SimdLevel;
        let avx512 = level.effective() == SimdLevel::Avx512;
        if avx512 && Isa::Avx512Gfni.available() {
            Isa::Avx512Gfni
        } else if avx512 && Isa::Avx512Vbmi.available() {
            Isa::Avx512Vbmi
        } else if avx512 && Isa::Avx512Vnni.available() {
            Isa::Avx512Vnni
        } else if Isa::AvxVnni.available() {
            Isa::AvxVnni
        } else {
            Isa::Madd
        }
    }
}

/// Eight i32 sums of four products of 32 unsigned (`u`) and 32 signed (`i`) bytes, in the
/// instructions of one [`Isa`]. Results are identical across variants: `vpmaddubsw`'s i16
/// pair sums cannot saturate for the codes here (see the module docs).
pub(super) trait Dot {
    /// Whether the Q4_K/Q5_K kernels read [`super::kquants::k4_crossed`]'s code registers
    /// (AVX-512 VL with GFNI), against activations in [`super::q4_k_order`]'s crossed layout
    /// ([`Isa::k4_crossed`]).
    const CROSSED: bool = false;
    /// `Σ u·i` per group of four bytes.
    unsafe fn dot_u(u: __m256i, i: __m256i) -> __m256i;
    /// `acc + Σ u·i` per group of four bytes.
    unsafe fn dot_u_acc(acc: __m256i, u: __m256i, i: __m256i) -> __m256i;
    /// `Σ u0·i0 + Σ u1·i1` per group of four bytes, for codes `u ≤ 31` (the 4- and 5-bit
    /// types, FP4 magnitudes) against activations `|i| ≤ 127`.
    #[inline(always)]
    unsafe fn dot_u2(u0: __m256i, i0: __m256i, u1: __m256i, i1: __m256i) -> __m256i {
        Self::dot_u_acc(Self::dot_u(u0, i0), u1, i1)
    }
    /// A Q4_K block's sub-block sums against one token's codes at `a` ([`super::q4_k_order`]):
    /// `l[i]`, `h[i]` are its transposed code registers ([`super::q4_k_blk`]), lane `k` of the
    /// result the sum of sub-block [`super::Q4K_LANES`]`[k]`.
    #[inline(always)]
    unsafe fn q4_k_sums(l: &[__m256i; 4], h: &[__m256i; 4], a: *const i8) -> __m256i {
        k4_sums::<Self>(l, h, a)
    }
    /// [`Dot::q4_k_sums`] for Q5_K's 5-bit codes ([`super::q5_k_blk`]).
    #[inline(always)]
    unsafe fn q5_k_sums(l: &[__m256i; 4], h: &[__m256i; 4], a: *const i8) -> __m256i {
        k4_sums::<Self>(l, h, a)
    }
    /// Eight 32-value blocks' sums against one token's codes at `a` ([`super::blocks8_order`]):
    /// `lo[i]`, `hi[i]` their transposed unsigned codes (Q4_0's nibbles, [`super::q4_0_oct`]),
    /// lane `l` of the result block `l`'s sum.
    #[inline(always)]
    unsafe fn blocks8_sums(lo: &[__m256i; 4], hi: &[__m256i; 4], a: *const i8) -> __m256i {
        let ld = |i: usize| _mm256_loadu_si256(a.add(32 * i) as *const __m256i);
        let pair = |i: usize| Self::dot_u_acc(Self::dot_u(lo[i], ld(2 * i)), hi[i], ld(2 * i + 1));
        _mm256_add_epi32(_mm256_add_epi32(pair(0), pair(1)), _mm256_add_epi32(pair(2), pair(3)))
    }
    /// [`Dot::blocks8_sums`] of unsigned codes of at most 24 (MXFP4's offset E2M1 values,
    /// [`super::fp4::mxfp4_oct`]).
    #[inline(always)]
    unsafe fn blocks8_sums_u24(lo: &[__m256i; 4], hi: &[__m256i; 4], a: *const i8) -> __m256i {
        Self::blocks8_sums(lo, hi, a)
    }
    /// Half a Q6_K block's sub-block sums against one token's codes at `a` ([`super::q6_k_order`]):
    /// `z` its transposed code registers ([`super::q6_k_blk`]), lane `k` of the result the
    /// sum of the half's sub-block [`super::Q4K_LANES`]`[k]`.
    #[inline(always)]
    unsafe fn q6_k_sums(z: &[__m256i; 4], a: *const i8) -> __m256i {
        let ld = |i: usize| _mm256_loadu_si256(a.add(32 * i) as *const __m256i);
        _mm256_add_epi32(
            Self::dot_u_acc(Self::dot_u(z[0], ld(0)), z[1], ld(1)),
            Self::dot_u_acc(Self::dot_u(z[2], ld(2)), z[3], ld(3)),
        )
    }
    /// `(a & m) | c`: one `vpternlogd` where AVX-512 VL is in use (written out: left to LLVM,
    /// Q6_K at 4 tokens ran 5 % slower).
    #[inline(always)]
    unsafe fn and_or(a: __m256i, m: __m256i, c: __m256i) -> __m256i {
        _mm256_or_si256(_mm256_and_si256(a, m), c)
    }
    /// [`nibbles_lo_hi`]: 16 bytes of packed nibbles at `p` as 32 codes.
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        nibbles_lo_hi(p)
    }
    /// The Q4_K/Q5_K block at `p`'s eight sub-block scales `d·sc_j` and mins `dmin·m_j`.
    #[inline(always)]
    unsafe fn k4_scaled(p: *const u8) -> (__m256, __m256) {
        k4_scaled_scalar(p)
    }
}

/// [`Dot::q4_k_sums`] in i32: the products of `l` and of `h` each add up per 128-bit half,
/// then the halves add across.
#[inline(always)]
unsafe fn k4_sums<D: Dot + ?Sized>(l: &[__m256i; 4], h: &[__m256i; 4], a: *const i8) -> __m256i {
    let ld = |i: usize| _mm256_loadu_si256(a.add(32 * i) as *const __m256i);
    let lo = _mm256_add_epi32(
        D::dot_u_acc(D::dot_u(l[0], ld(0)), l[1], ld(2)),
        D::dot_u_acc(D::dot_u(l[2], ld(4)), l[3], ld(6)),
    );
    let hi = _mm256_add_epi32(
        D::dot_u_acc(D::dot_u(h[0], ld(1)), h[1], ld(3)),
        D::dot_u_acc(D::dot_u(h[2], ld(5)), h[3], ld(7)),
    );
    halves_epi32(lo, hi)
}

/// `[x.low + x.high | y.low + y.high]` of 128-bit halves, in 32-bit lanes.
#[inline(always)]
unsafe fn halves_epi32(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(outer_halves(x, y), inner_halves(x, y))
}

/// `[x.low | y.high]`: a blend, which any vector port takes (the lane insert LLVM makes of
/// `vperm2i128 0x20` takes a shuffle port, and the kernels here are bound by those).
#[inline(always)]
unsafe fn outer_halves(x: __m256i, y: __m256i) -> __m256i {
    _mm256_blend_epi32::<0xF0>(x, y)
}

/// `[x.high | y.low]`, which with [`outer_halves`] holds each register's two halves in one lane.
#[inline(always)]
unsafe fn inner_halves(x: __m256i, y: __m256i) -> __m256i {
    _mm256_permute2x128_si256::<0x21>(x, y)
}

/// The 16-bit pair sums of a Q4_K or Q5_K block's four `l` registers and of its four `h`
/// registers against a token's codes at `a` ([`Dot::q4_k_sums`]), by `vpmaddubsw`.
#[inline(always)]
unsafe fn k4_pairs16(l: &[__m256i; 4], h: &[__m256i; 4], a: *const i8) -> (__m256i, __m256i) {
    let m = |u: __m256i, i: usize| _mm256_maddubs_epi16(u, _mm256_loadu_si256(a.add(32 * i) as *const __m256i));
    (
        _mm256_add_epi16(_mm256_add_epi16(m(l[0], 0), m(l[1], 2)), _mm256_add_epi16(m(l[2], 4), m(l[3], 6))),
        _mm256_add_epi16(_mm256_add_epi16(m(h[0], 1), m(h[1], 3)), _mm256_add_epi16(m(h[2], 5), m(h[3], 7))),
    )
}

/// [`Dot::k4_scaled`] through general registers: the 6-bit fields gathered by shifts and
/// masks on three 32-bit words ([`k4_scales`]), then widened and scaled. `d` and `dmin` are
/// loaded side by side into every 64-bit lane and converted together; an in-lane duplicate
/// then spreads each, where broadcasting two converted scalars took a lane-crossing shuffle
/// apiece.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scaled_scalar(p: *const u8) -> (__m256, __m256) {
    let h = _mm256_cvtph_ps(_mm_set1_epi32((p as *const i32).read_unaligned()));
    let (sc, mn) = k4_scales(p.add(4));
    (_mm256_mul_ps(sc, _mm256_moveldup_ps(h)), _mm256_mul_ps(mn, _mm256_movehdup_ps(h)))
}

/// `vpermb` indices placing a Q4_K block's scale bytes (`s_k` at byte `4 + k` of the block)
/// for [`k4_scaled_vbmi`]: `s0..s3, s8..s11` (all the scales need), then `s4..s11` (the mins).
static K4_GATHER: [u8; 16] = [4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15];
/// Per output byte, the bit of its 64-bit lane where its low field starts: scale `j` and min
/// `j < 4` at byte `j`, min `j ≥ 4` at the upper nibble of byte `j`.
static K4_LOW_AT: [u8; 16] = [0, 8, 16, 24, 32, 40, 48, 56, 0, 8, 16, 24, 36, 44, 52, 60];
/// The low field's width: six bits for `j < 4`, four for `j ≥ 4`.
static K4_LOW_MASK: [u8; 16] = [0x3f, 0x3f, 0x3f, 0x3f, 0x0f, 0x0f, 0x0f, 0x0f, 0x3f, 0x3f, 0x3f, 0x3f, 0x0f, 0x0f, 0x0f, 0x0f];
/// For `j ≥ 4`, where the two high bits (the top of byte `j − 4`) start, minus 4 so they land
/// at bits 4–5.
static K4_HIGH_AT: [u8; 16] = [0, 0, 0, 0, 2, 10, 18, 26, 0, 0, 0, 0, 2, 10, 18, 26];
/// Bits 4–5 for `j ≥ 4`.
static K4_HIGH_MASK: [u8; 16] = [0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30];

/// [`Dot::k4_scaled`] in vector registers: one `vpermb` puts the bytes each 64-bit lane needs
/// side by side, two `vpmultishiftqb` take every field from its bit offset, two logic
/// operations mask and merge them; then the scales and the mins widen, convert and scale.
/// About 17 instructions where the general-register route takes ~30 (a block of 144 bytes
/// is ~80 at one token); one warm thread, Q4_K at 1/2/4 tokens: 24.3/16.4/9.1 →
/// 25.1/16.5/9.5 GB/s of weights. All on 256-bit registers or narrower: with a 512-bit
/// instruction in flight, port 1 takes no vector work, and a version that widened all sixteen
/// bytes at once on 512 bits made the whole 256-bit kernel 30 % slower.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn k4_scaled_vbmi(p: *const u8) -> (__m256, __m256) {
    let ld = |t: &[u8; 16]| _mm_loadu_si128(t.as_ptr() as *const __m128i);
    let v = _mm_loadu_si128(p as *const __m128i);
    let g = _mm_permutexvar_epi8(ld(&K4_GATHER), v);
    let low = _mm_multishift_epi64_epi8(ld(&K4_LOW_AT), g);
    let high = _mm_and_si128(_mm_multishift_epi64_epi8(ld(&K4_HIGH_AT), g), ld(&K4_HIGH_MASK));
    // 0xEA: (A & B) | C.
    let bytes = _mm_ternarylogic_epi32::<0xEA>(low, ld(&K4_LOW_MASK), high);
    let h = _mm_cvtph_ps(v);
    let (dd, dmin) = (_mm256_broadcastss_ps(h), _mm256_broadcastss_ps(_mm_movehdup_ps(h)));
    let widen = |b: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    (_mm256_mul_ps(widen(bytes), dd), _mm256_mul_ps(widen(_mm_unpackhi_epi64(bytes, bytes)), dmin))
}

/// [`Isa::Madd`].
pub(super) struct Madd;
/// [`Isa::AvxVnni`].
pub(super) struct AvxVnni;
/// [`Isa::Avx512Vnni`].
pub(super) struct Avx512Vnni;
/// [`Isa::Avx512Gfni`]'s 256-bit kernels: [`Avx512Vnni`], the nibbles split by one affine byte
/// transform ([`nibbles_gfni`]).
pub(super) struct Avx512Gfni;

impl Dot for Madd {
    #[inline(always)]
    unsafe fn dot_u(u: __m256i, i: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, i), _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn dot_u_acc(acc: __m256i, u: __m256i, i: __m256i) -> __m256i {
        _mm256_add_epi32(acc, Self::dot_u(u, i))
    }
    /// [`Dot::q4_k_sums`] in 16 bits until the last step: each lane adds 16 products of a
    /// 4-bit code and an activation, at most `16·15·127 = 30480`, so the pair sums of all
    /// eight registers add without saturating and one `vpmaddwd` widens them.
    #[inline(always)]
    unsafe fn q4_k_sums(l: &[__m256i; 4], h: &[__m256i; 4], a: *const i8) -> __m256i {
        let (lo, hi) = k4_pairs16(l, h, a);
        let pairs = _mm256_add_epi16(outer_halves(lo, hi), inner_halves(lo, hi));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }
    /// [`Dot::q5_k_sums`] with the four registers of `l` (of `h`) added in 16 bits: 8 products
    /// of a 5-bit code and an activation, at most `8·31·127 = 31496`; the halves add in i32.
    #[inline(always)]
    unsafe fn q5_k_sums(l: &[__m256i; 4], h: &[__m256i; 4], a: *const i8) -> __m256i {
        let (lo, hi) = k4_pairs16(l, h, a);
        let one = _mm256_set1_epi16(1);
        halves_epi32(_mm256_madd_epi16(lo, one), _mm256_madd_epi16(hi, one))
    }
    /// [`Dot::blocks8_sums`] in 16 bits until the last step: each lane adds 16 products of a
    /// nibble (at most 15) and an activation, at most `16·15·127 = 30480`.
    #[inline(always)]
    unsafe fn blocks8_sums(lo: &[__m256i; 4], hi: &[__m256i; 4], a: *const i8) -> __m256i {
        let m = |c: __m256i, i: usize| _mm256_maddubs_epi16(c, _mm256_loadu_si256(a.add(32 * i) as *const __m256i));
        let s0 = _mm256_add_epi16(_mm256_add_epi16(m(lo[0], 0), m(hi[0], 1)), _mm256_add_epi16(m(lo[1], 2), m(hi[1], 3)));
        let s1 = _mm256_add_epi16(_mm256_add_epi16(m(lo[2], 4), m(hi[2], 5)), _mm256_add_epi16(m(lo[3], 6), m(hi[3], 7)));
        _mm256_madd_epi16(_mm256_add_epi16(s0, s1), _mm256_set1_epi16(1))
    }
    /// [`Dot::blocks8_sums_u24`] with four registers' pair sums added in 16 bits: each lane
    /// adds 8 products of a code of at most 24 and an activation, at most `8·24·127 = 24384`.
    #[inline(always)]
    unsafe fn blocks8_sums_u24(lo: &[__m256i; 4], hi: &[__m256i; 4], a: *const i8) -> __m256i {
        let m = |c: __m256i, i: usize| _mm256_maddubs_epi16(c, _mm256_loadu_si256(a.add(32 * i) as *const __m256i));
        let one = _mm256_set1_epi16(1);
        let s0 = _mm256_add_epi16(_mm256_add_epi16(m(lo[0], 0), m(hi[0], 1)), _mm256_add_epi16(m(lo[1], 2), m(hi[1], 3)));
        let s1 = _mm256_add_epi16(_mm256_add_epi16(m(lo[2], 4), m(hi[2], 5)), _mm256_add_epi16(m(lo[3], 6), m(hi[3], 7)));
        _mm256_add_epi32(_mm256_madd_epi16(s0, one), _mm256_madd_epi16(s1, one))
    }
    /// [`Dot::q6_k_sums`] with two registers' pair sums added in 16 bits: 4 products of a
    /// 6-bit code and an activation, at most `4·63·127 = 32004`.
    #[inline(always)]
    unsafe fn q6_k_sums(z: &[__m256i; 4], a: *const i8) -> __m256i {
        let ld = |i: usize| _mm256_loadu_si256(a.add(32 * i) as *const __m256i);
        let m = |i: usize| _mm256_maddubs_epi16(z[i], ld(i));
        let one = _mm256_set1_epi16(1);
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_add_epi16(m(0), m(1)), one),
            _mm256_madd_epi16(_mm256_add_epi16(m(2), m(3)), one),
        )
    }
    /// The two `vpmaddubsw` pair sums stay below `2·31·127` each, so they add in 16 bits
    /// and one `vpmaddwd` widens both: the same i32 sums in one instruction fewer.
    #[inline(always)]
    unsafe fn dot_u2(u0: __m256i, i0: __m256i, u1: __m256i, i1: __m256i) -> __m256i {
        let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(u0, i0), _mm256_maddubs_epi16(u1, i1));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }
}

impl Dot for AvxVnni {
    #[inline(always)]
    unsafe fn dot_u(u: __m256i, i: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, i)
    }
    #[inline(always)]
    unsafe fn dot_u_acc(acc: __m256i, u: __m256i, i: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, i)
    }
}

impl Dot for Avx512Vnni {
    #[inline(always)]
    unsafe fn dot_u(u: __m256i, i: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, i)
    }
    #[inline(always)]
    unsafe fn dot_u_acc(acc: __m256i, u: __m256i, i: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, i)
    }
    #[inline(always)]
    unsafe fn and_or(a: __m256i, m: __m256i, c: __m256i) -> __m256i {
        // 0xEA: (A & B) | C.
        _mm256_ternarylogic_epi32::<0xEA>(a, m, c)
    }
}

impl Dot for Avx512Gfni {
    const CROSSED: bool = true;
    #[inline(always)]
    unsafe fn dot_u(u: __m256i, i: __m256i) -> __m256i {
        Avx512Vnni::dot_u(u, i)
    }
    #[inline(always)]
    unsafe fn dot_u_acc(acc: __m256i, u: __m256i, i: __m256i) -> __m256i {
        Avx512Vnni::dot_u_acc(acc, u, i)
    }
    #[inline(always)]
    unsafe fn and_or(a: __m256i, m: __m256i, c: __m256i) -> __m256i {
        Avx512Vnni::and_or(a, m, c)
    }
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        nibbles_gfni(p)
    }
    #[inline(always)]
    unsafe fn k4_scaled(p: *const u8) -> (__m256, __m256) {
        k4_scaled_vbmi(p)
    }
}

/// 16 bytes of packed nibbles at `p` as 32 bytes: low nibbles, then high nibbles. The bytes
/// are broadcast to both halves by the load itself and one variable shift moves the upper
/// half's high nibbles down: two ALU operations instead of four and a lane insert.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles_lo_hi(p: *const u8) -> __m256i {
    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    let v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// [`nibbles_lo_hi`] in one ALU operation instead of two: `vgf2p8affineqb` applies an 8×8 bit
/// matrix to every byte, one matrix per 64-bit lane, so the lower half keeps bits 0–3 of each
/// byte and the upper half moves bits 4–7 down. Output bit `i` is the parity of the byte AND
/// matrix byte `7 − i`. One warm thread, Q4_K at 1/2/4 tokens (`cargo bench --bench kernels`,
/// alternating builds): 22.6/15.2/8.6 → 24.2/16.4/9.1 GB/s of weights.
#[inline]
#[target_feature(enable = "avx2,gfni")]
unsafe fn nibbles_gfni(p: *const u8) -> __m256i {
    const LOW: i64 = 0x0102_0408_0000_0000;
    const HIGH: i64 = 0x1020_4080_0000_0000;
    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    _mm256_gf2p8affine_epi64_epi8::<0>(v, _mm256_setr_epi64x(LOW, LOW, HIGH, HIGH))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_backend::conformance::Rng;

    /// Random 16-byte blocks: the vector unpacking of a Q4_K/Q5_K block's scales and of packed
    /// nibbles gives the general-register route's bits, block by block (the kernels' tests
    /// check them only through whole products).
    #[test]
    fn gfni_and_vbmi_unpacking_equal_the_plain_route() {
        if !Isa::Avx512Gfni.available() {
            eprintln!("skipped: this CPU has no AVX-512 VBMI and GFNI");
            return;
        }
        let mut rng = Rng::new(0x6f1);
        for _ in 0..20_000 {
            let mut b = [0u8; 16];
            for c in b.chunks_exact_mut(8) {
                c.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            // Finite scales, so that equal bits mean equal values (NaN payloads aside).
            for h in [0, 2] {
                let v = u16::from_le_bytes([b[h], b[h + 1]]) & 0x7bff;
                b[h..h + 2].copy_from_slice(&v.to_le_bytes());
            }
            // SAFETY: the CPU has every feature the functions enable (checked above), and `b`
            // holds the 16 bytes each reads.
            unsafe {
                let bits = |v: __m256| std::mem::transmute::<__m256, [u32; 8]>(v);
                let (s0, m0) = k4_scaled_scalar(b.as_ptr());
                let (s1, m1) = k4_scaled_vbmi(b.as_ptr());
                assert_eq!((bits(s0), bits(m0)), (bits(s1), bits(m1)), "scales of {b:02x?}");
                let n0 = std::mem::transmute::<__m256i, [u8; 32]>(nibbles_lo_hi(b.as_ptr()));
                let n1 = std::mem::transmute::<__m256i, [u8; 32]>(nibbles_gfni(b.as_ptr()));
                assert_eq!(n0, n1, "nibbles of {b:02x?}");
            }
        }
    }

    /// Madd's block sums that add pair sums of several registers in 16 bits give the i32
    /// sums at their documented bounds (every code at its largest magnitude against ±127
    /// everywhere) and on random codes: Q4_K (15) and Q5_K (31) against the per-register
    /// widening of [`k4_sums`], Q6_K (63), offset E2M1 (24) and Q4_0 (15) against sums of the
    /// bytes.
    #[test]
    fn madd_block_sums_add_in_16_bits_without_saturating() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let mut rng = Rng::new(0x3e3);
        let reg = |v: &[u8; 32]| unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) };
        let lanes = |v: __m256i| unsafe { std::mem::transmute::<__m256i, [i32; 8]>(v) };
        for case in 0..3_000 {
            // Activations: all +127, all −127, then random in −127..=127.
            let mut a = [0i8; 256];
            for v in a.iter_mut() {
                *v = match case {
                    0 | 4 => 127,
                    1 | 5 => -127,
                    _ => ((rng.next_u64() % 255) as i32 - 127) as i8,
                };
            }
            let mut codes = |max: u8| -> [[u8; 32]; 8] {
                let mut c = [[0u8; 32]; 8];
                for b in c.iter_mut().flatten() {
                    *b = if case < 4 { max } else { (rng.next_u64() % (max as u64 + 1)) as u8 };
                }
                c
            };
            let (c4, c5, c6, ce) = (codes(15), codes(31), codes(63), codes(24));
            let split = |c: &[[u8; 32]; 8]| ([0, 1, 2, 3].map(|i| reg(&c[i])), [4, 5, 6, 7].map(|i| reg(&c[i])));
            // SAFETY: AVX2 is present (checked above); every load reads 32 bytes of a 32-byte
            // array or of `a`'s 256.
            unsafe {
                let ap = a.as_ptr();
                for (c, name) in [(&c4, "Q4_K"), (&c5, "Q5_K")] {
                    let (l, h) = split(c);
                    let got = if name == "Q4_K" { Madd::q4_k_sums(&l, &h, ap) } else { Madd::q5_k_sums(&l, &h, ap) };
                    assert_eq!(lanes(got), lanes(k4_sums::<Madd>(&l, &h, ap)), "{name} case {case}");
                }
                // Q6_K: register i against activations 32i..; lane k sums bytes 4k..4k + 4.
                let want = |c: &[[u8; 32]; 8], regs: usize| -> [i32; 8] {
                    let mut w = [0i32; 8];
                    for (i, ci) in c.iter().take(regs).enumerate() {
                        for (b, &v) in ci.iter().enumerate() {
                            w[b / 4] += v as i32 * a[32 * i + b] as i32;
                        }
                    }
                    w
                };
                let z = [0, 1, 2, 3].map(|i| reg(&c6[i]));
                assert_eq!(lanes(Madd::q6_k_sums(&z, ap)), want(&c6, 4), "Q6_K case {case}");
                // Offset E2M1 codes: lo[i] against activations 64i.., hi[i] against 64i + 32...
                let order = [0, 4, 1, 5, 2, 6, 3, 7];
                let mut ce_in_order = [[0u8; 32]; 8];
                for (o, &j) in ce_in_order.iter_mut().zip(&order) {
                    *o = ce[j];
                }
                let (lo, hi) = split(&ce);
                assert_eq!(lanes(Madd::blocks8_sums_u24(&lo, &hi, ap)), want(&ce_in_order, 8), "E2M1 case {case}");
                // Q4_0's nibbles, in E2M1's register order.
                let mut c4_in_order = [[0u8; 32]; 8];
                for (o, &j) in c4_in_order.iter_mut().zip(&order) {
                    *o = c4[j];
                }
                let (lo, hi) = split(&c4);
                assert_eq!(lanes(Madd::blocks8_sums(&lo, &hi, ap)), want(&c4_in_order, 8), "Q4_0 case {case}");
            }
        }
    }

    /// `vpmaddubsw`'s 16-bit sum of two pair sums: at the bound it is documented for (codes 31
    /// against ±127 everywhere) and on random codes below it, the i32 sums of the bytes.
    #[test]
    fn madd_pair_sums_add_in_16_bits_without_saturating() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let mut rng = Rng::new(0x2d2);
        let mut cases: Vec<[[u8; 32]; 4]> = vec![[[31; 32], [127; 32], [31; 32], [127; 32]], [[31; 32], [0x81; 32], [31; 32], [0x81; 32]]];
        for _ in 0..2_000 {
            let mut c = [[0u8; 32]; 4];
            for (j, v) in c.iter_mut().enumerate() {
                for b in v.iter_mut() {
                    let r = rng.next_u64() as u8;
                    // Codes 0..=31; activations -127..=127.
                    *b = if j % 2 == 0 { r & 31 } else { (r % 255).wrapping_sub(127) };
                }
            }
            cases.push(c);
        }
        for [u0, i0, u1, i1] in cases {
            let want: Vec<i32> = (0..8)
                .map(|l| (4 * l..4 * l + 4).map(|b| u0[b] as i32 * i0[b] as i8 as i32 + u1[b] as i32 * i1[b] as i8 as i32).sum())
                .collect();
            // SAFETY: AVX2 is present (checked above); the loads read the 32-byte arrays.
            let got = unsafe {
                let ld = |v: &[u8; 32]| _mm256_loadu_si256(v.as_ptr() as *const __m256i);
                std::mem::transmute::<__m256i, [i32; 8]>(Madd::dot_u2(ld(&u0), ld(&i0), ld(&u1), ld(&i1)))
            };
            assert_eq!(got.to_vec(), want, "codes {u0:?} {u1:?}");
        }
    }
}
