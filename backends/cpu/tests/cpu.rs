//! CPU-specific behaviour beyond the shared conformance suite: zero-copy imports, read-only
//! imports, memory accounting, and the raw-slice kernels the engine's executors call.

use ft_backend::{
    reference, Backend, BackendError, BinaryOp, BufferUsage, DType, HostBytes, MatmulDesc, StreamId,
};
use ft_backend_cpu::{kernels, CpuBackend, CpuOptions, SimdLevel};
use std::sync::Arc;

const LEVELS: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512];

fn backend() -> CpuBackend {
    CpuBackend::new(CpuOptions {
        threads: Some(2),
        ..Default::default()
    })
    .expect("backend")
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32
                - 0.5
        })
        .collect()
}

#[test]
fn import_is_zero_copy_and_read_only() {
    let b = backend();
    let owner: Arc<Vec<u8>> = Arc::new((0..103u8).collect());
    let host = HostBytes::new(owner.clone(), 3, 100).expect("range");
    let mut buf = b
        .import_host(host, DType::BF16, BufferUsage::Weights)
        .expect("import");
    let seen = CpuBackend::buffer_bytes(&buf).expect("bytes");
    assert_eq!(seen.as_ptr(), owner[3..].as_ptr(), "import must not copy");
    assert_eq!(b.allocated_bytes(), 0, "imports are not allocations");
    let r = b.upload(StreamId::COMPUTE, &[0; 2], &mut buf, 0);
    assert!(
        matches!(r, Err(BackendError::Invalid(_))),
        "writing an import: {r:?}"
    );
    let mut dst = b
        .alloc(DType::BF16, 50, BufferUsage::Scratch)
        .expect("alloc");
    let r = b.copy(
        StreamId::COMPUTE,
        &dst,
        &mut buf,
        &ft_backend::CopyDesc {
            src_offset: 0,
            dst_offset: 0,
            len: 1,
        },
    );
    assert!(
        matches!(r, Err(BackendError::Invalid(_))),
        "copy into an import: {r:?}"
    );
    b.copy(
        StreamId::COMPUTE,
        &buf,
        &mut dst,
        &ft_backend::CopyDesc {
            src_offset: 0,
            dst_offset: 0,
            len: 50,
        },
    )
    .expect("copy out");
}

#[test]
fn memory_limit_and_accounting() {
    let b = CpuBackend::new(CpuOptions {
        memory_limit: Some(1 << 20),
        ..Default::default()
    })
    .expect("backend");
    assert_eq!(b.memory_info().expect("info").total, 1 << 20);
    let a = b.alloc(DType::F32, 1000, BufferUsage::Kv).expect("alloc");
    // Owned buffers are whole cache lines.
    assert_eq!(b.allocated_bytes(), 4032);
    assert_eq!(b.memory_info().expect("info").free, (1 << 20) - 4032);
    let big = b.alloc(DType::F32, 1 << 18, BufferUsage::Kv);
    assert!(
        matches!(big, Err(BackendError::OutOfMemory { .. })),
        "{big:?}"
    );
    drop(a);
    assert_eq!(b.allocated_bytes(), 0);
    let real = backend().memory_info().expect("info");
    assert!(real.total > 1 << 28 && real.free <= real.total, "{real:?}");
}

#[test]
fn clamped_swiglu_rejects_negative_limit() {
    let b = backend();
    let mut a = b.alloc(DType::F32, 4, BufferUsage::Scratch).expect("alloc");
    let c = b.alloc(DType::F32, 4, BufferUsage::Scratch).expect("alloc");
    let r = b.binary(
        BinaryOp::ClampedSwiGlu {
            alpha: 1.0,
            limit: -1.0,
        },
        &mut a,
        &c,
        4,
    );
    assert!(r.is_err());
}

#[test]
fn raw_kernels_on_unaligned_slices_match_reference() {
    let (n, k, m) = (3, 77, 21);
    let x = values(n * k, 1);
    for dtype in DType::ALL {
        let w = values(m * k, 2);
        let bytes = ft_backend::dtype::from_f32_slice(&w, dtype);
        let wd = ft_backend::dtype::to_f32_vec(&bytes, dtype).expect("decode");
        // One byte of padding misaligns every row for every dtype.
        let mut padded = vec![0u8; 1];
        padded.extend_from_slice(&bytes);
        let unaligned = &padded[1..];
        for level in LEVELS {
            let rows = 5..17;
            let mut out = vec![0f32; n * rows.len()];
            kernels::matmul_rows(level, &x, n, k, unaligned, dtype, rows.clone(), &mut out)
                .expect("matmul_rows");
            let want = reference::matmul(
                &x,
                &wd[rows.start * k..rows.end * k],
                None,
                n,
                k,
                rows.len(),
            );
            for (g, w) in out.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{level:?} {dtype}: {g} vs {w}"
                );
            }
            let mut one = vec![0f32; m];
            kernels::gemv_rows(level, &x[..k], unaligned, dtype, k, 0..m, &mut one)
                .expect("gemv_rows");
            let want = reference::matmul(&x[..k], &wd, None, 1, k, m);
            assert!(
                one.iter()
                    .zip(&want)
                    .all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs())),
                "{level:?} {dtype} gemv"
            );
            let mut row = vec![0f32; k];
            kernels::decode_row(level, &unaligned[k * dtype.size()..], dtype, &mut row)
                .expect("decode_row");
            assert_eq!(row, wd[k..2 * k]);
        }
        let mut short = vec![0f32; 2];
        assert!(kernels::gemv_rows(
            SimdLevel::Auto,
            &x[..k],
            unaligned,
            dtype,
            k,
            0..m,
            &mut short
        )
        .is_err());
        assert!(kernels::gemv_rows(
            SimdLevel::Auto,
            &x[..k],
            unaligned,
            dtype,
            k,
            0..m + 1,
            &mut vec![0.0; m + 1]
        )
        .is_err());
        assert!(kernels::gemv_rows(
            SimdLevel::Auto,
            &x[..k - 1],
            unaligned,
            dtype,
            k,
            0..m,
            &mut vec![0.0; m]
        )
        .is_err());
    }
}

#[test]
fn vector_exp_is_accurate_and_propagates_nan() {
    let xs: Vec<f32> = (-2000..=2000)
        .map(|i| i as f32 * 0.0441)
        .chain([-100.0, -87.0, 0.0, 88.0, f32::NAN])
        .collect();
    for level in LEVELS {
        let mut y = xs.clone();
        let sum = kernels::exp_sub_sum(level, &mut y, 0.0);
        for (x, y) in xs.iter().zip(&y) {
            if x.is_nan() {
                assert!(y.is_nan(), "{level:?}: exp(NaN) = {y}");
                continue;
            }
            let want = (*x as f64).exp();
            // Relative accuracy in the normal range; results below f32's normal range only need
            // to be tiny.
            let ok = if want < 1e-37 {
                (*y as f64) < 1e-36
            } else {
                ((*y as f64) - want).abs() <= 4e-7 * want
            };
            assert!(ok, "{level:?}: exp({x}) = {y}, want {want}");
        }
        assert!(sum.is_nan(), "the sum includes the NaN");
    }
}

#[test]
fn matmul_backend_matches_kernel_call_with_threads() {
    // The pool-split path and the single-threaded kernel agree bit for bit (same tiles).
    let b = backend();
    let (n, k, m) = (1, 512, 700);
    let x = values(k, 3);
    let w = ft_backend::dtype::from_f32_slice(&values(m * k, 4), DType::BF16);
    let mut single = vec![0f32; m];
    kernels::matmul_rows(b.simd_level(), &x, n, k, &w, DType::BF16, 0..m, &mut single)
        .expect("kernel");
    let mut xb = b.alloc(DType::F32, k, BufferUsage::Scratch).expect("alloc");
    b.upload(StreamId::COMPUTE, bytemuck::cast_slice(&x), &mut xb, 0)
        .expect("upload");
    let wb = b
        .import_host(HostBytes::from_vec(w), DType::BF16, BufferUsage::Weights)
        .expect("import");
    let mut out = b.alloc(DType::F32, m, BufferUsage::Scratch).expect("alloc");
    b.matmul(&xb, &wb, None, &mut out, &MatmulDesc::new(n, k, m))
        .expect("matmul");
    let got: &[f32] = bytemuck::cast_slice(CpuBackend::buffer_bytes(&out).expect("bytes"));
    assert_eq!(got, &single[..]);
}
