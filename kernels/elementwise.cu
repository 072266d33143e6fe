// Element-wise ops on f32: a = op(a, b) and x *= s, and f32 values stored as f16 or bf16 (new
// rows of a narrow KV cache). Grid-stride loops, one launch each.

#define OP_ADD 0
#define OP_MUL 1
#define OP_MUL_SIGMOID 2
#define OP_SWIGLU 3
#define OP_CLAMPED_SWIGLU 4
#define OP_LIMITED_SWIGLU 5

extern "C" __global__ void binary_f32(float* a, const float* __restrict__ b, u64 n, u32 op,
                                      float alpha, float limit) {
    for (usize i = (usize)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (usize)gridDim.x * blockDim.x) {
        float x = a[i], y = b[i];
        float r;
        switch (op) {
            case OP_ADD: r = x + y; break;
            case OP_MUL: r = x * y; break;
            case OP_MUL_SIGMOID: r = x * sigmoidf_(y); break;
            case OP_SWIGLU: r = x * sigmoidf_(x) * y; break;
            case OP_LIMITED_SWIGLU: {
                float g = fminf(x, limit);
                r = g * sigmoidf_(g) * fminf(fmaxf(y, -limit), limit);
                break;
            }
            default: {
                float g = fminf(x, limit);
                float u = fminf(fmaxf(y, -limit), limit);
                r = g * sigmoidf_(alpha * g) * (u + 1.0f);
            }
        }
        a[i] = r;
    }
}

extern "C" __global__ void scale_f32(float* x, u64 n, float s) {
    for (usize i = (usize)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (usize)gridDim.x * blockDim.x)
        x[i] *= s;
}

// Round to nearest even, in integer arithmetic so the result never depends on a compiler's
// float conversion; f16 saturates at ±65504 where it would overflow. The same steps as
// copy16 in shaders/rows.wgsl.
__device__ __forceinline__ u32 f32_to_bf16_bits(u32 b) {
    if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40u;
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ u32 f32_to_f16_bits(u32 b) {
    u32 sign = (b >> 16) & 0x8000u;
    u32 a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7bffu;  // saturate: a cache never holds infinity
    if (a >= 0x38800000u) {
        u32 r = a - 0x38000000u;
        return sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13);
    }
    if (a < 0x33000000u) return sign;
    u32 e = a >> 23;
    u32 mant = (a & 0x7fffffu) | 0x800000u;
    u32 shift = 126u - e;
    u32 q = mant >> shift;
    u32 rem = mant & ((1u << shift) - 1u);
    u32 half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    return sign | q;
}

extern "C" __global__ void store_f16(const float* __restrict__ src, u16* dst, u64 n) {
    for (usize i = (usize)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (usize)gridDim.x * blockDim.x)
        dst[i] = (u16)f32_to_f16_bits(__float_as_uint(src[i]));
}

extern "C" __global__ void store_bf16(const float* __restrict__ src, u16* dst, u64 n) {
    for (usize i = (usize)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (usize)gridDim.x * blockDim.x)
        dst[i] = (u16)f32_to_bf16_bits(__float_as_uint(src[i]));
}
