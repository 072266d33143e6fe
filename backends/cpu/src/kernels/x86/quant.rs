//! AVX2 dequantization of the block-quantized weight types, 8 or 16 values per step.
//!
//! E4M3 widens through f16: a code `s.eeee.mmm` placed as f16 bits `s.0eeee.mmm0000000` is the
//! same number divided by 2⁸ (f16's exponent bias is 15, E4M3's 7), subnormals included, so
//! `cvtph` plus the block scale times 256 gives the exact value. (The NaN code `0x7f` would
//! come out as 480; quantizers never write it.) E2M1 nibbles go through a 16-entry byte
//! table of doubled values (all integers), which halves the scale: both are exact.
//!
//! Safety contract: the CPU has AVX2, FMA and F16C, and `src`/`dst` hold whole blocks.

use ft_backend::quant::{e4m3_to_f32, e8m0_to_f32};
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
            // Plain types never reach the quantized path (the dispatcher checks).
            DType::F32 | DType::F16 | DType::BF16 => {}
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp8_block(src: *const u8, dst: *mut f32) {
    let scale = (src as *const f32).read_unaligned() * 256.0;
    let sv = _mm256_set1_ps(scale);
    let (sign_mask, mag_mask) = (_mm_set1_epi16(0x80), _mm_set1_epi16(0x7f));
    for i in 0..16 {
        let codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(src.add(4 + i * 8) as *const __m128i));
        let sign = _mm_slli_epi16::<8>(_mm_and_si128(codes, sign_mask));
        let mag = _mm_slli_epi16::<7>(_mm_and_si128(codes, mag_mask));
        let v = _mm256_cvtph_ps(_mm_or_si128(sign, mag));
        _mm256_storeu_ps(dst.add(i * 8), _mm256_mul_ps(v, sv));
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
