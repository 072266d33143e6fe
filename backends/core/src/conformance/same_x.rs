//! Conformance body for [`Backend::matmul_same_x`]: each part equal, bit for bit, to the
//! backend's own [`Backend::matmul`] of it (the trait's contract), which the matmul bodies
//! check against the reference.

use super::*;
use crate::{MatmulDesc, MatmulPart};

/// One part of a case: weight type, output features, a bias, and the weight and output
/// offsets (elements).
#[derive(Clone, Copy)]
struct Part {
    dtype: DType,
    m: usize,
    bias: bool,
    w_offset_rows: usize,
    out_offset: usize,
}

/// `matmul_same_x` over parts of every weight type the backend multiplies (plain and
/// block-quantized, mixed within one call, with biases and offsets) at 1, 3 and 20 tokens,
/// against one `matmul` call per part; then a part with a short output buffer is an error.
pub fn matmul_same_x(b: &dyn Backend) {
    let dtypes: Vec<DType> = [DType::F32, DType::BF16, DType::F16, DType::Q8_0, DType::Q4K, DType::Q6K]
        .into_iter()
        .filter(|&d| supported(b, Op::Matmul, d))
        .collect();
    let Some(&first) = dtypes.first() else { return };
    let mut rng = Rng::new(0x5a4d_4558);
    let k = 256;
    for &dtype in &dtypes {
        // Two of one type back to back (a shared preparation), one of another.
        let other = *dtypes.iter().find(|&&d| d != dtype).unwrap_or(&first);
        let parts = [
            Part { dtype, m: 37, bias: true, w_offset_rows: 0, out_offset: 0 },
            Part { dtype, m: 8, bias: false, w_offset_rows: 3, out_offset: 5 },
            Part { dtype: other, m: 5, bias: true, w_offset_rows: 1, out_offset: 0 },
        ];
        for n in [1, 3, 20] {
            let what = format!("matmul_same_x {dtype} + {other} n={n} k={k}");
            let x = upload_f32(b, &rng.vec(n * k, 1.0));
            let weights: Vec<DeviceBuffer> = parts
                .iter()
                .map(|p| {
                    let rows = p.w_offset_rows + p.m;
                    let bytes = crate::quant::quantize_matrix(p.dtype, &rng.vec(rows * k, 1.0), rows, k);
                    let mut w = b.alloc(p.dtype, rows * p.dtype.padded(k), BufferUsage::Weights).expect("alloc");
                    b.upload(StreamId::COMPUTE, &bytes, &mut w, 0).expect("upload");
                    w
                })
                .collect();
            let biases: Vec<Option<DeviceBuffer>> = parts.iter().map(|p| p.bias.then(|| upload_f32(b, &rng.vec(p.m, 1.0)))).collect();
            let descs: Vec<MatmulDesc> = parts
                .iter()
                .map(|p| MatmulDesc { w_offset: p.w_offset_rows * p.dtype.padded(k), out_offset: p.out_offset, ..MatmulDesc::new(n, k, p.m) })
                .collect();
            // Outputs start non-zero, so a part that writes outside its rows shows.
            let fresh = |p: &Part| upload_f32(b, &vec![0.5; p.out_offset + n * p.m + 3]);
            let mut alone: Vec<DeviceBuffer> = parts.iter().map(fresh).collect();
            for (i, out) in alone.iter_mut().enumerate() {
                b.matmul(&x, &weights[i], biases[i].as_ref(), out, &descs[i]).unwrap_or_else(|e| panic!("{what}: matmul: {e}"));
            }
            let mut together: Vec<DeviceBuffer> = parts.iter().map(fresh).collect();
            let mut calls: Vec<MatmulPart<'_>> = together
                .iter_mut()
                .enumerate()
                .map(|(i, out)| MatmulPart { w: &weights[i], bias: biases[i].as_ref(), out, desc: descs[i] })
                .collect();
            b.matmul_same_x(&x, &mut calls).unwrap_or_else(|e| panic!("{what}: {e}"));
            drop(calls);
            for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
                let (a, t) = (download(b, a), download(b, t));
                let differ = a.iter().zip(&t).position(|(x, y)| x.to_bits() != y.to_bits());
                assert!(differ.is_none(), "{what}: part {i} value {differ:?}: {:?} grouped, {:?} alone", differ.map(|j| t[j]), differ.map(|j| a[j]));
            }
        }
    }
    // A part whose output cannot hold its rows is refused, not written past.
    let x = upload_f32(b, &rng.vec(k, 1.0));
    let (w, _) = upload(b, DType::F32, &rng.vec(4 * k, 1.0), BufferUsage::Weights);
    let (mut fine, mut short) = (upload_f32(b, &[0.0; 4]), upload_f32(b, &[0.0; 3]));
    let desc = MatmulDesc::new(1, k, 4);
    let mut calls = [
        MatmulPart { w: &w, bias: None, out: &mut fine, desc },
        MatmulPart { w: &w, bias: None, out: &mut short, desc },
    ];
    assert!(b.matmul_same_x(&x, &mut calls).is_err(), "matmul_same_x accepted a 3-value output for 4 rows");
}
