// Shared helpers, prepended to every op file. Narrow weights (f16/bf16) are stored as pairs
// in u32 words and decoded with bit operations, so no adapter needs the shader-f16 feature.

// Element types of a u32-word buffer: 0 = f32, 1 = f16, 2 = bf16 (codes set by the host).
const DT_F32: u32 = 0u;
const DT_F16: u32 = 1u;
const DT_BF16: u32 = 2u;

// Exact IEEE half → single conversion, subnormals, infinities and NaNs included.
fn f16_bits_to_f32(h: u32) -> f32 {
    let s = (h >> 15u) & 1u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // m · 2⁻²⁴ is exact in f32.
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, s == 1u);
    }
    if (e == 31u) {
        return bitcast<f32>((s << 31u) | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>((s << 31u) | ((e + 112u) << 23u) | (m << 13u));
}

// Element `i` of a buffer of type `dt`, given the word that holds it.
fn decode(word: u32, i: u32, dt: u32) -> f32 {
    if (dt == DT_F32) {
        return bitcast<f32>(word);
    }
    let h = (word >> ((i & 1u) * 16u)) & 0xffffu;
    if (dt == DT_BF16) {
        return bitcast<f32>(h << 16u);
    }
    return f16_bits_to_f32(h);
}

// Index of the word holding element `i` of a buffer of type `dt`.
fn word_of(i: u32, dt: u32) -> u32 {
    return select(i >> 1u, i, dt == DT_F32);
}

// Flattens a 2-D dispatch (large grids exceed 65535 groups per dimension).
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// Stands in for −∞: exp(NEG_BIG − finite) is 0, and NEG_BIG − NEG_BIG is not NaN.
const NEG_BIG: f32 = -3.0e38;
