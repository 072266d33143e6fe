//! AVX2 dequantization of the block-quantized weight types, 8 or 16 values per step.
//!
//! E4M3 needs no conversion instruction: a code `s.eeee.mmm` placed as the f32 bits
//! `s.0000eeee.mmm0…` is the same number times 2⁻¹²⁰ (f32's exponent bias is 127, E4M3's 7),
//! subnormals included as f32 denormals, so two power-of-two steps and the block scale give the
//! exact value. (The NaN code `0x7f` would come out as 480; quantizers never write it.) E2M1
//! nibbles go through a 16-entry byte table of doubled values (all integers), which halves the
//! scale: both are exact.
//!
//! The GGML integer types widen their codes to f32 (exact) and apply the same f32 products, in
//! the same order and without FMA, as [`ft_backend::quant::decode_block`]: Q8_0/Q4_0
//! `q · d`, Q4_K/Q5_K `(d·sc) · q − (dmin·m)`, Q6_K `(d·scale) · q`, so every value is
//! bit-identical to the scalar decode.
//!
//! Safety contract: the CPU has AVX2, FMA and F16C, and `src`/`dst` hold whole blocks.

use ft_backend::quant::{e4m3_to_f32, e8m0_to_f32, scale_min_k4};
use ft_backend::DType;
use std::arch::x86_64::*;

/// Twice the E2M1 values, by code (bit 3 is the sign).
const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Dequantizes whole blocks of `dtype` from `src` into `dst` (`dst.len()` values).
///
/// # Safety
/// See the module docs.
pub(crate) unsafe fn decode_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let blocks = dst.len() / dtype.block_elems();
    let (bb, be) = (dtype.size(), dtype.block_elems());
    for b in 0..blocks {
        let (s, d) = (src.as_ptr().add(b * bb), dst.as_mut_ptr().add(b * be));
        match dtype {
            DType::F8E4M3 => fp8_block(s, d),
            DType::Nvfp4 => nvfp4_block(s, d),
            DType::Mxfp4 => mxfp4_block(s, d),
            DType::Q8_0 => q8_0_block(s, d),
            DType::Q4_0 => q4_0_block(s, d),
            DType::Q4K => q4_k_block(s, d),
            DType::Q5K => q5_k_block(s, d),
            DType::Q6K => q6_k_block(s, d),
            // Plain types never reach the quantized path (the dispatcher checks).
            DType::F32 | DType::F16 | DType::BF16 => {}
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp8_block(src: *const u8, dst: *mut f32) {
    // Scaled in two exact steps: the code's f32 bits times 2⁶⁴ (normal from here on, even for
    // subnormal codes), then the scale times 2⁵⁶ (finite for any scale below 2⁷¹), so the one
    // rounding is that of `e4m3 · scale`.
    let (up, sv) = (_mm256_set1_ps(f32::from_bits((127 + 64) << 23)), _mm256_set1_ps((src as *const f32).read_unaligned() * f32::from_bits((127 + 56) << 23)));
    let keep = _mm256_set1_epi32(0x87F0_0000u32 as i32);
    for i in 0..16 {
        let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(4 + i * 8) as *const __m128i));
        let bits = _mm256_and_si256(_mm256_srai_epi32::<4>(_mm256_slli_epi32::<24>(c)), keep);
        _mm256_storeu_ps(dst.add(i * 8), _mm256_mul_ps(_mm256_mul_ps(_mm256_castsi256_ps(bits), up), sv));
    }
}

/// 16 E2M1 codes (one per byte, low nibble) as f32 times `half_scale`, into `dst[..16]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp4_16(codes: __m128i, half_scale: __m256, dst: *mut f32) {
    let table = _mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i);
    let v = _mm_shuffle_epi8(table, codes);
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)));
    _mm256_storeu_ps(dst, _mm256_mul_ps(lo, half_scale));
    _mm256_storeu_ps(dst.add(8), _mm256_mul_ps(hi, half_scale));
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_block(src: *const u8, dst: *mut f32) {
    let global = (src as *const f32).read_unaligned();
    let low = _mm_set1_epi8(0x0f);
    for g in 0..16 {
        // The two scales multiply in f32 first, as the reference dequantization does.
        let s = e4m3_to_f32(*src.add(4 + g)) * global;
        let packed = _mm_loadl_epi64(src.add(20 + g * 8) as *const __m128i);
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), low);
        // Low nibble is the even value: interleave to value order.
        fp4_16(
            _mm_unpacklo_epi8(lo, hi),
            _mm256_set1_ps(s * 0.5),
            dst.add(g * 16),
        );
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_block(src: *const u8, dst: *mut f32) {
    let hs = _mm256_set1_ps(e8m0_to_f32(*src) * 0.5);
    let low = _mm_set1_epi8(0x0f);
    let packed = _mm_loadu_si128(src.add(1) as *const __m128i);
    // Byte j holds value j (low nibble) and value j + 16 (high nibble).
    fp4_16(_mm_and_si128(packed, low), hs, dst);
    fp4_16(
        _mm_and_si128(_mm_srli_epi16::<4>(packed), low),
        hs,
        dst.add(16),
    );
}

/// The little-endian f16 at `p`, widened.
#[inline]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits((p as *const u16).read_unaligned().to_le()).to_f32()
}

/// 16 signed bytes as f32 times `scale`, into `dst[..16]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i8x16_scaled(v: __m128i, scale: __m256, dst: *mut f32) {
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)));
    _mm256_storeu_ps(dst, _mm256_mul_ps(lo, scale));
    _mm256_storeu_ps(dst.add(8), _mm256_mul_ps(hi, scale));
}

/// 16 unsigned bytes `q` as `mul · q − sub` (a product, then a difference: no FMA), into
/// `dst[..16]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn u8x16_affine(v: __m128i, mul: __m256, sub: __m256, dst: *mut f32) {
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)));
    _mm256_storeu_ps(dst, _mm256_sub_ps(_mm256_mul_ps(lo, mul), sub));
    _mm256_storeu_ps(dst.add(8), _mm256_sub_ps(_mm256_mul_ps(hi, mul), sub));
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_block(src: *const u8, dst: *mut f32) {
    let d = _mm256_set1_ps(f16_at(src));
    for i in 0..2 {
        i8x16_scaled(
            _mm_loadu_si128(src.add(2 + 16 * i) as *const __m128i),
            d,
            dst.add(16 * i),
        );
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_block(src: *const u8, dst: *mut f32) {
    let d = _mm256_set1_ps(f16_at(src));
    let (low, eight) = (_mm_set1_epi8(0x0f), _mm_set1_epi8(8));
    let packed = _mm_loadu_si128(src.add(2) as *const __m128i);
    // Byte j holds value j (low nibble) and value j + 16 (high nibble), both offset by 8.
    let lo = _mm_sub_epi8(_mm_and_si128(packed, low), eight);
    let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(packed), low), eight);
    i8x16_scaled(lo, d, dst);
    i8x16_scaled(hi, d, dst.add(16));
}

/// The `(d·sc, dmin·m)` pair of sub-block `j` of a Q4_K/Q5_K block, as vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scale(src: *const u8, j: usize) -> (__m256, __m256) {
    let (d, dmin) = (f16_at(src), f16_at(src.add(2)));
    let (sc, m) = scale_min_k4(j, std::slice::from_raw_parts(src.add(4), 12));
    (
        _mm256_set1_ps(d * sc as f32),
        _mm256_set1_ps(dmin * m as f32),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_block(src: *const u8, dst: *mut f32) {
    let low = _mm_set1_epi8(0x0f);
    for c in 0..4 {
        let (d0, m0) = k4_scale(src, 2 * c);
        let (d1, m1) = k4_scale(src, 2 * c + 1);
        for h in 0..2 {
            // Bytes 32c + 16h.. hold values 64c + 16h.. (low nibbles) and 64c + 32 + 16h..
            // (high nibbles).
            let packed = _mm_loadu_si128(src.add(16 + 32 * c + 16 * h) as *const __m128i);
            let out = dst.add(64 * c + 16 * h);
            u8x16_affine(_mm_and_si128(packed, low), d0, m0, out);
            u8x16_affine(
                _mm_and_si128(_mm_srli_epi16::<4>(packed), low),
                d1,
                m1,
                out.add(32),
            );
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_block(src: *const u8, dst: *mut f32) {
    let (low, one) = (_mm_set1_epi8(0x0f), _mm_set1_epi8(1));
    let qh = [
        _mm_loadu_si128(src.add(16) as *const __m128i),
        _mm_loadu_si128(src.add(32) as *const __m128i),
    ];
    for s in 0..8 {
        let (ds, ms) = k4_scale(src, s);
        let (nib, bit) = (
            _mm_cvtsi32_si128(4 * (s % 2) as i32),
            _mm_cvtsi32_si128(s as i32),
        );
        for (h, &qhh) in qh.iter().enumerate() {
            let packed = _mm_loadu_si128(src.add(48 + 32 * (s / 2) + 16 * h) as *const __m128i);
            let q = _mm_and_si128(_mm_srl_epi16(packed, nib), low);
            // Bit s of qh byte l is the fifth bit of value 32s + l.
            let hb = _mm_and_si128(_mm_srl_epi16(qhh, bit), one);
            let q = _mm_or_si128(q, _mm_slli_epi16::<4>(hb));
            u8x16_affine(q, ds, ms, dst.add(32 * s + 16 * h));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_block(src: *const u8, dst: *mut f32) {
    let d = f16_at(src.add(208));
    let scales = src.add(192) as *const i8;
    let (low, three, off) = (_mm_set1_epi8(0x0f), _mm_set1_epi8(3), _mm_set1_epi8(32));
    for half in 0..2 {
        for quarter in 0..4 {
            // Values 128·half + 32·quarter + l: low 4 bits in ql byte 64·half + 32·(quarter % 2)
            // + l (nibble quarter / 2), top 2 bits in qh byte 32·half + l (bits 2·quarter).
            let nib = _mm_cvtsi32_si128(4 * (quarter / 2) as i32);
            let hsh = _mm_cvtsi32_si128(2 * quarter as i32);
            for h in 0..2 {
                let l0 = 16 * h;
                let ql =
                    _mm_loadu_si128(src.add(64 * half + 32 * (quarter % 2) + l0) as *const __m128i);
                let qh = _mm_loadu_si128(src.add(128 + 32 * half + l0) as *const __m128i);
                let lo = _mm_and_si128(_mm_srl_epi16(ql, nib), low);
                let hi = _mm_and_si128(_mm_srl_epi16(qh, hsh), three);
                let q = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16::<4>(hi)), off);
                let v = 128 * half + 32 * quarter + l0;
                let s = _mm256_set1_ps(d * *scales.add(v / 16) as f32);
                i8x16_scaled(q, s, dst.add(v));
            }
        }
    }
}
