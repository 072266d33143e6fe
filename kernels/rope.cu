// Rotary embedding in place on f32 activations. The host computes each token's angles in
// f64 (accurate at large positions) and passes cos/sin, already multiplied by the scaling,
// as table[t * half + i] = (cos, sin). One thread per (token, head, pair).

extern "C" __global__ void rope_f32(float* x, const float2* __restrict__ table, u32 n_tokens,
                                    u32 n_heads, u32 head_stride, u32 row_stride, u32 rot_offset,
                                    u32 half, u32 interleaved) {
    usize idx = (usize)blockIdx.x * blockDim.x + threadIdx.x;
    usize total = (usize)n_tokens * n_heads * half;
    if (idx >= total) return;
    u32 i = (u32)(idx % half);
    usize th = idx / half;
    u32 h = (u32)(th % n_heads);
    u32 t = (u32)(th / n_heads);
    float2 cs = table[(usize)t * half + i];
    usize base = (usize)t * row_stride + (usize)h * head_stride + rot_offset;
    usize ia = interleaved ? base + 2 * i : base + i;
    usize ib = interleaved ? base + 2 * i + 1 : base + i + half;
    float a = x[ia], b = x[ib];
    x[ia] = a * cs.x - b * cs.y;
    x[ib] = b * cs.x + a * cs.y;
}
