// Shared by every kernel file: the Rust side prepends this text before compiling each .cu,
// so NVRTC needs no include paths and no CUDA headers at all.
//
// Weight dtypes are a template parameter DT: 0 = f32, 1 = f16, 2 = bf16 (the order of
// DType::ALL on the Rust side). Narrow types are decoded with bit operations / one PTX cvt,
// never through cuda_fp16.h or cuda_bf16.h.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
// NVRTC predefines no size_t without headers; element indices above 2^32 need 64 bits.
typedef unsigned long long usize;

#define FT_INF __int_as_float(0x7f800000)

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Element i of a buffer of dtype DT, widened to f32 (exactly).
template <int DT>
__device__ __forceinline__ float ld(const void* p, usize i) {
    if (DT == DT_F32) return ((const float*)p)[i];
    if (DT == DT_F16) return f16_to_f32(((const u16*)p)[i]);
    return bf16_to_f32(((const u16*)p)[i]);
}

// Decodes the 32-bit word holding two narrow elements (low half first: little endian).
template <int DT>
__device__ __forceinline__ void unpack2(u32 w, float& a, float& b) {
    if (DT == DT_F16) {
        a = f16_to_f32((u16)(w & 0xffffu));
        b = f16_to_f32((u16)(w >> 16));
    } else {
        a = __uint_as_float(w << 16);
        b = __uint_as_float(w & 0xffff0000u);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds 32 floats; the trailing barrier lets callers reuse it at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    __syncthreads();
    return t;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch[lane] : -FT_INF;
    t = warp_max(t);
    __syncthreads();
    return t;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
