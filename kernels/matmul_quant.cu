// out[n, m] = x[n, k] · w[m, k]ᵀ (+ bias[m]) with w in a block-quantized dtype (QDT), the
// blocks decoded in the kernel exactly as ft_backend::quant::decode_block does (same f32
// operations in the same order), products accumulated in f32.
//
// A port of shaders/matmul_quant.wgsl, function for function (the WGSL is the
// version the conformance suite runs in CI, on lavapipe); only the byte access differs: CUDA
// reads bytes directly where WGSL extracts them from u32 words.
//
// `w` arrives offset on the host to the first byte of the first row used (MatmulDesc's
// w_offset is on a block boundary); row j starts j · row_bytes later, a row holding
// ceil(k / block) whole blocks. One block of QM_WG threads per (output row, QM_TB tokens):
// the row is cut into 32-value units (every block size is a multiple of 32, so a unit lies
// in one block and shares one scale, or two for the 16-value scales of NVFP4 and Q6_K);
// threads stride over units, decode one into `wv`, apply it to each token, and a tree
// reduction in shared memory combines their partial sums. Values past k (a partial last
// block's zero padding) are never multiplied.

typedef unsigned char u8;

#define Q_FP8 0
#define Q_NVFP4 1
#define Q_MXFP4 2
#define Q_Q8_0 3
#define Q_Q4_0 4
#define Q_Q4_K 5
#define Q_Q5_K 6
#define Q_Q6_K 7

#define QM_WG 64
#define QM_TB 4
#define QM_UNIT 32

// Values and bytes per block (ft_backend::quant::block_elems / block_bytes).
template <int QDT> struct QBlock;
template <> struct QBlock<Q_FP8> { static constexpr u32 elems = 128, bytes = 132; };
template <> struct QBlock<Q_NVFP4> { static constexpr u32 elems = 256, bytes = 148; };
template <> struct QBlock<Q_MXFP4> { static constexpr u32 elems = 32, bytes = 17; };
template <> struct QBlock<Q_Q8_0> { static constexpr u32 elems = 32, bytes = 34; };
template <> struct QBlock<Q_Q4_0> { static constexpr u32 elems = 32, bytes = 18; };
template <> struct QBlock<Q_Q4_K> { static constexpr u32 elems = 256, bytes = 144; };
template <> struct QBlock<Q_Q5_K> { static constexpr u32 elems = 256, bytes = 176; };
template <> struct QBlock<Q_Q6_K> { static constexpr u32 elems = 256, bytes = 210; };

// Byte a of the weights.
__device__ __forceinline__ u32 byte_at(const u8* w, usize a) { return w[a]; }

// Bytes a..a+2, little endian.
__device__ __forceinline__ u32 u16_at(const u8* w, usize a) { return (u32)w[a] | ((u32)w[a + 1] << 8); }

// Bytes a..a+4, little endian, at any byte offset.
__device__ __forceinline__ u32 word_at(const u8* w, usize a) {
    return (u32)w[a] | ((u32)w[a + 1] << 8) | ((u32)w[a + 2] << 16) | ((u32)w[a + 3] << 24);
}

// Byte e (0..4) of a word.
__device__ __forceinline__ u32 byte_of(u32 c, u32 e) { return (c >> (8u * e)) & 0xffu; }

// A byte as a signed 8-bit value.
__device__ __forceinline__ float i8_of(u32 b) { return (float)((int)(b << 24) >> 24); }

// E4M3 (float8_e4m3fn) from bits: bias 7, S.1111.111 NaN, subnormals man · 2⁻⁹.
__device__ __forceinline__ float e4m3(u32 c) {
    u32 e = (c >> 3) & 15u;
    u32 mn = c & 7u;
    float v;
    if (e == 15u && mn == 7u) {
        v = __uint_as_float(0x7fc00000u);
    } else if (e == 0u) {
        v = (float)mn * 0.001953125f;
    } else {
        v = __uint_as_float(((e + 120u) << 23) | (mn << 20));
    }
    return (c & 0x80u) ? -v : v;
}

// E2M1 nibble from bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign.
__device__ __forceinline__ float e2m1(u32 c) {
    u32 e = (c >> 1) & 3u;
    u32 mn = c & 1u;
    float v = (float)mn * 0.5f;
    if (e != 0u) v = __uint_as_float(((e + 126u) << 23) | (mn << 22));
    return (c & 8u) ? -v : v;
}

// E8M0: 2^(c − 127); 0 is the subnormal 2⁻¹²⁷, 255 NaN.
__device__ __forceinline__ float e8m0(u32 c) {
    u32 bits = c == 0u ? 0x00400000u : (c << 23);
    bits |= c == 255u ? 0x00400000u : 0u;
    return __uint_as_float(bits);
}

// ggml's get_scale_min_k4: the 6-bit scale (x) and min (y) of sub-block j from the 12 bytes
// at a.
__device__ __forceinline__ uint2 scale_min_k4(const u8* w, u32 j, usize a) {
    if (j < 4u) return make_uint2(byte_at(w, a + j) & 63u, byte_at(w, a + j + 4) & 63u);
    u32 q = byte_at(w, a + j + 4);
    return make_uint2((q & 15u) | ((byte_at(w, a + j - 4) >> 6) << 4), (q >> 4) | ((byte_at(w, a + j) >> 6) << 4));
}

// FP8: [f32 scale][128 codes]; value = e4m3 · scale.
__device__ __forceinline__ void unit_fp8(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 128u) * 132u;
    float s = __uint_as_float(word_at(w, b));
    usize q = b + 4u + v0 % 128u;
#pragma unroll
    for (u32 i = 0; i < 8u; ++i) {
        u32 c = word_at(w, q + 4u * i);
#pragma unroll
        for (u32 e = 0; e < 4u; ++e) wv[4u * i + e] = e4m3(byte_of(c, e)) * s;
    }
}

// NVFP4: [f32 global][16 e4m3 scales][128 bytes of pairs, low nibble first]; a unit is two
// 16-value groups; value = e2m1 · (e4m3 scale · global).
__device__ __forceinline__ void unit_nvfp4(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 256u) * 148u;
    u32 g0 = (v0 % 256u) / 16u;
    float global = __uint_as_float(word_at(w, b));
#pragma unroll
    for (u32 h = 0; h < 2u; ++h) {
        float s = e4m3(byte_at(w, b + 4u + g0 + h)) * global;
        usize q = b + 20u + (g0 + h) * 8u;
#pragma unroll
        for (u32 i = 0; i < 2u; ++i) {
            u32 c = word_at(w, q + 4u * i);
#pragma unroll
            for (u32 e = 0; e < 4u; ++e) {
                u32 by = byte_of(c, e);
                u32 o = 16u * h + 8u * i + 2u * e;
                wv[o] = e2m1(by & 15u) * s;
                wv[o + 1u] = e2m1(by >> 4) * s;
            }
        }
    }
}

// MXFP4: [e8m0 scale][16 bytes: value j low nibble, j + 16 high]; value = e2m1 · 2^(e−127).
__device__ __forceinline__ void unit_mxfp4(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 32u) * 17u;
    float s = e8m0(byte_at(w, b));
#pragma unroll
    for (u32 i = 0; i < 4u; ++i) {
        u32 c = word_at(w, b + 1u + 4u * i);
#pragma unroll
        for (u32 e = 0; e < 4u; ++e) {
            u32 by = byte_of(c, e);
            wv[4u * i + e] = e2m1(by & 15u) * s;
            wv[4u * i + e + 16u] = e2m1(by >> 4) * s;
        }
    }
}

// Q8_0: [f16 d][32 × i8]; value = q · d.
__device__ __forceinline__ void unit_q8_0(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 32u) * 34u;
    float d = f16_to_f32((u16)u16_at(w, b));
#pragma unroll
    for (u32 i = 0; i < 8u; ++i) {
        u32 c = word_at(w, b + 2u + 4u * i);
#pragma unroll
        for (u32 e = 0; e < 4u; ++e) wv[4u * i + e] = i8_of(byte_of(c, e)) * d;
    }
}

// Q4_0: [f16 d][16 bytes: value j low nibble, j + 16 high, each offset by 8]; value = (q−8)·d.
__device__ __forceinline__ void unit_q4_0(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 32u) * 18u;
    float d = f16_to_f32((u16)u16_at(w, b));
#pragma unroll
    for (u32 i = 0; i < 4u; ++i) {
        u32 c = word_at(w, b + 2u + 4u * i);
#pragma unroll
        for (u32 e = 0; e < 4u; ++e) {
            u32 by = byte_of(c, e);
            wv[4u * i + e] = (float)((int)(by & 15u) - 8) * d;
            wv[4u * i + e + 16u] = (float)((int)(by >> 4) - 8) * d;
        }
    }
}

// Q4_K: [f16 d][f16 dmin][12 bytes scales/mins][128 bytes qs]; sub-block s of 32 values
// reads nibble s % 2 of qs[32·(s/2) ..]; value = (d · sc) · q − (dmin · m). The products
// are rounded separately (__fmul_rn/__fsub_rn: no contraction into an FMA), as ggml does.
__device__ __forceinline__ void unit_q4_k(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 256u) * 144u;
    u32 s = (v0 % 256u) / 32u;
    float d = f16_to_f32((u16)u16_at(w, b));
    float dmin = f16_to_f32((u16)u16_at(w, b + 2u));
    uint2 sm = scale_min_k4(w, s, b + 4u);
    float d0 = d * (float)sm.x;
    float n0 = dmin * (float)sm.y;
    usize q = b + 16u + 32u * (s / 2u);
    u32 sh = 4u * (s % 2u);
#pragma unroll
    for (u32 i = 0; i < 8u; ++i) {
        u32 c = word_at(w, q + 4u * i);
#pragma unroll
        for (u32 e = 0; e < 4u; ++e) wv[4u * i + e] = __fsub_rn(__fmul_rn(d0, (float)((byte_of(c, e) >> sh) & 15u)), n0);
    }
}

// Q5_K: Q4_K plus [32 bytes qh] before qs: bit s of qh[l] is the fifth bit of value 32s + l.
__device__ __forceinline__ void unit_q5_k(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 256u) * 176u;
    u32 s = (v0 % 256u) / 32u;
    float d = f16_to_f32((u16)u16_at(w, b));
    float dmin = f16_to_f32((u16)u16_at(w, b + 2u));
    uint2 sm = scale_min_k4(w, s, b + 4u);
    float ds = d * (float)sm.x;
    float ms = dmin * (float)sm.y;
    usize qh = b + 16u;
    usize q = b + 48u + 32u * (s / 2u);
    u32 sh = 4u * (s % 2u);
#pragma unroll
    for (u32 i = 0; i < 8u; ++i) {
        u32 c = word_at(w, q + 4u * i);
        u32 h = word_at(w, qh + 4u * i);
#pragma unroll
        for (u32 e = 0; e < 4u; ++e) {
            u32 v = ((byte_of(c, e) >> sh) & 15u) | (((byte_of(h, e) >> s) & 1u) << 4);
            wv[4u * i + e] = __fsub_rn(__fmul_rn(ds, (float)v), ms);
        }
    }
}

// Q6_K: [128 bytes ql][64 bytes qh][16 × i8 scales][f16 d]; value v of the block: low bits
// from ql[64·(v/128) + w%64] (nibble w/64), high bits from qh[32·(v/128) + w%32] (bits
// 2·(w/32)), w = v % 128; value = (d · scale[v/16]) · (q − 32).
__device__ __forceinline__ void unit_q6_k(const u8* w, usize rb, u32 v0, float* wv) {
    usize b = rb + (usize)(v0 / 256u) * 210u;
    u32 v = v0 % 256u;
    u32 h = v / 128u;
    u32 w0 = v % 128u;
    usize ql = b + 64u * h + w0 % 64u;
    u32 lsh = 4u * (w0 / 64u);
    usize qh = b + 128u + 32u * h;
    u32 hsh = 2u * (w0 / 32u);
    float d = f16_to_f32((u16)u16_at(w, b + 208u));
    float da = d * i8_of(byte_at(w, b + 192u + v / 16u));
    float db = d * i8_of(byte_at(w, b + 193u + v / 16u));
#pragma unroll
    for (u32 i = 0; i < 8u; ++i) {
        u32 c = word_at(w, ql + 4u * i);
        u32 hb = word_at(w, qh + 4u * i);
        float sc = i < 4u ? da : db;
#pragma unroll
        for (u32 e = 0; e < 4u; ++e) {
            u32 q = ((byte_of(c, e) >> lsh) & 15u) | (((byte_of(hb, e) >> hsh) & 3u) << 4);
            wv[4u * i + e] = sc * (float)((int)q - 32);
        }
    }
}

// Decodes the 32 values of the row starting at byte rb that begin at value v0 into wv.
template <int QDT>
__device__ __forceinline__ void decode_unit(const u8* w, usize rb, u32 v0, float* wv) {
    if (QDT == Q_FP8) unit_fp8(w, rb, v0, wv);
    else if (QDT == Q_NVFP4) unit_nvfp4(w, rb, v0, wv);
    else if (QDT == Q_MXFP4) unit_mxfp4(w, rb, v0, wv);
    else if (QDT == Q_Q8_0) unit_q8_0(w, rb, v0, wv);
    else if (QDT == Q_Q4_0) unit_q4_0(w, rb, v0, wv);
    else if (QDT == Q_Q4_K) unit_q4_k(w, rb, v0, wv);
    else if (QDT == Q_Q5_K) unit_q5_k(w, rb, v0, wv);
    else unit_q6_k(w, rb, v0, wv);
}

// Grid (m, ceil(n / QM_TB)), QM_WG threads.
template <int QDT>
__device__ __forceinline__ void matmul_quant_impl(const float* __restrict__ x, const u8* __restrict__ w,
                                                  const float* __restrict__ bias, float* __restrict__ out,
                                                  u32 n, u32 k, u32 m) {
    __shared__ float red[QM_WG * QM_TB];
    u32 lid = threadIdx.x;
    u32 j = blockIdx.x;
    u32 t0 = blockIdx.y * QM_TB;
    // Uniform over the block, so no thread misses the barriers below.
    if (j >= m || t0 >= n) return;
    u32 nt = min((u32)QM_TB, n - t0);
    float acc[QM_TB];
#pragma unroll
    for (u32 t = 0; t < QM_TB; ++t) acc[t] = 0.0f;
    usize row_bytes = (usize)((k + QBlock<QDT>::elems - 1u) / QBlock<QDT>::elems) * QBlock<QDT>::bytes;
    usize rb = (usize)j * row_bytes;
    u32 units = (k + QM_UNIT - 1u) / QM_UNIT;
    float wv[QM_UNIT];
    for (u32 u = lid; u < units; u += QM_WG) {
        u32 v0 = u * QM_UNIT;
        decode_unit<QDT>(w, rb, v0, wv);
        u32 cnt = min((u32)QM_UNIT, k - v0);
#pragma unroll
        for (u32 t = 0; t < QM_TB; ++t) {
            if (t < nt) {
                const float* xr = x + (usize)(t0 + t) * k + v0;
                float s = 0.0f;
#pragma unroll
                for (u32 i = 0; i < QM_UNIT; ++i) {
                    if (i < cnt) s += xr[i] * wv[i];
                }
                acc[t] += s;
            }
        }
    }
#pragma unroll
    for (u32 t = 0; t < QM_TB; ++t) red[lid * QM_TB + t] = acc[t];
    __syncthreads();
    for (u32 s = QM_WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) {
#pragma unroll
            for (u32 t = 0; t < QM_TB; ++t) red[lid * QM_TB + t] += red[(lid + s) * QM_TB + t];
        }
        __syncthreads();
    }
    if (lid < nt) {
        float v = red[lid];
        if (bias) v += bias[j];
        out[(usize)(t0 + lid) * m + j] = v;
    }
}

#define MATMUL_QUANT(NAME, QDT)                                                                     \
    extern "C" __global__ void __launch_bounds__(QM_WG) matmul_q_##NAME(                           \
        const float* x, const void* w, const float* bias, float* out, u32 n, u32 k, u32 m) {        \
        matmul_quant_impl<QDT>(x, (const u8*)w, bias, out, n, k, m);                                 \
    }
MATMUL_QUANT(fp8, Q_FP8)
MATMUL_QUANT(nvfp4, Q_NVFP4)
MATMUL_QUANT(mxfp4, Q_MXFP4)
MATMUL_QUANT(q8_0, Q_Q8_0)
MATMUL_QUANT(q4_0, Q_Q4_0)
MATMUL_QUANT(q4_k, Q_Q4_K)
MATMUL_QUANT(q5_k, Q_Q5_K)
MATMUL_QUANT(q6_k, Q_Q6_K)
