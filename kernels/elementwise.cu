// Element-wise ops on f32: a = op(a, b) and x *= s. Grid-stride loops, one launch each.

#define OP_ADD 0
#define OP_MUL 1
#define OP_MUL_SIGMOID 2
#define OP_SWIGLU 3
#define OP_CLAMPED_SWIGLU 4

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
