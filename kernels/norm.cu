// Row-wise RMSNorm: out = x / sqrt(mean(x²) + eps) * g, g = w or 1 + w (unit_offset).
// One block per row; x and out f32, w f32/f16/bf16.

template <int DT>
__device__ __forceinline__ void rms_norm_impl(const float* __restrict__ x, const void* __restrict__ w,
                                              float* __restrict__ out, u32 dim, float eps,
                                              u32 unit_offset) {
    __shared__ float scratch[32];
    const float* xr = x + (usize)blockIdx.x * dim;
    float* orow = out + (usize)blockIdx.x * dim;
    float ss = 0.0f;
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) ss = fmaf(xr[c], xr[c], ss);
    ss = block_sum(ss, scratch);
    // Correctly rounded sqrt and division, not rsqrtf (2 ulp), to stay within 1e-5 of the
    // f64 reference.
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (u32 c = threadIdx.x; c < dim; c += blockDim.x) {
        float g = ld<DT>(w, c);
        if (unit_offset) g += 1.0f;
        orow[c] = (xr[c] * inv) * g;
    }
}

#define RMS(NAME, DT)                                                                           \
    extern "C" __global__ void rms_norm_##NAME(const float* x, const void* w, float* out,       \
                                               u32 dim, float eps, u32 unit_offset) {           \
        rms_norm_impl<DT>(x, w, out, dim, eps, unit_offset);                                    \
    }
RMS(f32, DT_F32)
RMS(f16, DT_F16)
RMS(bf16, DT_BF16)
