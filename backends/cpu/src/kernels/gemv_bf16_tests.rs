//! The `vdpbf16ps` prefill path of [`super::matmul`] against f64 references, and the plain
//! dtypes' tiles against themselves.

use super::*;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        })
        .collect()
}

fn bf16(v: f32) -> f64 {
    half::bf16::from_f32(v).to_f64()
}

/// Whether this CPU takes the bf16 path at all (otherwise the Int8 mode must stay exact).
fn has_dpbf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        SimdLevel::Auto.effective() == SimdLevel::Avx512 && super::super::x86::dpbf16::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The product in the int8 mode and in the exact one.
fn both_modes(pool: &ThreadPool, x: &[f32], n: usize, k: usize, w: &[u8], dtype: DType, m: usize) -> (Vec<f32>, Vec<f32>) {
    let run = |dot| {
        let mut out = vec![f32::NAN; n * m];
        matmul(Some(pool), SimdLevel::Auto, dot, x, n, k, w, dtype, m, &mut out).expect("matmul");
        out
    };
    (run(QuantDot::Int8), run(QuantDot::Exact))
}

#[test]
fn activations_round_to_nearest_even() {
    // Ties (the low 16 bits exactly 0x8000) go to the even neighbour; the tail is not a
    // multiple of 32 so the masked conversion is covered too.
    let (n, k) = (12, 7);
    let mut x: Vec<f32> = values(n * k, 9);
    x[3] = f32::from_bits(0x3f80_8000); // tie, even below
    x[4] = f32::from_bits(0x3f81_8000); // tie, even above
    x[70] = f32::from_bits(0xbf80_8001);
    let got =
        bf16_activations(SimdLevel::Auto, QuantDot::Int8, &x, n, k, DType::BF16).expect("round");
    if !has_dpbf16() {
        eprintln!("skipped: this CPU has no AVX-512 BF16, the bf16 activation path is not taken");
        assert!(got.is_none());
        return;
    }
    let got = got.expect("bf16 path on a CPU with AVX-512 BF16").rows;
    let want: Vec<u16> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    assert_eq!(got, want);
    // Exact mode, other dtypes and other instruction sets never round.
    assert!(
        bf16_activations(SimdLevel::Auto, QuantDot::Exact, &x, n, k, DType::BF16)
            .expect("exact")
            .is_none()
    );
    assert!(
        bf16_activations(SimdLevel::Auto, QuantDot::Int8, &x, n, k, DType::F16)
            .expect("f16")
            .is_none()
    );
    assert!(
        bf16_activations(SimdLevel::Avx2, QuantDot::Int8, &x, n, k, DType::BF16)
            .expect("avx2")
            .is_none()
    );
}

#[test]
fn product_matches_rounded_reference() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    // Token counts around the tile (6); k with and without a 32 tail; row counts with a ragged
    // end and enough rows for the pool split.
    for &(n, k, m) in &[
        (1, 2048, 130),
        (4, 300, 7),
        (12, 64, 5),
        (13, 37, 9),
        (19, 2053, 33),
        (31, 768, 130),
        (64, 96, 4),
        // AMX tiles: one and two row tiles, one and two token tiles.
        (16, 64, 16),
        (20, 64, 48),
        (47, 128, 40),
    ] {
        let x = values(n * k, (n * k) as u64);
        let wf = values(m * k, (m + k) as u64);
        let w = ft_backend::dtype::from_f32_slice(&wf, DType::BF16);
        let (got, exact) = both_modes(&pool, &x, n, k, &w, DType::BF16, m);
        for t in 0..n {
            for r in 0..m {
                let (mut rounded, mut full, mut mag) = (0f64, 0f64, 0f64);
                for p in 0..k {
                    let wv = bf16(wf[r * k + p]);
                    rounded += bf16(x[t * k + p]) * wv;
                    full += x[t * k + p] as f64 * wv;
                    mag += (x[t * k + p] as f64 * wv).abs();
                }
                let g = got[t * m + r] as f64;
                // bf16 activations: each element off by ≤ 2⁻⁹ of itself.
                assert!(
                    (g - full).abs() <= mag / 512.0,
                    "n={n} k={k} [{t},{r}]: {g} vs {full}"
                );
                if has_dpbf16() {
                    // The products of bf16 pairs are exact in f32; what remains is f32
                    // accumulation: one rounding per 32-element step and lane, 8 to reduce;
                    // the AMX tiles round once per pair.
                    let steps = if amx_takes(n, k) { k as f64 / 2.0 } else { k as f64 / 32.0 + 8.0 };
                    let tol = steps * mag * f64::from(f32::EPSILON);
                    assert!(
                        (g - rounded).abs() <= tol,
                        "n={n} k={k} [{t},{r}]: {g} vs rounded {rounded} (tol {tol})"
                    );
                } else {
                    assert_eq!(got[t * m + r], exact[t * m + r]);
                }
            }
        }
    }
}

/// Whether a bf16 product of `n` tokens of `k` takes the AMX tiles on this CPU.
fn amx_takes(n: usize, k: usize) -> bool {
    amx_tiles(SimdLevel::Auto, QuantDot::Int8, n, k)
}

#[test]
fn a_token_gets_the_same_bits_whatever_shares_the_product() {
    // Batching must not change a sequence's numbers: with bf16 activations each token's row
    // of the product is the one it gets alone, bit for bit (ragged row ends, pool split or
    // not), in every product of fewer tokens than take the AMX tiles (batched decode). (The
    // exact kernels tile 1 and 2–6 tokens with different accumulator splits, so they agree
    // only to rounding.)
    if !has_dpbf16() {
        eprintln!("skipped: this CPU has no AVX-512 BF16, the bf16 activation path is not taken");
        return;
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    for (k, m) in [(300, 70), (2048, 130)] {
        let w = ft_backend::dtype::from_f32_slice(&values(m * k, 5), DType::BF16);
        let x = values(20 * k, 6);
        let mut alone = vec![0f32; 20 * m];
        for t in 0..20 {
            matmul(
                Some(&pool),
                SimdLevel::Auto,
                QuantDot::Int8,
                &x[t * k..][..k],
                1,
                k,
                &w,
                DType::BF16,
                m,
                &mut alone[t * m..][..m],
            )
            .expect("alone");
        }
        for n in [2, 5, 12, 15] {
            let mut together = vec![0f32; n * m];
            matmul(
                Some(&pool),
                SimdLevel::Auto,
                QuantDot::Int8,
                &x[..n * k],
                n,
                k,
                &w,
                DType::BF16,
                m,
                &mut together,
            )
            .expect("together");
            assert_eq!(together, alone[..n * m], "k={k} n={n}");
        }
    }
}

#[test]
fn short_inputs_are_shape_errors() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    let (n, k, m) = (16, 64, 8);
    let x = values(n * k, 1);
    let w = ft_backend::dtype::from_f32_slice(&values(m * k, 2), DType::BF16);
    let mut out = vec![0f32; n * m];
    let run = |x: &[f32], w: &[u8], out: &mut [f32]| {
        matmul(Some(&pool), SimdLevel::Auto, QuantDot::Int8, x, n, k, w, DType::BF16, m, out)
    };
    assert!(run(&x[..n * k - 1], &w, &mut out).is_err());
    assert!(run(&x, &w[..w.len() - 2], &mut out).is_err());
    assert!(run(&x, &w, &mut out[..n * m - 1]).is_err());
    assert!(run(&x, &w, &mut out).is_ok());
}

#[test]
fn quantized_prefill_matches_rounded_dequantized_reference() {
    // Past 4 tokens the int8 mode gives integer block types dequantized rows rounded to bf16
    // (on the AMX tiles from 16 tokens where the CPU has them); up to 4 it keeps their int8
    // kernels; FP8 meets bf16 activations in its own kernel, four
    // tokens at a time (AVX-512 VBMI; checked in `fused_tests`), on the tiles from 32 tokens with
    // its weights exact, and stays exact elsewhere. The 40-row case leaves a ragged tile.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    for (k, m) in [(512, 40), (40, 9), (160, 17)] {
        let wf = values(m * k, 11);
        for dtype in DType::QUANTIZED {
            let w = ft_backend::quant::quantize_matrix(dtype, &wf, m, k);
            let rb = dtype.row_bytes(k);
            let mut deq = vec![0f32; m * dtype.padded(k)];
            for r in 0..m {
                super::super::quant::decode_row(
                    SimdLevel::Auto,
                    &w[r * rb..][..rb],
                    dtype,
                    &mut deq[r * dtype.padded(k)..][..dtype.padded(k)],
                );
            }
            for n in [5, 13, 20, 40] {
                let x = values(n * k, n as u64 + 40);
                let (got, exact) = both_modes(&pool, &x, n, k, &w, dtype, m);
                // Types that take their fused kernels at every token count are checked
                // against each token alone (`int8_tests::grouped_prefill_equals_each_token_alone`).
                if super::super::quant::in_groups(SimdLevel::Auto, QuantDot::Int8, dtype, n, k) {
                    continue;
                }
                // FP8 from 32 tokens on the AMX tiles: its codes unscaled (exact in bf16), the
                // scales applied in f32 per block, so only the activations are rounded.
                let fp8_tiles = dtype == DType::F8E4M3 && widened_on_tiles(SimdLevel::Auto, QuantDot::Int8, n, k);
                let bf16_path = has_dpbf16() && (dtype != DType::F8E4M3 || fp8_tiles);
                for t in 0..n {
                    for r in 0..m {
                        let row = &deq[r * dtype.padded(k)..][..k];
                        let (mut rounded, mut full, mut mag) = (0f64, 0f64, 0f64);
                        for p in 0..k {
                            rounded += bf16(x[t * k + p]) * if fp8_tiles { row[p] as f64 } else { bf16(row[p]) };
                            full += x[t * k + p] as f64 * row[p] as f64;
                            mag += (x[t * k + p] as f64 * row[p] as f64).abs();
                        }
                        let g = got[t * m + r] as f64;
                        // Weights and activations each off by ≤ 2⁻⁹ of themselves.
                        assert!(
                            (g - full).abs() <= mag / 256.0,
                            "{dtype} n={n} [{t},{r}]: {g} vs {full}"
                        );
                        if bf16_path {
                            let steps = if amx_takes(n, k) { k as f64 / 2.0 } else { k as f64 / 32.0 + 8.0 };
                            let tol = steps * mag * f64::from(f32::EPSILON);
                            assert!(
                                (g - rounded).abs() <= tol,
                                "{dtype} n={n} [{t},{r}]: {g} vs rounded {rounded}"
                            );
                        } else {
                            assert_eq!(
                                got[t * m + r],
                                exact[t * m + r],
                                "{dtype} n={n}: the exact path"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Pool tasks: decode-sized products in tasks of ~32 KiB (at most 512 of them), prefill four a
/// thread for small products, capped by bytes for large ones (the output head); always whole
/// prefill chunks, and the tasks cover every row.
#[test]
fn task_rows_caps_bytes_and_keeps_chunks() {
    // An expert's gate in bf16 (768 rows of 4 KiB), one token: 32 KiB is 8 rows, one chunk.
    assert_eq!(task_rows(2, 1, 768, 4096), CHUNK_ROWS);
    // A 4.7 MB Q4_K projection (4096 rows of 1152 B): 28 rows → 32, 128 tasks.
    assert_eq!(task_rows(2, 1, 4096, 1152), 32);
    // A 151,936-row bf16 head at one token: 512 tasks of ~1.2 MB, not 19,000 of 32 KiB.
    assert_eq!(task_rows(2, 1, 151_936, 4096), 304);
    assert!(151_936usize.div_ceil(task_rows(2, 4, 151_936, 4096)) <= DECODE_TASKS);
    // Prefill: the gate, a quarter per thread pair → 96 rows; the head 128 rows (512 KiB).
    assert_eq!(task_rows(2, 64, 768, 4096), 96);
    assert_eq!(task_rows(2, 64, 151_936, 4096), 128);
    // Rows wider than the cap still make one chunk a task.
    assert_eq!(task_rows(2, 64, 10_000, 4 << 20), CHUNK_ROWS);
    // At one token they are ≥ 32 KiB each, and the 512-task cap makes ~19 → 32 rows.
    assert_eq!(task_rows(2, 1, 10_000, 4 << 20), 2 * CHUNK_ROWS);
    // A few rows on many threads: one chunk.
    assert_eq!(task_rows(16, 64, 20, 64), CHUNK_ROWS);
    for n in [1, 4, 5, 64] {
        for (threads, m, rb) in [(1, 1, 1), (2, 151_936, 4096), (3, 1000, 700), (8, 33, 10)] {
            let per = task_rows(threads, n, m, rb);
            assert!(per >= 1 && per.is_multiple_of(CHUNK_ROWS));
            assert!(m.div_ceil(per) * per >= m);
        }
    }
}

/// Products of at least `amx::MIN_TOKENS` tokens on the AMX tiles: a token's row is the same
/// in every such product (the tiles sum each (row, token) over k in one order, whatever the
/// other tokens), rows past the last whole tile of 16 included, and within the rounding bound
/// of the product of the bf16-rounded values (checked in `product_matches_rounded_reference`).
#[test]
fn tile_products_agree_across_token_counts() {
    if !amx_takes(64, 64) {
        eprintln!("skipped: this CPU has no AMX tiles (or the kernel refused them)");
        return;
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
    for (k, m) in [(64, 35), (2048, 130)] {
        let w = ft_backend::dtype::from_f32_slice(&values(m * k, 7), DType::BF16);
        let x = values(50 * k, 8);
        let run = |n: usize, t0: usize| {
            let mut out = vec![f32::NAN; n * m];
            matmul(Some(&pool), SimdLevel::Auto, QuantDot::Int8, &x[t0 * k..][..n * k], n, k, &w, DType::BF16, m, &mut out).expect("matmul");
            out
        };
        let all = run(50, 0);
        for (n, t0) in [(16, 0), (17, 33), (32, 3), (40, 10)] {
            let part = run(n, t0);
            assert_eq!(part, all[t0 * m..][..n * m], "k={k} n={n} from token {t0}");
        }
    }
}

/// A product run on the calling thread alone (a decode expert side by side with others) gives
/// the bits it gets split over the pool in the decode tasks or the prefill ones (the plain
/// dtypes' written in place, through the general tiles and through the panels), in both
/// modes, for the plain dtypes and every block type; rows enough for many tasks, and a ragged
/// last one.
#[test]
fn a_product_alone_equals_it_split_over_the_pool() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
    let (k, m) = (256, 600);
    let wf = values(m * k, 21);
    let bf: Vec<u8> = wf.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
    let hf: Vec<u8> = wf.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    let ff: Vec<u8> = wf.iter().flat_map(|v| v.to_le_bytes()).collect();
    let plain = [(DType::BF16, bf), (DType::F16, hf), (DType::F32, ff)];
    let weights = plain.into_iter().chain(DType::QUANTIZED.into_iter().map(|d| (d, ft_backend::quant::quantize_matrix(d, &wf, m, k))));
    for (dtype, w) in weights {
        for dot in [QuantDot::Exact, QuantDot::Int8] {
            for n in [1, 3, 8, 20] {
                let x = values(n * k, n as u64 + 60);
                let (mut split, mut alone) = (vec![0f32; n * m], vec![0f32; n * m]);
                matmul(Some(&pool), SimdLevel::Auto, dot, &x, n, k, &w, dtype, m, &mut split).expect("split");
                matmul(None, SimdLevel::Auto, dot, &x, n, k, &w, dtype, m, &mut alone).expect("alone");
                assert!(m.div_ceil(task_rows(2, n, m, dtype.row_bytes(k))) > 2, "{dtype} n={n}: the split should make several tasks");
                let same = split.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{dtype} {dot:?} n={n}: alone and split differ");
            }
        }
    }
}

/// A one-token product streams several rows a tile (eight for 2-byte weights, four for f32,
/// one at a ragged end), each row summed in its own accumulator: every row gets the bits it
/// gets in a product of that row alone, whatever tile it fell in (13 and 21 rows: whole
/// tiles, a four-row tile and single rows; `k` off the 32-value step).
#[test]
fn a_decode_row_gets_its_own_bits_in_any_tile() {
    for (k, m) in [(300, 13), (2048, 21)] {
        let wf = values(m * k, 31);
        let x = values(k, 32);
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let w = ft_backend::dtype::from_f32_slice(&wf, dtype);
            let rb = dtype.row_bytes(k);
            let mut all = vec![f32::NAN; m];
            matmul(None, SimdLevel::Auto, QuantDot::Exact, &x, 1, k, &w, dtype, m, &mut all).expect("all rows");
            for r in 0..m {
                let mut one = [f32::NAN];
                matmul(None, SimdLevel::Auto, QuantDot::Exact, &x, 1, k, &w[r * rb..][..rb], dtype, 1, &mut one).expect("one row");
                assert_eq!(all[r].to_bits(), one[0].to_bits(), "{dtype} k={k}: row {r} of {m}");
            }
        }
    }
}
