//! Matrix products against block-quantized weight rows (FP8, NVFP4, MXFP4 and GGML's Q8_0,
//! Q4_0, Q4_K, Q5_K, Q6_K).
//!
//! A chunk of rows is dequantized once into an f32 scratch that stays in L2, and the f32
//! tiles of [`super::gemv`] then sweep every token over it. The decode follows
//! [`ft_backend::quant`] exactly (same value tables, same scale products), so results equal
//! the f32 product of the dequantized weights up to summation order.

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

/// `out[t*os + r] = x[t*xs..][..k] · row(r)` for `t < n`, `r < nrows`, rows of `dtype` stored
/// contiguously (`dtype.row_bytes(k)` bytes each) at the start of `w`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    level: SimdLevel,
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
    let (rb, kp) = (dtype.row_bytes(k), dtype.padded(k));
    let w_need = nrows.checked_mul(rb);
    if w_need.is_none_or(|need| need > w.len()) {
        return Err(shape_err(format!(
            "{dtype} matmul of {nrows} rows × k={k}: weights hold {} bytes, need {nrows} × {rb}",
            w.len()
        )));
    }
    #[cfg(target_arch = "x86_64")]
    if fused(level, x, xs, n, k, w, dtype, nrows, out, os)? {
        return Ok(());
    }
    let mut scratch = vec![0f32; CHUNK_ROWS.min(nrows) * kp];
    for c0 in (0..nrows).step_by(CHUNK_ROWS) {
        let cr = CHUNK_ROWS.min(nrows - c0);
        for r in 0..cr {
            decode_row(
                level,
                &w[(c0 + r) * rb..][..rb],
                dtype,
                &mut scratch[r * kp..][..kp],
            );
        }
        let bytes: &[u8] = bytemuck::cast_slice(&scratch[..cr * kp]);
        // Padded tail values are decoded but never read: the f32 tiles stop at `k`.
        super::gemv::block(
            level,
            x,
            xs,
            n,
            k,
            bytes,
            DType::F32,
            kp,
            cr,
            &mut out[c0..],
            os,
        )?;
    }
    Ok(())
}

/// Decode-sized products (`1 ≤ n ≤ 4` tokens) through the fused kernels of
/// [`super::x86::qdot`], which stream each weight row once and expand its codes in registers.
/// Returns `Ok(false)` (nothing done) where they do not apply: no AVX2, more tokens, or a dtype
/// without a kernel.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn fused(
    level: SimdLevel,
    x: &[f32],
    xs: usize,
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    nrows: usize,
    out: &mut [f32],
    os: usize,
) -> Result<bool> {
    use super::x86::qdot;
    if !(1..=qdot::MAX_TOKENS).contains(&n)
        || !matches!(level.effective(), SimdLevel::Avx2 | SimdLevel::Avx512)
        || !qdot::supported(dtype)
    {
        return Ok(false);
    }
    let x_need = (n - 1).checked_mul(xs).and_then(|v| v.checked_add(k));
    let out_need = (n - 1).checked_mul(os).and_then(|v| v.checked_add(nrows));
    if x_need.is_none_or(|v| v > x.len()) || out_need.is_none_or(|v| v > out.len()) {
        return Err(shape_err(format!(
            "{dtype} matmul of {n} tokens × {nrows} rows × k={k}: x has {} values, out {}",
            x.len(),
            out.len()
        )));
    }
    if nrows == 0 {
        return Ok(true);
    }
    let (be, kp) = (dtype.block_elems(), dtype.padded(k));
    // The kernels read whole blocks of activations: a partial last block is zero-padded
    // (padded weight values then contribute nothing, as in the scratch path).
    let padded: Vec<f32>;
    let (xp, xps) = if kp == k {
        (x.as_ptr(), xs)
    } else {
        let mut v = vec![0f32; n * kp];
        for t in 0..n {
            v[t * kp..][..k].copy_from_slice(&x[t * xs..][..k]);
        }
        padded = v;
        (padded.as_ptr(), kp)
    };
    let blocks = kp / be;
    let apb = qdot::aux_per_block(dtype);
    let mut aux = vec![0f32; n * blocks * apb];
    if let Some(g) = be.checked_div(apb) {
        for t in 0..n {
            // SAFETY: `xp + t·xps` holds `kp` readable values (checked or padded above).
            let xt = unsafe { std::slice::from_raw_parts(xp.add(t * xps), kp) };
            for (s, c) in aux[t * blocks * apb..][..blocks * apb]
                .iter_mut()
                .zip(xt.chunks_exact(g))
            {
                *s = c.iter().sum();
            }
        }
    }
    let job = qdot::Job {
        x: xp,
        xs: xps,
        aux: aux.as_ptr(),
        auxs: blocks * apb,
        w: w.as_ptr(),
        rb: dtype.row_bytes(k),
        blocks,
        out: out.as_mut_ptr(),
        os,
    };
    // SAFETY: `effective` confirmed AVX2/FMA/F16C; the caller checked `w` holds `nrows` rows
    // of whole blocks, and `x`, `out` and `aux` were checked or sized above.
    unsafe { qdot::run(dtype, &job, n, nrows) };
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_backend::conformance::Rng;

    /// `blocks` blocks of `dtype`: random bytes for the GGML integer types (their f16 scale
    /// fields kept finite, half of them realistic small scales), quantized random values for
    /// the minifloat types (whose NaN codes the SIMD decode does not reproduce).
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
                            block(level, &x, xs, n, k, wv, dtype, nrows, &mut out, os)
                                .expect("block");
                            for t in 0..n {
                                for r in 0..nrows {
                                    let (mut want, mut mag) = (0f64, 0f64);
                                    for p in 0..k {
                                        let v = x[t * xs + p] as f64 * dec[r * kp + p] as f64;
                                        want += v;
                                        mag += v.abs();
                                    }
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
}
