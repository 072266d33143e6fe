//! Block-quantized weight formats: the minifloat codes, the engine's packed block layouts,
//! and plain reference encoders/decoders that every kernel is checked against.
//!
//! A quantized matrix is stored row by row; each row is a whole number of self-contained
//! blocks (scales next to the values they scale), padded with zero values up to the block
//! size. Self-contained blocks let one expert, one row or one row range be sliced, copied
//! and cached without a second scale tensor travelling beside it (GGUF stores every block
//! type this way, and the engine's MXFP4 block is GGUF's byte for byte).
//!
//! | dtype | values per block | bytes | layout |
//! |---|---|---|---|
//! | [`DType::F8E4M3`] | 128 | 132 | f32 scale, 128 E4M3 codes |
//! | [`DType::Nvfp4`] | 256 | 148 | f32 global scale, 16 E4M3 scales (one per 16 values), 128 bytes of E2M1 pairs (low nibble first) |
//! | [`DType::Mxfp4`] | 32 | 17 | E8M0 scale, 16 bytes: byte `j` holds value `j` (low nibble) and `j + 16` (high) |
//! | [`DType::Q8_0`] | 32 | 34 | f16 `d`, 32 × i8 `qs` |
//! | [`DType::Q4_0`] | 32 | 18 | f16 `d`, 16 bytes `qs`: byte `j` holds value `j` (low nibble) and `j + 16` (high), each offset by 8 |
//! | [`DType::Q4K`] | 256 | 144 | f16 `d`, f16 `dmin`, 12 bytes of eight 6-bit scales and mins ([`scale_min_k4`]), 128 bytes `qs`: per 64 values 32 bytes, low nibbles values 0..32, high nibbles 32..64 |
//! | [`DType::Q5K`] | 256 | 176 | f16 `d`, f16 `dmin`, 12 bytes scales and mins, 32 bytes `qh` (bit `s` of byte `l`: 5th bit of value `32s + l`), 128 bytes `qs` as Q4_K |
//! | [`DType::Q6K`] | 256 | 210 | 128 bytes `ql` (low 4 bits), 64 bytes `qh` (high 2 bits), 16 × i8 scales (one per 16 values), f16 `d` |
//!
//! The five GGML types are GGUF's blocks byte for byte (`block_q8_0`, `block_q4_0`,
//! `block_q4_K`, `block_q5_K`, `block_q6_K` of ggml), so GGUF tensor data is used in place.
//!
//! Dequantization is exactly the publishers' arithmetic: FP8 `code · scale_inv` (the
//! checkpoint's `weight_scale_inv`); NVFP4 `e2m1 · (f32(e4m3 scale) · global)`, the product of
//! the two scales taken in f32 first, as ModelOpt does; MXFP4 `e2m1 · 2^(e − 127)`. The GGML
//! types follow ggml's `dequantize_row_*` in f32 without fused multiply-adds: Q8_0/Q4_0
//! `d · q`; Q4_K/Q5_K `(d · sc) · q − (dmin · m)`, both products taken first; Q6_K
//! `(d · scale) · (q − 32)`.

use crate::dtype::DType;

/// Values of the E2M1 (FP4) codes 0..8; code bit 3 is the sign.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The largest finite E4M3 (`float8_e4m3fn`) magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The value of an E4M3 code, built from bits (no `exp2` call: kernels decode a scale per 16
/// values, so this sits on the decode path).
const fn e4m3_value(code: u8) -> f32 {
    let exp = ((code >> 3) & 0x0f) as u32;
    let man = (code & 0x07) as u32;
    let mag = if exp == 15 && man == 7 {
        f32::NAN
    } else if exp == 0 {
        // Subnormal: man · 2⁻⁹, exact in f32.
        man as f32 * f32::from_bits((127 - 9) << 23)
    } else {
        f32::from_bits(((exp + 127 - 7) << 23) | (man << 20))
    };
    if code & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = e4m3_value(c as u8);
        c += 1;
    }
    t
}

/// Every E4M3 code's value.
static E4M3_TABLE: [f32; 256] = e4m3_table();

/// Decodes an E4M3 (`float8_e4m3fn`: bias 7, no infinities, `S.1111.111` is NaN) code.
#[inline]
pub fn e4m3_to_f32(code: u8) -> f32 {
    E4M3_TABLE[code as usize]
}

/// Encodes `x` as E4M3, rounding to nearest (ties to even) and saturating at ±448; NaN stays
/// NaN.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < (-6f32).exp2() {
        // Subnormals are multiples of 2⁻⁹; codes 0..=8 (8 being the smallest normal, 2⁻⁶).
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    // Normal: keep 3 of the 23 mantissa bits, rounding to nearest, ties to even.
    let bits = a.to_bits();
    let exp = (bits >> 23) as i32 - 127 + 7;
    let man = bits & 0x7f_ffff;
    let keep = man >> 20;
    let rest = man & 0xf_ffff;
    let up = rest > 0x8_0000 || (rest == 0x8_0000 && keep & 1 == 1);
    // A mantissa carry moves to the next binade, which the code arithmetic does by itself.
    let code = ((exp as u32) << 3) + keep + up as u32;
    sign | code.min(0x7e) as u8
}

/// Decodes an E2M1 nibble (low 4 bits of `code`).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let v = E2M1_VALUES[(code & 7) as usize];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Encodes `x` as an E2M1 nibble, rounding to nearest (ties to the even code) and saturating
/// at ±6.
pub fn f32_to_e2m1(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8u8 } else { 0 };
    let a = if x.is_nan() { 0.0 } else { x.abs() };
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for (c, v) in E2M1_VALUES.iter().enumerate() {
        let err = (v - a).abs();
        if err < best_err || (err == best_err && c & 1 == 0) {
            best = c as u8;
            best_err = err;
        }
    }
    // -0 and +0 are both code 0 for our purposes (the sign of zero never matters in a dot).
    if best == 0 {
        0
    } else {
        sign | best
    }
}

/// Decodes an E8M0 scale: `2^(code − 127)`; 255 is NaN. Built from bits (code 0 is the
/// subnormal 2⁻¹²⁷).
#[inline]
pub fn e8m0_to_f32(code: u8) -> f32 {
    match code {
        255 => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        c => f32::from_bits((c as u32) << 23),
    }
}

/// Values per GGML "K" super-block ([`DType::Q4K`], [`DType::Q5K`], [`DType::Q6K`]).
pub const QK_K: usize = 256;

/// The little-endian f16 at `src[at..at + 2]`, widened (exactly).
#[inline]
fn f16_at(src: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([src[at], src[at + 1]]).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed `scales` bytes of a
/// Q4_K or Q5_K block (ggml's `get_scale_min_k4`): bytes 0..4 hold the low 6 bits of scales
/// 0..4 and bytes 4..8 those of mins 0..4, their top 2 bits being the high bits of scales and
/// mins 4..8, whose low 4 bits are bytes 8..12 (scale low nibble, min high nibble).
#[inline]
pub fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Packs eight 6-bit scales and mins (values above 63 are masked) the way [`scale_min_k4`]
/// reads them.
pub fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for j in 0..4 {
        out[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        out[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        out[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
    }
    out
}

fn decode_q8_0(src: &[u8], dst: &mut [f32]) {
    let d = f16_at(src, 0);
    for (o, q) in dst[..32].iter_mut().zip(&src[2..34]) {
        *o = (*q as i8) as f32 * d;
    }
}

fn decode_q4_0(src: &[u8], dst: &mut [f32]) {
    let d = f16_at(src, 0);
    for (j, byte) in src[2..18].iter().enumerate() {
        dst[j] = ((byte & 0x0f) as i32 - 8) as f32 * d;
        dst[j + 16] = ((byte >> 4) as i32 - 8) as f32 * d;
    }
}

fn decode_q4_k(src: &[u8], dst: &mut [f32]) {
    let (d, dmin) = (f16_at(src, 0), f16_at(src, 2));
    let (scales, qs) = (&src[4..16], &src[16..144]);
    for c in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * c, scales);
        let (sc1, m1) = scale_min_k4(2 * c + 1, scales);
        let (d0, n0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, n1) = (d * sc1 as f32, dmin * m1 as f32);
        for (l, byte) in qs[32 * c..32 * c + 32].iter().enumerate() {
            dst[64 * c + l] = d0 * (byte & 0x0f) as f32 - n0;
            dst[64 * c + 32 + l] = d1 * (byte >> 4) as f32 - n1;
        }
    }
}

fn decode_q5_k(src: &[u8], dst: &mut [f32]) {
    let (d, dmin) = (f16_at(src, 0), f16_at(src, 2));
    let (scales, qh, qs) = (&src[4..16], &src[16..48], &src[48..176]);
    for s in 0..8 {
        let (sc, m) = scale_min_k4(s, scales);
        let (ds, ms) = (d * sc as f32, dmin * m as f32);
        let low = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        for l in 0..32 {
            let q = ((low[l] >> (4 * (s % 2))) & 0x0f) | (((qh[l] >> s) & 1) << 4);
            dst[32 * s + l] = ds * q as f32 - ms;
        }
    }
}

fn decode_q6_k(src: &[u8], dst: &mut [f32]) {
    let (ql, qh, scales) = (&src[0..128], &src[128..192], &src[192..208]);
    let d = f16_at(src, 208);
    for (v, o) in dst[..QK_K].iter_mut().enumerate() {
        let (h, w) = (v / 128, v % 128);
        let lo = (ql[64 * h + w % 64] >> (4 * (w / 64))) & 0x0f;
        let hi = (qh[32 * h + w % 32] >> (2 * (w / 32))) & 3;
        let q = (lo | (hi << 4)) as i32 - 32;
        *o = (d * (scales[v / 16] as i8) as f32) * q as f32;
    }
}

/// Values per block of a quantized dtype (1 for plain types).
pub const fn block_elems(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => 1,
        DType::F8E4M3 => 128,
        DType::Nvfp4 => 256,
        DType::Mxfp4 => 32,
        DType::Q8_0 | DType::Q4_0 => 32,
        DType::Q4K | DType::Q5K | DType::Q6K => QK_K,
    }
}

/// Bytes per block of a quantized dtype (the element size for plain types).
pub const fn block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 4,
        DType::F16 | DType::BF16 => 2,
        DType::F8E4M3 => 132,
        DType::Nvfp4 => 148,
        DType::Mxfp4 => 17,
        DType::Q8_0 => 34,
        DType::Q4_0 => 18,
        DType::Q4K => 144,
        DType::Q5K => 176,
        DType::Q6K => 210,
    }
}

/// Decodes one whole block of `dtype` (`src` holds at least [`block_bytes`]) into
/// `dst[..block_elems]`. Plain dtypes decode one element.
pub fn decode_block(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => dst[0] = f32::from_le_bytes([src[0], src[1], src[2], src[3]]),
        DType::F16 => dst[0] = half::f16::from_le_bytes([src[0], src[1]]).to_f32(),
        DType::BF16 => dst[0] = half::bf16::from_le_bytes([src[0], src[1]]).to_f32(),
        DType::F8E4M3 => {
            let scale = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
            for (d, c) in dst[..128].iter_mut().zip(&src[4..132]) {
                *d = e4m3_to_f32(*c) * scale;
            }
        }
        DType::Nvfp4 => {
            let global = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
            for g in 0..16 {
                let s = e4m3_to_f32(src[4 + g]) * global;
                for (j, byte) in src[20 + g * 8..20 + g * 8 + 8].iter().enumerate() {
                    dst[g * 16 + 2 * j] = e2m1_to_f32(byte & 0x0f) * s;
                    dst[g * 16 + 2 * j + 1] = e2m1_to_f32(byte >> 4) * s;
                }
            }
        }
        DType::Mxfp4 => {
            let s = e8m0_to_f32(src[0]);
            for (j, byte) in src[1..17].iter().enumerate() {
                dst[j] = e2m1_to_f32(byte & 0x0f) * s;
                dst[j + 16] = e2m1_to_f32(byte >> 4) * s;
            }
        }
        DType::Q8_0 => decode_q8_0(src, dst),
        DType::Q4_0 => decode_q4_0(src, dst),
        DType::Q4K => decode_q4_k(src, dst),
        DType::Q5K => decode_q5_k(src, dst),
        DType::Q6K => decode_q6_k(src, dst),
    }
}

/// The largest magnitude in `v` (0 for an empty slice).
pub fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// The FP8 scale (`weight_scale_inv`) of a block whose largest magnitude is `amax`:
/// `amax / 448`, 1 for an all-zero block.
pub fn fp8_scale(amax: f32) -> f32 {
    if amax > 0.0 {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

/// ModelOpt's per-tensor NVFP4 scale: `amax / (6 · 448)` (1 for an all-zero tensor).
pub fn nvfp4_global_scale(amax: f32) -> f32 {
    if amax > 0.0 {
        amax / (6.0 * E4M3_MAX)
    } else {
        1.0
    }
}

/// One NVFP4 group of 16 values (fewer are zero-padded) under the tensor's `global` scale:
/// the E4M3 scale code `amax₁₆/(6·global)` and each value's E2M1 code.
pub fn nvfp4_group(values: &[f32], global: f32) -> (u8, [u8; 16]) {
    let code = f32_to_e4m3(amax(values) / 6.0 / global);
    let scale = e4m3_to_f32(code) * global;
    let mut q = [0u8; 16];
    if scale > 0.0 {
        for (c, v) in q.iter_mut().zip(values) {
            *c = f32_to_e2m1(v / scale);
        }
    }
    (code, q)
}

/// The E8M0 code of the smallest power of two `s` with `amax / s ≤ 6` (127, i.e. 1, for 0).
pub fn mxfp4_scale_code(amax: f32) -> u8 {
    if amax <= 0.0 || !amax.is_finite() {
        return 127;
    }
    let e = (amax / 6.0).log2().ceil() as i32;
    (e + 127).clamp(0, 254) as u8
}

/// One MXFP4 block of 32 values (fewer are zero-padded): the E8M0 scale code and each value's
/// E2M1 code.
pub fn mxfp4_group(values: &[f32]) -> (u8, [u8; 32]) {
    let code = mxfp4_scale_code(amax(values));
    let scale = e8m0_to_f32(code);
    let mut q = [0u8; 32];
    for (c, v) in q.iter_mut().zip(values) {
        *c = f32_to_e2m1(v / scale);
    }
    (code, q)
}

/// One Q8_0 block of 32 values, as ggml's `quantize_row_q8_0_ref`: `d = amax / 127` (stored
/// as f16), `q = round(x / d)` (half away from zero, computed as `x · (1/d)` with the f32 `d`).
fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let d = amax(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}

/// One Q4_0 block of 32 values, as ggml's `quantize_row_q4_0_ref`: the value of largest
/// magnitude (the first, on ties) maps to code 0, `d = max / −8`, `q = min(15, trunc(x/d +
/// 8.5))`.
fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let (mut am, mut max) = (0f32, 0f32);
    for &v in x {
        if am < v.abs() {
            am = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
    let q = |v: f32| ((v * id + 8.5) as i8).clamp(0, 15) as u8;
    out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
}

/// The smallest f16 at least `x` (`x ≥ 0`; saturating at the largest finite f16).
fn f16_at_least(x: f32) -> half::f16 {
    let h = half::f16::from_f32(x);
    if h.is_infinite() {
        return half::f16::MAX;
    }
    if h.to_f32() < x {
        half::f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

/// Codes `q = round((x + m) / step)` clamped to `qmin..=qmax` for `x` in `xs`, written to `q`;
/// returns the squared error of the values they decode to, `step · q − m`.
fn affine_codes(xs: &[f32], step: f32, m: f32, qmin: i32, qmax: i32, q: &mut [i32]) -> f32 {
    let mut err = 0f32;
    for (c, &x) in q.iter_mut().zip(xs) {
        *c = if step != 0.0 {
            (((x + m) / step).round() as i32).clamp(qmin, qmax)
        } else {
            0.clamp(qmin, qmax)
        };
        let e = step * *c as f32 - m - x;
        err += e * e;
    }
    err
}

/// Picks the integer sub-block scale code (in `lo..=hi`) next to `want / d`, the one of the two
/// neighbours whose codes reconstruct `xs` with the smaller squared error; fills `q`.
#[allow(clippy::too_many_arguments)]
fn pick_scale(
    xs: &[f32],
    d: f32,
    want: f32,
    lo: i32,
    hi: i32,
    m: f32,
    qr: (i32, i32),
    q: &mut [i32],
) -> i32 {
    if d <= 0.0 {
        affine_codes(xs, 0.0, m, qr.0, qr.1, q);
        return 0;
    }
    let r = want / d;
    let cands = [
        (r.floor() as i32).clamp(lo, hi),
        (r.ceil() as i32).clamp(lo, hi),
    ];
    let mut tmp = [0i32; 32];
    let tmp = &mut tmp[..xs.len()];
    let mut best = (
        cands[0],
        affine_codes(xs, d * cands[0] as f32, m, qr.0, qr.1, q),
    );
    if cands[1] != cands[0] {
        let e = affine_codes(xs, d * cands[1] as f32, m, qr.0, qr.1, tmp);
        if e < best.1 {
            best = (cands[1], e);
            q.copy_from_slice(tmp);
        }
    }
    best.0
}

/// Q4_K/Q5_K codes for one super-block of 256 values with `nmax` = 15 or 31 levels: per 32
/// values a min `m = −min(0, min x)` and a scale `(max x + m) / nmax`; the mins are quantized
/// up to 6 bits of `dmin = max m / 63` (so no value falls below the range), the scales to 6
/// bits of `d = max scale / 63` (each rounded down or up, whichever reconstructs the
/// sub-block better), `d` and `dmin` rounded up to f16. Returns `(d, dmin, sc, m, q)`.
fn quantize_k_affine(
    x: &[f32],
    nmax: i32,
) -> (half::f16, half::f16, [u8; 8], [u8; 8], [i32; QK_K]) {
    let mut mins = [0f32; 8];
    let mut maxs = [0f32; 8];
    for s in 0..8 {
        let sub = &x[32 * s..32 * s + 32];
        mins[s] = -sub.iter().fold(0f32, |a, &v| a.min(v));
        maxs[s] = sub.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    }
    let dmin = f16_at_least(mins.iter().fold(0f32, |a, &v| a.max(v)) / 63.0);
    let dminf = dmin.to_f32();
    let mut mq = [0u8; 8];
    let mut meff = [0f32; 8];
    for s in 0..8 {
        if dminf > 0.0 {
            mq[s] = ((mins[s] / dminf).ceil() as i32).clamp(0, 63) as u8;
        }
        meff[s] = dminf * mq[s] as f32;
    }
    let want: Vec<f32> = (0..8)
        .map(|s| ((maxs[s] + meff[s]) / nmax as f32).max(0.0))
        .collect();
    let d = f16_at_least(want.iter().fold(0f32, |a, &v| a.max(v)) / 63.0);
    let df = d.to_f32();
    let mut sc = [0u8; 8];
    let mut q = [0i32; QK_K];
    for s in 0..8 {
        sc[s] = pick_scale(
            &x[32 * s..32 * s + 32],
            df,
            want[s],
            0,
            63,
            meff[s],
            (0, nmax),
            &mut q[32 * s..32 * s + 32],
        ) as u8;
    }
    (d, dmin, sc, mq, q)
}

/// One Q4_K block (see [`quantize_k_affine`]).
fn quantize_q4_k(x: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, m, q) = quantize_k_affine(x, 15);
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(&pack_scale_min_k4(&sc, &m));
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] | (q[64 * c + 32 + l] << 4)) as u8));
    }
}

/// One Q5_K block (see [`quantize_k_affine`]).
fn quantize_q5_k(x: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, m, q) = quantize_k_affine(x, 31);
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(&pack_scale_min_k4(&sc, &m));
    out.extend(
        (0..32).map(|l| (0..8).fold(0u8, |h, s| h | ((((q[32 * s + l] >> 4) & 1) as u8) << s))),
    );
    for c in 0..4 {
        out.extend(
            (0..32).map(|l| ((q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4)) as u8),
        );
    }
}

/// One Q6_K block: per 16 values the signed scale `max / −32` of the value of largest
/// magnitude (so it gets code −32, the signed-maximum trick of ggml's Q4_0), quantized to an
/// i8 multiple of `d = max |scale| / 127` (d rounded up to f16; each scale rounded down or up
/// in magnitude, whichever reconstructs better); codes `round(x / (d · scale))` in −32..=31.
fn quantize_q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut want = [0f32; 16];
    for (s, w) in want.iter_mut().enumerate() {
        let (mut am, mut max) = (0f32, 0f32);
        for &v in &x[16 * s..16 * s + 16] {
            if am < v.abs() {
                am = v.abs();
                max = v;
            }
        }
        *w = max / -32.0;
    }
    let d = f16_at_least(want.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0);
    let df = d.to_f32();
    let mut sc = [0i8; 16];
    let mut q = [0i32; QK_K];
    for s in 0..16 {
        // A negative scale flips the codes' sign; search over its magnitude's neighbours.
        sc[s] = pick_scale(
            &x[16 * s..16 * s + 16],
            df,
            want[s],
            -127,
            127,
            0.0,
            (-32, 31),
            &mut q[16 * s..16 * s + 16],
        ) as i8;
    }
    let u = |v: usize| (q[v] + 32) as u8;
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for v in 0..QK_K {
        let (h, w) = (v / 128, v % 128);
        ql[64 * h + w % 64] |= (u(v) & 15) << (4 * (w / 64));
        qh[32 * h + w % 32] |= (u(v) >> 4) << (2 * (w / 32));
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&c| c as u8));
    out.extend_from_slice(&d.to_le_bytes());
}

/// Quantizes one row of `values` into `dtype` blocks (zero-padded to whole blocks), appending
/// to `out`. Scales follow the publishers' recipes: FP8 [`fp8_scale`] per block; NVFP4 a
/// row-wide [`nvfp4_global_scale`] and [`nvfp4_group`] per 16; MXFP4 [`mxfp4_group`]; Q8_0 and
/// Q4_0 exactly as ggml's reference quantizers (`quantize_row_q8_0_ref`, `..._q4_0_ref`);
/// Q4_K, Q5_K and Q6_K with min/max scales per sub-block and 6- or 8-bit quantized
/// super-block scales (valid GGUF blocks, though not ggml's iterative search). Plain dtypes
/// are encoded element by element.
pub fn quantize_row(dtype: DType, values: &[f32], out: &mut Vec<u8>) {
    quantize_row_with_global(dtype, values, nvfp4_global_scale(amax(values)), out)
}

/// [`quantize_row`] with the NVFP4 global scale given (shared by all rows of a tensor, as
/// checkpoints store it); other dtypes ignore it.
fn quantize_row_with_global(dtype: DType, values: &[f32], global: f32, out: &mut Vec<u8>) {
    let be = block_elems(dtype);
    if be == 1 {
        out.extend_from_slice(&crate::dtype::from_f32_slice(values, dtype));
        return;
    }
    for block in values.chunks(be) {
        match dtype {
            DType::F8E4M3 => {
                let scale = fp8_scale(amax(block));
                out.extend_from_slice(&scale.to_le_bytes());
                out.extend(block.iter().map(|v| f32_to_e4m3(v / scale)));
                out.resize(out.len() + be - block.len(), 0);
            }
            DType::Nvfp4 => {
                out.extend_from_slice(&global.to_le_bytes());
                let groups: Vec<(u8, [u8; 16])> = (0..16)
                    .map(|g| nvfp4_group(block.get(g * 16..).map_or(&[][..], |b| &b[..b.len().min(16)]), global))
                    .collect();
                out.extend(groups.iter().map(|(s, _)| *s));
                for (_, q) in &groups {
                    out.extend((0..8).map(|j| q[2 * j] | (q[2 * j + 1] << 4)));
                }
            }
            DType::Mxfp4 => {
                let (e, q) = mxfp4_group(block);
                out.push(e);
                out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
            }
            DType::Q8_0 | DType::Q4_0 | DType::Q4K | DType::Q5K | DType::Q6K => {
                let mut full = [0f32; QK_K];
                full[..block.len()].copy_from_slice(block);
                let full = &full[..be];
                match dtype {
                    DType::Q8_0 => quantize_q8_0(full, out),
                    DType::Q4_0 => quantize_q4_0(full, out),
                    DType::Q4K => quantize_q4_k(full, out),
                    DType::Q5K => quantize_q5_k(full, out),
                    _ => quantize_q6_k(full, out),
                }
            }
            DType::F32 | DType::F16 | DType::BF16 => unreachable!("plain dtypes returned above"),
        }
    }
}

/// Quantizes a `[rows, cols]` f32 matrix into `dtype` rows (each padded to whole blocks).
pub fn quantize_matrix(dtype: DType, values: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let global = nvfp4_global_scale(amax(values));
    let mut out = Vec::with_capacity(rows * dtype.row_bytes(cols));
    for r in 0..rows {
        quantize_row_with_global(dtype, &values[r * cols..(r + 1) * cols], global, &mut out);
    }
    out
}

/// Decodes a `[rows, cols]` matrix of `dtype` rows (padding dropped); `None` if `bytes` is too
/// short.
pub fn dequantize_matrix(dtype: DType, bytes: &[u8], rows: usize, cols: usize) -> Option<Vec<f32>> {
    let rb = dtype.row_bytes(cols);
    if bytes.len() < rows.checked_mul(rb)? {
        return None;
    }
    let (be, bb) = (block_elems(dtype), block_bytes(dtype));
    let mut out = Vec::with_capacity(rows * cols);
    let mut block = vec![0f32; be];
    for r in 0..rows {
        let row = &bytes[r * rb..(r + 1) * rb];
        for (b, src) in row.chunks_exact(bb).enumerate() {
            decode_block(dtype, src, &mut block);
            let take = be.min(cols - b * be);
            out.extend_from_slice(&block[..take]);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every E4M3 code against the format's definition, written out independently.
    #[test]
    fn e4m3_all_codes() {
        let mut finite = 0;
        for c in 0u16..256 {
            let c = c as u8;
            let v = e4m3_to_f32(c);
            let (s, e, m) = (c >> 7, (c >> 3) & 15, c & 7);
            if e == 15 && m == 7 {
                assert!(v.is_nan(), "{c:#04x}");
                continue;
            }
            finite += 1;
            let mag = if e == 0 {
                m as f64 * 2f64.powi(-9)
            } else {
                (8 + m as u32) as f64 * 2f64.powi(e as i32 - 10)
            };
            let want = if s == 1 { -mag } else { mag } as f32;
            assert_eq!(v.to_bits(), want.to_bits(), "code {c:#04x}");
            // Every finite code round-trips through the encoder (±0 both encode as themselves).
            assert_eq!(f32_to_e4m3(v), c, "re-encode {c:#04x} = {v}");
        }
        assert_eq!(finite, 254);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    }

    /// The fast encoder against an exhaustive nearest-code search (ties to the even code).
    #[test]
    fn e4m3_encoder_matches_nearest_code_search() {
        let nearest = |a: f32| -> u8 {
            let mut best = (0u8, f32::INFINITY);
            for c in 0u8..0x7f {
                let err = (e4m3_to_f32(c) - a).abs();
                if err < best.1 || (err == best.1 && c & 1 == 0) {
                    best = (c, err);
                }
            }
            best.0
        };
        let mut x = 1e-4f32;
        while x < 460.0 {
            for v in [x, -x] {
                let want = if v < 0.0 { 0x80 | nearest(-v) } else { nearest(v) };
                assert_eq!(f32_to_e4m3(v), want, "{v}");
            }
            x *= 1.0007;
        }
        // Every midpoint between neighbouring codes.
        for c in 0u8..0x7e {
            let mid = (e4m3_to_f32(c) + e4m3_to_f32(c + 1)) / 2.0;
            assert_eq!(f32_to_e4m3(mid), nearest(mid), "midpoint after {c:#04x}");
        }
    }

    #[test]
    fn e4m3_rounding_and_saturation() {
        assert_eq!(f32_to_e4m3(1000.0), 0x7e);
        assert_eq!(f32_to_e4m3(-1e9), 0xfe);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
        // 1.0625 lies half-way between 1.0 (0x38) and 1.125 (0x39): ties to even.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.0626), 0x39);
        // 17 lies between 16 (0x58) and 18 (0x59): tie to even.
        assert_eq!(f32_to_e4m3(17.0), 0x58);
        assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00);
    }

    #[test]
    fn e2m1_table() {
        let want = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for (c, w) in want.iter().enumerate() {
            assert_eq!(e2m1_to_f32(c as u8), *w, "code {c}");
            if c != 8 {
                assert_eq!(f32_to_e2m1(*w), c as u8);
            }
        }
        assert_eq!(f32_to_e2m1(0.25), 0); // tie → even code 0
        assert_eq!(f32_to_e2m1(0.75), 2); // tie between 0.5 (1) and 1.0 (2) → even
        assert_eq!(f32_to_e2m1(2.5), 4); // tie between 2 (4) and 3 (5)
        assert_eq!(f32_to_e2m1(5.0), 6); // tie between 4 (6) and 6 (7)
        assert_eq!(f32_to_e2m1(100.0), 7);
        assert_eq!(f32_to_e2m1(-100.0), 15);
    }

    #[test]
    fn e8m0_codes() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
        assert!(e8m0_to_f32(255).is_nan());
        for c in 1u8..255 {
            assert_eq!(e8m0_to_f32(c), 2f32.powi(c as i32 - 127));
        }
        assert_eq!(mxfp4_scale_code(6.0), 127);
        assert_eq!(mxfp4_scale_code(6.1), 128);
        assert_eq!(mxfp4_scale_code(0.0), 127);
    }

    /// Quantize → dequantize stays within each format's step size, and padding is dropped.
    #[test]
    fn round_trip_error_bounds() {
        let cols = 300; // not a multiple of any block: partial last blocks
        let rows = 3;
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 * 0.37).sin() * 2.5)
            .collect();
        for (dtype, rel) in [
            (DType::F8E4M3, 1.0 / 16.0),
            (DType::Nvfp4, 0.25),
            (DType::Mxfp4, 0.5),
        ] {
            let q = quantize_matrix(dtype, &values, rows, cols);
            assert_eq!(q.len(), rows * dtype.row_bytes(cols));
            let back = dequantize_matrix(dtype, &q, rows, cols).expect("decode");
            assert_eq!(back.len(), values.len());
            for (a, b) in values.iter().zip(&back) {
                // Error relative to the block's largest value (2.5 here), the scale's unit.
                assert!((a - b).abs() <= rel * 2.5 + 1e-6, "{dtype}: {a} vs {b}");
            }
            assert!(dequantize_matrix(dtype, &q[..q.len() - 1], rows, cols).is_none());
        }
    }

    fn f16b(x: f32) -> [u8; 2] {
        half::f16::from_f32(x).to_le_bytes()
    }

    fn decoded(dtype: DType, block: &[u8]) -> Vec<f32> {
        assert_eq!(block.len(), block_bytes(dtype), "{dtype}: block size");
        let mut out = vec![f32::NAN; block_elems(dtype)];
        decode_block(dtype, block, &mut out);
        out
    }

    #[test]
    fn ggml_names_and_sizes() {
        for (d, name, shown, be, bb) in [
            (DType::Q8_0, "q8_0", "Q8_0", 32, 34),
            (DType::Q4_0, "q4_0", "Q4_0", 32, 18),
            (DType::Q4K, "q4_k", "Q4_K", 256, 144),
            (DType::Q5K, "q5_k", "Q5_K", 256, 176),
            (DType::Q6K, "q6_k", "Q6_K", 256, 210),
        ] {
            assert_eq!(d.name(), name);
            assert_eq!(d.to_string(), shown);
            assert_eq!(DType::parse(name), Some(d));
            assert_eq!(DType::parse(shown), Some(d));
            assert_eq!((d.block_elems(), d.size()), (be, bb));
            assert!(d.is_quantized());
            assert!(DType::QUANTIZED.contains(&d));
            assert_eq!(d.row_bytes(be + 1), 2 * bb);
            assert_eq!(d.padded(be + 1), 2 * be);
            assert_eq!(d.bytes_for(4 * be), Some(4 * bb));
            assert_eq!(d.bytes_for(be + 1), None);
            for op in crate::Op::ALL {
                assert_eq!(op.fully_supported(d), op == crate::Op::Matmul, "{op:?} {d}");
                assert!(!op.supported_unquantized(d));
            }
        }
        // The existing types keep their names.
        assert_eq!(DType::Mxfp4.to_string(), "mxfp4");
        assert_eq!(DType::F8E4M3.to_string(), "fp8");
    }

    #[test]
    fn q8_0_known_block() {
        let qs: Vec<i8> = (0..32)
            .map(|j| [-128, -1, 0, 1, 127, 5, -77, 64][j % 8])
            .collect();
        let mut b = f16b(0.5).to_vec();
        b.extend(qs.iter().map(|&q| q as u8));
        let got = decoded(DType::Q8_0, &b);
        for j in 0..32 {
            assert_eq!(got[j], qs[j] as f32 * 0.5, "value {j}");
        }
        assert_eq!(got[0], -64.0);
        assert_eq!(got[4], 63.5);
    }

    #[test]
    fn q4_0_known_block() {
        let mut b = f16b(-2.0).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let got = decoded(DType::Q4_0, &b);
        for j in 0..16 {
            assert_eq!(got[j], -2.0 * (j as f32 - 8.0), "value {j}");
            assert_eq!(got[j + 16], -2.0 * (7.0 - j as f32), "value {}", j + 16);
        }
        assert_eq!(got[0], 16.0);
        assert_eq!(got[31], 16.0);
        assert_eq!(got[15], -14.0);
    }

    /// The 12 scale bytes written out by hand from the bit diagram in ggml (rather than with
    /// [`pack_scale_min_k4`]).
    fn k4_scales_by_hand(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
        let mut b = [0u8; 12];
        for j in 0..4 {
            // 0..4: EEAAAAAA (A = low 6 bits of scale j, E = bits 4..6 of scale j + 4).
            b[j] = sc[j] + 64 * (sc[j + 4] / 16);
            // 4..8: the same for the mins.
            b[j + 4] = m[j] + 64 * (m[j + 4] / 16);
            // 8..12: min j + 4 low bits (high nibble), scale j + 4 low bits (low nibble).
            b[j + 8] = (sc[j + 4] % 16) + 16 * (m[j + 4] % 16);
        }
        b
    }

    #[test]
    fn k4_scale_packing() {
        let sc = [1u8, 2, 3, 63, 17, 33, 48, 5];
        let m = [0u8, 63, 7, 9, 16, 31, 32, 62];
        let packed = pack_scale_min_k4(&sc, &m);
        assert_eq!(packed, k4_scales_by_hand(&sc, &m));
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
        // Every value in every slot.
        for v in 0..64u8 {
            for j in 0..8 {
                let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
                a[j] = v;
                b[7 - j] = 63 - v;
                let p = pack_scale_min_k4(&a, &b);
                assert_eq!(scale_min_k4(j, &p).0, v);
                assert_eq!(scale_min_k4(7 - j, &p).1, 63 - v);
            }
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn q4_k_known_block() {
        let sc = [1u8, 2, 3, 63, 17, 33, 48, 5];
        let m = [0u8, 63, 7, 9, 16, 31, 32, 62];
        let (d, dmin) = (0.25f32, 0.5f32);
        let mut b = f16b(d).to_vec();
        b.extend(f16b(dmin));
        b.extend(k4_scales_by_hand(&sc, &m));
        for _c in 0..4 {
            b.extend((0..32u8).map(|l| (l % 16) | ((15 - l % 16) << 4)));
        }
        let got = decoded(DType::Q4K, &b);
        for v in 0..256 {
            let (s, l) = (v / 32, v % 32);
            // Even sub-blocks are the low nibbles, odd ones the high nibbles of the same bytes.
            let q = if s % 2 == 0 { l % 16 } else { 15 - l % 16 };
            let want = d * sc[s] as f32 * q as f32 - dmin * m[s] as f32;
            assert_eq!(got[v], want, "value {v}");
        }
        assert_eq!(got[32 * 3 + 1], 0.25 * 63.0 * 14.0 - 0.5 * 9.0);
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn q5_k_known_block() {
        let sc = [1u8, 2, 3, 63, 17, 33, 48, 5];
        let m = [0u8, 63, 7, 9, 16, 31, 32, 62];
        let (d, dmin) = (0.125f32, 2.0f32);
        let mut b = f16b(d).to_vec();
        b.extend(f16b(dmin));
        b.extend(k4_scales_by_hand(&sc, &m));
        // qh byte l: bit s is the 5th bit of value 32s + l.
        b.extend((0..32u8).map(|l| l.wrapping_mul(37) ^ 0x5a));
        for _c in 0..4 {
            b.extend((0..32u8).map(|l| (l % 16) | ((15 - l % 16) << 4)));
        }
        let got = decoded(DType::Q5K, &b);
        for v in 0..256 {
            let (s, l) = (v / 32, v % 32);
            let low = if s % 2 == 0 { l % 16 } else { 15 - l % 16 };
            let hbit = (((l as u8).wrapping_mul(37) ^ 0x5a) >> s) & 1;
            let q = low + 16 * hbit as usize;
            let want = d * sc[s] as f32 * q as f32 - dmin * m[s] as f32;
            assert_eq!(got[v], want, "value {v}");
        }
    }

    #[test]
    fn q6_k_known_block() {
        // Codes 0..64 (value q − 32), packed with ggml's own loop shape: per 128 values, byte
        // l of ql carries values l (low) and l + 64 (high), byte l + 32 values l + 32 and
        // l + 96; byte l of qh the top bits of l, l + 32, l + 64, l + 96 (2 bits each).
        let q: Vec<u8> = (0..256).map(|v| ((v * 7 + v / 64) % 64) as u8).collect();
        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        for n in 0..2 {
            let (y, l0, h0) = (&q[128 * n..], 64 * n, 32 * n);
            for l in 0..32 {
                ql[l0 + l] = (y[l] & 15) | ((y[l + 64] & 15) << 4);
                ql[l0 + l + 32] = (y[l + 32] & 15) | ((y[l + 96] & 15) << 4);
                qh[h0 + l] = (y[l] >> 4)
                    | ((y[l + 32] >> 4) << 2)
                    | ((y[l + 64] >> 4) << 4)
                    | ((y[l + 96] >> 4) << 6);
            }
        }
        let scales: Vec<i8> = (0..16)
            .map(|i| [-128, 127, -1, 3, 0, 50, -7, 9][i % 8])
            .collect();
        let d = 0.0625f32;
        let mut b = ql.to_vec();
        b.extend(qh);
        b.extend(scales.iter().map(|&s| s as u8));
        b.extend(f16b(d));
        let got = decoded(DType::Q6K, &b);
        for v in 0..256 {
            let want = d * scales[v / 16] as f32 * (q[v] as f32 - 32.0);
            assert_eq!(got[v], want, "value {v}");
        }
    }

    /// Values with very different magnitudes per 16, so sub-block scales differ, with a few
    /// all-positive, all-negative and all-zero sub-blocks.
    fn spiky_values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = crate::conformance::Rng::new(seed);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let g = i / 16;
            let mag = [1.0, 0.01, 7.5, 0.3, 100.0, 2.0][g % 6] * (1.0 + (g % 5) as f32);
            let u = rng.uniform();
            out.push(match (g / 6) % 4 {
                1 => u.abs() * mag + mag * 0.5,
                2 => -(u.abs() * mag),
                3 if g % 6 == 1 => 0.0,
                _ => u * mag,
            });
        }
        out
    }

    /// GGML types: quantize → dequantize stays within a bound relative to each block's largest
    /// magnitude, the RMS error close to a uniform quantizer's; the Q8_0/Q4_0 encoders keep
    /// ggml's rounding rules.
    #[test]
    fn ggml_round_trip_error_bounds() {
        let (rows, cols) = (5, 700); // partial last block for every type
        let values = spiky_values(rows * cols, 7);
        // (dtype, max error and RMS error per block, in units of the block's amax)
        for (dtype, max_rel, rms_rel) in [
            (DType::Q8_0, 0.51 / 127.0 + 1e-3, 0.4 / 127.0),
            (DType::Q4_0, 1.01 / 8.0, 0.4 / 8.0),
            // K types: a sub-block spanning the whole super-block's range has step
            // 2·amax/nmax; 6-bit sub-block scales may round it up by a 63rd.
            (DType::Q4K, 1.25 / 15.0, 0.4 * 2.0 / 15.0),
            (DType::Q5K, 1.25 / 31.0, 0.4 * 2.0 / 31.0),
            (DType::Q6K, 1.0 / 32.0, 0.4 / 32.0),
        ] {
            let q = quantize_matrix(dtype, &values, rows, cols);
            assert_eq!(q.len(), rows * dtype.row_bytes(cols));
            let back = dequantize_matrix(dtype, &q, rows, cols).expect("decode");
            let be = dtype.block_elems();
            let (mut worst_max, mut worst_rms) = (0f32, 0f32);
            for r in 0..rows {
                for b0 in (0..cols).step_by(be) {
                    let idx = r * cols + b0..r * cols + (b0 + be).min(cols);
                    let (x, y) = (&values[idx.clone()], &back[idx]);
                    let a = amax(x);
                    let mut sse = 0f32;
                    for (u, v) in x.iter().zip(y) {
                        let e = (u - v).abs();
                        assert!(
                            e <= max_rel * a + 1e-30,
                            "{dtype}: {u} vs {v} (block amax {a})"
                        );
                        if a > 0.0 {
                            worst_max = worst_max.max(e / a);
                        }
                        sse += e * e;
                    }
                    let rms = (sse / x.len() as f32).sqrt();
                    assert!(
                        rms <= rms_rel * a,
                        "{dtype}: block rms {rms} > {} (amax {a})",
                        rms_rel * a
                    );
                    if a > 0.0 {
                        worst_rms = worst_rms.max(rms / a);
                    }
                }
            }
            eprintln!("{dtype}: worst max error {worst_max:.4} · amax, worst block rms {worst_rms:.4} · amax");
            assert!(dequantize_matrix(dtype, &q[..q.len() - 1], rows, cols).is_none());
        }
    }

    #[test]
    fn ggml_reference_quantizer_rules() {
        // Q8_0: amax / 127, rounding half away from zero.
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = -0.5;
        x[3] = 1.5;
        x[4] = -126.5;
        let mut out = Vec::new();
        quantize_row(DType::Q8_0, &x, &mut out);
        assert_eq!(&out[..2], &f16b(1.0));
        assert_eq!(&out[2..7], &[127u8, 1, 255, 2, (-127i8) as u8]);
        // Q4_0: the signed maximum gets code 0 (value −8·d), the other extreme clamps at 15.
        let mut x = vec![0f32; 32];
        x[5] = -4.0;
        x[20] = 4.0; // same magnitude, later: not the maximum
        x[6] = 1.0;
        let mut out = Vec::new();
        quantize_row(DType::Q4_0, &x, &mut out);
        assert_eq!(&out[..2], &f16b(0.5));
        let v = decoded(DType::Q4_0, &out);
        assert_eq!(v[5], -4.0);
        assert_eq!(v[20], 3.5);
        assert_eq!(v[6], 1.0);
        assert_eq!(v[0], 0.0);
        // All-zero blocks stay zero and are valid.
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4K, DType::Q5K, DType::Q6K] {
            let mut out = Vec::new();
            quantize_row(dtype, &vec![0.0; dtype.block_elems()], &mut out);
            assert!(decoded(dtype, &out).iter().all(|v| *v == 0.0), "{dtype}");
        }
    }

    /// The python interpreter with the `gguf` package: `FT_PYTHON`, else the workspace's
    /// `.venv/bin/python`.
    fn gguf_python() -> std::path::PathBuf {
        match std::env::var_os("FT_PYTHON") {
            Some(p) => p.into(),
            None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"),
        }
    }

    /// Runs `script` (argv: the GGML type name, input file, output file) under the gguf
    /// python on `input`; `None` (after saying why) when python or `gguf` is missing and
    /// `FT_REQUIRE_GGUF_PY` is not `1`.
    fn run_gguf_py(script: &str, qtype: &str, input: &[u8]) -> Option<Vec<u8>> {
        let require = std::env::var("FT_REQUIRE_GGUF_PY").is_ok_and(|v| v == "1");
        let skip = |why: String| {
            if require {
                panic!("gguf-py cross-check required (FT_REQUIRE_GGUF_PY=1) but {why}");
            }
            eprintln!("skipped: gguf-py cross-check for {qtype}: {why} (set FT_PYTHON to a python with the `gguf` package)");
            None
        };
        let py = gguf_python();
        let dir = std::env::temp_dir();
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("ft-gguf-{}-{call}-{qtype}", std::process::id());
        let (inp, outp) = (
            dir.join(format!("{tag}.in")),
            dir.join(format!("{tag}.out")),
        );
        std::fs::write(&inp, input).expect("write temp input");
        let res = std::process::Command::new(&py)
            .arg("-c")
            .arg(script)
            .arg(qtype)
            .arg(&inp)
            .arg(&outp)
            .output();
        let _ = std::fs::remove_file(&inp);
        let out = match res {
            Err(e) => return skip(format!("cannot run {}: {e}", py.display())),
            Ok(o) => o,
        };
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("No module named") {
                return skip(format!(
                    "{} has no gguf/numpy module: {}",
                    py.display(),
                    err.trim()
                ));
            }
            panic!("gguf-py failed for {qtype}: {err}");
        }
        let bytes = std::fs::read(&outp).expect("read gguf-py output");
        let _ = std::fs::remove_file(&outp);
        Some(bytes)
    }

    const GGUF_DEQUANT: &str = "\
import sys, numpy as np
from gguf.constants import GGMLQuantizationType as T, GGML_QUANT_SIZES
from gguf.quants import dequantize
t = T[sys.argv[1]]
bs, ts = GGML_QUANT_SIZES[t]
raw = np.fromfile(sys.argv[2], dtype=np.uint8)
out = dequantize(raw.reshape(-1, ts), t)
np.ascontiguousarray(out, dtype='<f4').tofile(sys.argv[3])
";

    const GGUF_QUANT: &str = "\
import sys, numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import quantize
t = T[sys.argv[1]]
x = np.fromfile(sys.argv[2], dtype='<f4').reshape(-1, 256)
np.ascontiguousarray(quantize(x, t)).tofile(sys.argv[3])
";

    /// `decode_block` against gguf-py's numpy dequantization of random blocks (random bytes,
    /// f16 scales finite), bit for bit: both take the same f32 operations in the same order.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn ggml_decode_matches_gguf_py() {
        let mut rng = crate::conformance::Rng::new(0x6767_7566);
        for (dtype, name) in [
            (DType::Q8_0, "Q8_0"),
            (DType::Q4_0, "Q4_0"),
            (DType::Q4K, "Q4_K"),
            (DType::Q5K, "Q5_K"),
            (DType::Q6K, "Q6_K"),
        ] {
            let (bb, be) = (block_bytes(dtype), block_elems(dtype));
            let nblocks = 400;
            let mut raw: Vec<u8> = (0..nblocks * bb).map(|_| rng.next_u64() as u8).collect();
            // f16 fields: any finite value (subnormals and zero included), some of them small
            // normals like real scales.
            let f16_at: &[usize] = match dtype {
                DType::Q4K | DType::Q5K => &[0, 2],
                DType::Q6K => &[208],
                _ => &[0],
            };
            for b in 0..nblocks {
                for &at in f16_at {
                    let mut bits = rng.next_u64() as u16;
                    if b % 2 == 0 {
                        bits = half::f16::from_f32(rng.uniform() * 0.01).to_bits();
                    } else if (bits >> 10) & 0x1f == 0x1f {
                        bits &= !0x4000; // no inf/NaN
                    }
                    raw[b * bb + at..b * bb + at + 2].copy_from_slice(&bits.to_le_bytes());
                }
            }
            let Some(py) = run_gguf_py(GGUF_DEQUANT, name, &raw) else {
                return;
            };
            assert_eq!(py.len(), nblocks * be * 4, "{dtype}: gguf-py output size");
            let mut ours = vec![0f32; be];
            for b in 0..nblocks {
                decode_block(dtype, &raw[b * bb..], &mut ours);
                for j in 0..be {
                    let o = (b * be + j) * 4;
                    let theirs = f32::from_le_bytes([py[o], py[o + 1], py[o + 2], py[o + 3]]);
                    assert!(
                        theirs.to_bits() == ours[j].to_bits(),
                        "{dtype}: block {b} value {j}: ours {} ({:#010x}), gguf-py {} ({:#010x})",
                        ours[j],
                        ours[j].to_bits(),
                        theirs,
                        theirs.to_bits()
                    );
                }
            }
        }
    }

    /// The Q8_0 and Q4_0 encoders against gguf-py's (which reproduce ggml's reference
    /// quantizers bit for bit): identical bytes.
    #[test]
    fn ggml_quantize_matches_gguf_py() {
        let values = spiky_values(64 * 256, 11);
        let input: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (dtype, name) in [(DType::Q8_0, "Q8_0"), (DType::Q4_0, "Q4_0")] {
            let Some(py) = run_gguf_py(GGUF_QUANT, name, &input) else {
                return;
            };
            let ours = quantize_matrix(dtype, &values, 64, 256);
            assert_eq!(ours.len(), py.len(), "{dtype}: size");
            if let Some(i) = (0..ours.len()).find(|&i| ours[i] != py[i]) {
                panic!(
                    "{dtype}: byte {i} (block {}): ours {:#04x}, gguf-py {:#04x}",
                    i / dtype.size(),
                    ours[i],
                    py[i]
                );
            }
        }
    }
}
