//! Tensors larger than one storage binding (big embeddings, fused expert weights on real
//! GPUs) are bound through aligned windows. The binding cap is lowered to 64 KiB here so the
//! windowed paths run on any adapter; results must equal the reference exactly (gather,
//! copies) or within the conformance bound (matmul).

use ft_backend::conformance::{Rng, MATMUL_RTOL};
use ft_backend::dtype::{from_f32_slice, to_f32_vec};
use ft_backend::{
    reference, Backend, BufferUsage, CopyDesc, DType, MatmulDesc, RmsNormDesc, StreamId,
};
use ft_backend_wgpu::{WgpuBackend, WgpuOptions};

const CAP: u64 = 64 << 10;

fn backend() -> Option<WgpuBackend> {
    let opts = WgpuOptions {
        max_binding_bytes: Some(CAP),
        ..Default::default()
    };
    match WgpuBackend::new(opts) {
        Ok(b) => Some(b),
        Err(e) if std::env::var("FT_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("FT_REQUIRE_WGPU=1 but the wgpu backend did not open: {e}")
        }
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
}

fn upload(b: &WgpuBackend, dtype: DType, v: &[f32]) -> (ft_backend::DeviceBuffer, Vec<f32>) {
    let bytes = from_f32_slice(v, dtype);
    let mut buf = b
        .alloc(dtype, v.len(), BufferUsage::Weights)
        .expect("alloc");
    b.upload(StreamId::COMPUTE, &bytes, &mut buf, 0)
        .expect("upload");
    (buf, to_f32_vec(&bytes, dtype).expect("decode"))
}

fn download(b: &WgpuBackend, buf: &ft_backend::DeviceBuffer) -> Vec<f32> {
    let mut bytes = vec![0u8; buf.size_bytes()];
    b.download(StreamId::COMPUTE, buf, 0, &mut bytes)
        .expect("download");
    to_f32_vec(&bytes, buf.dtype()).expect("decode")
}

#[test]
fn matmul_selects_one_expert_of_a_tensor_larger_than_a_binding() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new(7);
    let (experts, n, k, m) = (8, 3, 300, 16);
    for dtype in DType::ALL {
        // One extra leading element makes every expert start at an odd element.
        let (w, wv) = upload(&b, dtype, &rng.vec(1 + experts * m * k, 1.0));
        assert!(
            w.size_bytes() as u64 > CAP,
            "the weights must exceed one binding"
        );
        let x = rng.vec(n * k, 1.0);
        let (xb, _) = upload(&b, DType::F32, &x);
        for e in [0, 5, experts - 1] {
            let w_offset = 1 + e * m * k;
            let mut out = b
                .alloc(DType::F32, n * m, BufferUsage::Scratch)
                .expect("alloc");
            let desc = MatmulDesc {
                w_offset,
                ..MatmulDesc::new(n, k, m)
            };
            b.matmul(&xb, &w, None, &mut out, &desc).expect("matmul");
            let ws = &wv[w_offset..][..m * k];
            let want = reference::matmul(&x, ws, None, n, k, m);
            let got = download(&b, &out);
            for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
                let (i, j) = (idx / m, idx % m);
                let mag: f32 = (0..k).map(|p| (x[i * k + p] * ws[j * k + p]).abs()).sum();
                let bound = MATMUL_RTOL * (k as f32).sqrt() * mag;
                assert!(
                    (g - r).abs() <= bound,
                    "{dtype} expert {e} [{i},{j}]: {g} vs {r}"
                );
            }
        }
    }
}

#[test]
fn gather_from_a_table_larger_than_a_binding() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new(8);
    let (rows, cols) = (200, 300);
    for dtype in DType::ALL {
        let (t, tv) = upload(&b, dtype, &rng.vec(rows * cols, 2.0));
        let ids = [199u32, 0, 77, 77, 3];
        let mut out = b
            .alloc(DType::F32, ids.len() * cols, BufferUsage::Scratch)
            .expect("alloc");
        b.gather_rows(&t, &ids, cols, &mut out).expect("gather");
        assert_eq!(
            download(&b, &out),
            reference::gather_rows(&tv, &ids, cols),
            "{dtype}"
        );
    }
}

#[test]
fn copies_inside_buffers_larger_than_a_binding() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new(9);
    let len = 100_000;
    for dtype in DType::ALL {
        let (src, sv) = upload(&b, dtype, &rng.vec(len, 3.0));
        let (mut dst, dv) = upload(&b, dtype, &rng.vec(len, 3.0));
        let mut want = dv.clone();
        for (so, d, n) in [
            (33_333, 70_001, 1001),
            (40_000, 10_000, 3000),
            (99_999, 0, 1),
        ] {
            b.copy(
                StreamId::COMPUTE,
                &src,
                &mut dst,
                &CopyDesc {
                    src_offset: so,
                    dst_offset: d,
                    len: n,
                },
            )
            .expect("copy");
            want[d..d + n].copy_from_slice(&sv[so..so + n]);
        }
        assert_eq!(download(&b, &dst), want, "{dtype}");
    }
}

#[test]
fn activations_beyond_one_binding_are_a_clear_error() {
    let Some(b) = backend() else { return };
    let (rows, dim) = (100, 1000); // 400 KB of f32 in one row-wise op
    let (x, _) = upload(&b, DType::F32, &vec![1.0; rows * dim]);
    let (w, _) = upload(&b, DType::F32, &vec![1.0; dim]);
    let mut out = b
        .alloc(DType::F32, rows * dim, BufferUsage::Scratch)
        .expect("alloc");
    let desc = RmsNormDesc {
        rows,
        dim,
        eps: 1e-6,
        unit_offset: false,
    };
    let err = b
        .rms_norm(&x, &w, &mut out, &desc)
        .expect_err("too large for one binding");
    assert!(err.to_string().contains("binding"), "{err}");
}

/// Block-quantized experts of a fused tensor larger than a binding: each expert's rows are
/// bound through a byte window (blocks of 17, 18, 34, … bytes start at any byte of it).
#[test]
fn quantized_matmul_selects_one_expert_of_a_tensor_larger_than_a_binding() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new(10);
    let (n, k, m) = (5, 300, 16);
    for dtype in DType::QUANTIZED {
        let experts = (2 * CAP as usize / (m * dtype.row_bytes(k))).max(3);
        let per = m * dtype.padded(k);
        let mut bytes = Vec::new();
        let mut values = Vec::new();
        for _ in 0..experts {
            let v = rng.vec(m * k, 1.0);
            let q = ft_backend::quant::quantize_matrix(dtype, &v, m, k);
            values.push(ft_backend::quant::dequantize_matrix(dtype, &q, m, k).expect("decode"));
            bytes.extend(q);
        }
        let mut w = b
            .alloc(dtype, experts * per, BufferUsage::Weights)
            .expect("alloc");
        assert!(
            w.size_bytes() as u64 > CAP,
            "{dtype}: the weights must exceed one binding"
        );
        b.upload(StreamId::COMPUTE, &bytes, &mut w, 0)
            .expect("upload");
        let x = rng.vec(n * k, 1.0);
        let (xb, _) = upload(&b, DType::F32, &x);
        for e in [0, experts / 2, experts - 1] {
            let mut out = b
                .alloc(DType::F32, n * m, BufferUsage::Scratch)
                .expect("alloc");
            let desc = MatmulDesc {
                w_offset: e * per,
                ..MatmulDesc::new(n, k, m)
            };
            b.matmul(&xb, &w, None, &mut out, &desc).expect("matmul");
            let ws = &values[e];
            let want = reference::matmul(&x, ws, None, n, k, m);
            let got = download(&b, &out);
            for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
                let (i, j) = (idx / m, idx % m);
                let mag: f32 = (0..k).map(|p| (x[i * k + p] * ws[j * k + p]).abs()).sum();
                let bound = MATMUL_RTOL * (k as f32).sqrt() * mag;
                assert!(
                    (g - r).abs() <= bound,
                    "{dtype} expert {e} [{i},{j}]: {g} vs {r}"
                );
            }
        }
        // Other kernels refuse block types instead of misreading them.
        let (xr, _) = upload(&b, DType::F32, &vec![1.0; k]);
        let mut o = b.alloc(DType::F32, k, BufferUsage::Scratch).expect("alloc");
        let desc = RmsNormDesc {
            rows: 1,
            dim: k,
            eps: 1e-6,
            unit_offset: false,
        };
        assert!(
            b.rms_norm(&xr, &w, &mut o, &desc).is_err(),
            "{dtype}: rms_norm accepted"
        );
    }
}

/// Whole blocks of a quantized buffer copy byte for byte.
#[test]
fn quantized_blocks_copy() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new(11);
    for dtype in DType::QUANTIZED {
        let be = dtype.block_elems();
        // 8 blocks: offsets of 4 blocks are word-aligned for every block size.
        let bytes = ft_backend::quant::quantize_matrix(dtype, &rng.vec(8 * be, 1.0), 1, 8 * be);
        let mut src = b.alloc(dtype, 8 * be, BufferUsage::Weights).expect("alloc");
        b.upload(StreamId::COMPUTE, &bytes, &mut src, 0)
            .expect("upload");
        let mut dst = b.alloc(dtype, 8 * be, BufferUsage::Weights).expect("alloc");
        let desc = CopyDesc {
            src_offset: 0,
            dst_offset: 4 * be,
            len: 4 * be,
        };
        b.copy(StreamId::COMPUTE, &src, &mut dst, &desc)
            .expect("copy");
        let mut got = vec![0u8; dst.size_bytes()];
        b.download(StreamId::COMPUTE, &dst, 0, &mut got)
            .expect("download");
        let half = 4 * dtype.size();
        assert!(got[..half].iter().all(|v| *v == 0), "{dtype}");
        assert_eq!(&got[half..], &bytes[..half], "{dtype}");
        let inside = CopyDesc {
            src_offset: 1,
            dst_offset: 0,
            len: be,
        };
        assert!(
            b.copy(StreamId::COMPUTE, &src, &mut dst, &inside).is_err(),
            "{dtype}: copy inside a block"
        );
    }
}
