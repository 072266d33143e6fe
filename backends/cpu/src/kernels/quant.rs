//! Matrix products against block-quantized weight rows (FP8, NVFP4, MXFP4).
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
