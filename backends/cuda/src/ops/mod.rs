//! The kernel ops of the trait: shape checks on the host, then one or two launches.

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
