//! Several independent products run as one piece of work on the pool: their row chunks in
//! one list, each worker a contiguous run of it ([`super::ranges`]).
//!
//! What it serves: a one-token product split over the workers ([`super::gemv::matmul`]), and
//! a layer's decode experts, all gate and up products at once and then all down products
//! (the engine's CPU executors), so that the workers finish together once a phase, not once
//! per product or expert.

use super::gemv::{put_rows, task_rows, whole_rows, Product, DECODE_TOKENS};
use super::{need, shape_err, QuantDot, SimdLevel};
use ft_backend::{DType, Result};
use rayon::ThreadPool;
use std::ops::Range;
use std::sync::{Mutex, OnceLock};

/// One product of [`matmul_same_x`]: `out[n, m] = x[n, k] · w[m, k]ᵀ`, `x` and `k` shared.
pub struct SameX<'a> {
    /// `[m, k]` weights of `dtype`.
    pub w: &'a [u8],
    /// The weights' type.
    pub dtype: DType,
    /// Output features.
    pub m: usize,
    /// `[n, m]` output.
    pub out: &'a mut [f32],
}

/// Products of the same activations (an expert's gate and up products, a layer's q/k/v),
/// each as [`super::gemv::matmul`] computes it, bit for bit. Decode-sized ones (at most
/// [`DECODE_TOKENS`]) on a pool of several workers run as one [`matmul_many`] list, so the
/// workers finish together once rather than once a product. Larger ones run one after
/// another with the activations prepared for the block-quantized kernels once for a run of
/// products of one weight type rather than once each: in a 512-token Q4_K_M prefill that
/// preparation, the codes and sums of every token, held ~2.6 % of the samples.
pub fn matmul_same_x(pool: Option<&ThreadPool>, level: SimdLevel, dot: QuantDot, x: &[f32], n: usize, k: usize, items: &mut [SameX<'_>]) -> Result<()> {
    if let Some(pool) = pool.filter(|p| p.current_num_threads() > 1 && n <= DECODE_TOKENS && items.len() > 1) {
        let mut many: Vec<ManyItem<'_>> = items.iter_mut().map(|it| ManyItem { x, n, k, w: it.w, dtype: it.dtype, m: it.m, out: &mut *it.out }).collect();
        return matmul_many(pool, level, dot, &mut many);
    }
    let mut made = None;
    for it in items.iter_mut() {
        let item = ManyItem { x, n, k, w: it.w, dtype: it.dtype, m: it.m, out: &mut *it.out };
        super::gemv::product_into(pool, level, dot, item, &mut made)?;
    }
    Ok(())
}

/// One product of [`matmul_many`]: `out[n, m] = x[n, k] · w[m, k]ᵀ`.
pub struct ManyItem<'a> {
    /// `[n, k]` activations.
    pub x: &'a [f32],
    /// Tokens.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// `[m, k]` weights of `dtype`.
    pub w: &'a [u8],
    /// The weights' type.
    pub dtype: DType,
    /// Output features.
    pub m: usize,
    /// `[n, m]` output.
    pub out: &'a mut [f32],
}

/// Several independent products as one piece of work on `pool` (module docs): the workers
/// finish together once, not once per product. Products with the same activations (bit for
/// bit) prepare them once. Every product gives the bits [`super::gemv::matmul`] gives it
/// (the same kernels over the same rows).
pub fn matmul_many<'a>(pool: &ThreadPool, level: SimdLevel, dot: QuantDot, items: &mut [ManyItem<'a>]) -> Result<()> {
    let _timed = items.iter().all(|it| it.n <= DECODE_TOKENS).then(|| super::clock::enter(items.iter().map(|it| it.m.saturating_mul(it.dtype.row_bytes(it.k))).sum()));
    let threads = pool.current_num_threads();
    let (ws, ms): (Vec<&'a [u8]>, Vec<usize>) = items.iter().map(|it| (it.w, it.m)).unzip();
    // The first item with the same activations (bit for bit) prepares them for each item.
    let mut first = Vec::with_capacity(items.len());
    // (item, rows) and cost (weight bytes times tokens) of every chunk.
    let mut chunks: Vec<(usize, Range<usize>)> = Vec::new();
    let mut cost = Vec::new();
    for (i, it) in items.iter().enumerate() {
        whole_rows(it.w, it.out.len(), it.n, it.m, it.k, it.dtype)?;
        let len = need(it.n, it.k, "n·k")?;
        let x: &[u8] = bytemuck::cast_slice(it.x.get(..len).ok_or_else(|| shape_err(format!("matmul of {} tokens × k={}: x has {}", it.n, it.k, it.x.len())))?);
        let same = |o: &ManyItem<'_>| (o.n, o.k, o.dtype) == (it.n, it.k, it.dtype) && bytemuck::cast_slice::<f32, u8>(&o.x[..len]) == x;
        first.push((0..i).find(|&j| first[j] == j && same(&items[j])).unwrap_or(i));
        let rb = it.dtype.row_bytes(it.k);
        let per = task_rows(threads, it.n, it.m, rb);
        for r0 in (0..it.m).step_by(per) {
            let r = r0..(r0 + per).min(it.m);
            cost.push(r.len() * rb * it.n);
            chunks.push((i, r));
        }
    }
    // A product of a few tokens is prepared by the first chunk that needs it, on whichever
    // worker runs it (a second worker needing it meanwhile makes its own copy, cheaper than a
    // wait), not one after another before the work is shared out: 8 one-token experts' down
    // products took 14 µs so. The first product and prefill-sized ones, whose bf16 tiles take
    // long, are made here, before any worker starts: made twice, or waited for by a parked
    // worker, they cost a fifth of a 512-token prefill.
    let products: Vec<OnceLock<Product<'a>>> = items.iter().map(|_| OnceLock::new()).collect();
    let acts: Vec<_> = items.iter().map(|it| (it.x, it.n, it.k, it.dtype)).collect();
    let make = |j: usize| {
        let (x, n, k, dtype) = acts[j];
        Product::new(level, dot, x, n, k, dtype)
    };
    for (j, cell) in products.iter().enumerate() {
        if first[j] == j && (j == 0 || acts[j].1 > DECODE_TOKENS) {
            let _ = cell.set(make(j)?);
        }
    }
    let product = |i: usize| -> Result<&Product<'a>> {
        let cell = &products[first[i]];
        if cell.get().is_none() {
            let _ = cell.set(make(first[i])?);
        }
        cell.get().ok_or_else(|| shape_err("prepared activations vanished"))
    };
    let (outs, mut strided) = chunk_outputs(items, &chunks);
    super::ranges::run_chunks(pool, &cost, |c| {
        let (i, r) = &chunks[c];
        let mut o = lock(&outs[c]);
        let o = match &mut *o {
            ChunkOut::Direct(o) => &mut **o,
            ChunkOut::Buf(b) => &mut b[..],
        };
        product(*i)?.rows(ws[*i], r.clone(), o)
    })?;
    // The buffered chunks' columns into their strided outputs.
    for ((i, r), o) in chunks.iter().zip(outs) {
        if let (ChunkOut::Buf(buf), Some(out)) = (o.into_inner().unwrap_or_else(|p| p.into_inner()), &mut strided[*i]) {
            put_rows(out, ms[*i], r.start, &buf, buf.len() / r.len());
        }
    }
    Ok(())
}

/// Each chunk's output (`chunks` in item order): its part of the item's output for one token,
/// else a buffer of its own; and per item, the output the buffers go into afterwards (none
/// for one token).
#[allow(clippy::type_complexity)]
fn chunk_outputs<'o>(items: &'o mut [ManyItem<'_>], chunks: &[(usize, Range<usize>)]) -> (Vec<Mutex<ChunkOut<'o>>>, Vec<Option<&'o mut [f32]>>) {
    let mut outs = Vec::with_capacity(chunks.len());
    let mut strided = Vec::with_capacity(items.len());
    let mut at = 0;
    for (i, it) in items.iter_mut().enumerate() {
        let mine = chunks[at..].iter().take_while(|(c, _)| *c == i).count();
        let rows = chunks[at..at + mine].iter().map(|(_, r)| r.len());
        at += mine;
        if it.n == 1 {
            let mut rest = &mut it.out[..it.m];
            for len in rows {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
                outs.push(Mutex::new(ChunkOut::Direct(head)));
                rest = tail;
            }
            strided.push(None);
        } else {
            outs.extend(rows.map(|len| Mutex::new(ChunkOut::Buf(vec![0f32; it.n * len]))));
            strided.push(Some(&mut *it.out));
        }
    }
    (outs, strided)
}

/// Where one chunk of [`matmul_many`] writes.
enum ChunkOut<'a> {
    /// Its rows of a one-token output.
    Direct(&'a mut [f32]),
    /// `[n, rows]`, copied into the strided output afterwards.
    Buf(Vec<f32>),
}

/// The chunk behind `m`: each is claimed by one worker only, so the lock is never contended
/// (and a panic elsewhere leaves its data as good as it was).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemv::matmul;
    use ft_backend::conformance::Rng;

    fn pool(threads: usize) -> ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool")
    }

    /// A layer's worth of products of mixed types, shapes and token counts, two of them on the
    /// same activations: each output bit for bit what `matmul` alone gives, on any pool.
    #[test]
    fn every_product_equals_matmul_alone() {
        let mut rng = Rng::new(11);
        let (h, i) = (512, 192);
        let shapes: Vec<(DType, usize, usize, usize)> = vec![
            (DType::Q4K, 1, h, i),
            (DType::Q4K, 1, h, i),
            (DType::Q6K, 1, i, h),
            (DType::Q8_0, 3, h, i),
            (DType::BF16, 1, h, 40),
            (DType::F32, 2, i, 70),
            (DType::Mxfp4, 1, h, i),
        ];
        let ws: Vec<Vec<u8>> = shapes.iter().map(|&(d, _, k, m)| ft_backend::quant::quantize_matrix(d, &rng.vec(m * k, 1.0), m, k)).collect();
        let shared = rng.vec(h, 1.0);
        let xs: Vec<Vec<f32>> =
            shapes.iter().enumerate().map(|(j, &(_, n, k, _))| if j < 2 { shared.clone() } else { rng.vec(n * k, 1.0) }).collect();
        for dot in [QuantDot::Exact, QuantDot::Int8] {
            let want: Vec<Vec<f32>> = shapes
                .iter()
                .zip(&ws)
                .zip(&xs)
                .map(|((&(d, n, k, m), w), x)| {
                    let mut o = vec![0f32; n * m];
                    matmul(None, SimdLevel::Auto, dot, x, n, k, w, d, m, &mut o).expect("matmul");
                    o
                })
                .collect();
            for threads in [1, 2, 3] {
                let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&(_, n, _, m)| vec![f32::NAN; n * m]).collect();
                let mut items: Vec<ManyItem<'_>> = shapes
                    .iter()
                    .zip(&ws)
                    .zip(&xs)
                    .zip(&mut outs)
                    .map(|(((&(dtype, n, k, m), w), x), out)| ManyItem { x, n, k, w, dtype, m, out })
                    .collect();
                matmul_many(&pool(threads), SimdLevel::Auto, dot, &mut items).expect("many");
                for (j, (got, want)) in outs.iter().zip(&want).enumerate() {
                    let same = got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dot} {threads} threads: product {j} ({:?}) differs", shapes[j].0);
                }
            }
        }
    }

    /// Products on the same activations, types in runs and mixed (the shared preparation is
    /// made again when the type changes), decode and prefill token counts: each output bit
    /// for bit what `matmul` alone gives, with a pool of two and without one.
    #[test]
    fn products_on_the_same_activations_equal_matmul_alone() {
        let mut rng = Rng::new(12);
        let (k, m) = (512, 96);
        let types = [DType::Q4K, DType::Q4K, DType::Q6K, DType::BF16, DType::Q4K, DType::Q8_0];
        let ws: Vec<Vec<u8>> = types.iter().map(|&d| ft_backend::quant::quantize_matrix(d, &rng.vec(m * k, 1.0), m, k)).collect();
        for n in [1, 3, 20] {
            let x = rng.vec(n * k, 1.0);
            for dot in [QuantDot::Exact, QuantDot::Int8] {
                for p in [None, Some(pool(2))] {
                    let want: Vec<Vec<f32>> = types
                        .iter()
                        .zip(&ws)
                        .map(|(&d, w)| {
                            let mut o = vec![0f32; n * m];
                            matmul(p.as_ref(), SimdLevel::Auto, dot, &x, n, k, w, d, m, &mut o).expect("matmul");
                            o
                        })
                        .collect();
                    let mut outs: Vec<Vec<f32>> = types.iter().map(|_| vec![f32::NAN; n * m]).collect();
                    let mut items: Vec<SameX<'_>> = types.iter().zip(&ws).zip(&mut outs).map(|((&dtype, w), out)| SameX { w, dtype, m, out }).collect();
                    matmul_same_x(p.as_ref(), SimdLevel::Auto, dot, &x, n, k, &mut items).expect("same x");
                    for (j, (got, want)) in outs.iter().zip(&want).enumerate() {
                        let same = got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{dot} n={n} pool={}: product {j} ({}) differs", p.is_some(), types[j]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_short_weight_or_output_is_an_error_before_any_work() {
        let p = pool(2);
        let x = vec![1f32; 256];
        let w = ft_backend::quant::quantize_matrix(DType::Q4K, &vec![0.5; 64 * 256], 64, 256);
        let mut out = vec![0f32; 64];
        let mut short_out = vec![0f32; 63];
        let r = matmul_many(&p, SimdLevel::Auto, QuantDot::Int8, &mut [
            ManyItem { x: &x, n: 1, k: 256, w: &w, dtype: DType::Q4K, m: 64, out: &mut out },
            ManyItem { x: &x, n: 1, k: 256, w: &w[..w.len() - 1], dtype: DType::Q4K, m: 64, out: &mut short_out },
        ]);
        assert!(r.is_err());
        let r = matmul_many(&p, SimdLevel::Auto, QuantDot::Int8, &mut [ManyItem { x: &x[..100], n: 1, k: 256, w: &w, dtype: DType::Q4K, m: 64, out: &mut out }]);
        assert!(matches!(r, Err(ft_backend::BackendError::Shape(_))), "{r:?}");
    }
}
