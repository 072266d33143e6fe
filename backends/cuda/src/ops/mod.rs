//! The kernel ops of the trait: shape checks on the host, then one or two launches on the
//! compute stream.

pub(crate) mod attn;
pub(crate) mod linear;
pub(crate) mod quant;
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
        // Unreachable: block types go to `quant::matmul`, and `memory::ptr_at` refuses them
        // for every other kernel.
        _ => names[0],
    }
}

/// Blocks for a grid-stride loop over `n` elements: enough to fill the card, no more.
pub(crate) fn grid_1d(b: &CudaBackend, n: usize) -> u32 {
    let want = n.div_ceil(BLOCK as usize).max(1);
    want.min(b.sm_count as usize * 8) as u32
}

/// Every kernel the backend launches, by kernel file, with its parameter list: one letter
/// per parameter, `p` a device pointer, `l` a u64, `u` a u32, `f` an f32. Launches are
/// checked against it at run time, and the nvrtc_compile test checks it against the PTX, so
/// an argument list that disagrees with a kernel's signature cannot reach the GPU.
pub const KERNELS: &[(&str, &[(&str, &str)])] = &[
    (
        "matmul",
        &[
            ("gemv_f32", "ppppuuu"),
            ("gemv_f16", "ppppuuu"),
            ("gemv_bf16", "ppppuuu"),
            ("gemm_f32", "ppppuuu"),
            ("gemm_f16", "ppppuuu"),
            ("gemm_bf16", "ppppuuu"),
        ],
    ),
    (
        "matmul_quant",
        &[
            ("matmul_q_fp8", "ppppuuu"),
            ("matmul_q_nvfp4", "ppppuuu"),
            ("matmul_q_mxfp4", "ppppuuu"),
            ("matmul_q_q8_0", "ppppuuu"),
            ("matmul_q_q4_0", "ppppuuu"),
            ("matmul_q_q4_k", "ppppuuu"),
            ("matmul_q_q5_k", "ppppuuu"),
            ("matmul_q_q6_k", "ppppuuu"),
        ],
    ),
    ("norm", &[("rms_norm_f32", "pppufu"), ("rms_norm_f16", "pppufu"), ("rms_norm_bf16", "pppufu")]),
    ("rope", &[("rope_f32", "ppuuuuuuu")]),
    (
        "attention",
        &[
            ("attention_f32_v4", ATTN),
            ("attention_f32_v8", ATTN),
            ("attention_f32_v16", ATTN),
            ("attention_f16_v4", ATTN),
            ("attention_f16_v8", ATTN),
            ("attention_f16_v16", ATTN),
            ("attention_bf16_v4", ATTN),
            ("attention_bf16_v8", ATTN),
            ("attention_bf16_v16", ATTN),
        ],
    ),
    ("elementwise", &[("binary_f32", "ppluff"), ("scale_f32", "plf"), ("store_f16", "ppl"), ("store_bf16", "ppl")]),
    ("softmax_topk", &[("softmax_f32", "pu"), ("top_k_f32", "puupp")]),
    (
        "gather_scatter",
        &[
            ("gather_rows_f32", "ppup"),
            ("gather_rows_f16", "ppup"),
            ("gather_rows_bf16", "ppup"),
            ("scatter_add_rows_f32", "ppppppu"),
        ],
    ),
    (
        "recurrent",
        &[
            ("causal_conv1d_f32", "ppppuuuu"),
            ("causal_conv1d_f16", "ppppuuuu"),
            ("causal_conv1d_bf16", "ppppuuuu"),
            ("conv_state_update_f32", "ppuuu"),
            ("gated_delta_rule_f32", "pppppppuuuuuff"),
        ],
    ),
];

/// Parameters of every attention kernel.
const ATTN: &str = "pppppuuuuuufupu";

/// The kernel file and parameter letters of `kernel`.
pub fn kernel_info(kernel: &str) -> Option<(&'static str, &'static str)> {
    KERNELS
        .iter()
        .find_map(|(file, ks)| ks.iter().find(|(k, _)| *k == kernel).map(|(_, sig)| (*file, *sig)))
}
