//! Conformance bodies for memory, transfers, streams and error handling.

use super::*;
use crate::{
    reference, AttentionDesc, BackendError, BinaryOp, BufferStorage, CopyDesc, EventId, HostBytes,
    MatmulDesc, RmsNormDesc, RopeDesc,
};

/// f32 values stored into a narrower buffer (a KV cache's new rows) at even and odd offsets,
/// around what is already there: bit for bit the reference's round-to-nearest-even, ties,
/// subnormals and signed zeros included; f16 saturates at ±65504 instead of overflowing.
pub fn store(b: &dyn Backend, dtype: DType) {
    if !b.supports_store(dtype) {
        println!("skipped: store into {dtype}: not supported by the {} backend", b.kind());
        return;
    }
    let mut rng = Rng::new(0x7374_6f72);
    if dtype.is_quantized() {
        return store_blocks(b, dtype, &mut rng);
    }
    let mut values = rng.vec(61, 3.0);
    // Halfway cases of both formats, tiny and huge values, signed zero.
    let special = [
        1.0 + f32::EPSILON * 32768.0,
        1.0 + f32::EPSILON * 98304.0,
        1.0 + f32::EPSILON * 4096.0,
        1.0 + f32::EPSILON * 12288.0,
        -2.5e-6,
        3.0e-8,
        1.0e-40,
        70000.0,
        -1.0e30,
        -0.0,
        65504.0,
        65520.0,
    ];
    values[..special.len()].copy_from_slice(&special);
    let src = b
        .import_host(HostBytes::from_vec(from_f32_slice(&values, DType::F32)), DType::F32, BufferUsage::Scratch)
        .expect("import");
    let es = dtype.size();
    let old: Vec<f32> = (0..80).map(|i| i as f32 * 0.5 - 7.0).collect();
    for (src_offset, dst_offset, len) in [(0, 0, 61), (1, 3, 40), (5, 10, 1), (2, 11, 2), (0, 0, 0)] {
        let mut dst = b.alloc(dtype, old.len(), BufferUsage::Kv).expect("alloc");
        b.upload(StreamId::COMPUTE, &from_f32_slice(&old, dtype), &mut dst, 0).expect("upload");
        b.store(&src, &mut dst, &CopyDesc { src_offset, dst_offset, len }).expect("store");
        let mut got = vec![0u8; 80 * es];
        b.download(StreamId::COMPUTE, &dst, 0, &mut got).expect("download");
        let mut want = old.clone();
        want[dst_offset..dst_offset + len].copy_from_slice(&values[src_offset..src_offset + len]);
        if dtype == DType::F16 {
            want.iter_mut().for_each(|v| *v = v.clamp(-65504.0, 65504.0));
        }
        assert_eq!(got, from_f32_slice(&want, dtype), "store {len} values {src_offset} → {dst_offset} into {dtype}");
    }
    let mut small = b.alloc(dtype, 4, BufferUsage::Kv).expect("alloc");
    assert!(b.store(&src, &mut small, &CopyDesc { src_offset: 0, dst_offset: 2, len: 3 }).is_err(), "store past the end");
}

/// [`store`] into a block-quantized cache (Q8_0): whole blocks at block offsets, each the
/// reference's quantization of its values, the blocks around them untouched; a range that
/// is not whole blocks is refused.
fn store_blocks(b: &dyn Backend, dtype: DType, rng: &mut Rng) {
    let be = dtype.block_elems();
    let values = rng.vec(3 * be, 3.0);
    let src = b
        .import_host(HostBytes::from_vec(from_f32_slice(&values, DType::F32)), DType::F32, BufferUsage::Scratch)
        .expect("import");
    let old: Vec<f32> = (0..4 * be).map(|i| i as f32 * 0.25 - 7.0).collect();
    for (src_offset, dst_offset, len) in [(0, 0, 3 * be), (be, 3 * be, be), (be, 2 * be, 2 * be), (0, 0, 0)] {
        let mut dst = b.alloc(dtype, old.len(), BufferUsage::Kv).expect("alloc");
        b.upload(StreamId::COMPUTE, &from_f32_slice(&old, dtype), &mut dst, 0).expect("upload");
        b.store(&src, &mut dst, &CopyDesc { src_offset, dst_offset, len }).expect("store");
        let mut got = vec![0u8; dst.size_bytes()];
        b.download(StreamId::COMPUTE, &dst, 0, &mut got).expect("download");
        let mut want = old.clone();
        want[dst_offset..dst_offset + len].copy_from_slice(&values[src_offset..src_offset + len]);
        assert_eq!(got, from_f32_slice(&want, dtype), "store {len} values {src_offset} → {dst_offset} into {dtype}");
    }
    let mut dst = b.alloc(dtype, old.len(), BufferUsage::Kv).expect("alloc");
    assert!(b.store(&src, &mut dst, &CopyDesc { src_offset: 0, dst_offset: 1, len: be }).is_err(), "a store off the block grid");
    assert!(b.store(&src, &mut dst, &CopyDesc { src_offset: 0, dst_offset: 4 * be, len: be }).is_err(), "store past the end");
}

/// Uploads at offsets, partial downloads, device copies with offsets for every dtype, on the
/// compute stream and on a created one; fresh buffers read as zeros. All exact.
pub fn copy_upload_download(b: &dyn Backend) {
    let mut rng = Rng::new(0x636f_7079);
    let side = b.create_stream().expect("create_stream");
    for dtype in DType::ALL {
        if !supported(b, Op::Copy, dtype) {
            continue;
        }
        // Offsets and lengths below count units: elements, or whole blocks of a block type.
        let (es, u) = (dtype.size(), dtype.block_elems());
        let len = 100;
        let mut a = b.alloc(dtype, len * u, BufferUsage::Scratch).expect("alloc");
        assert_eq!(
            (a.dtype(), a.len(), a.size_bytes(), a.usage()),
            (dtype, len * u, len * es, BufferUsage::Scratch)
        );
        assert!(
            download(b, &a).iter().all(|v| *v == 0.0),
            "alloc {dtype} is not zero-filled"
        );
        let bytes = from_f32_slice(&rng.vec(60 * u, 4.0), dtype);
        b.upload(side, &bytes, &mut a, 10 * es)
            .expect("upload at offset");
        b.synchronize(side).expect("synchronize");
        let mut part = vec![0u8; 20 * es];
        b.download(StreamId::COMPUTE, &a, 15 * es, &mut part)
            .expect("partial download");
        assert_eq!(part, bytes[5 * es..25 * es], "partial download {dtype}");

        let mut c = b.alloc(dtype, 50 * u, BufferUsage::Kv).expect("alloc");
        b.copy(
            StreamId::COMPUTE,
            &a,
            &mut c,
            &CopyDesc {
                src_offset: 12 * u,
                dst_offset: 3 * u,
                len: 40 * u,
            },
        )
        .expect("copy");
        b.copy(
            side,
            &a,
            &mut c,
            &CopyDesc {
                src_offset: 0,
                dst_offset: 49 * u,
                len: u,
            },
        )
        .expect("copy");
        b.copy(
            StreamId::COMPUTE,
            &a,
            &mut c,
            &CopyDesc {
                src_offset: 0,
                dst_offset: 0,
                len: 0,
            },
        )
        .expect("empty copy");
        b.synchronize(side).expect("synchronize");
        let mut all = vec![0u8; 50 * es];
        b.download(StreamId::COMPUTE, &c, 0, &mut all)
            .expect("download");
        let mut want = vec![0u8; 50 * es];
        want[3 * es..43 * es].copy_from_slice(&bytes[2 * es..42 * es]);
        assert_eq!(all, want, "copy {dtype}");
    }
}

/// `import_host` of slices at odd byte offsets (misaligned for every dtype) used as matmul
/// weights and activations and as a gather table; imported bytes download unchanged; a
/// length that is not whole elements fails. Writing into an import may succeed or fail, but
/// must not panic.
pub fn import_host(b: &dyn Backend) {
    let mut rng = Rng::new(0x696d_706f);
    for (dtype, pad) in [(DType::F32, 1usize), (DType::BF16, 1), (DType::F16, 3)] {
        for (n, k, m) in [(1, 100, 20), (3, 33, 7), (9, 520, 40)] {
            let wv = rng.vec(m * k, 1.0);
            let wbytes = from_f32_slice(&wv, dtype);
            let wdec = to_f32_vec(&wbytes, dtype).expect("decode");
            let w = b
                .import_host(padded(&wbytes, pad), dtype, BufferUsage::Weights)
                .expect("import weights");
            let x = rng.vec(n * k, 1.0);
            let xi = b
                .import_host(
                    padded(&from_f32_slice(&x, DType::F32), 2),
                    DType::F32,
                    BufferUsage::Scratch,
                )
                .expect("import x");
            let mut out = b
                .alloc(DType::F32, n * m, BufferUsage::Scratch)
                .expect("alloc");
            b.matmul(&xi, &w, None, &mut out, &MatmulDesc::new(n, k, m))
                .expect("matmul on imported buffers");
            let want = reference::matmul(&x, &wdec, None, n, k, m);
            let bound = |idx: usize| {
                let (i, j) = (idx / m, idx % m);
                MATMUL_RTOL
                    * (k as f32).sqrt()
                    * (0..k)
                        .map(|p| (x[i * k + p] * wdec[j * k + p]).abs())
                        .sum::<f32>()
            };
            assert_close(
                &format!("matmul on imported {dtype} at +{pad}, {n}×{k}×{m}"),
                &download(b, &out),
                &want,
                bound,
            );

            if b.supports(Op::GatherRows, dtype) {
                let ids = [0u32, (m - 1) as u32, 3];
                let mut g = b
                    .alloc(DType::F32, ids.len() * k, BufferUsage::Scratch)
                    .expect("alloc");
                b.gather_rows(&w, &ids, k, &mut g)
                    .expect("gather from import");
                assert_eq!(
                    download(b, &g),
                    reference::gather_rows(&wdec, &ids, k),
                    "gather from imported {dtype}"
                );
            }
            assert_eq!(download(b, &w), wdec, "download of imported {dtype}");
        }
        let mut w = b
            .import_host(padded(&[1, 2, 3, 4], pad), dtype, BufferUsage::Weights)
            .expect("import");
        let _ = b.upload(StreamId::COMPUTE, &[0; 2], &mut w, 0);
    }
    let odd = b.import_host(
        HostBytes::from_vec(vec![0; 6]),
        DType::F32,
        BufferUsage::Weights,
    );
    assert!(odd.is_err(), "6 bytes imported as f32 must fail");
}

/// `bytes` placed `pad` bytes into a larger allocation, as a slice of it.
fn padded(bytes: &[u8], pad: usize) -> HostBytes {
    let mut v = vec![0xAAu8; pad];
    v.extend_from_slice(bytes);
    v.extend_from_slice(&[0xAA; 5]);
    HostBytes::new(Arc::new(v), pad, bytes.len()).expect("in bounds")
}

/// Streams and events: created streams are distinct from the compute stream, events
/// recorded on either complete by `synchronize`, cross-stream waits are accepted, and unknown
/// streams or events are errors.
pub fn streams_events(b: &dyn Backend) {
    let s1 = b.create_stream().expect("create_stream");
    let s2 = b.create_stream().expect("create_stream");
    assert!(
        s1 != StreamId::COMPUTE && s2 != StreamId::COMPUTE && s1 != s2,
        "streams must be distinct"
    );
    let mut buf = b
        .alloc(DType::F32, 16, BufferUsage::Staging)
        .expect("alloc");
    b.upload(s1, &[7u8; 64], &mut buf, 0)
        .expect("upload on a copy stream");
    let e1 = b.record_event(s1).expect("record_event");
    b.wait_event(StreamId::COMPUTE, e1).expect("wait_event");
    let e0 = b.record_event(StreamId::COMPUTE).expect("record_event");
    b.wait_event(s2, e0).expect("wait_event");
    for s in [s1, s2, StreamId::COMPUTE] {
        b.synchronize(s).expect("synchronize");
    }
    assert!(
        b.event_done(e1).expect("event_done") && b.event_done(e0).expect("event_done"),
        "events after synchronize"
    );
    let mut back = [0u8; 64];
    b.download(StreamId::COMPUTE, &buf, 0, &mut back)
        .expect("download");
    assert_eq!(back, [7u8; 64]);
    let bad_stream = StreamId(u32::MAX);
    let bad_event = EventId(u64::MAX);
    assert!(
        b.record_event(bad_stream).is_err(),
        "record_event on an unknown stream"
    );
    assert!(
        b.synchronize(bad_stream).is_err(),
        "synchronize an unknown stream"
    );
    assert!(
        b.wait_event(StreamId::COMPUTE, bad_event).is_err(),
        "wait on an unknown event"
    );
    assert!(
        b.event_done(bad_event).is_err(),
        "event_done of an unknown event"
    );
    assert!(
        b.upload(bad_stream, &[0; 4], &mut buf, 0).is_err(),
        "upload on an unknown stream"
    );
}

/// Memory facts: `0 < free <= total`, empty buffers, and an impossible allocation is an
/// error (not an abort).
pub fn memory(b: &dyn Backend) {
    let info = b.memory_info().expect("memory_info");
    assert!(
        info.total > 0 && info.free <= info.total,
        "memory_info {info:?}"
    );
    let empty = b
        .alloc(DType::BF16, 0, BufferUsage::Scratch)
        .expect("empty alloc");
    assert!(empty.is_empty());
    assert!(
        b.alloc(DType::F32, usize::MAX / 2, BufferUsage::Scratch)
            .is_err(),
        "overflowing size"
    );
    assert!(
        b.alloc(DType::F32, usize::MAX / 8, BufferUsage::Scratch)
            .is_err(),
        "half the address space"
    );
    assert!(!b.device_name().is_empty());
}

/// Storage no backend recognises, to check that foreign buffers are refused.
struct Foreign;

impl BufferStorage for Foreign {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Asserts that `r` is an error.
fn fails<T>(what: &str, r: crate::Result<T>) {
    assert!(r.is_err(), "{what}: expected an error");
}

/// Bad shapes, offsets, dtypes, ids, streams and foreign buffers give errors, never panics.
pub fn errors(b: &dyn Backend) {
    let f = |n: usize| upload_f32(b, &vec![0.5; n]);
    let (x, w, mut out) = (f(10), f(40), f(10));
    let mm = |n, k, m| MatmulDesc::new(n, k, m);
    fails(
        "matmul x too short",
        b.matmul(&x, &w, None, &mut out, &mm(1, 11, 1)),
    );
    fails(
        "matmul w too short",
        b.matmul(&x, &w, None, &mut out, &mm(1, 10, 5)),
    );
    fails(
        "matmul w offset",
        b.matmul(
            &x,
            &w,
            None,
            &mut out,
            &MatmulDesc {
                w_offset: 35,
                ..mm(1, 10, 1)
            },
        ),
    );
    fails(
        "matmul out too short",
        b.matmul(&x, &f(400), None, &mut out, &mm(1, 10, 11)),
    );
    fails(
        "matmul out offset",
        b.matmul(
            &x,
            &w,
            None,
            &mut out,
            &MatmulDesc {
                out_offset: 9,
                ..mm(1, 10, 2)
            },
        ),
    );
    fails(
        "matmul bias too short",
        b.matmul(&x, &w, Some(&f(1)), &mut out, &mm(1, 10, 2)),
    );
    fails(
        "matmul n·k overflow",
        b.matmul(&x, &w, None, &mut out, &mm(usize::MAX / 2, 4, 1)),
    );
    let (xb, _) = upload(b, DType::BF16, &[0.5; 10], BufferUsage::Scratch);
    fails(
        "matmul bf16 activations",
        b.matmul(&xb, &w, None, &mut out, &mm(1, 10, 1)),
    );

    let norm = |rows, dim| RmsNormDesc {
        rows,
        dim,
        eps: 1e-6,
        unit_offset: false,
    };
    fails(
        "rms_norm x too short",
        b.rms_norm(&x, &w, &mut out, &norm(2, 6)),
    );
    fails(
        "rms_norm w too short",
        b.rms_norm(&f(100), &x, &mut f(100), &norm(5, 20)),
    );

    let rope = |rotary_dim, positions: Vec<u32>, row_stride| RopeDesc {
        n_tokens: 2,
        n_heads: 1,
        head_stride: 4,
        row_stride,
        rot_offset: 0,
        rotary_dim,
        interleaved: false,
        positions,
        inv_freq: vec![1.0, 0.5],
        scaling: 1.0,
    };
    let mut r = f(10);
    fails(
        "rope odd rotary_dim",
        b.rope(&mut r, &rope(3, vec![0, 1], 4)),
    );
    fails(
        "rope too few positions",
        b.rope(&mut r, &rope(4, vec![0], 4)),
    );
    fails("rope past the end", b.rope(&mut r, &rope(4, vec![0, 1], 7)));
    fails(
        "rope too few frequencies",
        b.rope(&mut r, &rope(6, vec![0, 1], 6)),
    );

    let att = |n_heads, n_kv_heads, kv_len| AttentionDesc {
        n_tokens: 2,
        n_heads,
        n_kv_heads,
        head_dim: 2,
        v_head_dim: 2,
        kv_len,
        scale: 1.0,
        window: None,
    };
    let (q, kc, vc, mut ao) = (f(16), f(16), f(16), f(16));
    fails(
        "attention heads not a multiple",
        b.attention(&q, &kc, &vc, None, &mut ao, &att(3, 2, 4)),
    );
    fails(
        "attention kv_len < n_tokens",
        b.attention(&q, &kc, &vc, None, &mut ao, &att(2, 2, 1)),
    );
    fails(
        "attention kv_len > capacity",
        b.attention(&q, &kc, &vc, None, &mut ao, &att(2, 2, 5)),
    );
    fails(
        "attention too few sinks",
        b.attention(&q, &kc, &vc, Some(&f(1)), &mut ao, &att(2, 2, 3)),
    );
    fails(
        "attention out too short",
        b.attention(&q, &kc, &vc, None, &mut f(7), &att(2, 2, 3)),
    );

    let mut a = f(10);
    fails("binary n > a", b.binary(BinaryOp::Add, &mut a, &f(20), 11));
    fails("binary n > b", b.binary(BinaryOp::Mul, &mut a, &f(5), 6));
    fails("scale n > len", b.scale(&mut a, 2.0, 11));
    fails("softmax past the end", b.softmax(&mut a, 3, 4));
    fails("top_k k > cols", b.top_k(&x, 2, 5, 6));
    fails("top_k past the end", b.top_k(&x, 3, 4, 1));
    fails(
        "gather id out of range",
        b.gather_rows(&w, &[0, 4], 10, &mut f(20)),
    );
    fails(
        "gather out too short",
        b.gather_rows(&w, &[0, 1], 10, &mut f(19)),
    );
    fails(
        "scatter rows vs scales",
        b.scatter_add_rows(&mut f(20), &x, &[0, 1], &[1.0], 5),
    );
    fails(
        "scatter row out of range",
        b.scatter_add_rows(&mut f(20), &x, &[0, 4], &[1.0, 1.0], 5),
    );
    fails(
        "scatter x too short",
        b.scatter_add_rows(&mut f(20), &x, &[0, 1, 2], &[1.0; 3], 5),
    );

    let cd = |src_offset, dst_offset, len| CopyDesc {
        src_offset,
        dst_offset,
        len,
    };
    fails(
        "copy src range",
        b.copy(StreamId::COMPUTE, &x, &mut f(20), &cd(5, 0, 6)),
    );
    fails(
        "copy dst range",
        b.copy(StreamId::COMPUTE, &x, &mut f(5), &cd(0, 0, 6)),
    );
    fails(
        "copy offset overflow",
        b.copy(StreamId::COMPUTE, &x, &mut f(5), &cd(usize::MAX, 0, 2)),
    );
    let (mut bf, _) = upload(b, DType::BF16, &[0.0; 10], BufferUsage::Scratch);
    fails(
        "copy dtype mismatch",
        b.copy(StreamId::COMPUTE, &x, &mut bf, &cd(0, 0, 1)),
    );
    fails(
        "upload past the end",
        b.upload(StreamId::COMPUTE, &[0; 8], &mut a, 36),
    );
    fails(
        "upload offset overflow",
        b.upload(StreamId::COMPUTE, &[0; 8], &mut a, usize::MAX),
    );
    fails(
        "download past the end",
        b.download(StreamId::COMPUTE, &x, 33, &mut [0; 8]),
    );

    let foreign = DeviceBuffer::new(Box::new(Foreign), DType::F32, 10, BufferUsage::Scratch);
    fails(
        "foreign buffer as matmul input",
        b.matmul(&foreign, &w, None, &mut out, &mm(1, 10, 1)),
    );
    fails(
        "foreign buffer download",
        b.download(StreamId::COMPUTE, &foreign, 0, &mut [0; 4]),
    );
    let mut foreign_out =
        DeviceBuffer::new(Box::new(Foreign), DType::F32, 10, BufferUsage::Scratch);
    let r = b.upload(StreamId::COMPUTE, &[0; 4], &mut foreign_out, 0);
    assert!(
        matches!(r, Err(BackendError::Invalid(_))),
        "foreign upload target must be Invalid, got {r:?}"
    );
}
