// Host-side check of the block decoders of kernels/matmul_quant.cu (see host_decode.rs): the
// CUDA C up to the kernel body is compiled as plain C++ against the shims below and each
// unit decoder is compared bit for bit with ft_backend::quant::decode_block.
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <vector>
#include <cmath>
#define __device__
#define __forceinline__ inline
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long usize;
static inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
static inline u32 fbits(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
struct uint2 {
    u32 x, y;
};
static inline uint2 make_uint2(u32 a, u32 b) { return {a, b}; }
static inline float f16_to_f32(u16 h) {
    u32 s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 0x3ff;
    if (e == 0) { float v = (float)m * 5.9604644775390625e-8f; return s ? -v : v; }
    if (e == 31) return __uint_as_float((s << 31) | 0x7f800000u | (m << 13));
    return __uint_as_float((s << 31) | ((e + 112) << 23) | (m << 13));
}
#include DECODE_SOURCE
template <int Q> void run(const unsigned char* w, u32 be, u32 bb, u32 nb, const float* want, const char* name) {
    long bad = 0, total = 0;
    float wv[32];
    for (u32 b = 0; b < nb; ++b)
        for (u32 v0 = 0; v0 < be; v0 += 32) {
            decode_unit<Q>(w, (usize)b * bb, v0, wv);
            for (u32 i = 0; i < 32; ++i) {
                float g = wv[i], r = want[b * be + v0 + i];
                bool ok = (std::isnan(g) && std::isnan(r)) || fbits(g) == fbits(r) || (g == 0 && r == 0);
                total++;
                if (!ok && bad++ < 5) printf("  %s block %u value %u: %g vs %g\n", name, b, v0 + i, g, r);
            }
        }
    printf("%s: %ld/%ld values differ\n", name, bad, total);
}
int main(int argc, char** argv) {
    if (argc < 2) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 2;
    const char* names[] = {"fp8", "nvfp4", "mxfp4", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"};
    u32 hdr[4];
    while (fread(hdr, 4, 4, f) == 4) {
        u32 code = hdr[0], be = hdr[1], bb = hdr[2], nb = hdr[3];
        std::vector<unsigned char> bytes(nb * bb); fread(bytes.data(), 1, bytes.size(), f);
        std::vector<float> want(nb * be); fread(want.data(), 4, want.size(), f);
        const unsigned char* w = bytes.data(); const float* r = want.data(); const char* n = names[code];
        switch (code) {
            case 0: run<Q_FP8>(w, be, bb, nb, r, n); break;
            case 1: run<Q_NVFP4>(w, be, bb, nb, r, n); break;
            case 2: run<Q_MXFP4>(w, be, bb, nb, r, n); break;
            case 3: run<Q_Q8_0>(w, be, bb, nb, r, n); break;
            case 4: run<Q_Q4_0>(w, be, bb, nb, r, n); break;
            case 5: run<Q_Q4_K>(w, be, bb, nb, r, n); break;
            case 6: run<Q_Q5_K>(w, be, bb, nb, r, n); break;
            case 7: run<Q_Q6_K>(w, be, bb, nb, r, n); break;
        }
    }
}
