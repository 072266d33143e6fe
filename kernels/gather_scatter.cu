// Row gather from a table of any dtype into f32, and the scaled scatter-add that combines
// expert outputs into tokens. Ids are checked on the host before launch.

template <int DT>
__device__ __forceinline__ void gather_impl(const void* __restrict__ src, const u32* __restrict__ ids,
                                            u32 cols, float* __restrict__ out) {
    usize base = (usize)ids[blockIdx.y] * cols;
    float* o = out + (usize)blockIdx.y * cols;
    for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
        o[c] = ld<DT>(src, base + c);
}

#define GATHER(NAME, DT)                                                                        \
    extern "C" __global__ void gather_rows_##NAME(const void* src, const u32* ids, u32 cols,    \
                                                  float* out) {                                 \
        gather_impl<DT>(src, ids, cols, out);                                                   \
    }
GATHER(f32, DT_F32)
GATHER(f16, DT_F16)
GATHER(bf16, DT_BF16)

// The host groups the (row, scale, source) triples by destination row, keeping their order:
// group g adds entries order[start[g] .. start[g+1]] into acc row dest[g]. One block row per
// group and one thread per column, so no two threads touch the same element and the sum is
// formed in the reference's order.
extern "C" __global__ void scatter_add_rows_f32(float* acc, const float* __restrict__ x,
                                                const u32* __restrict__ dest,
                                                const u32* __restrict__ start,
                                                const u32* __restrict__ order,
                                                const float* __restrict__ scales, u32 cols) {
    u32 g = blockIdx.y;
    float* a = acc + (usize)dest[g] * cols;
    u32 s0 = start[g], s1 = start[g + 1];
    for (u32 c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
        float v = a[c];
        for (u32 e = s0; e < s1; ++e) {
            u32 i = order[e];
            v += scales[i] * x[(usize)i * cols + c];
        }
        a[c] = v;
    }
}
