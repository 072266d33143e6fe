// Row-wise softmax in place, and per-row top-k selection, both on f32; one block per row.

extern "C" __global__ void softmax_f32(float* x, u32 cols) {
    __shared__ float scratch[32];
    float* row = x + (usize)blockIdx.x * cols;
    float mx = -FT_INF;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, row[c]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(row[c] - mx);
    sum = block_sum(sum, scratch);
    float inv = 1.0f / sum;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) row[c] = expf(row[c] - mx) * inv;
}

// A key whose unsigned order is f32::total_cmp's order (NaNs included), so selection ties and
// specials behave exactly as the reference's sort.
__device__ __forceinline__ u32 order_key(float v) {
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Packs (key, index) so that a larger value means "better": larger key, then lower index.
__device__ __forceinline__ u64 pack(u32 key, u32 idx) { return ((u64)key << 32) | (u64)(~idx); }

__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u64 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// k rounds of a block-wide arg-max; round r takes the best element strictly worse than the
// one round r−1 took, so nothing is marked and any row length works.
extern "C" __global__ void top_k_f32(const float* __restrict__ x, u32 cols, u32 k,
                                     u32* __restrict__ out_idx, float* __restrict__ out_val) {
    __shared__ u64 scratch[32];
    const float* row = x + (usize)blockIdx.x * cols;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u64 prev = ~0ull;
    for (u32 r = 0; r < k; ++r) {
        u64 best = 0;
        for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
            u64 p = pack(order_key(row[c]), c);
            if (p < prev && p > best) best = p;
        }
        best = warp_max_u64(best);
        if (lane == 0) scratch[warp] = best;
        __syncthreads();
        u64 t = lane < nw ? scratch[lane] : 0ull;
        t = warp_max_u64(t);
        __syncthreads();
        prev = t;
        if (threadIdx.x == 0) {
            u32 idx = ~(u32)(t & 0xffffffffu);
            out_idx[(usize)blockIdx.x * k + r] = idx;
            out_val[(usize)blockIdx.x * k + r] = row[idx];
        }
    }
}
