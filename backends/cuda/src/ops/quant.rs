//! Matmul with block-quantized weights (`kernels/matmul_quant.cu`), behind an opt-in.
//!
//! The kernels are a port of the wgpu backend's `matmul_quant.wgsl`, which passes the
//! conformance suite on lavapipe in CI. These CUDA ones are compiled to PTX in CI (the
//! nvrtc_compile test) but have never run on a GPU, so the backend does not claim them:
//! `supports(Matmul, <block type>)` is false and quantized buffers are refused, unless
//! `FT_CUDA_QUANT=1` is set when the backend is opened. `scripts/gpu-check.sh` sets it, so
//! the conformance suite's `matmul_fp8`, `matmul_q4_k`, … cases run them on a GPU machine;
//! once they pass there, the opt-in can become the default.

use crate::device::{Arg, CudaBackend};
use crate::memory::{f32_at, need, storage, u32_of};
use ft_backend::{BackendError, DType, DeviceBuffer, MatmulDesc, Result};

/// The environment variable that enables the quantized matmul kernels.
pub const QUANT_ENV: &str = "FT_CUDA_QUANT";

/// Tokens per block (`QM_TB` in matmul_quant.cu).
const TOKENS: usize = 4;
/// Threads per block (`QM_WG` in matmul_quant.cu).
const THREADS: u32 = 64;

/// Whether `FT_CUDA_QUANT=1`.
pub fn quant_from_env() -> bool {
    std::env::var(QUANT_ENV).is_ok_and(|v| v == "1")
}

/// The kernel for weights of block type `dtype` (`None` for plain types).
pub(crate) fn kernel(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F8E4M3 => "matmul_q_fp8",
        DType::Nvfp4 => "matmul_q_nvfp4",
        DType::Mxfp4 => "matmul_q_mxfp4",
        DType::Q8_0 => "matmul_q_q8_0",
        DType::Q4_0 => "matmul_q_q4_0",
        DType::Q4K => "matmul_q_q4_k",
        DType::Q5K => "matmul_q_q5_k",
        DType::Q6K => "matmul_q_q6_k",
        DType::F32 | DType::F16 | DType::BF16 => return None,
    })
}

/// The error for a block type while the opt-in is off.
pub(crate) fn not_enabled(dtype: DType) -> BackendError {
    BackendError::Unsupported { backend: format!("cuda (set {QUANT_ENV}=1 to try the untested kernels)"), op: ft_backend::Op::Matmul, dtype }
}

/// See [`ft_backend::Backend::matmul`], for weights of a block type: `w_offset` (in values)
/// must be on a block boundary; row `j` is `dtype.row_bytes(k)` bytes after row `j − 1`.
pub(crate) fn matmul(
    b: &CudaBackend,
    x: &DeviceBuffer,
    w: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    out: &mut DeviceBuffer,
    d: &MatmulDesc,
) -> Result<()> {
    let dt = w.dtype();
    let name = kernel(dt).ok_or_else(|| BackendError::Invalid(format!("{dt} is not a block type")))?;
    if !b.quant_matmul {
        return Err(not_enabled(dt));
    }
    let MatmulDesc { n, k, m, .. } = *d;
    let be = dt.block_elems();
    if !d.w_offset.is_multiple_of(be) {
        return Err(BackendError::Shape(format!("{dt} weight offset {} is not on a block boundary", d.w_offset)));
    }
    let start = need(d.w_offset / be, dt.size(), "matmul w")?;
    let len = need(m, dt.row_bytes(k), "matmul w")?;
    let ws = storage(w, "matmul w")?;
    if start.checked_add(len).is_none_or(|end| end > w.size_bytes()) {
        return Err(BackendError::Shape(format!("matmul w: bytes {start}..+{len} of a buffer of {}", w.size_bytes())));
    }
    let xp = f32_at(x, d.x_offset, need(n, k, "matmul x")?, "matmul x")?;
    let bp = bias.map(|bb| f32_at(bb, d.bias_offset, m, "matmul bias")).transpose()?.unwrap_or(0);
    let op = f32_at(out, d.out_offset, need(n, m, "matmul out")?, "matmul out")?;
    if n == 0 || m == 0 {
        return Ok(());
    }
    let args = [
        Arg::Ptr(xp),
        Arg::Ptr(ws.ptr + start as u64),
        Arg::Ptr(bp),
        Arg::Ptr(op),
        Arg::U32(u32_of(n, "matmul n")?),
        Arg::U32(u32_of(k, "matmul k")?),
        Arg::U32(u32_of(m, "matmul m")?),
    ];
    let grid = (u32_of(m, "matmul m")?, u32_of(n.div_ceil(TOKENS), "matmul token blocks")?, 1);
    b.launch(name, grid, THREADS, 0, &args)
}
