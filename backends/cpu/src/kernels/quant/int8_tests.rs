//! The int8-activation kernels ([`QuantDot::Int8`]) against f64 references.

use super::*;
use crate::kernels::x86::qdot_i8::Isa;
use ft_backend::conformance::Rng;

/// Every int8 type: weights and their scalar decode, for `nrows` rows of `k` values.
fn weights(dtype: DType, nrows: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let (kp, rb) = (dtype.padded(k), dtype.row_bytes(k));
    let raw = super::tests::random_blocks(dtype, nrows * kp / dtype.block_elems(), rng);
    let mut dec = vec![0f32; nrows * kp];
    for r in 0..nrows {
        super::super::elementwise::decode_scalar(&raw[r * rb..][..rb], dtype, &mut dec[r * kp..][..kp]);
    }
    (raw, dec)
}

/// Every block type with an int8 kernel.
fn int8_types() -> Vec<DType> {
    DType::QUANTIZED.into_iter().filter(|&d| crate::kernels::x86::qdot_i8::supported(d)).collect()
}

fn avx2() -> bool {
    matches!(SimdLevel::Auto.effective(), SimdLevel::Avx2 | SimdLevel::Avx512)
}

/// The integer instruction variants this CPU runs (each is checked; the plain AVX2 one
/// always), named once per test so a log shows what was covered.
fn isas(test: &str) -> Vec<Isa> {
    let v: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.available()).collect();
    let missing: Vec<Isa> = Isa::ALL.into_iter().filter(|i| !i.available()).collect();
    eprintln!("{test}: int8 variants {v:?} (not on this CPU: {missing:?})");
    v
}

/// [`block`] with int8 activations in `isa`'s instructions.
#[allow(clippy::too_many_arguments)]
fn int8_block(
    isa: Isa,
    x: &[f32],
    xs: usize,
    n: usize,
    k: usize,
    w: &[u8],
    dtype: DType,
    nrows: usize,
    out: &mut [f32],
    os: usize,
) {
    Prepared::new(SimdLevel::Auto, QuantDot::Int8, x, xs, n, k, dtype)
        .expect("prepare")
        .expect("an int8 kernel")
        .with_isa(isa)
        .run(w, nrows, out, os)
        .expect("run");
}

/// Activations that int8 represents exactly (each group of 32 is `c·2^e` with integer
/// `|c| ≤ 127` and one `|c| = 127`), so the integer kernels must give the f32 product of
/// the dequantized weights: any wrong nibble, bit plane, scale or offset shows at once.
/// Tolerance `1e-6 · Σ|x·w|`, as for the f32 fused kernels; every instruction variant gives
/// the same bits.
#[test]
fn int8_exact_on_representable_activations() {
    if !avx2() {
        eprintln!("skipped: the int8 kernels need AVX2");
        return;
    }
    let isas = isas("int8_exact_on_representable_activations");
    let mut rng = Rng::new(0x18a);
    for dtype in int8_types() {
        let be = dtype.block_elems();
        for &k in &[be, 3 * be, 2 * be - 40, 8 * be + 32] {
            let kp = dtype.padded(k);
            for &nrows in &[1usize, 2, 3, 5] {
                let (raw, dec) = weights(dtype, nrows, k, &mut rng);
                for n in 1..=4usize {
                    let (xs, os) = (k + 5, nrows + 1);
                    let mut x = vec![0f32; n * xs];
                    for t in 0..n {
                        for g0 in (0..k).step_by(32) {
                            let e = ((rng.next_u64() % 9) as i32 - 4) as f32;
                            for p in g0..(g0 + 32).min(k) {
                                let c = if p == g0 { 127.0 } else { (rng.next_u64() % 255) as f32 - 127.0 };
                                x[t * xs + p] = c * e.exp2();
                            }
                        }
                    }
                    let mut out = vec![f32::NAN; n * os];
                    int8_block(isas[0], &x, xs, n, k, &raw, dtype, nrows, &mut out, os);
                    let mut outs = vec![(isas[0], out.clone())];
                    for &isa in &isas[1..] {
                        let mut other = vec![f32::NAN; n * os];
                        int8_block(isa, &x, xs, n, k, &raw, dtype, nrows, &mut other, os);
                        if isa.own_sums(dtype) {
                            // A kernel of the variant's own adds its f32 sums in another
                            // order: it is held to the reference below instead.
                            outs.push((isa, other));
                            continue;
                        }
                        for (a, b) in out.iter().zip(&other) {
                            assert!(
                                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                                "{dtype} {isa:?} n={n} k={k} rows={nrows}: {b} vs {:?} {a}",
                                isas[0]
                            );
                        }
                    }
                    for (isa, out) in &outs {
                        for t in 0..n {
                            for r in 0..nrows {
                                let (want, mag) = super::tests::exact_dot(&x[t * xs..][..k], &dec[r * kp..][..k]);
                                let got = out[t * os + r] as f64;
                                assert!(
                                    (got - want).abs() <= 1e-6 * mag,
                                    "{dtype} {isa:?} n={n} k={k} rows={nrows} t={t} r={r}: got {got}, want {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Random activations: the error against the exact product stays within the rounding bound
/// `Σ_p |w_p| · d_g(p) / 2` (each code is off by at most half its group's step `d_g`) plus
/// `1e-6 · Σ|x·w|`; the typical relative error is printed.
#[test]
fn int8_error_within_rounding_bound() {
    if !avx2() {
        eprintln!("skipped: the int8 kernels need AVX2");
        return;
    }
    let mut rng = Rng::new(0x18b);
    let isas = isas("int8_error_within_rounding_bound");
    for (dtype, &isa) in int8_types().into_iter().flat_map(|d| isas.iter().map(move |i| (d, i))) {
        let (k, nrows, n) = (8 * dtype.block_elems() + 32, 9, 3);
        let kp = dtype.padded(k);
        let (raw, dec) = weights(dtype, nrows, k, &mut rng);
        let x = rng.vec(n * k, 2.0);
        let mut out = vec![0f32; n * nrows];
        int8_block(isa, &x, k, n, k, &raw, dtype, nrows, &mut out, nrows);
        let mut rel = 0f64;
        for t in 0..n {
            let xt = &x[t * k..][..k];
            let steps: Vec<f64> = xt
                .chunks(32)
                .map(|g| g.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0)
                .collect();
            for r in 0..nrows {
                let (mut want, mut mag, mut bound) = (0f64, 0f64, 0f64);
                for p in 0..k {
                    let w = dec[r * kp + p] as f64;
                    want += xt[p] as f64 * w;
                    mag += (xt[p] as f64 * w).abs();
                    bound += w.abs() * steps[p / 32] / 2.0;
                }
                let err = (out[t * nrows + r] as f64 - want).abs();
                assert!(err <= bound * 1.001 + 1e-6 * mag, "{dtype} {isa:?} t={t} r={r}: error {err} > bound {bound}");
                rel = rel.max(err / mag);
            }
        }
        println!("{dtype} {isa:?}: int8 worst error / Σ|x·w| = {rel:.2e}");
    }
}

/// The pool-split product equals the single-thread one bit for bit, for both modes (rows are
/// independent), and FP8 under `Int8` stays exact where the CPU lacks AVX-512 BF16 and VBMI
/// (its bf16-activation kernel is checked in `fused_tests`).
#[test]
fn pool_split_matches_single_thread() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
    let mut rng = Rng::new(0x18c);
    for dtype in DType::QUANTIZED {
        let (k, m) = (4 * dtype.block_elems(), 200);
        let (raw, _) = weights(dtype, m, k, &mut rng);
        for n in [1usize, 3] {
            let x = rng.vec(n * k, 1.0);
            for dot in [QuantDot::Exact, QuantDot::Int8] {
                let mut single = vec![0f32; n * m];
                block(SimdLevel::Auto, dot, &x, k, n, k, &raw, dtype, m, &mut single, m).expect("block");
                let mut split = vec![0f32; n * m];
                super::super::matmul(Some(&pool), SimdLevel::Auto, dot, &x, n, k, &raw, dtype, m, &mut split)
                    .expect("matmul");
                assert!(
                    single.iter().zip(&split).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{dtype} {dot} n={n}: split differs"
                );
                if dtype == DType::F8E4M3 && dot == QuantDot::Int8 && !crate::kernels::x86::fp8_bf16::available() {
                    let mut exact = vec![0f32; n * m];
                    block(SimdLevel::Auto, QuantDot::Exact, &x, k, n, k, &raw, dtype, m, &mut exact, m)
                        .expect("block");
                    assert_eq!(exact, single, "fp8 has no int8 kernel and stays exact");
                }
            }
        }
    }
}

/// A prefill of a type that runs its fused kernel a few tokens at a time gives every token
/// the products it gets alone, bit for bit (pool split, ragged last group), and stays within
/// the int8 error of the exact product.
#[test]
fn grouped_prefill_equals_each_token_alone() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
    let mut rng = Rng::new(0x9a7);
    let grouped: Vec<DType> = DType::QUANTIZED.into_iter().filter(|&d| in_groups(SimdLevel::Auto, QuantDot::Int8, d, 5, 5 * d.block_elems())).collect();
    if grouped.is_empty() {
        println!("skipped: this CPU runs no type's fused kernels in groups (needs AVX2)");
        return;
    }
    for dtype in grouped {
        // Five blocks: MXFP4's 512-bit kernel takes four a step and the fifth alone.
        let (k, m) = (5 * dtype.block_elems(), 200);
        let (raw, dec) = weights(dtype, m, k, &mut rng);
        let kp = dtype.padded(k);
        // 17 and 35: the Q4_K and Q5_K pair kernel takes up to 16 tokens a pass and an odd
        // last token goes alone; FP8 meets the AMX tiles from 32 (not bit-identical, see
        // `in_groups`); 70: the activations are prepared over the pool (`PARALLEL_TOKENS`).
        for n in [5usize, 9, 14, 2, 17, 35, 70] {
            if n > 4 && !in_groups(SimdLevel::Auto, QuantDot::Int8, dtype, n, k) {
                continue;
            }
            let x = rng.vec(n * k, 1.0);
            let mut together = vec![0f32; n * m];
            // From inside the pool, as the engine calls: large products prepare over it.
            pool.install(|| super::super::matmul(Some(&pool), SimdLevel::Auto, QuantDot::Int8, &x, n, k, &raw, dtype, m, &mut together)).expect("matmul");
            for t in 0..n {
                let mut alone = vec![0f32; m];
                super::super::matmul(Some(&pool), SimdLevel::Auto, QuantDot::Int8, &x[t * k..][..k], 1, k, &raw, dtype, m, &mut alone)
                    .expect("matmul");
                let row = &together[t * m..][..m];
                assert!(row.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "{dtype} n={n} t={t}: differs from alone");
                // The rounding bound of `int8_error_within_rounding_bound` (the largest error
                // against the largest result failed on cancelling random rows); FP8 meets bf16
                // activations, each off by at most 2⁻⁹ of itself.
                let xt = &x[t * k..][..k];
                for (r, g) in row.iter().enumerate() {
                    let (mut want, mut mag, mut bound) = (0f64, 0f64, 0f64);
                    for (p, &xv) in xt.iter().enumerate() {
                        let w = dec[r * kp + p] as f64;
                        let step = if dtype == DType::F8E4M3 {
                            xv.abs() as f64 / 256.0
                        } else {
                            xt[p / 32 * 32..].iter().take(32).fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0
                        };
                        want += xv as f64 * w;
                        mag += (xv as f64 * w).abs();
                        bound += w.abs() * step / 2.0;
                    }
                    let err = (*g as f64 - want).abs();
                    assert!(err <= bound * 1.001 + 1e-5 * mag, "{dtype} n={n} t={t} r={r}: error {err} > bound {bound}");
                }
            }
        }
    }
}

/// Q4_K's and Q5_K's 512-bit pair kernel gives each token the bits the 256-bit kernel gives it
/// alone, in every AVX-512 variant (the plain scale unpacking and VBMI's), for whole passes of
/// eight pairs, ragged ones and an odd last token, on rows of 1 to 9 blocks.
#[test]
fn k4_pairs_equal_each_token_alone() {
    use crate::kernels::x86::qdot_i8::k4_pairs;
    if !k4_pairs::available() {
        eprintln!("skipped: the pair kernel needs AVX-512 F/BW/VL and VNNI");
        return;
    }
    let mut rng = Rng::new(0x4b2);
    let wide: Vec<Isa> = isas("k4_pairs_equal_each_token_alone").into_iter().filter(|i| matches!(i, Isa::Avx512Vnni | Isa::Avx512Vbmi | Isa::Avx512Gfni)).collect();
    assert!(!wide.is_empty(), "AVX-512 VNNI without an AVX-512 int8 variant");
    for (dtype, &blocks) in [DType::Q4K, DType::Q5K].into_iter().flat_map(|d| [1usize, 3, 9].iter().map(move |b| (d, b))) {
        let (k, m) = (blocks * 256, 7);
        let (raw, _) = weights(dtype, m, k, &mut rng);
        for &n in &[k4_pairs::MIN_TOKENS, 9, 16, 17, 33] {
            let x = rng.vec(n * k, 1.5);
            for &isa in &wide {
                let prepared = Prepared::new(SimdLevel::Auto, QuantDot::Int8, &x, k, n, k, dtype).expect("prepare").expect("an int8 kernel").with_isa(isa);
                assert!(prepared.has_pairs(), "{dtype} {isa:?} n={n}: the pair kernel was not taken");
                let mut together = vec![0f32; n * m];
                prepared.run(&raw, m, &mut together, m).expect("run");
                for t in 0..n {
                    let mut alone = vec![0f32; m];
                    int8_block(isa, &x[t * k..][..k], k, 1, k, &raw, dtype, m, &mut alone, m);
                    let got = &together[t * m..][..m];
                    assert!(got.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "{dtype} {isa:?} blocks={blocks} n={n} t={t}: {got:?} vs alone {alone:?}");
                }
            }
        }
    }
}

/// `FT_AMX_QUANT_PREFILL=1`'s routing (`in_groups_with`): where the CPU has AMX tiles, the
/// integer types' products of 32 tokens or more leave their int8 kernels for the tiles and
/// shorter ones stay; without the request every one stays.
#[test]
fn amx_quant_prefill_sends_long_products_to_the_tiles() {
    use super::prepared::in_groups_with;
    let k = 2048;
    let tiles = crate::kernels::gemv::amx_tiles(SimdLevel::Auto, QuantDot::Int8, 64, k);
    eprintln!("AMX tiles on this CPU: {tiles}");
    let mut checked = 0;
    for dtype in [DType::Q4K, DType::Q5K, DType::Q6K, DType::Q8_0, DType::Mxfp4] {
        if !in_groups_with(SimdLevel::Auto, QuantDot::Int8, dtype, 64, k, false) {
            continue;
        }
        checked += 1;
        assert!(in_groups_with(SimdLevel::Auto, QuantDot::Int8, dtype, 16, k, true), "{dtype}: 16 tokens stay in groups");
        assert!(in_groups_with(SimdLevel::Auto, QuantDot::Int8, dtype, 31, k, true), "{dtype}: 31 tokens stay in groups");
        assert_eq!(in_groups_with(SimdLevel::Auto, QuantDot::Int8, dtype, 32, k, true), !tiles, "{dtype}: 32 tokens");
        assert_eq!(in_groups_with(SimdLevel::Auto, QuantDot::Int8, dtype, 512, k, true), !tiles, "{dtype}: 512 tokens");
        assert!(in_groups_with(SimdLevel::Auto, QuantDot::Int8, dtype, 512, k, false), "{dtype}: without the request");
    }
    if checked == 0 {
        eprintln!("skipped: no integer type runs its int8 kernels in groups on this CPU");
    }
}

/// Bad shapes are errors, never out-of-bounds reads: short weights, short activations, a
/// short output.
#[test]
fn prepared_shape_errors() {
    let dtype = DType::Q4K;
    let k = 256;
    let w = vec![0u8; dtype.row_bytes(k) * 4];
    let x = vec![1f32; 2 * k];
    let mut out = vec![0f32; 8];
    assert!(block(SimdLevel::Auto, QuantDot::Int8, &x, k, 2, k, &w[..100], dtype, 4, &mut out, 4).is_err());
    assert!(block(SimdLevel::Auto, QuantDot::Int8, &x[..k + 3], k, 2, k, &w, dtype, 4, &mut out, 4).is_err());
    assert!(block(SimdLevel::Auto, QuantDot::Int8, &x, k, 2, k, &w, dtype, 4, &mut out[..6], 4).is_err());
}

/// NVFP4 rows of `k` values, global scale `global`, group scale codes from `code(row, group)`
/// and random E2M1 codes, against one token of int8-representable activations times
/// `x_scale`, in every instruction variant: each result within `1e-6 · Σ|x·w|` of the scalar
/// decode's product, finite, or NaN where that is NaN.
fn nvfp4_against_decode(test: &str, k: usize, nrows: usize, global: f32, x_scale: f32, mut rng: Rng, code: impl Fn(usize, usize, &mut Rng) -> u8) {
    let dtype = DType::Nvfp4;
    let blocks = k / dtype.block_elems();
    let mut raw = vec![0u8; nrows * dtype.row_bytes(k)];
    for (i, blk) in raw.chunks_exact_mut(ft_backend::quant::block_bytes(dtype)).enumerate() {
        blk[..4].copy_from_slice(&global.to_le_bytes());
        for g in 0..16 {
            blk[4 + g] = code(i / blocks, g, &mut rng);
        }
        for b in &mut blk[20..] {
            *b = rng.next_u64() as u8;
        }
    }
    let mut dec = vec![0f32; nrows * k];
    super::super::elementwise::decode_scalar(&raw, dtype, &mut dec);
    let x: Vec<f32> = (0..k).map(|p| if p % 32 == 0 { 127.0 } else { (rng.next_u64() % 255) as f32 - 127.0 } * x_scale).collect();
    for isa in isas(test) {
        let mut out = vec![0f32; nrows];
        int8_block(isa, &x, k, 1, k, &raw, dtype, nrows, &mut out, nrows);
        for r in 0..nrows {
            let (want, mag) = super::tests::exact_dot(&x, &dec[r * k..][..k]);
            let got = out[r] as f64;
            if want.is_nan() {
                assert!(got.is_nan(), "{test}: {isa:?} row {r}: a NaN scale must give NaN, got {got}");
            } else {
                assert!(got.is_finite() && (got - want).abs() <= 1e-6 * mag, "{test}: {isa:?} row {r}: got {got}, want {want}");
            }
        }
    }
}

/// NVFP4's scales are decoded in vectors (E4M3 widened through f16): blocks whose 16 scales
/// run through all 256 codes (subnormals, ±448, the NaN codes).
#[test]
fn nvfp4_every_scale_code() {
    if !avx2() {
        eprintln!("skipped: the int8 kernels need AVX2");
        return;
    }
    nvfp4_against_decode("nvfp4_every_scale_code", 256, 16, 0.75, 1.0, Rng::new(0x18d), |r, g, _| (16 * r + g) as u8);
}

/// A global scale whose `2⁸·global` overflows while the scales times it do not takes the
/// reference's order of multiplications (the kernel folds `2⁸` into the global otherwise):
/// scale codes up to 1.875 in magnitude against a global of 2·10³⁶, activations small enough
/// to keep every partial sum finite in f32.
#[test]
fn nvfp4_global_past_the_fold() {
    if !avx2() {
        eprintln!("skipped: the int8 kernels need AVX2");
        return;
    }
    assert!((2e36f32 * 256.0).is_infinite());
    // Exponent field at most 7 (values below 2), either sign.
    let code = |_: usize, _: usize, rng: &mut Rng| (rng.next_u64() as u8 & 0x3f) | (rng.next_u64() as u8 & 0x80);
    nvfp4_against_decode("nvfp4_global_past_the_fold", 512, 8, 2e36, 2f32.powi(-20), Rng::new(0x18f), code);
}

/// The branch-free E8M0 decode of the AVX2 MXFP4 kernel (eight blocks' scale bytes, 17 bytes
/// apart) is the reference's for every code (2⁻¹²⁷ for 0, NaN for 255), each in every lane.
#[test]
fn e8m0_lanes_match_the_reference_decode() {
    if !avx2() {
        eprintln!("skipped: the int8 kernels need AVX2");
        return;
    }
    for first in (0..256).step_by(8) {
        // Eight blocks' scale bytes where an MXFP4 run holds them, the codes between them set.
        let mut run = [0xa5u8; 136];
        for b in 0..8 {
            run[17 * b] = (first + b) as u8;
        }
        let mut lanes = [0f32; 8];
        // SAFETY: AVX2 checked above; `run` holds the eight blocks read.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), crate::kernels::x86::qdot_i8::e8m0_x8(run.as_ptr())) };
        for (b, ours) in lanes.into_iter().enumerate() {
            let code = (first + b) as u8;
            let reference = ft_backend::quant::e8m0_to_f32(code);
            assert!(ours.to_bits() == reference.to_bits() || (ours.is_nan() && reference.is_nan()), "code {code}: {ours} vs {reference}");
        }
    }
}

/// MXFP4 rows whose every block has one E8M0 code, the two decoded apart from the rest among
/// them (0 is 2⁻¹²⁷, 255 NaN): every int8 variant, the 512-bit kernel included (two steps of
/// four blocks and a last block alone), gives the reference's product.
#[test]
fn mxfp4_exponent_codes() {
    if !avx2() {
        eprintln!("skipped: the int8 kernels need AVX2");
        return;
    }
    let dtype = DType::Mxfp4;
    let codes = [0u8, 1, 2, 60, 126, 127, 128, 140, 255];
    let (k, nrows) = (9 * 32, codes.len());
    let rb = dtype.row_bytes(k);
    let mut rng = Rng::new(0x18e);
    let mut raw: Vec<u8> = (0..nrows * rb).map(|_| rng.next_u64() as u8).collect();
    for (r, &c) in codes.iter().enumerate() {
        for b in 0..k / 32 {
            raw[r * rb + 17 * b] = c;
        }
    }
    let mut dec = vec![0f32; nrows * k];
    super::super::elementwise::decode_scalar(&raw, dtype, &mut dec);
    // Integers with 127 in every group: scale 1, so int8 holds them exactly.
    let x: Vec<f32> = (0..k).map(|p| if p % 32 == 0 { 127.0 } else { (rng.next_u64() % 255) as f32 - 127.0 }).collect();
    for isa in isas("mxfp4_exponent_codes") {
        let mut out = vec![0f32; nrows];
        int8_block(isa, &x, k, 1, k, &raw, dtype, nrows, &mut out, nrows);
        for (r, &c) in codes.iter().enumerate() {
            let (want, mag) = super::tests::exact_dot(&x, &dec[r * k..][..k]);
            let got = out[r] as f64;
            if c == 255 {
                assert!(got.is_nan(), "{isa:?} code 255: NaN scale must give NaN, got {got}");
            } else {
                assert!(mag > 0.0 && (got - want).abs() <= 1e-6 * mag, "{isa:?} code {c}: got {got}, want {want}");
            }
        }
        // Code 255 with positive codes and activations only: still NaN.
        let row: Vec<u8> = (0..k / 32).flat_map(|_| std::iter::once(255u8).chain([0x22u8; 16])).collect();
        let pos: Vec<f32> = (0..k).map(|p| (1 + p % 127) as f32).collect();
        let mut out = [0f32];
        int8_block(isa, &pos, k, 1, k, &row, dtype, 1, &mut out, 1);
        assert!(out[0].is_nan(), "{isa:?} code 255, positive products: got {}", out[0]);
    }
}
