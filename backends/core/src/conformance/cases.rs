//! Conformance bodies for the kernels; tolerances are in the [parent module](super).

use super::*;
use crate::{reference, AttentionDesc, BackendError, BinaryOp, MatmulDesc, RmsNormDesc, RopeDesc};

/// Offsets of one matmul case (elements of x, w, bias, out).
#[derive(Clone, Copy, Default)]
struct Offsets {
    x: usize,
    w: usize,
    bias: usize,
    out: usize,
}

/// `matmul` with weights of `dtype`: GEMV and prefill shapes, SIMD tails, bias, offsets
/// (including odd weight offsets that misalign rows), `k = 0`, and outputs beyond
/// `out_offset + n·m` left untouched.
pub fn matmul(b: &dyn Backend, dtype: DType) {
    if !supported(b, Op::Matmul, dtype) {
        return;
    }
    let mut rng = Rng::new(0x6d61_746d_756c ^ dtype.size() as u64 ^ (dtype == DType::BF16) as u64);
    let shapes = [
        (1, 1, 1),
        (1, 17, 5),
        (3, 33, 7),
        (9, 100, 13),
        (1, 64, 16),
        (4, 128, 9),
        (8, 257, 33),
        (17, 300, 40),
        (1, 4096, 64),
        (9, 4096, 64),
        (5, 1000, 70),
        (33, 520, 70),
        (2, 1536, 100),
        (13, 2100, 20),
    ];
    for (i, &(n, k, m)) in shapes.iter().enumerate() {
        check_matmul(
            b,
            dtype,
            &mut rng,
            (n, k, m),
            Offsets::default(),
            i % 2 == 0,
        );
    }
    let odd = Offsets {
        x: 3,
        w: 5,
        bias: 2,
        out: 7,
    };
    check_matmul(b, dtype, &mut rng, (2, 70, 21), odd, true);
    check_matmul(b, dtype, &mut rng, (12, 45, 9), odd, false);
    check_matmul(b, dtype, &mut rng, (3, 0, 4), odd, true);
}

fn check_matmul(
    b: &dyn Backend,
    dtype: DType,
    rng: &mut Rng,
    (n, k, m): (usize, usize, usize),
    off: Offsets,
    with_bias: bool,
) {
    let what = format!(
        "matmul {dtype} n={n} k={k} m={m} offsets=({},{},{},{}) bias={with_bias}",
        off.x, off.w, off.bias, off.out
    );
    let x = rng.vec(off.x + n * k, 1.0);
    let (w, wv) = upload(
        b,
        dtype,
        &rng.vec(off.w + m * k + 3, 1.0),
        BufferUsage::Weights,
    );
    let bias_v = rng.vec(off.bias + m + 1, 1.0);
    let bias = with_bias.then(|| upload_f32(b, &bias_v));
    const SENTINEL: f32 = 12345.0;
    let mut out = upload_f32(b, &vec![SENTINEL; off.out + n * m + 5]);
    let desc = MatmulDesc {
        n,
        k,
        m,
        x_offset: off.x,
        w_offset: off.w,
        bias_offset: off.bias,
        out_offset: off.out,
    };
    b.matmul(&upload_f32(b, &x), &w, bias.as_ref(), &mut out, &desc)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = download(b, &out);
    let (xs, ws) = (&x[off.x..][..n * k], &wv[off.w..][..m * k]);
    let bs = with_bias.then(|| &bias_v[off.bias..][..m]);
    let want = reference::matmul(xs, ws, bs, n, k, m);
    assert_close(&what, &got[off.out..][..n * m], &want, matmul_bound(xs, ws, bs, k, m));
    assert!(
        got[..off.out]
            .iter()
            .chain(&got[off.out + n * m..])
            .all(|v| *v == SENTINEL),
        "{what}: wrote outside its output"
    );
}

/// The matmul tolerance at output `idx` of an `[n, m]` result: [`MATMUL_RTOL`] × √k × the sum
/// of the magnitudes of the products (plus the bias).
fn matmul_bound<'a>(x: &'a [f32], w: &'a [f32], bias: Option<&'a [f32]>, k: usize, m: usize) -> impl Fn(usize) -> f32 + 'a {
    move |idx| {
        let (i, j) = (idx / m, idx % m);
        let mag: f32 = (0..k).map(|p| (x[i * k + p] * w[j * k + p]).abs()).sum::<f32>() + bias.map_or(0.0, |b| b[j].abs());
        MATMUL_RTOL * (k as f32).sqrt().max(1.0) * mag
    }
}

/// `matmul` with block-quantized weights of `dtype` against the f32 product of the
/// dequantized weights ([`crate::quant::dequantize_matrix`]): GEMV and prefill shapes, rows
/// whose last block is partial, and the second of two stacked matrices (an expert of a fused
/// tensor, selected by `w_offset`). Same tolerance as the plain dtypes: only the summation
/// order may differ from the reference.
pub fn matmul_quant(b: &dyn Backend, dtype: DType) {
    if !supported(b, Op::Matmul, dtype) {
        return;
    }
    let mut rng = Rng::new(0x7175_616e ^ dtype.block_elems() as u64);
    let shapes = [
        (1, 32, 1),
        (1, 128, 5),
        (1, 300, 7),
        (3, 256, 16),
        (9, 1000, 33),
        (17, 520, 40),
        (1, 4096, 64),
        (33, 2100, 20),
    ];
    for (i, &(n, k, m)) in shapes.iter().enumerate() {
        let what = format!("matmul {dtype} n={n} k={k} m={m}");
        let second = i % 2 == 1;
        // Weights of very different magnitudes per row, so scales differ from block to block.
        let vals: Vec<Vec<f32>> = (0..2)
            .map(|_| {
                (0..m * k)
                    .map(|j| rng.uniform() * (1.0 + (j / k) as f32 * 3.0))
                    .collect()
            })
            .collect();
        let mut bytes = crate::quant::quantize_matrix(dtype, &vals[0], m, k);
        bytes.extend(crate::quant::quantize_matrix(dtype, &vals[1], m, k));
        let pick = usize::from(second);
        let row_bytes = dtype.row_bytes(k);
        let ws = crate::quant::dequantize_matrix(dtype, &bytes[pick * m * row_bytes..], m, k)
            .expect("dequantize");
        let per_matrix = m * dtype.padded(k);
        let mut w = b
            .alloc(dtype, 2 * per_matrix, BufferUsage::Weights)
            .unwrap_or_else(|e| panic!("{what}: alloc: {e}"));
        b.upload(StreamId::COMPUTE, &bytes, &mut w, 0)
            .unwrap_or_else(|e| panic!("{what}: upload: {e}"));
        let x = rng.vec(n * k, 1.0);
        let bias_v = rng.vec(m, 1.0);
        let bias = upload_f32(b, &bias_v);
        let mut out = upload_f32(b, &vec![0.0; n * m]);
        let desc = MatmulDesc {
            w_offset: pick * per_matrix,
            ..MatmulDesc::new(n, k, m)
        };
        b.matmul(&upload_f32(b, &x), &w, Some(&bias), &mut out, &desc)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = download(b, &out);
        let want = reference::matmul(&x, &ws, Some(&bias_v), n, k, m);
        assert_close(&what, &got, &want, matmul_bound(&x, &ws, Some(&bias_v), k, m));
    }
    // A weight offset inside a block is refused, not misread.
    let mut w = b
        .alloc(dtype, 2 * dtype.padded(64), BufferUsage::Weights)
        .expect("alloc");
    let bytes = crate::quant::quantize_matrix(dtype, &rng.vec(128, 1.0), 2, 64);
    b.upload(StreamId::COMPUTE, &bytes, &mut w, 0)
        .expect("upload");
    let mut out = upload_f32(b, &[0.0]);
    let desc = MatmulDesc {
        w_offset: 1,
        ..MatmulDesc::new(1, 64, 1)
    };
    assert!(
        b.matmul(&upload_f32(b, &[0.5; 64]), &w, None, &mut out, &desc)
            .is_err(),
        "{dtype}: misaligned weight offset accepted"
    );
}

/// `rms_norm` with a weight of `dtype`, both `w` and `1 + w` forms, rows of very different
/// scales.
pub fn rms_norm(b: &dyn Backend, dtype: DType) {
    if !supported(b, Op::RmsNorm, dtype) {
        return;
    }
    let mut rng = Rng::new(0x0072_6d73 + dtype.size() as u64 * 7 + (dtype == DType::BF16) as u64);
    for &(rows, dim, unit_offset) in &[
        (1, 1, false),
        (3, 17, false),
        (2, 64, true),
        (5, 1000, false),
        (4, 4096, true),
        (40, 2048, false),
    ] {
        let mut x = rng.vec(rows * dim, 1.0);
        for (r, row) in x.chunks_mut(dim).enumerate() {
            let s = 10f32.powi(r as i32 % 5 - 2);
            row.iter_mut().for_each(|v| *v *= s);
        }
        let wv: Vec<f32> = rng
            .vec(dim, 0.5)
            .iter()
            .map(|v| if unit_offset { *v } else { 1.0 + v })
            .collect();
        let (w, wv) = upload(b, dtype, &wv, BufferUsage::Weights);
        let mut out = b
            .alloc(DType::F32, rows * dim, BufferUsage::Scratch)
            .expect("alloc");
        let desc = RmsNormDesc {
            rows,
            dim,
            eps: 1e-6,
            unit_offset,
        };
        b.rms_norm(&upload_f32(b, &x), &w, &mut out, &desc)
            .expect("rms_norm");
        let want = reference::rms_norm(&x, &wv, &desc);
        assert_rel(
            &format!("rms_norm {dtype} {rows}×{dim} unit_offset={unit_offset}"),
            &download(b, &out),
            &want,
            RMS_NORM_RTOL,
            SMALL_ATOL,
        );
    }
}

/// `rope`: default and interleaved pairing, partial rotary dims at an offset inside padded
/// rows, YaRN-style scaling, large positions, and enough tokens to run in parallel.
pub fn rope(b: &dyn Backend) {
    if !supported(b, Op::Rope, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x726f_7065);
    let freqs = |dim: usize, base: f32| {
        (0..dim / 2)
            .map(|i| base.powf(-(2.0 * i as f32) / dim as f32))
            .collect::<Vec<_>>()
    };
    let mut cases = vec![
        // (tokens, heads, head_stride, row_stride, rot_offset, rotary_dim, interleaved, scaling)
        (3, 4, 16, 64, 0, 16, false, 1.0, vec![0, 7, 4095]),
        (3, 4, 16, 64, 0, 16, true, 1.0, vec![1, 100, 3000]),
        (2, 3, 24, 77, 4, 8, false, 1.0, vec![5, 1234]),
        (2, 3, 24, 77, 4, 8, true, 1.3, vec![2047, 9]),
        (1, 1, 6, 6, 0, 6, false, 0.9, vec![17]),
    ];
    cases.push((
        64,
        8,
        128,
        8 * 128,
        0,
        64,
        false,
        1.0,
        (0..64).map(|t| 1000 + t * 3).collect(),
    ));
    for (
        n_tokens,
        n_heads,
        head_stride,
        row_stride,
        rot_offset,
        rotary_dim,
        interleaved,
        scaling,
        positions,
    ) in cases
    {
        let desc = RopeDesc {
            n_tokens,
            n_heads,
            head_stride,
            row_stride,
            rot_offset,
            rotary_dim,
            interleaved,
            positions,
            inv_freq: freqs(
                rotary_dim,
                if scaling == 1.0 { 10_000.0 } else { 150_000.0 },
            ),
            scaling,
        };
        let x = rng.vec(n_tokens * row_stride + 3, 1.0);
        let mut buf = upload_f32(b, &x);
        b.rope(&mut buf, &desc)
            .unwrap_or_else(|e| panic!("rope {desc:?}: {e}"));
        let mut want = x.clone();
        reference::rope(&mut want, &desc);
        let what = format!("rope tokens={n_tokens} heads={n_heads} rot={rot_offset}+{rotary_dim} interleaved={interleaved}");
        assert_close(&what, &download(b, &buf), &want, |_| ROPE_ATOL);
    }
}

/// `attention` with a KV cache of `dtype`: prefill (n > 1, from position 0 and continuing),
/// decode (n = 1, kv_len > n, capacity > kv_len), GQA and MQA, sliding windows (including 1),
/// sinks, `v_head_dim != head_dim`, odd head sizes, up to 16 query heads per KV head, the
/// head sizes of the supported families up to MLA's 576, and prefill chunks of 16+ tokens.
pub fn attention(b: &dyn Backend, dtype: DType) {
    if !supported(b, Op::Attention, dtype) {
        return;
    }
    let mut rng = Rng::new(0x6174_746e + dtype.size() as u64 * 3 + (dtype == DType::BF16) as u64);
    // (n_tokens, n_heads, n_kv_heads, head_dim, v_head_dim, kv_len, capacity, window, sinks)
    let cases = [
        (7, 4, 2, 16, 16, 7, 7, None, false),
        (1, 8, 2, 64, 64, 37, 48, None, false),
        (5, 4, 4, 20, 20, 20, 24, None, false),
        (6, 4, 1, 16, 16, 30, 30, Some(8), false),
        (3, 6, 2, 32, 32, 40, 40, Some(16), true),
        (2, 4, 2, 24, 40, 17, 20, None, true),
        (1, 16, 4, 128, 128, 300, 320, None, false),
        (9, 8, 2, 64, 64, 200, 200, Some(64), true),
        (4, 2, 1, 8, 8, 10, 12, Some(1), true),
        (1, 2, 2, 3, 5, 1, 1, None, false),
        (3, 20, 2, 32, 48, 50, 50, None, true),
        (1, 16, 1, 64, 64, 100, 100, Some(50), false),
        // The head sizes of the supported families: Qwen3-Next's 256, 512, and MLA's absorbed
        // attention (DeepSeek-V3: keys of 576 = 512 latent + 64 rotary, values of 512).
        (1, 4, 2, 256, 256, 33, 40, None, false),
        (3, 4, 2, 256, 256, 3, 3, None, false),
        (1, 2, 1, 512, 512, 20, 24, None, false),
        (1, 8, 1, 576, 512, 29, 32, None, false),
        (4, 8, 1, 576, 512, 4, 4, None, false),
        // Prefill chunks of 16+ tokens (the CPU's AMX tile path): from position 0, continuing
        // a cache with a window and sinks, and MLA's 576 / 512.
        (24, 8, 2, 64, 64, 24, 24, None, false),
        (20, 8, 2, 128, 128, 150, 160, Some(64), true),
        (17, 8, 1, 576, 512, 40, 40, None, false),
        // DeepSeek-V4's decode: 64 query heads on one shared K=V head of 512, its 128 window
        // rows and 512 chosen entries, sinks.
        (1, 64, 1, 512, 512, 640, 640, None, true),
        // Past some kernels' limits (CUDA's values of 512, wgpu's keys of 1024): a backend
        // either computes them or says so in `supports_attention` and refuses the call.
        (1, 2, 1, 640, 640, 9, 9, None, false),
        (2, 2, 1, 1100, 64, 5, 5, None, false),
    ];
    for (
        n_tokens,
        n_heads,
        n_kv_heads,
        head_dim,
        v_head_dim,
        kv_len,
        capacity,
        window,
        with_sinks,
    ) in cases
    {
        // A block-quantized cache (Q8_0) keeps each head in whole blocks.
        let be = dtype.block_elems();
        if head_dim % be != 0 || v_head_dim % be != 0 {
            continue;
        }
        let desc = AttentionDesc {
            n_tokens,
            n_heads,
            n_kv_heads,
            head_dim,
            v_head_dim,
            kv_len,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
        };
        let fits = b.supports_attention(&desc, dtype);
        let q = rng.vec(n_tokens * n_heads * head_dim, 2.0);
        // Cache entries beyond kv_len hold garbage that must not be read.
        let mut kv = rng.vec(capacity * n_kv_heads * head_dim, 1.0);
        kv[kv_len * n_kv_heads * head_dim..]
            .iter_mut()
            .for_each(|v| *v = 1e30);
        let (k, kd) = upload(b, dtype, &kv, BufferUsage::Kv);
        let mut vv = rng.vec(capacity * n_kv_heads * v_head_dim, 1.0);
        vv[kv_len * n_kv_heads * v_head_dim..]
            .iter_mut()
            .for_each(|v| *v = 1e30);
        let (v, vd) = upload(b, dtype, &vv, BufferUsage::Kv);
        let sinks_v = rng.vec(n_heads, 2.0);
        let sinks = with_sinks.then(|| upload_f32(b, &sinks_v));
        let mut out = b
            .alloc(
                DType::F32,
                n_tokens * n_heads * v_head_dim,
                BufferUsage::Scratch,
            )
            .expect("alloc");
        let what = format!("attention {dtype} {desc:?} sinks={with_sinks}");
        let r = b.attention(&upload_f32(b, &q), &k, &v, sinks.as_ref(), &mut out, &desc);
        if !fits {
            assert!(
                matches!(r, Err(BackendError::Unsupported { .. })),
                "{what}: supports_attention says no, so the call must be refused, not {r:?}"
            );
            println!("skipped: {what}: beyond the {} backend's attention kernels (as supports_attention says)", b.kind());
            continue;
        }
        r.unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = reference::attention(&q, &kd, &vd, with_sinks.then_some(&sinks_v[..]), &desc);
        assert_rel(
            &what,
            &download(b, &out),
            &want,
            ATTENTION_RTOL,
            ATTENTION_ATOL,
        );
    }
}

/// Every [`BinaryOp`] over lengths from 1 to 70 000 (crossing parallel thresholds), leaving
/// elements past `n` untouched.
pub fn binary(b: &dyn Backend) {
    if !supported(b, Op::Binary, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x6269_6e61);
    let ops = [
        BinaryOp::Add,
        BinaryOp::Mul,
        BinaryOp::MulSigmoid,
        BinaryOp::SwiGlu,
        BinaryOp::ClampedSwiGlu {
            alpha: 1.702,
            limit: 7.0,
        },
        BinaryOp::LimitedSwiGlu { limit: 3.0 },
    ];
    for op in ops {
        for n in [1usize, 15, 1000, 70_000] {
            let av = rng.vec(n + 2, 10.0);
            let bv = rng.vec(n + 5, 10.0);
            let mut a = upload_f32(b, &av);
            b.binary(op, &mut a, &upload_f32(b, &bv), n)
                .unwrap_or_else(|e| panic!("binary {op:?} n={n}: {e}"));
            let mut want = av.clone();
            reference::binary(op, &mut want[..n], &bv[..n]);
            let (rtol, atol) = match op {
                BinaryOp::Add | BinaryOp::Mul => (ONE_ROUNDING_RTOL, 0.0),
                _ => (EXP_RTOL, SMALL_ATOL),
            };
            assert_rel(
                &format!("binary {op:?} n={n}"),
                &download(b, &a),
                &want,
                rtol,
                atol,
            );
        }
    }
}

/// `scale` over several lengths, leaving elements past `n` untouched.
pub fn scale(b: &dyn Backend) {
    if !supported(b, Op::Scale, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x7363_616c);
    for n in [0usize, 1, 33, 5000, 70_000] {
        let xv = rng.vec(n + 3, 100.0);
        let mut x = upload_f32(b, &xv);
        b.scale(&mut x, -1.7, n).expect("scale");
        let want: Vec<f32> = xv
            .iter()
            .enumerate()
            .map(|(i, v)| if i < n { v * -1.7 } else { *v })
            .collect();
        assert_rel(
            &format!("scale n={n}"),
            &download(b, &x),
            &want,
            ONE_ROUNDING_RTOL,
            0.0,
        );
    }
}

/// Row-wise `softmax`, including a single column, large logits and many rows.
pub fn softmax(b: &dyn Backend) {
    if !supported(b, Op::Softmax, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x736f_6674);
    for (rows, cols, spread) in [
        (1, 1, 1.0),
        (3, 7, 1.0),
        (2, 128, 20.0),
        (5, 1000, 30.0),
        (64, 4096, 5.0),
    ] {
        let mut xv = rng.vec(rows * cols + 2, spread);
        xv[..cols].iter_mut().for_each(|v| *v = 0.25); // a constant row
        let mut x = upload_f32(b, &xv);
        b.softmax(&mut x, rows, cols).expect("softmax");
        let mut want = xv.clone();
        reference::softmax(&mut want[..rows * cols], rows, cols);
        assert_rel(
            &format!("softmax {rows}×{cols}"),
            &download(b, &x),
            &want,
            EXP_RTOL,
            SMALL_ATOL,
        );
    }
}

/// `top_k` with many ties (they must go to the lower index), `k = cols`, `k = 0`, and both
/// small-k and large-k shapes.
pub fn top_k(b: &dyn Backend) {
    if !supported(b, Op::TopK, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x746f_706b);
    for (rows, cols, k) in [
        (1, 1, 1),
        (4, 128, 8),
        (3, 10, 10),
        (2, 60, 30),
        (5, 7, 0),
        (16, 256, 4),
    ] {
        // Quarter steps in [-2, 2] make ties common.
        let xv: Vec<f32> = rng
            .vec(rows * cols, 2.0)
            .iter()
            .map(|v| (v * 4.0).round() / 4.0)
            .collect();
        let got = b.top_k(&upload_f32(b, &xv), rows, cols, k).expect("top_k");
        let want = reference::top_k(&xv, rows, cols, k);
        assert_eq!(got, want, "top_k {rows}×{cols} k={k}");
    }
}

/// `gather_rows` from a table of `dtype` (repeated ids, first and last row), exact.
pub fn gather_rows(b: &dyn Backend, dtype: DType) {
    if !supported(b, Op::GatherRows, dtype) {
        return;
    }
    let mut rng = Rng::new(0x6761_7468 + dtype.size() as u64 + (dtype == DType::BF16) as u64);
    for cols in [1usize, 17, 64, 4096] {
        let rows = 50;
        let (table, tv) = upload(b, dtype, &rng.vec(rows * cols, 3.0), BufferUsage::Weights);
        let ids: Vec<u32> = vec![0, 49, 7, 7, 23, 1, 48];
        let mut out = upload_f32(b, &vec![-9.0; ids.len() * cols + 4]);
        b.gather_rows(&table, &ids, cols, &mut out)
            .expect("gather_rows");
        let mut want = reference::gather_rows(&tv, &ids, cols);
        want.extend_from_slice(&[-9.0; 4]);
        assert_eq!(download(b, &out), want, "gather_rows {dtype} cols={cols}");
    }
}

/// `scatter_add_rows` with repeated destination rows.
pub fn scatter_add_rows(b: &dyn Backend) {
    if !supported(b, Op::ScatterAddRows, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x7363_6174);
    for cols in [1usize, 33, 1024] {
        let acc_v = rng.vec(10 * cols, 1.0);
        let rows: Vec<u32> = vec![3, 0, 9, 3, 5, 3, 1];
        let scales = rng.vec(rows.len(), 1.0);
        let xv = rng.vec(rows.len() * cols, 2.0);
        let mut acc = upload_f32(b, &acc_v);
        b.scatter_add_rows(&mut acc, &upload_f32(b, &xv), &rows, &scales, cols)
            .expect("scatter_add_rows");
        let mut want = acc_v.clone();
        reference::scatter_add_rows(&mut want, &xv, &rows, &scales, cols);
        let bound = |idx: usize| {
            let (r, c) = (idx / cols, idx % cols);
            let mag: f32 = rows
                .iter()
                .enumerate()
                .filter(|(_, &d)| d as usize == r)
                .map(|(i, _)| (scales[i] * xv[i * cols + c]).abs())
                .sum();
            SCATTER_RTOL * (acc_v[idx].abs() + mag)
        };
        assert_close(
            &format!("scatter_add_rows cols={cols}"),
            &download(b, &acc),
            &want,
            bound,
        );
    }
}
