//! The kernel ops of the trait: shape checks on the host, then one or two launches on the
//! compute stream.

pub(crate) mod attn;
pub(crate) mod linear;
pub(crate) mod rows;

use crate::device::CudaBackend;
use ft_backend::DType;

/// Threads per block of the row and element-wise kernels.
pub(crate) const BLOCK: u32 = 256;

/// The kernel for `dtype` out of its `[f32, f16, bf16]` instantiations.
pub(crate) fn by_dtype(dtype: DType, names: [&'static str; 3]) -> &'static str {
    match dtype {
        DType::F32 => names[0],
        DType::F16 => names[1],
        DType::BF16 => names[2],
    }
}

/// Blocks for a grid-stride loop over `n` elements: enough to fill the card, no more.
pub(crate) fn grid_1d(b: &CudaBackend, n: usize) -> u32 {
    let want = n.div_ceil(BLOCK as usize).max(1);
    want.min(b.sm_count as usize * 8) as u32
}

/// Every kernel the backend launches, by kernel file (checked against the PTX in tests).
pub const KERNEL_NAMES: &[(&str, &[&str])] = &[
    ("matmul", &["gemv_f32", "gemv_f16", "gemv_bf16", "gemm_f32", "gemm_f16", "gemm_bf16"]),
    ("norm", &["rms_norm_f32", "rms_norm_f16", "rms_norm_bf16"]),
    ("rope", &["rope_f32"]),
    (
        "attention",
        &[
            "attention_f32_v4", "attention_f32_v8", "attention_f32_v16",
            "attention_f16_v4", "attention_f16_v8", "attention_f16_v16",
            "attention_bf16_v4", "attention_bf16_v8", "attention_bf16_v16",
        ],
    ),
    ("elementwise", &["binary_f32", "scale_f32"]),
    ("softmax_topk", &["softmax_f32", "top_k_f32"]),
    ("gather_scatter", &["gather_rows_f32", "gather_rows_f16", "gather_rows_bf16", "scatter_add_rows_f32"]),
    (
        "recurrent",
        &["causal_conv1d_f32", "causal_conv1d_f16", "causal_conv1d_bf16", "conv_state_update_f32", "gated_delta_rule_f32"],
    ),
];
