// Causal attention of new queries against a KV cache (f32/f16/bf16), with GQA, an optional
// sliding window and optional per-head sinks; semantics of ft_backend::reference::attention.
//
// One block per (head, token). Each warp walks every nw-th key with an online softmax
// (running max, running sum, accumulator of VPL values per lane, so v_head_dim ≤ 32·VPL);
// the warps' partial results are merged through shared memory at the end, together with the
// sink, which joins the softmax denominator but has no value. Dynamic shared memory:
// head_dim + 2·nw + nw·v_head_dim floats. A paged cache (page_rows > 0) is a pool: the
// sequence's row j lives at pool row pages[j / page_rows] * page_rows + j % page_rows
// (shaders/attention.wgsl reads pages the same way, and runs in CI on lavapipe).

template <int DT, int VPL>
__device__ __forceinline__ void attention_impl(const float* __restrict__ q, const void* __restrict__ kc,
                                               const void* __restrict__ vc,
                                               const float* __restrict__ sinks, float* __restrict__ out,
                                               u32 n_tokens, u32 n_heads, u32 n_kv_heads, u32 head_dim,
                                               u32 v_head_dim, u32 kv_len, float scale, u32 window,
                                               const u32* __restrict__ pages, u32 page_rows) {
    extern __shared__ float smem[];
    u32 h = blockIdx.x, t = blockIdx.y;
    u32 kvh = h / (n_heads / n_kv_heads);
    u32 pos = kv_len - n_tokens + t;
    u32 start = (window != 0 && pos + 1 > window) ? pos + 1 - window : 0;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;

    float* qs = smem;
    const float* qg = q + ((usize)t * n_heads + h) * head_dim;
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qg[d];
    __syncthreads();

    float m = -FT_INF, l = 0.0f;
    float o[VPL];
#pragma unroll
    for (int e = 0; e < VPL; ++e) o[e] = 0.0f;
    for (u32 j = start + warp; j <= pos; j += nw) {
        usize r = page_rows ? (usize)pages[j / page_rows] * page_rows + j % page_rows : j;
        usize kb = (r * n_kv_heads + kvh) * head_dim;
        float s = 0.0f;
        for (u32 d = lane; d < head_dim; d += 32) s = fmaf(qs[d], ld<DT>(kc, kb + d), s);
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn);
        float p = expf(s - mn);
        l = l * corr + p;
        usize vb = (r * n_kv_heads + kvh) * v_head_dim;
#pragma unroll
        for (int e = 0; e < VPL; ++e) {
            u32 c = lane + 32 * e;
            float vv = c < v_head_dim ? ld<DT>(vc, vb + c) : 0.0f;
            o[e] = fmaf(p, vv, o[e] * corr);
        }
        m = mn;
    }

    float* wm = qs + head_dim;
    float* wl = wm + nw;
    float* wo = wl + nw;
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < VPL; ++e) {
        u32 c = lane + 32 * e;
        if (c < v_head_dim) wo[(usize)warp * v_head_dim + c] = o[e];
    }
    __syncthreads();
    float mx = sinks ? sinks[h] : -FT_INF;
    for (int w = 0; w < nw; ++w) mx = fmaxf(mx, wm[w]);
    float denom = sinks ? expf(sinks[h] - mx) : 0.0f;
    for (int w = 0; w < nw; ++w) denom += wl[w] * expf(wm[w] - mx);
    float inv = 1.0f / denom;
    float* og = out + ((usize)t * n_heads + h) * v_head_dim;
    for (u32 c = threadIdx.x; c < v_head_dim; c += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < nw; ++w) acc += wo[(usize)w * v_head_dim + c] * expf(wm[w] - mx);
        og[c] = acc * inv;
    }
}

#define ATTN(NAME, DT, VPL)                                                                      \
    extern "C" __global__ void attention_##NAME##_v##VPL(                                        \
        const float* q, const void* kc, const void* vc, const float* sinks, float* out,          \
        u32 n_tokens, u32 n_heads, u32 n_kv_heads, u32 head_dim, u32 v_head_dim, u32 kv_len,     \
        float scale, u32 window, const u32* pages, u32 page_rows) {                              \
        attention_impl<DT, VPL>(q, kc, vc, sinks, out, n_tokens, n_heads, n_kv_heads, head_dim,  \
                                v_head_dim, kv_len, scale, window, pages, page_rows);            \
    }
ATTN(f32, DT_F32, 4)
ATTN(f32, DT_F32, 8)
ATTN(f32, DT_F32, 16)
ATTN(f16, DT_F16, 4)
ATTN(f16, DT_F16, 8)
ATTN(f16, DT_F16, 16)
ATTN(bf16, DT_BF16, 4)
ATTN(bf16, DT_BF16, 8)
ATTN(bf16, DT_BF16, 16)
