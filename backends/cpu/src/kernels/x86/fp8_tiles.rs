//! FP8 (E4M3 codes with an f32 scale per 128 values of a row) prefill on the AMX tiles, with
//! the weights exact.
//!
//! Every E4M3 value is exact in bf16 (3 mantissa bits, exponents well inside bf16's range), so
//! the codes go to the tiles unscaled and each 128-value block's sums are scaled in f32 as they
//! leave the tiles ([`amx::Scales`]). Rounding the scaled weights to bf16 instead moved the FP8
//! fixture's logits by 0.36 between a sequence alone and in a batch.

use super::amx;
use std::arch::x86_64::*;

/// Values per scale.
const BLOCK: usize = 128;
/// Bytes per block: the f32 scale, then 128 codes.
const BLOCK_BYTES: usize = 132;

/// bf16 bits of E4M3 subnormals `m·2⁻⁹` by `m` (index 0..8; the rest unused).
static SUBNORMAL: [u16; 32] = {
    let mut t = [0u16; 32];
    t[1] = 0x3B00; // 2^-9
    t[2] = 0x3B80; // 2^-8
    t[3] = 0x3BC0; // 1.5·2^-8
    t[4] = 0x3C00; // 2^-7
    t[5] = 0x3C20; // 1.25·2^-7
    t[6] = 0x3C40; // 1.5·2^-7
    t[7] = 0x3C60; // 1.75·2^-7
    t
};

/// bf16 bits of the unscaled E4M3 codes `src[..len]` into `dst` (`len` a multiple of 32).
///
/// # Safety
/// AVX-512 BW; `src` holds `len` bytes and `dst` room for `len` values.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn e4m3_bf16(src: *const u8, dst: *mut u16, len: usize) {
    let sub = _mm512_loadu_si512(SUBNORMAL.as_ptr() as *const _);
    let (m7f, bias) = (_mm512_set1_epi16(0x7f), _mm512_set1_epi16(120 << 7));
    for i in (0..len).step_by(32) {
        let x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(src.add(i) as *const __m256i));
        let sign = _mm512_slli_epi16::<8>(_mm512_and_si512(x, _mm512_set1_epi16(0x80)));
        let mag = _mm512_and_si512(x, m7f);
        // Normal: exponent e + 120 (bias 7 → 127), mantissa's 3 bits on top of bf16's 7.
        let normal = _mm512_add_epi16(_mm512_slli_epi16::<4>(mag), bias);
        let small = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
        let v = _mm512_mask_permutexvar_epi16(normal, small, mag, sub);
        // S.1111.111 is NaN (E4M3 has no infinities).
        let v = _mm512_mask_mov_epi16(v, _mm512_cmpeq_epi16_mask(mag, m7f), _mm512_set1_epi16(0x7fc0));
        _mm512_storeu_si512(dst.add(i) as *mut _, _mm512_or_si512(v, sign));
    }
}

/// `out[t·os + r] = x_t · w_r` for the `nrows` FP8 rows of `w` (`k` a multiple of 32; rows of
/// whole blocks, a short last one padded), `xt` the token tiles of [`amx::prepare`]: 32 rows
/// at a time decoded to unscaled bf16 with their scales beside them.
///
/// # Safety
/// [`amx::available`] returned true and the CPU has AVX-512 BW; `k` is a multiple of 32, `w`
/// holds `nrows` rows of `⌈k / 128⌉` blocks, `xt` is [`amx::prepare`]'s output for `n` tokens
/// of `k`, `out` covers `(n − 1)·os + nrows`.
pub(crate) unsafe fn rows(xt: &[u32], n: usize, k: usize, w: &[u8], nrows: usize, out: *mut f32, os: usize) {
    const CHUNK: usize = 2 * amx::TILE;
    let blocks = k.div_ceil(BLOCK);
    let rb = blocks * BLOCK_BYTES;
    let mut codes = vec![0u16; CHUNK * k];
    let mut scales = vec![0f32; CHUNK * blocks];
    let mut ragged = Vec::new();
    for c0 in (0..nrows).step_by(CHUNK) {
        let cr = CHUNK.min(nrows - c0);
        // Rows past `cr` of a ragged last chunk stay zero (scale 0): they fill its last tile.
        let padded = cr.next_multiple_of(amx::TILE);
        codes[cr * k..padded * k].fill(0);
        scales[cr * blocks..padded * blocks].fill(0.0);
        for r in 0..cr {
            let row = &w[(c0 + r) * rb..][..rb];
            for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
                scales[r * blocks + b] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
                // A short last block's padding codes stay out of the k values.
                let len = BLOCK.min(k - b * BLOCK);
                e4m3_bf16(block.as_ptr().add(4), codes.as_mut_ptr().add(r * k + b * BLOCK), len);
            }
        }
        let sc = amx::Scales { s: &scales, per_row: blocks, steps: BLOCK / amx::KSTEP };
        let w = codes.as_ptr() as *const u8;
        if padded == cr {
            amx::rows(xt, n, k, w, padded / amx::TILE, out.add(c0), os, Some(&sc));
        } else {
            // The padding rows' sums go to a scratch output, not past this product's rows.
            ragged.resize(n * padded, 0.0);
            amx::rows(xt, n, k, w, padded / amx::TILE, ragged.as_mut_ptr(), padded, Some(&sc));
            for t in 0..n {
                std::ptr::copy_nonoverlapping(ragged.as_ptr().add(t * padded), out.add(t * os + c0), cr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code decodes to the bf16 bits of its exact value (NaN to a NaN).
    #[test]
    fn every_e4m3_code_is_its_value_in_bf16() {
        if !is_x86_feature_detected!("avx512bw") {
            eprintln!("skipped: no AVX-512 BW on this CPU");
            return;
        }
        let src: Vec<u8> = (0..=255u8).collect();
        let mut dst = vec![0u16; 256];
        // SAFETY: AVX-512 BW checked; 256 codes and values.
        unsafe { e4m3_bf16(src.as_ptr(), dst.as_mut_ptr(), 256) };
        for (c, &b) in src.iter().zip(&dst) {
            let want = ft_backend::quant::e4m3_to_f32(*c);
            let got = f32::from_bits((b as u32) << 16);
            if want.is_nan() {
                assert!(got.is_nan(), "code {c:#04x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "code {c:#04x}: {got} against {want}");
            }
        }
    }
}
