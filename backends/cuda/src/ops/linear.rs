//! Matmul, RMSNorm, RoPE and the element-wise and row-wise f32 ops.

use super::{by_dtype, grid_1d, BLOCK};
use crate::device::{Arg, CudaBackend};
use crate::error::driver;
use crate::memory::{f32_at, need, ptr_at, u32_of};
use cudarc::driver::result;
use ft_backend::{BackendError, BinaryOp, DeviceBuffer, MatmulDesc, Result, RmsNormDesc, RopeDesc, StreamId, TopK};

/// Token counts up to this use the GEMV kernel (one weight pass per token, from L2 after the
/// first); beyond it the tiled GEMM.
const GEMV_MAX_N: usize = 4;
/// Threads (warps × 32, one output row per warp) per GEMV block. Four warps rather than
/// eight spread an expert's 768-row matrices over more SMs.
const GEMV_BLOCK: u32 = 128;

/// See [`ft_backend::Backend::matmul`].
pub(crate) fn matmul(
    b: &CudaBackend,
    x: &DeviceBuffer,
    w: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    out: &mut DeviceBuffer,
    d: &MatmulDesc,
) -> Result<()> {
    if w.dtype().is_quantized() {
        return super::quant::matmul(b, x, w, bias, out, d);
    }
    let MatmulDesc { n, k, m, .. } = *d;
    let xp = f32_at(x, d.x_offset, need(n, k, "matmul x")?, "matmul x")?;
    let wp = ptr_at(w, d.w_offset, need(m, k, "matmul w")?, "matmul w")?;
    let bp = bias.map(|bb| f32_at(bb, d.bias_offset, m, "matmul bias")).transpose()?.unwrap_or(0);
    let op = f32_at(out, d.out_offset, need(n, m, "matmul out")?, "matmul out")?;
    if n == 0 || m == 0 {
        return Ok(());
    }
    let (n32, k32, m32) = (u32_of(n, "matmul n")?, u32_of(k, "matmul k")?, u32_of(m, "matmul m")?);
    let args = [Arg::Ptr(xp), Arg::Ptr(wp), Arg::Ptr(bp), Arg::Ptr(op), Arg::U32(n32), Arg::U32(k32), Arg::U32(m32)];
    let dt = w.dtype();
    if n <= GEMV_MAX_N {
        let kernel = by_dtype(dt, ["gemv_f32", "gemv_f16", "gemv_bf16"]);
        b.launch(kernel, (m32.div_ceil(GEMV_BLOCK / 32), n32, 1), GEMV_BLOCK, 0, &args)
    } else {
        let kernel = by_dtype(dt, ["gemm_f32", "gemm_f16", "gemm_bf16"]);
        b.launch(kernel, (m32.div_ceil(64), n32.div_ceil(64), 1), 256, 0, &args)
    }
}

/// See [`ft_backend::Backend::rms_norm`].
pub(crate) fn rms_norm(b: &CudaBackend, x: &DeviceBuffer, w: &DeviceBuffer, out: &mut DeviceBuffer, d: &RmsNormDesc) -> Result<()> {
    let total = need(d.rows, d.dim, "rms_norm")?;
    let xp = f32_at(x, 0, total, "rms_norm x")?;
    let wp = ptr_at(w, 0, d.dim, "rms_norm w")?;
    let op = f32_at(out, 0, total, "rms_norm out")?;
    if total == 0 {
        return Ok(());
    }
    let args = [
        Arg::Ptr(xp),
        Arg::Ptr(wp),
        Arg::Ptr(op),
        Arg::U32(u32_of(d.dim, "rms_norm dim")?),
        Arg::F32(d.eps),
        Arg::U32(d.unit_offset as u32),
    ];
    let kernel = by_dtype(w.dtype(), ["rms_norm_f32", "rms_norm_f16", "rms_norm_bf16"]);
    b.launch(kernel, (u32_of(d.rows, "rms_norm rows")?, 1, 1), BLOCK, 0, &args)
}

/// See [`ft_backend::Backend::rope`]. The cos/sin table is computed here in f64 exactly as
/// the reference does and copied with the launch, so large positions lose nothing.
pub(crate) fn rope(b: &CudaBackend, x: &mut DeviceBuffer, d: &RopeDesc) -> Result<()> {
    let half = d.rotary_dim / 2;
    if !d.rotary_dim.is_multiple_of(2) {
        return Err(BackendError::Shape(format!("rotary_dim {} is odd", d.rotary_dim)));
    }
    if d.positions.len() < d.n_tokens {
        return Err(BackendError::Shape(format!("{} positions for {} tokens", d.positions.len(), d.n_tokens)));
    }
    if d.inv_freq.len() < half {
        return Err(BackendError::Shape(format!("{} inverse frequencies, need {half}", d.inv_freq.len())));
    }
    let len = x.len();
    let xp = f32_at(x, 0, len, "rope x")?;
    if d.n_tokens == 0 || d.n_heads == 0 || half == 0 {
        return Ok(());
    }
    let span = need(d.n_heads - 1, d.head_stride, "rope head extent")?
        .checked_add(d.rot_offset)
        .and_then(|v| v.checked_add(d.rotary_dim))
        .ok_or_else(|| BackendError::Shape("rope head extent overflows".into()))?;
    let extent = need(d.n_tokens - 1, d.row_stride, "rope row extent")?.checked_add(span);
    if extent.is_none_or(|e| e > len) {
        return Err(BackendError::Shape(format!(
            "rope over {} tokens × {} heads (row stride {}, head stride {}, offset {}, dim {}) exceeds {len} values",
            d.n_tokens, d.n_heads, d.row_stride, d.head_stride, d.rot_offset, d.rotary_dim
        )));
    }
    let table = rope_table(d);
    let total = need(need(d.n_tokens, d.n_heads, "rope")?, half, "rope")?;
    let stream = b.stream(StreamId::COMPUTE)?;
    let mut arena = b.arena()?;
    let ptrs = arena.put(&b.ctx, &stream, &[&table], 0)?;
    let args = [
        Arg::Ptr(xp),
        Arg::Ptr(ptrs[0]),
        Arg::U32(u32_of(d.n_tokens, "rope tokens")?),
        Arg::U32(u32_of(d.n_heads, "rope heads")?),
        Arg::U32(u32_of(d.head_stride, "rope head stride")?),
        Arg::U32(u32_of(d.row_stride, "rope row stride")?),
        Arg::U32(u32_of(d.rot_offset, "rope offset")?),
        Arg::U32(u32_of(half, "rope dim")?),
        Arg::U32(d.interleaved as u32),
    ];
    b.launch("rope_f32", (u32_of(total.div_ceil(BLOCK as usize), "rope grid")?, 1, 1), BLOCK, 0, &args)
}

/// See [`ft_backend::Backend::binary`].
pub(crate) fn binary(b: &CudaBackend, op: BinaryOp, a: &mut DeviceBuffer, bb: &DeviceBuffer, n: usize) -> Result<()> {
    let bp = f32_at(bb, 0, n, "binary b")?;
    let ap = f32_at(a, 0, n, "binary a")?;
    let (code, alpha, limit) = match op {
        BinaryOp::Add => (0, 0.0, 0.0),
        BinaryOp::Mul => (1, 0.0, 0.0),
        BinaryOp::MulSigmoid => (2, 0.0, 0.0),
        BinaryOp::SwiGlu => (3, 0.0, 0.0),
        BinaryOp::ClampedSwiGlu { alpha, limit } => (4, alpha, limit),
        BinaryOp::LimitedSwiGlu { limit } => (5, 0.0, limit),
    };
    let args = [Arg::Ptr(ap), Arg::Ptr(bp), Arg::U64(n as u64), Arg::U32(code), Arg::F32(alpha), Arg::F32(limit)];
    b.launch("binary_f32", (grid_1d(b, n), 1, 1), BLOCK, 0, &args)
}

/// See [`ft_backend::Backend::scale`].
pub(crate) fn scale(b: &CudaBackend, x: &mut DeviceBuffer, s: f32, n: usize) -> Result<()> {
    let xp = f32_at(x, 0, n, "scale x")?;
    b.launch("scale_f32", (grid_1d(b, n), 1, 1), BLOCK, 0, &[Arg::Ptr(xp), Arg::U64(n as u64), Arg::F32(s)])
}

/// See [`ft_backend::Backend::store`] (f16 and bf16 destinations; f32 is a copy).
pub(crate) fn store(b: &CudaBackend, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &ft_backend::CopyDesc) -> Result<()> {
    let kernel = match dst.dtype() {
        ft_backend::DType::F16 => "store_f16",
        ft_backend::DType::BF16 => "store_bf16",
        dtype => return Err(BackendError::Unsupported { backend: "cuda".into(), op: ft_backend::Op::Copy, dtype }),
    };
    let sp = f32_at(src, desc.src_offset, desc.len, "store source")?;
    let dp = ptr_at(dst, desc.dst_offset, desc.len, "store destination")?;
    if desc.len == 0 {
        return Ok(());
    }
    b.launch(kernel, (grid_1d(b, desc.len), 1, 1), BLOCK, 0, &[Arg::Ptr(sp), Arg::Ptr(dp), Arg::U64(desc.len as u64)])
}

/// See [`ft_backend::Backend::softmax`].
pub(crate) fn softmax(b: &CudaBackend, x: &mut DeviceBuffer, rows: usize, cols: usize) -> Result<()> {
    let xp = f32_at(x, 0, need(rows, cols, "softmax")?, "softmax x")?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let args = [Arg::Ptr(xp), Arg::U32(u32_of(cols, "softmax cols")?)];
    b.launch("softmax_f32", (u32_of(rows, "softmax rows")?, 1, 1), BLOCK, 0, &args)
}

/// See [`ft_backend::Backend::top_k`]: selected on the device, only `rows × k` results come
/// back.
pub(crate) fn top_k(b: &CudaBackend, x: &DeviceBuffer, rows: usize, cols: usize, k: usize) -> Result<TopK> {
    if k > cols {
        return Err(BackendError::Shape(format!("top-{k} of {cols} columns")));
    }
    let xp = f32_at(x, 0, need(rows, cols, "top_k")?, "top_k x")?;
    let n = need(rows, k, "top_k results")?;
    if n == 0 {
        return Ok(TopK::default());
    }
    let stream = b.stream(StreamId::COMPUTE)?;
    let mut arena = b.arena()?;
    // Two result tables of n u32/f32 values, written by the kernel.
    let ptrs = arena.put(&b.ctx, &stream, &[&vec![0u8; n * 4]], n * 4)?;
    let args = [
        Arg::Ptr(xp),
        Arg::U32(u32_of(cols, "top_k cols")?),
        Arg::U32(u32_of(k, "top_k k")?),
        Arg::Ptr(ptrs[0]),
        Arg::Ptr(ptrs[1]),
    ];
    b.launch("top_k_f32", (u32_of(rows, "top_k rows")?, 1, 1), BLOCK, 0, &args)?;
    let mut idx = vec![0u8; n * 4];
    let mut val = vec![0u8; n * 4];
    b.bind()?;
    // SAFETY: both tables lie in the arena (sized by `put`); synchronised before reading.
    unsafe {
        result::memcpy_dtoh_async(&mut idx, ptrs[0], stream.cu_stream())
            .and_then(|()| result::memcpy_dtoh_async(&mut val, ptrs[1], stream.cu_stream()))
    }
    .and_then(|()| stream.synchronize())
    .map_err(|e| driver(e, "top_k results"))?;
    drop(arena);
    let word = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    Ok(TopK {
        indices: idx.chunks_exact(4).map(|c| u32::from_le_bytes(word(c))).collect(),
        values: val.chunks_exact(4).map(|c| f32::from_le_bytes(word(c))).collect(),
    })
}

/// `(cos, sin)` per token and pair as little-endian f32 bytes, angles in f64 and scaled as in
/// the reference.
pub(crate) fn rope_table(d: &RopeDesc) -> Vec<u8> {
    let half = d.rotary_dim / 2;
    let mut table = Vec::with_capacity(d.n_tokens * half * 8);
    for &pos in &d.positions[..d.n_tokens] {
        for &f in &d.inv_freq[..half] {
            let angle = pos as f64 * f as f64;
            table.extend_from_slice(&((angle.cos() as f32) * d.scaling).to_le_bytes());
            table.extend_from_slice(&((angle.sin() as f32) * d.scaling).to_le_bytes());
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use ft_backend::RopeDesc;

    #[test]
    fn rope_table_matches_the_reference_rotation() {
        // Rotating (1, 0) pairs with the reference gives exactly the table's (cos, sin).
        let d = RopeDesc {
            n_tokens: 2,
            n_heads: 1,
            head_stride: 4,
            row_stride: 4,
            rot_offset: 0,
            rotary_dim: 4,
            interleaved: true,
            positions: vec![1, 4095],
            inv_freq: vec![1.0, 1e-4],
            scaling: 1.5,
        };
        let mut x = vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
        ft_backend::reference::rope(&mut x, &d);
        let t: Vec<f32> = super::rope_table(&d).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(t, x);
    }
}
