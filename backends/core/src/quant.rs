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
//!
//! Dequantization is exactly the publishers' arithmetic: FP8 `code · scale_inv` (the
//! checkpoint's `weight_scale_inv`); NVFP4 `e2m1 · (f32(e4m3 scale) · global)`, the product of
//! the two scales taken in f32 first, as ModelOpt does; MXFP4 `e2m1 · 2^(e − 127)`.

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

/// Values per block of a quantized dtype (1 for plain types).
pub const fn block_elems(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => 1,
        DType::F8E4M3 => 128,
        DType::Nvfp4 => 256,
        DType::Mxfp4 => 32,
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

/// Quantizes one row of `values` into `dtype` blocks (zero-padded to whole blocks), appending
/// to `out`. Scales follow the publishers' recipes: FP8 [`fp8_scale`] per block; NVFP4 a
/// row-wide [`nvfp4_global_scale`] and [`nvfp4_group`] per 16; MXFP4 [`mxfp4_group`]. Plain
/// dtypes are encoded element by element.
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
}
