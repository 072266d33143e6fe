//! Row and element kernels: dtype widening, axpy, exp, softmax, RMSNorm, scale and the
//! element-wise binary ops.
//!
//! Only the pieces whose speed matters per token (widening, axpy, exp) have hand-written
//! SIMD; the rest is lane-shaped portable code that the compiler vectorises well enough for
//! ops that touch each value once.

use super::{shape_err, SimdLevel};
use ft_backend::{BinaryOp, DType, Result};

/// Elements per chunk of the sigmoid-based ops: small enough for a stack buffer, long enough
/// for the vector exp to run at full width.
const EXP_CHUNK: usize = 64;

/// Widens `out.len()` elements of `dtype` at the start of `bytes` (any alignment) to f32.
/// Exact for every dtype.
pub fn decode_row(level: SimdLevel, bytes: &[u8], dtype: DType, out: &mut [f32]) -> Result<()> {
    check_bytes(bytes, dtype, out.len())?;
    #[cfg(target_arch = "x86_64")]
    {
        let d = super::x86::code(dtype);
        // SAFETY: level confirmed by `effective`; `check_bytes` covers `out.len()` elements.
        unsafe {
            match level.effective() {
                SimdLevel::Avx512 => {
                    super::x86::avx512::decode(d, bytes.as_ptr(), out.as_mut_ptr(), out.len());
                    return Ok(());
                }
                SimdLevel::Avx2 => {
                    super::x86::avx2::decode(d, bytes.as_ptr(), out.as_mut_ptr(), out.len());
                    return Ok(());
                }
                _ => {}
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    decode_scalar(bytes, dtype, out);
    Ok(())
}

/// `out[i] += alpha · w[i]` where `w` is `out.len()` elements of `dtype` (any alignment).
pub fn axpy_row(
    level: SimdLevel,
    alpha: f32,
    bytes: &[u8],
    dtype: DType,
    out: &mut [f32],
) -> Result<()> {
    check_bytes(bytes, dtype, out.len())?;
    #[cfg(target_arch = "x86_64")]
    {
        let d = super::x86::code(dtype);
        // SAFETY: as in `decode_row`.
        unsafe {
            match level.effective() {
                SimdLevel::Avx512 => {
                    super::x86::avx512::axpy(d, alpha, bytes.as_ptr(), out.as_mut_ptr(), out.len());
                    return Ok(());
                }
                SimdLevel::Avx2 => {
                    super::x86::avx2::axpy(d, alpha, bytes.as_ptr(), out.as_mut_ptr(), out.len());
                    return Ok(());
                }
                _ => {}
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    let mut buf = [0f32; EXP_CHUNK];
    let es = dtype.size();
    for (i, o) in out.chunks_mut(EXP_CHUNK).enumerate() {
        let w = &mut buf[..o.len()];
        decode_scalar(&bytes[i * EXP_CHUNK * es..], dtype, w);
        o.iter_mut()
            .zip(w.iter())
            .for_each(|(o, w)| *o += alpha * w);
    }
    Ok(())
}

fn check_bytes(bytes: &[u8], dtype: DType, len: usize) -> Result<()> {
    if dtype.is_quantized() {
        // Block-quantized weights are only read by the matmul kernels, a whole block at a time.
        return Err(shape_err(format!(
            "{dtype} values cannot be read one element at a time"
        )));
    }
    match len.checked_mul(dtype.size()) {
        Some(b) if b <= bytes.len() => Ok(()),
        _ => Err(shape_err(format!(
            "{} bytes hold fewer than {len} {dtype} values",
            bytes.len()
        ))),
    }
}

/// Portable widening; `bytes` must hold `out.len()` elements (callers check). A quantized
/// dtype decodes whole blocks: `out.len()` must then be a multiple of the block.
pub(crate) fn decode_scalar(bytes: &[u8], dtype: DType, out: &mut [f32]) {
    match dtype {
        DType::F8E4M3
        | DType::Nvfp4
        | DType::Mxfp4
        | DType::Q8_0
        | DType::Q4_0
        | DType::Q4K
        | DType::Q5K
        | DType::Q6K => out
            .chunks_exact_mut(dtype.block_elems())
            .zip(bytes.chunks_exact(dtype.size()))
            .for_each(|(o, b)| ft_backend::quant::decode_block(dtype, b, o)),
        DType::F32 => out
            .iter_mut()
            .zip(bytes.chunks_exact(4))
            .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        DType::F16 => out
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .for_each(|(o, c)| {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()
            }),
        DType::BF16 => out
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .for_each(|(o, c)| {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)
            }),
    }
}

/// `x[i] = exp(x[i] - sub)`; returns the sum of the new values (softmax's denominator).
/// The SIMD paths use a polynomial `expf` with about 2 ulp of relative error.
pub fn exp_sub_sum(level: SimdLevel, x: &mut [f32], sub: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: level confirmed by `effective`; the pointer covers `x.len()` values.
        unsafe {
            match level.effective() {
                SimdLevel::Avx512 => {
                    return super::x86::avx512::exp_sub_sum(x.as_mut_ptr(), x.len(), sub)
                }
                SimdLevel::Avx2 => {
                    return super::x86::avx2::exp_sub_sum(x.as_mut_ptr(), x.len(), sub)
                }
                _ => {}
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    x.iter_mut().fold(0f32, |s, v| {
        *v = (*v - sub).exp();
        s + *v
    })
}

/// Largest value of `x` (NaN ignored, like `f32::max`); `-inf` when empty.
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for i in 0..16 {
            m[i] = m[i].max(c[i]);
        }
    }
    m.iter().copied().fold(tail, f32::max)
}

/// Softmax in place over each row of `cols` values (`x.len()` a multiple of `cols`).
pub fn softmax_rows(level: SimdLevel, x: &mut [f32], cols: usize) -> Result<()> {
    if cols == 0 {
        return Ok(());
    }
    if !x.len().is_multiple_of(cols) {
        return Err(shape_err(format!(
            "{} values are not rows of {cols}",
            x.len()
        )));
    }
    for row in x.chunks_exact_mut(cols) {
        let m = max(row);
        let inv = 1.0 / exp_sub_sum(level, row, m);
        row.iter_mut().for_each(|v| *v *= inv);
    }
    Ok(())
}

/// RMSNorm of each row of `w.len()` values: `out = x / sqrt(mean(x²) + eps) · g` with
/// `g = w` or `1 + w` (`unit_offset`).
pub fn rms_norm_rows(
    x: &[f32],
    w: &[f32],
    eps: f32,
    unit_offset: bool,
    out: &mut [f32],
) -> Result<()> {
    let dim = w.len();
    if dim == 0 {
        return Ok(());
    }
    if !x.len().is_multiple_of(dim) || out.len() != x.len() {
        return Err(shape_err(format!(
            "rms_norm: x {} / out {} values are not rows of {dim}",
            x.len(),
            out.len()
        )));
    }
    for (row, o) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss = super::gemv::dot(row, row) as f64;
        let inv = (1.0 / (ss / dim as f64 + eps as f64).sqrt()) as f32;
        if unit_offset {
            o.iter_mut()
                .zip(row)
                .zip(w)
                .for_each(|((o, x), w)| *o = x * inv * (1.0 + w));
        } else {
            o.iter_mut()
                .zip(row)
                .zip(w)
                .for_each(|((o, x), w)| *o = x * inv * w);
        }
    }
    Ok(())
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

/// `a = op(a, b)` element-wise over `a.len()` values (`b` at least as long).
///
/// The sigmoid-based ops compute their exponentials a chunk at a time with the vector exp;
/// `ClampedSwiGlu` and `LimitedSwiGlu` need `limit >= 0`.
pub fn binary(level: SimdLevel, op: BinaryOp, a: &mut [f32], b: &[f32]) -> Result<()> {
    let Some(b) = b.get(..a.len()) else {
        return Err(shape_err(format!(
            "binary: b has {} values, a has {}",
            b.len(),
            a.len()
        )));
    };
    match op {
        BinaryOp::Add => a.iter_mut().zip(b).for_each(|(a, b)| *a += b),
        BinaryOp::Mul => a.iter_mut().zip(b).for_each(|(a, b)| *a *= b),
        BinaryOp::MulSigmoid => with_exp(level, a, b, |_, b| -b, |a, _, e| a / (1.0 + e)),
        BinaryOp::SwiGlu => with_exp(level, a, b, |a, _| -a, |a, b, e| a / (1.0 + e) * b),
        BinaryOp::ClampedSwiGlu { alpha, limit } => {
            if limit.is_nan() || limit < 0.0 {
                return Err(shape_err(format!(
                    "clamped SwiGLU limit must be >= 0, got {limit}"
                )));
            }
            // `f32::min`/`max` rather than `clamp`, which panics on NaN bounds.
            let g = |a: f32| a.min(limit);
            with_exp(
                level,
                a,
                b,
                |a, _| -alpha * g(a),
                |a, b, e| g(a) / (1.0 + e) * (b.max(-limit).min(limit) + 1.0),
            )
        }
        BinaryOp::LimitedSwiGlu { limit } => {
            if limit.is_nan() || limit < 0.0 {
                return Err(shape_err(format!(
                    "limited SwiGLU limit must be >= 0, got {limit}"
                )));
            }
            let g = |a: f32| a.min(limit);
            with_exp(level, a, b, |a, _| -g(a), |a, b, e| g(a) / (1.0 + e) * b.max(-limit).min(limit))
        }
    }
    Ok(())
}

/// Runs `a[i] = fin(a[i], b[i], exp(arg(a[i], b[i])))` in stack-sized chunks.
fn with_exp(
    level: SimdLevel,
    a: &mut [f32],
    b: &[f32],
    arg: impl Fn(f32, f32) -> f32,
    fin: impl Fn(f32, f32, f32) -> f32,
) {
    let mut buf = [0f32; EXP_CHUNK];
    for (ac, bc) in a.chunks_mut(EXP_CHUNK).zip(b.chunks(EXP_CHUNK)) {
        let e = &mut buf[..ac.len()];
        e.iter_mut()
            .zip(ac.iter().zip(bc))
            .for_each(|(e, (a, b))| *e = arg(*a, *b));
        exp_sub_sum(level, e, 0.0);
        ac.iter_mut()
            .zip(bc)
            .zip(e.iter())
            .for_each(|((a, b), e)| *a = fin(*a, *b, *e));
    }
}
