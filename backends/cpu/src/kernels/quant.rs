//! Matrix products against block-quantized weight rows (FP8, NVFP4, MXFP4 and GGML's Q8_0,
//! Q4_0, Q4_K, Q5_K, Q6_K).
//!
//! A chunk of rows is dequantized once into an f32 scratch that stays in L2, and the f32
//! tiles of [`super::gemv`] then sweep every token over it. The decode follows
//! [`ft_backend::quant`] exactly (same value tables, same scale products), so results equal
//! the f32 product of the dequantized weights up to summation order. In [`QuantDot::Int8`]
//! mode, decode-sized products take the int8 kernels and prefill-sized ones the bf16 tiles
//! ([`block_bf16`]), except for the types that run their fused kernels a few tokens at a time
//! ([`in_groups`]).

use super::{shape_err, SimdLevel};
use ft_backend::{DType, Result};

/// Rows dequantized per chunk: 16 rows of k = 4096 are 256 KiB of f32, resident in L2.
const CHUNK_ROWS: usize = 16;

/// Dequantizes one stored row (`src` holds `dtype.row_bytes(dst.len())`, `dst.len()` a whole
/// number of blocks) into `dst`.
pub(crate) fn decode_row(level: SimdLevel, src: &[u8], dtype: DType, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(level.effective(), SimdLevel::Avx2 | SimdLevel::Avx512) {
        // SAFETY: AVX2/FMA/F16C confirmed by `effective` (AVX-512 machines have them too);
        // callers pass whole blocks, which is what the loops read and write.
        unsafe { super::x86::quant::decode_row(dtype, src, dst) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    super::elementwise::decode_scalar(src, dtype, dst);
}

/// How decode-sized products (1..=4 tokens) meet block-quantized weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QuantDot {
    /// f32 activations: the f32 product of the dequantized weights, up to summation order.
    #[default]
    Exact,
    /// Activations quantized to int8 (one scale per 32 values) and multiplied in integers, as
    /// llama.cpp does: the 4-bit types run about twice as fast on AVX2; each product carries a
    /// relative error of about 1e-3 of `Σ|x·w|`. bf16 and FP8 weights meet bf16-rounded
    /// activations where the CPU has AVX-512 BF16 (`vdpbf16ps`, ≤ 2⁻⁹ of each activation; FP8
    /// also needs VBMI, else it stays exact); f16 and f32 stay exact.
    Int8,
}

impl QuantDot {
    /// Lower-case name for flags, config files and logs.
    pub fn name(self) -> &'static str {
        match self {
            QuantDot::Exact => "exact",
            QuantDot::Int8 => "int8",
        }
    }

    /// Parses `exact` or `int8` (case-insensitive).
    pub fn parse(s: &str) -> Option<QuantDot> {
        match s.trim().to_ascii_lowercase().as_str() {
            "exact" | "f32" => Some(QuantDot::Exact),
            "int8" | "i8" => Some(QuantDot::Int8),
            _ => None,
        }
    }
}

impl std::fmt::Display for QuantDot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QuantDot {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        QuantDot::parse(s).ok_or_else(|| format!("`{s}` is not a quantized dot mode (exact, int8)"))
    }
}

/// `out[t*os + r] = x[t*xs..][..k] · row(r)` for `t < n`, `r < nrows`, rows of `dtype` stored
/// contiguously (`dtype.row_bytes(k)` bytes each) at the start of `w`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    level: SimdLevel,
    dot: QuantDot,
    x: &[f32],
    xs: usize,
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    nrows: usize,
    out: &mut [f32],
    os: usize,
) -> Result<()> {
    check_weights(k, w, dtype, nrows)?;
    if let Some(prep) = Prepared::new(level, dot, x, xs, n, k, dtype)? {
        return prep.run(w, nrows, out, os);
    }
    let kp = dtype.padded(k);
    decoded_chunks(level, k, w, dtype, nrows, |c0, rows| {
        let cr = rows.len() / kp;
        // Padded tail values are decoded but never read: the f32 tiles stop at `k`.
        super::gemv::block(level, x, xs, n, k, bytemuck::cast_slice(rows), DType::F32, kp, cr, &mut out[c0..], os)
    })
}

/// [`block`] for a prefill against bf16 activations `xb` (`[n, k]`, contiguous): each chunk of
/// rows is dequantized, rounded to bf16 and multiplied with `vdpbf16ps`
/// ([`super::gemv::bf16_rows`]). Only reached where `xb` could be made, on a CPU that has the
/// instructions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block_bf16(
    level: SimdLevel,
    xb: &super::gemv::Bf16X,
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    nrows: usize,
    out: &mut [f32],
    os: usize,
) -> Result<()> {
    check_weights(k, w, dtype, nrows)?;
    if n == 0 || xb.rows.len() < n * k || out.len() < (n - 1) * os + nrows {
        return Err(shape_err(format!(
            "{dtype} matmul of {n} tokens × {nrows} rows × k={k}: x holds {}, out {}",
            xb.rows.len(),
            out.len()
        )));
    }
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::F8E4M3 {
        let xt = xb.tiles.as_ref().ok_or_else(|| shape_err(format!("an FP8 product of {n} tokens × k={k} in the bf16 path needs the AMX tiles")))?;
        // SAFETY: the tiles exist only where granted (with AVX-512, BW included) and `k` is a
        // multiple of 32; the weights were checked above to hold `nrows` rows of whole blocks,
        // `xt` was prepared for these `n` tokens of `k`, and `out` covers `(n − 1)·os + nrows`.
        unsafe { super::x86::fp8_tiles::rows(xt, n, k, w, nrows, out.as_mut_ptr(), os) };
        return Ok(());
    }
    let (kp, rb) = (dtype.padded(k), dtype.row_bytes(k));
    // On the AMX tiles, two row tiles a chunk: each weight tile then meets two token tiles
    // and each token tile two weight tiles.
    let chunk = if xb.tiles.is_some() { 2 * CHUNK_ROWS } else { CHUNK_ROWS };
    let mut scratch = vec![0u16; chunk.min(nrows) * k];
    // Through one f32 row, cache-hot, and a rounding pass.
    let mut row = vec![0f32; kp];
    for c0 in (0..nrows).step_by(chunk) {
        let cr = chunk.min(nrows - c0);
        for (r, dst) in scratch.chunks_exact_mut(k).take(cr).enumerate() {
            decode_row(level, &w[(c0 + r) * rb..][..rb], dtype, &mut row);
            super::gemv::round_bf16(&row[..k], dst);
        }
        super::gemv::bf16_rows(xb, n, k, bytemuck::cast_slice(&scratch[..cr * k]), 0..cr, &mut out[c0..], os);
    }
    Ok(())
}

/// Dequantizes `nrows` rows of `w` ([`CHUNK_ROWS`] at a time, each row padded to whole blocks)
/// and hands each chunk to `f(first row, decoded rows)`: the products then run on cache-hot
/// f32 rows instead of block codes.
fn decoded_chunks(
    level: SimdLevel,
    k: usize,
    w: &[u8],
    dtype: DType,
    nrows: usize,
    mut f: impl FnMut(usize, &[f32]) -> Result<()>,
) -> Result<()> {
    let (rb, kp) = (dtype.row_bytes(k), dtype.padded(k));
    let mut scratch = vec![0f32; CHUNK_ROWS.min(nrows) * kp];
    for c0 in (0..nrows).step_by(CHUNK_ROWS) {
        let cr = CHUNK_ROWS.min(nrows - c0);
        for (r, row) in scratch.chunks_exact_mut(kp).take(cr).enumerate() {
            decode_row(level, &w[(c0 + r) * rb..][..rb], dtype, row);
        }
        f(c0, &scratch[..cr * kp])?;
    }
    Ok(())
}

/// A shape error unless `w` holds `nrows` rows of `dtype.row_bytes(k)` bytes.
fn check_weights(k: usize, w: &[u8], dtype: DType, nrows: usize) -> Result<()> {
    let rb = dtype.row_bytes(k);
    if nrows.checked_mul(rb).is_none_or(|need| need > w.len()) {
        return Err(shape_err(format!(
            "{dtype} matmul of {nrows} rows × k={k}: weights hold {} bytes, need {nrows} × {rb}",
            w.len()
        )));
    }
    Ok(())
}


mod prepared;
pub(crate) use prepared::{in_groups, Aligned, Prepared};

#[cfg(all(test, target_arch = "x86_64"))]
mod int8_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use ft_backend::conformance::Rng;

    /// `blocks` blocks of `dtype`: random bytes for the GGML integer types (their f16 scale
    /// fields kept finite, half of them realistic small scales), quantized random values for
    /// the minifloat types (whose NaN codes the SIMD decode does not reproduce).
    /// `(Σ x·w, Σ |x·w|)` in f64 over the common length: a product's reference and the scale
    /// its tolerance is relative to.
    pub(super) fn exact_dot(x: &[f32], w: &[f32]) -> (f64, f64) {
        x.iter().zip(w).fold((0.0, 0.0), |(s, m), (&a, &b)| {
            let v = a as f64 * b as f64;
            (s + v, m + v.abs())
        })
    }

    pub(super) fn random_blocks(dtype: DType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
        let (bb, be) = (dtype.size(), dtype.block_elems());
        let f16_fields: &[usize] = match dtype {
            DType::Q8_0 | DType::Q4_0 => &[0],
            DType::Q4K | DType::Q5K => &[0, 2],
            DType::Q6K => &[208],
            _ => {
                let vals: Vec<f32> = (0..blocks * be)
                    .map(|i| rng.uniform() * (1.0 + (i / be) as f32))
                    .collect();
                return ft_backend::quant::quantize_matrix(dtype, &vals, blocks, be);
            }
        };
        let mut raw: Vec<u8> = (0..blocks * bb).map(|_| rng.next_u64() as u8).collect();
        for b in 0..blocks {
            for &at in f16_fields {
                let mut bits = rng.next_u64() as u16;
                if b % 2 == 0 {
                    bits = half::f16::from_f32(rng.uniform() * 0.05).to_bits();
                } else if (bits >> 10) & 0x1f == 0x1f {
                    bits &= !0x4000;
                }
                raw[b * bb + at..][..2].copy_from_slice(&bits.to_le_bytes());
            }
        }
        raw
    }

    /// FP8 blocks holding every E4M3 code but the two NaNs (subnormals and both zeros
    /// included), at scales from 2⁻¹²⁰ to 2⁷⁰ and a denormal one: every SIMD level's decode
    /// equals the scalar decode bit for bit.
    #[test]
    fn fp8_decode_of_every_code_at_every_scale() {
        let codes: Vec<u8> = (0..=255u8).filter(|c| c & 0x7f != 0x7f).chain([0, 0x80]).collect();
        let scales = [1e-40f32, 2f32.powi(-120), 3.7e-30, 1e-4, 0.75, 1.0, 3.3e5, 2f32.powi(70) * 1.5];
        let mut raw = Vec::new();
        for (i, s) in scales.iter().enumerate() {
            raw.extend_from_slice(&s.to_le_bytes());
            raw.extend((0..128).map(|j| codes[(j + 128 * (i % 2)) % 256]));
        }
        let n = scales.len() * 128;
        let mut want = vec![0f32; n];
        super::super::elementwise::decode_scalar(&raw, DType::F8E4M3, &mut want);
        for level in [SimdLevel::Avx2, SimdLevel::Avx512] {
            let mut got = vec![f32::NAN; n];
            decode_row(level, &raw, DType::F8E4M3, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{level:?} value {i} (scale {}): {g} vs {w}", scales[i / 128]);
            }
        }
    }

    /// Every SIMD level's decode of every quantized type equals the scalar decode bit for bit,
    /// from unaligned sources.
    #[test]
    fn simd_decode_equals_scalar() {
        let mut rng = Rng::new(0x5eed);
        for dtype in DType::QUANTIZED {
            let blocks = 37;
            let raw = random_blocks(dtype, blocks, &mut rng);
            let mut unaligned = vec![0u8; raw.len() + 1];
            unaligned[1..].copy_from_slice(&raw);
            let n = blocks * dtype.block_elems();
            let mut want = vec![0f32; n];
            super::super::elementwise::decode_scalar(&raw, dtype, &mut want);
            for level in [SimdLevel::Auto, SimdLevel::Avx2, SimdLevel::Avx512] {
                let mut got = vec![f32::NAN; n];
                decode_row(level, &unaligned[1..], dtype, &mut got);
                for i in 0..n {
                    assert!(
                        got[i].to_bits() == want[i].to_bits(),
                        "{dtype} at {:?}: value {i}: {} vs scalar {}",
                        level.effective(),
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

/// The fused decode kernels against an f64 dot product of the scalar decode.
#[cfg(test)]
mod fused_tests {
    use super::*;
    use ft_backend::conformance::Rng;

    /// Every type, token count 1..=5 (5 takes the scratch path), row counts that are not
    /// multiples of the row interleave, k with a partial last block, unaligned weights.
    ///
    /// Tolerance: the conformance matmul bound `1e-5 · √k · Σ|x·w|`, and also `1e-6 · Σ|x·w|`
    /// (about 17 ulps of the magnitude sum; f32 summation-order error with the per-block
    /// scale factoring measures ≤ 2.5e-7 here). Worst ratios are printed.
    #[test]
    fn fused_matches_scalar_reference() {
        let mut rng = Rng::new(0xf05e);
        let mut worst = 0f64;
        for dtype in DType::QUANTIZED {
            let be = dtype.block_elems();
            let mut rel = 0f64;
            for &k in &[be, 3 * be, 2 * be - 5, be / 2 + 1, 8 * be + 7] {
                let kp = dtype.padded(k);
                let rb = dtype.row_bytes(k);
                for &nrows in &[1usize, 2, 3, 5, 7, 9] {
                    let raw = super::tests::random_blocks(dtype, nrows * kp / be, &mut rng);
                    let mut unaligned = vec![0u8; raw.len() + 3];
                    unaligned[3..].copy_from_slice(&raw);
                    let wv = &unaligned[3..];
                    let mut dec = vec![0f32; nrows * kp];
                    for r in 0..nrows {
                        super::super::elementwise::decode_scalar(
                            &raw[r * rb..][..rb],
                            dtype,
                            &mut dec[r * kp..][..kp],
                        );
                    }
                    for n in 1..=5usize {
                        // Strided activations and outputs, as attention-style callers pass.
                        let (xs, os) = (k + 3, nrows + 2);
                        let x = rng.vec(n * xs, 1.0);
                        for level in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
                            let mut out = vec![f32::NAN; n * os];
                            block(level, QuantDot::Exact, &x, xs, n, k, wv, dtype, nrows, &mut out, os)
                                .expect("block");
                            for t in 0..n {
                                for r in 0..nrows {
                                    let (want, mag) = super::tests::exact_dot(&x[t * xs..][..k], &dec[r * kp..][..k]);
                                    let got = out[t * os + r] as f64;
                                    let bound = 1e-5 * (k as f64).sqrt().max(1.0) * mag;
                                    let err = (got - want).abs();
                                    worst = worst.max(err / bound.max(f64::MIN_POSITIVE));
                                    rel = rel.max(err / mag.max(f64::MIN_POSITIVE));
                                    // Beyond the conformance bound, a few ulps of the
                                    // magnitude sum: a wrong scale or code shows at once.
                                    assert!(
                                        err <= bound && err <= 1e-6 * mag,
                                        "{dtype} {:?} n={n} k={k} rows={nrows} t={t} r={r}: \
                                         got {got}, want {want}, error {err} > {bound}",
                                        level.effective()
                                    );
                                }
                            }
                        }
                    }
                }
            }
            println!("{dtype}: worst error / Σ|x·w| = {rel:.3e}");
        }
        println!("fused quantized matmul: worst error/bound = {worst:.3e}");
    }

    /// FP8 rows holding every E4M3 code but the two NaNs (subnormals and both zeros
    /// included) against activations from 2⁻⁴⁵ to 2⁴⁷ of both signs: the AVX2 kernel reads the
    /// codes as f32 bits worth `e4m3·2⁻¹²⁰` and the activations scaled by 2⁶⁴, which must leave
    /// every product exact. Same bound as above (1e-6 of `Σ|x·w|`, f32 summation order).
    #[test]
    fn fp8_every_code_at_every_magnitude() {
        let dtype = DType::F8E4M3;
        let codes: Vec<u8> = (0..=255u8).filter(|c| c & 0x7f != 0x7f).chain([0, 0x80]).collect();
        assert_eq!(codes.len(), 256);
        let (k, nrows) = (256, 3);
        let mut rng = Rng::new(0xe4e3);
        let mut raw = Vec::new();
        for r in 0..nrows {
            for b in 0..2 {
                let scale = 0.75f32 * (2f32).powi(r as i32 * 3 - 4 + b);
                raw.extend_from_slice(&scale.to_le_bytes());
                // Each row its own rotation of the codes, so every code meets many activations.
                raw.extend((0..128).map(|i| codes[(128 * b as usize + i + 37 * r) % 256]));
            }
        }
        assert_eq!(raw.len(), nrows * dtype.row_bytes(k));
        let mut dec = vec![0f32; nrows * k];
        super::super::elementwise::decode_scalar(&raw, dtype, &mut dec);
        for n in 1..=4usize {
            // One magnitude band a token, so that a band's lost products would show against
            // its own Σ|x·w|.
            let x: Vec<f32> = (0..n * k)
                .map(|i| {
                    let e = [-45, -20, 0, 20, 45][(i / k + n) % 5] + (i % 3) as i32;
                    let sign = if rng.next_u64() % 2 == 0 { 1.0 } else { -1.0 };
                    sign * (1.0 + rng.uniform().abs()) * (2f32).powi(e)
                })
                .collect();
            for level in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
                let mut out = vec![f32::NAN; n * nrows];
                block(level, QuantDot::Exact, &x, k, n, k, &raw, dtype, nrows, &mut out, nrows).expect("block");
                for t in 0..n {
                    for r in 0..nrows {
                        let (want, mag) = super::tests::exact_dot(&x[t * k..][..k], &dec[r * k..][..k]);
                        let (got, err) = (out[t * nrows + r] as f64, (out[t * nrows + r] as f64 - want).abs());
                        assert!(err <= 1e-6 * mag, "{:?} n={n} t={t} r={r}: got {got}, want {want} (Σ|x·w| {mag})", level.effective());
                    }
                }
            }
        }
    }

    /// FP8 with `Int8` on AVX-512 BF16 + VBMI: the product of the exactly decoded weights with
    /// the activations rounded to bf16, up to f32 summation order (1e-6 of `Σ|x·w|`), for
    /// every token count, row counts off the interleave, partial last blocks and unaligned
    /// weights; and within bf16's rounding (2⁻⁸ of `Σ|x·w|`) of the exact product.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fp8_with_bf16_activations_matches_its_reference() {
        if !super::super::x86::fp8_bf16::available() {
            println!("skipped: fp8_with_bf16_activations_matches_its_reference: no AVX-512 BF16 and VBMI");
            return;
        }
        let dtype = DType::F8E4M3;
        let be = dtype.block_elems();
        let mut rng = Rng::new(0xf8b1);
        for &k in &[be, 3 * be, 2 * be - 5, 8 * be + 7] {
            let (kp, rb) = (dtype.padded(k), dtype.row_bytes(k));
            for &nrows in &[1usize, 2, 3, 7] {
                let raw = super::tests::random_blocks(dtype, nrows * kp / be, &mut rng);
                let mut unaligned = vec![0u8; raw.len() + 3];
                unaligned[3..].copy_from_slice(&raw);
                let mut dec = vec![0f32; nrows * kp];
                for r in 0..nrows {
                    super::super::elementwise::decode_scalar(&raw[r * rb..][..rb], dtype, &mut dec[r * kp..][..kp]);
                }
                for n in 1..=4usize {
                    let (xs, os) = (k + 3, nrows + 2);
                    let x = rng.vec(n * xs, 1.0);
                    let mut out = vec![f32::NAN; n * os];
                    block(SimdLevel::Avx512, QuantDot::Int8, &x, xs, n, k, &unaligned[3..], dtype, nrows, &mut out, os).expect("block");
                    for t in 0..n {
                        for r in 0..nrows {
                            let (mut want, mut exact, mut mag) = (0f64, 0f64, 0f64);
                            for p in 0..k {
                                let (xv, w) = (x[t * xs + p], dec[r * kp + p] as f64);
                                want += half::bf16::from_f32(xv).to_f32() as f64 * w;
                                exact += xv as f64 * w;
                                mag += (xv as f64 * w).abs();
                            }
                            let got = out[t * os + r] as f64;
                            assert!((got - want).abs() <= 1e-6 * mag, "k={k} rows={nrows} n={n} t={t} r={r}: got {got}, want {want}");
                            assert!((got - exact).abs() <= mag / 256.0, "k={k} rows={nrows} n={n}: {got} vs exact {exact}");
                        }
                    }
                }
            }
        }
        // Any token count through the pool (four tokens a pass): every token's results are
        // bit for bit those of the token alone, so a sequence's numbers do not depend on its
        // batch or prefill chunk.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
        let (k, m) = (3 * be, 70);
        let raw = super::tests::random_blocks(dtype, m * k / be, &mut rng);
        for n in [1usize, 4, 5, 9, 13] {
            let x = rng.vec(n * k, 1.0);
            let mut all = vec![0f32; n * m];
            super::super::matmul(Some(&pool), SimdLevel::Avx512, QuantDot::Int8, &x, n, k, &raw, dtype, m, &mut all).expect("matmul");
            for t in 0..n {
                let mut one = vec![0f32; m];
                super::super::matmul(Some(&pool), SimdLevel::Avx512, QuantDot::Int8, &x[t * k..][..k], 1, k, &raw, dtype, m, &mut one).expect("matmul");
                assert!(one.iter().zip(&all[t * m..][..m]).all(|(a, b)| a.to_bits() == b.to_bits()), "n={n} token {t}: differs from alone");
            }
        }
    }
}
