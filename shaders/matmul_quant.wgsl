// out[t, j] = Σₚ x[t, p] · w[j, p] (+ bias[j]) with w in a block-quantized dtype (QDT), the
// blocks decoded in the kernel exactly as ft_backend::quant::decode_block does (same f32
// operations in the same order), products accumulated in f32.
//
// The weights are raw bytes in a u32-word buffer: WGSL has no 8-bit type, and blocks of
// 17, 18, 34, 132, 148 or 210 bytes start at any byte, so bytes are extracted from words
// (`byte_at`, `u16_at`, and `word_at`, which joins two words for 4 bytes at any offset).
// Row j starts at byte w_byte + j · row_bytes; a row holds ceil(k / block) whole blocks.
//
// One workgroup per (output row j, block of TB tokens), as matmul.wgsl. The row is cut into
// units of 32 values (every block size is a multiple of 32, so a unit never straddles a
// block and shares one scale, or two for the 16-value scales of NVFP4 and Q6_K); threads
// stride over units, decode one into `wv`, and apply it to each token; a tree reduction
// combines the threads' f32 partial sums. Values past k (a partial last block's zero
// padding) are never multiplied: x has no elements there.
//
// The CUDA backend's kernels/matmul_quant.cu mirrors this file function for function.

struct Params {
    n: u32,
    k: u32,
    m: u32,
    x_off: u32,
    w_byte: u32,
    b_off: u32,
    o_off: u32,
    has_bias: u32,
    tok_blocks: u32,
    row_bytes: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Block types (codes set by the host, src/quant.rs).
const Q_FP8: u32 = 0u;
const Q_NVFP4: u32 = 1u;
const Q_MXFP4: u32 = 2u;
const Q_Q8_0: u32 = 3u;
const Q_Q4_0: u32 = 4u;
const Q_Q4_K: u32 = 5u;
const Q_Q5_K: u32 = 6u;
const Q_Q6_K: u32 = 7u;

override QDT: u32 = 0u;
const WG: u32 = 64u;
const TB: u32 = 4u;
const UNIT: u32 = 32u;

var<workgroup> red: array<f32, 256>; // WG × TB
// The decoded weights of the current unit.
var<private> wv: array<f32, 32>;

// Byte `a` of the weights.
fn byte_at(a: u32) -> u32 {
    return (w[a >> 2u] >> ((a & 3u) * 8u)) & 0xffu;
}

// Bytes a..a+2, little endian (the second word is read only when the pair straddles two).
fn u16_at(a: u32) -> u32 {
    let sh = (a & 3u) * 8u;
    if (sh <= 16u) {
        return (w[a >> 2u] >> sh) & 0xffffu;
    }
    return byte_at(a) | (byte_at(a + 1u) << 8u);
}

// Bytes a..a+4, little endian, at any byte offset (all four must lie in the buffer).
fn word_at(a: u32) -> u32 {
    let i = a >> 2u;
    let sh = (a & 3u) * 8u;
    if (sh == 0u) {
        return w[i];
    }
    return (w[i] >> sh) | (w[i + 1u] << (32u - sh));
}

// Byte e (0..4) of a word.
fn byte_of(c: u32, e: u32) -> u32 {
    return (c >> (8u * e)) & 0xffu;
}

// A byte as a signed 8-bit value.
fn i8_of(b: u32) -> f32 {
    return f32(bitcast<i32>(b << 24u) >> 24u);
}

// E4M3 (float8_e4m3fn) from bits: bias 7, S.1111.111 NaN, subnormals man · 2⁻⁹.
fn e4m3(c: u32) -> f32 {
    let e = (c >> 3u) & 15u;
    let mn = c & 7u;
    var v: f32;
    if (e == 15u && mn == 7u) {
        v = bitcast<f32>(0x7f800000u | (mn << 20u));
    } else if (e == 0u) {
        v = f32(mn) * 0.001953125;
    } else {
        v = bitcast<f32>(((e + 120u) << 23u) | (mn << 20u));
    }
    return select(v, -v, (c & 0x80u) != 0u);
}

// E2M1 nibble from bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign.
fn e2m1(c: u32) -> f32 {
    let e = (c >> 1u) & 3u;
    let mn = c & 1u;
    var v = f32(mn) * 0.5;
    if (e != 0u) {
        v = bitcast<f32>(((e + 126u) << 23u) | (mn << 22u));
    }
    return select(v, -v, (c & 8u) != 0u);
}

// E8M0: 2^(c − 127); 0 is the subnormal 2⁻¹²⁷, 255 NaN.
fn e8m0(c: u32) -> f32 {
    var bits = select(c << 23u, 0x00400000u, c == 0u);
    bits |= select(0u, 0x00400000u, c == 255u);
    return bitcast<f32>(bits);
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 bytes at a.
fn scale_min_k4(j: u32, a: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(a + j) & 63u, byte_at(a + j + 4u) & 63u);
    }
    let q = byte_at(a + j + 4u);
    return vec2<u32>((q & 15u) | ((byte_at(a + j - 4u) >> 6u) << 4u),
                     (q >> 4u) | ((byte_at(a + j) >> 6u) << 4u));
}

// FP8: [f32 scale][128 codes]; value = e4m3 · scale.
fn unit_fp8(rb: u32, v0: u32) {
    let b = rb + (v0 / 128u) * 132u;
    let s = bitcast<f32>(word_at(b));
    let q = b + 4u + v0 % 128u;
    for (var i = 0u; i < 8u; i++) {
        let c = word_at(q + 4u * i);
        for (var e = 0u; e < 4u; e++) {
            wv[4u * i + e] = e4m3(byte_of(c, e)) * s;
        }
    }
}

// NVFP4: [f32 global][16 e4m3 scales][128 bytes of pairs, low nibble first]; a unit is two
// 16-value groups; value = e2m1 · (e4m3 scale · global).
fn unit_nvfp4(rb: u32, v0: u32) {
    let b = rb + (v0 / 256u) * 148u;
    let g0 = (v0 % 256u) / 16u;
    let global = bitcast<f32>(word_at(b));
    for (var h = 0u; h < 2u; h++) {
        let s = e4m3(byte_at(b + 4u + g0 + h)) * global;
        let q = b + 20u + (g0 + h) * 8u;
        for (var i = 0u; i < 2u; i++) {
            let c = word_at(q + 4u * i);
            for (var e = 0u; e < 4u; e++) {
                let by = byte_of(c, e);
                let o = 16u * h + 8u * i + 2u * e;
                wv[o] = e2m1(by & 15u) * s;
                wv[o + 1u] = e2m1(by >> 4u) * s;
            }
        }
    }
}

// MXFP4: [e8m0 scale][16 bytes: value j low nibble, j + 16 high]; value = e2m1 · 2^(e−127).
fn unit_mxfp4(rb: u32, v0: u32) {
    let b = rb + (v0 / 32u) * 17u;
    let s = e8m0(byte_at(b));
    for (var i = 0u; i < 4u; i++) {
        let c = word_at(b + 1u + 4u * i);
        for (var e = 0u; e < 4u; e++) {
            let by = byte_of(c, e);
            wv[4u * i + e] = e2m1(by & 15u) * s;
            wv[4u * i + e + 16u] = e2m1(by >> 4u) * s;
        }
    }
}

// Q8_0: [f16 d][32 × i8]; value = q · d.
fn unit_q8_0(rb: u32, v0: u32) {
    let b = rb + (v0 / 32u) * 34u;
    let d = f16_bits_to_f32(u16_at(b));
    for (var i = 0u; i < 8u; i++) {
        let c = word_at(b + 2u + 4u * i);
        for (var e = 0u; e < 4u; e++) {
            wv[4u * i + e] = i8_of(byte_of(c, e)) * d;
        }
    }
}

// Q4_0: [f16 d][16 bytes: value j low nibble, j + 16 high, each offset by 8]; value = (q−8)·d.
fn unit_q4_0(rb: u32, v0: u32) {
    let b = rb + (v0 / 32u) * 18u;
    let d = f16_bits_to_f32(u16_at(b));
    for (var i = 0u; i < 4u; i++) {
        let c = word_at(b + 2u + 4u * i);
        for (var e = 0u; e < 4u; e++) {
            let by = byte_of(c, e);
            wv[4u * i + e] = f32(i32(by & 15u) - 8) * d;
            wv[4u * i + e + 16u] = f32(i32(by >> 4u) - 8) * d;
        }
    }
}

// Q4_K: [f16 d][f16 dmin][12 bytes scales/mins][128 bytes qs]; sub-block s of 32 values
// reads nibble s % 2 of qs[32·(s/2) ..]; value = (d · sc) · q − (dmin · m).
fn unit_q4_k(rb: u32, v0: u32) {
    let b = rb + (v0 / 256u) * 144u;
    let s = (v0 % 256u) / 32u;
    let d = f16_bits_to_f32(u16_at(b));
    let dmin = f16_bits_to_f32(u16_at(b + 2u));
    let sm = scale_min_k4(s, b + 4u);
    let d0 = d * f32(sm.x);
    let n0 = dmin * f32(sm.y);
    let q = b + 16u + 32u * (s / 2u);
    let sh = 4u * (s % 2u);
    for (var i = 0u; i < 8u; i++) {
        let c = word_at(q + 4u * i);
        for (var e = 0u; e < 4u; e++) {
            wv[4u * i + e] = d0 * f32((byte_of(c, e) >> sh) & 15u) - n0;
        }
    }
}

// Q5_K: Q4_K plus [32 bytes qh] before qs: bit s of qh[l] is the fifth bit of value 32s + l.
fn unit_q5_k(rb: u32, v0: u32) {
    let b = rb + (v0 / 256u) * 176u;
    let s = (v0 % 256u) / 32u;
    let d = f16_bits_to_f32(u16_at(b));
    let dmin = f16_bits_to_f32(u16_at(b + 2u));
    let sm = scale_min_k4(s, b + 4u);
    let ds = d * f32(sm.x);
    let ms = dmin * f32(sm.y);
    let qh = b + 16u;
    let q = b + 48u + 32u * (s / 2u);
    let sh = 4u * (s % 2u);
    for (var i = 0u; i < 8u; i++) {
        let c = word_at(q + 4u * i);
        let h = word_at(qh + 4u * i);
        for (var e = 0u; e < 4u; e++) {
            let v = ((byte_of(c, e) >> sh) & 15u) | (((byte_of(h, e) >> s) & 1u) << 4u);
            wv[4u * i + e] = ds * f32(v) - ms;
        }
    }
}

// Q6_K: [128 bytes ql][64 bytes qh][16 × i8 scales][f16 d]; value v of the block: low bits
// from ql[64·(v/128) + w%64] (nibble w/64), high bits from qh[32·(v/128) + w%32] (bits
// 2·(w/32)), w = v % 128; value = (d · scale[v/16]) · (q − 32).
fn unit_q6_k(rb: u32, v0: u32) {
    let b = rb + (v0 / 256u) * 210u;
    let v = v0 % 256u;
    let h = v / 128u;
    let w0 = v % 128u;
    let ql = b + 64u * h + w0 % 64u;
    let lsh = 4u * (w0 / 64u);
    let qh = b + 128u + 32u * h;
    let hsh = 2u * (w0 / 32u);
    let d = f16_bits_to_f32(u16_at(b + 208u));
    let da = d * i8_of(byte_at(b + 192u + v / 16u));
    let db = d * i8_of(byte_at(b + 193u + v / 16u));
    for (var i = 0u; i < 8u; i++) {
        let c = word_at(ql + 4u * i);
        let hb = word_at(qh + 4u * i);
        let sc = select(db, da, i < 4u);
        for (var e = 0u; e < 4u; e++) {
            let q = ((byte_of(c, e) >> lsh) & 15u) | (((byte_of(hb, e) >> hsh) & 3u) << 4u);
            wv[4u * i + e] = sc * f32(i32(q) - 32);
        }
    }
}

// Decodes the 32 values of the row starting at byte rb that begin at value v0 into wv.
fn decode_unit(rb: u32, v0: u32) {
    if (QDT == Q_FP8) {
        unit_fp8(rb, v0);
    } else if (QDT == Q_NVFP4) {
        unit_nvfp4(rb, v0);
    } else if (QDT == Q_MXFP4) {
        unit_mxfp4(rb, v0);
    } else if (QDT == Q_Q8_0) {
        unit_q8_0(rb, v0);
    } else if (QDT == Q_Q4_0) {
        unit_q4_0(rb, v0);
    } else if (QDT == Q_Q4_K) {
        unit_q4_k(rb, v0);
    } else if (QDT == Q_Q5_K) {
        unit_q5_k(rb, v0);
    } else {
        unit_q6_k(rb, v0);
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    if (g >= p.m * p.tok_blocks) {
        return;
    }
    let j = g % p.m;
    let t0 = (g / p.m) * TB;
    let nt = min(TB, p.n - t0);
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    let rb = p.w_byte + j * p.row_bytes;
    let units = (p.k + UNIT - 1u) / UNIT;
    for (var u = lid; u < units; u += WG) {
        let v0 = u * UNIT;
        decode_unit(rb, v0);
        let cnt = min(UNIT, p.k - v0);
        for (var t = 0u; t < nt; t++) {
            let xb = p.x_off + (t0 + t) * p.k + v0;
            var s = 0.0;
            for (var i = 0u; i < cnt; i++) {
                s += x[xb + i] * wv[i];
            }
            acc[t] += s;
        }
    }
    for (var t = 0u; t < TB; t++) {
        red[lid * TB + t] = acc[t];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var t = 0u; t < TB; t++) {
                red[lid * TB + t] += red[(lid + s) * TB + t];
            }
        }
        workgroupBarrier();
    }
    if (lid < nt) {
        var v = red[lid];
        if (p.has_bias != 0u) {
            v += bias[p.b_off + j];
        }
        out[p.o_off + (t0 + lid) * p.m + j] = v;
    }
}
