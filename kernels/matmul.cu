// out[n, m] = x[n, k] · w[m, k]ᵀ (+ bias[m]); x, bias, out f32, w f32/f16/bf16.
// Pointers arrive already offset (MatmulDesc offsets are applied on the host), so a weight
// row may start at any element: the GEMV peels elements until it can use 16-byte loads.

// GEMV (and n ≤ a few tokens): one warp per output row, grid (ceil(m / warps), n).
template <int DT>
__device__ __forceinline__ void gemv_impl(const float* __restrict__ x, const void* __restrict__ w,
                                          const float* __restrict__ bias, float* __restrict__ out,
                                          u32 n, u32 k, u32 m) {
    u32 lane = threadIdx.x & 31;
    u32 row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    u32 tok = blockIdx.y;
    if (row >= m || tok >= n) return;
    const float* xr = x + (usize)tok * k;
    float acc = 0.0f;
    if (DT == DT_F32) {
        const float* wr = (const float*)w + (usize)row * k;
        u32 head = (u32)(((16u - ((usize)wr & 15u)) & 15u) / 4u);
        if (head > k) head = k;
        for (u32 p = lane; p < head; p += 32) acc = fmaf(xr[p], wr[p], acc);
        u32 nvec = (k - head) / 4u;
        const float4* wv = (const float4*)(wr + head);
#pragma unroll 4
        for (u32 v = lane; v < nvec; v += 32) {
            float4 q = wv[v];
            const float* xp = xr + head + v * 4u;
            acc = fmaf(xp[0], q.x, acc);
            acc = fmaf(xp[1], q.y, acc);
            acc = fmaf(xp[2], q.z, acc);
            acc = fmaf(xp[3], q.w, acc);
        }
        for (u32 p = head + nvec * 4u + lane; p < k; p += 32) acc = fmaf(xr[p], wr[p], acc);
    } else {
        const u16* wr = (const u16*)w + (usize)row * k;
        u32 head = (u32)(((16u - ((usize)wr & 15u)) & 15u) / 2u);
        if (head > k) head = k;
        for (u32 p = lane; p < head; p += 32) acc = fmaf(xr[p], ld<DT>(wr, p), acc);
        u32 nvec = (k - head) / 8u;
        const uint4* wv = (const uint4*)(wr + head);
#pragma unroll 4
        for (u32 v = lane; v < nvec; v += 32) {
            uint4 q = wv[v];
            const float* xp = xr + head + v * 8u;
            float a, b;
            unpack2<DT>(q.x, a, b); acc = fmaf(xp[0], a, acc); acc = fmaf(xp[1], b, acc);
            unpack2<DT>(q.y, a, b); acc = fmaf(xp[2], a, acc); acc = fmaf(xp[3], b, acc);
            unpack2<DT>(q.z, a, b); acc = fmaf(xp[4], a, acc); acc = fmaf(xp[5], b, acc);
            unpack2<DT>(q.w, a, b); acc = fmaf(xp[6], a, acc); acc = fmaf(xp[7], b, acc);
        }
        for (u32 p = head + nvec * 8u + lane; p < k; p += 32) acc = fmaf(xr[p], ld<DT>(wr, p), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(usize)tok * m + row] = acc + (bias ? bias[row] : 0.0f);
}

// Tiled GEMM for prefill: 64×64 output tile per block of 256 threads (4×4 each), k in
// steps of 16 through shared memory; weights are widened to f32 as they are staged.
#define TM 64
#define TN 64
#define TK 16
template <int DT>
__device__ __forceinline__ void gemm_impl(const float* __restrict__ x, const void* __restrict__ w,
                                          const float* __restrict__ bias, float* __restrict__ out,
                                          u32 n, u32 k, u32 m) {
    __shared__ float As[TK][TM + 4];
    __shared__ float Bs[TK][TN + 4];
    u32 row0 = blockIdx.y * TM, col0 = blockIdx.x * TN;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
    for (u32 k0 = 0; k0 < k; k0 += TK) {
        for (int e = threadIdx.x; e < TM * TK; e += blockDim.x) {
            int i = e / TK, kk = e % TK;
            u32 kg = k0 + kk;
            u32 r = row0 + i, c = col0 + i;
            As[kk][i] = (r < n && kg < k) ? x[(usize)r * k + kg] : 0.0f;
            Bs[kk][i] = (c < m && kg < k) ? ld<DT>(w, (usize)c * k + kg) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                a[q] = As[kk][ty + 16 * q];
                b[q] = Bs[kk][tx + 16 * q];
            }
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[q][r] = fmaf(a[q], b[r], acc[q][r]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        u32 r = row0 + ty + 16 * q;
        if (r >= n) continue;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            u32 c = col0 + tx + 16 * s;
            if (c < m) out[(usize)r * m + c] = acc[q][s] + (bias ? bias[c] : 0.0f);
        }
    }
}

#define MATMUL(NAME, DT)                                                                          \
    extern "C" __global__ void gemv_##NAME(const float* x, const void* w, const float* bias,      \
                                           float* out, u32 n, u32 k, u32 m) {                     \
        gemv_impl<DT>(x, w, bias, out, n, k, m);                                                  \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256) gemm_##NAME(                                \
        const float* x, const void* w, const float* bias, float* out, u32 n, u32 k, u32 m) {     \
        gemm_impl<DT>(x, w, bias, out, n, k, m);                                                  \
    }
MATMUL(f32, DT_F32)
MATMUL(f16, DT_F16)
MATMUL(bf16, DT_BF16)
