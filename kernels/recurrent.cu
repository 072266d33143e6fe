// Recurrent-layer ops of Gated DeltaNet: the depthwise causal convolution with carried state
// and the gated delta rule; semantics of ft_backend::reference.

// out[t, c] = act(Σ_j w[c, j] · u[t + j, c]), u = state rows then x rows. One thread per
// (token, channel); the state is updated by the second kernel, launched after this one.
template <int DT>
__device__ __forceinline__ void conv_impl(const float* __restrict__ x, const void* __restrict__ w,
                                          const float* __restrict__ state, float* __restrict__ out,
                                          u32 n_tokens, u32 channels, u32 kernel, u32 silu) {
    usize idx = (usize)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (usize)n_tokens * channels) return;
    u32 c = (u32)(idx % channels), t = (u32)(idx / channels);
    u32 hist = kernel - 1;
    float acc = 0.0f;
    for (u32 j = 0; j < kernel; ++j) {
        u32 r = t + j;
        float u = r < hist ? state[(usize)r * channels + c] : x[(usize)(r - hist) * channels + c];
        acc = fmaf(ld<DT>(w, (usize)c * kernel + j), u, acc);
    }
    out[idx] = silu ? acc * sigmoidf_(acc) : acc;
}

#define CONV(NAME, DT)                                                                           \
    extern "C" __global__ void causal_conv1d_##NAME(const float* x, const void* w,               \
                                                    const float* state, float* out, u32 n_tokens, \
                                                    u32 channels, u32 kernel, u32 silu) {        \
        conv_impl<DT>(x, w, state, out, n_tokens, channels, kernel, silu);                       \
    }
CONV(f32, DT_F32)
CONV(f16, DT_F16)
CONV(bf16, DT_BF16)

// state ← the last kernel − 1 rows of u. One thread per channel, rows in increasing order:
// row r reads u[n_tokens + r], which lies at or after anything this thread already wrote.
extern "C" __global__ void conv_state_update_f32(const float* __restrict__ x, float* state,
                                                 u32 n_tokens, u32 channels, u32 kernel) {
    u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    u32 hist = kernel - 1;
    for (u32 r = 0; r < hist; ++r) {
        u32 src = n_tokens + r;
        float u = src < hist ? state[(usize)src * channels + c] : x[(usize)(src - hist) * channels + c];
        state[(usize)r * channels + c] = u;
    }
}

// The gated delta rule, one block per value head, the steps in order. Thread j owns column j
// of the head's state S[dk, dv] (so the state's updates need no synchronisation); the
// normalised q and k of the step are shared. Dynamic shared memory: 2·dk floats.
extern "C" __global__ void gated_delta_rule_f32(const float* __restrict__ qkv,
                                                const float* __restrict__ beta_logits,
                                                const float* __restrict__ decay_in,
                                                const float* __restrict__ a_log,
                                                const float* __restrict__ dt_bias, float* state,
                                                float* __restrict__ out, u32 n_tokens, u32 hk,
                                                u32 hv, u32 dk, u32 dv, float eps, float scale) {
    extern __shared__ float sm[];
    __shared__ float scratch[32];
    float* qs = sm;
    float* ks = sm + dk;
    u32 h = blockIdx.x;
    u32 kh = h / (hv / hk);
    usize row = 2 * (usize)hk * dk + (usize)hv * dv;
    float* S = state + (usize)h * dk * dv;
    for (u32 t = 0; t < n_tokens; ++t) {
        const float* r = qkv + (usize)t * row;
        float sq = 0.0f, sk = 0.0f;
        for (u32 d = threadIdx.x; d < dk; d += blockDim.x) {
            float qv = r[(usize)kh * dk + d], kv = r[(usize)hk * dk + (usize)kh * dk + d];
            qs[d] = qv;
            ks[d] = kv;
            sq = fmaf(qv, qv, sq);
            sk = fmaf(kv, kv, sk);
        }
        sq = block_sum(sq, scratch);
        sk = block_sum(sk, scratch);
        float iq = scale / sqrtf(sq + eps), ik = 1.0f / sqrtf(sk + eps);
        for (u32 d = threadIdx.x; d < dk; d += blockDim.x) {
            qs[d] *= iq;
            ks[d] *= ik;
        }
        __syncthreads();
        float beta = sigmoidf_(beta_logits[(usize)t * hv + h]);
        float xin = decay_in[(usize)t * hv + h] + dt_bias[h];
        float sp = xin > 20.0f ? xin : log1pf(expf(xin));
        // exp(g) with g down to about −16·softplus: formed in f64 as the reference does.
        float decay = (float)exp(-exp((double)a_log[h]) * (double)sp);
        const float* v = r + 2 * (usize)hk * dk + (usize)h * dv;
        for (u32 j = threadIdx.x; j < dv; j += blockDim.x) {
            float mem = 0.0f;
            for (u32 i = 0; i < dk; ++i) {
                float s = S[(usize)i * dv + j] * decay;
                S[(usize)i * dv + j] = s;
                mem = fmaf(ks[i], s, mem);
            }
            float delta = (v[j] - mem) * beta;
            float acc = 0.0f;
            for (u32 i = 0; i < dk; ++i) {
                float s = fmaf(ks[i], delta, S[(usize)i * dv + j]);
                S[(usize)i * dv + j] = s;
                acc = fmaf(qs[i], s, acc);
            }
            out[((usize)t * hv + h) * dv + j] = acc;
        }
        __syncthreads();
    }
}
