//! Plain reference implementations of every op, on host `f32` slices.
//!
//! They define the semantics of the trait: written for clarity (f64 accumulation where it
//! costs nothing), never for speed. The conformance suite compares backends against them.

use crate::ops::{AttentionDesc, BinaryOp, RmsNormDesc, RopeDesc, TopK};

/// `x[n, k] · w[m, k]ᵀ + bias[m]`.
pub fn matmul(x: &[f32], w: &[f32], bias: Option<&[f32]>, n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * m];
    for i in 0..n {
        for j in 0..m {
            let mut acc = 0f64;
            for p in 0..k {
                acc += x[i * k + p] as f64 * w[j * k + p] as f64;
            }
            out[i * m + j] = acc as f32 + bias.map_or(0.0, |b| b[j]);
        }
    }
    out
}

/// Row-wise RMSNorm.
pub fn rms_norm(x: &[f32], w: &[f32], d: &RmsNormDesc) -> Vec<f32> {
    let mut out = vec![0f32; d.rows * d.dim];
    for r in 0..d.rows {
        let row = &x[r * d.dim..(r + 1) * d.dim];
        let ms = row.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / d.dim as f64;
        let inv = 1.0 / (ms + d.eps as f64).sqrt();
        for c in 0..d.dim {
            let g = if d.unit_offset { 1.0 + w[c] } else { w[c] };
            out[r * d.dim + c] = (row[c] as f64 * inv) as f32 * g;
        }
    }
    out
}

/// Rotary embedding in place.
pub fn rope(x: &mut [f32], d: &RopeDesc) {
    let half = d.rotary_dim / 2;
    for t in 0..d.n_tokens {
        let pos = d.positions[t] as f64;
        for h in 0..d.n_heads {
            let base = t * d.row_stride + h * d.head_stride + d.rot_offset;
            for i in 0..half {
                let angle = pos * d.inv_freq[i] as f64;
                let (cos, sin) = ((angle.cos() as f32) * d.scaling, (angle.sin() as f32) * d.scaling);
                let (ia, ib) = if d.interleaved { (base + 2 * i, base + 2 * i + 1) } else { (base + i, base + i + half) };
                let (a, b) = (x[ia], x[ib]);
                x[ia] = a * cos - b * sin;
                x[ib] = b * cos + a * sin;
            }
        }
    }
}

/// Causal attention against a cache; see [`AttentionDesc`] for layouts.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], sinks: Option<&[f32]>, d: &AttentionDesc) -> Vec<f32> {
    let group = d.n_heads / d.n_kv_heads;
    let mut out = vec![0f32; d.n_tokens * d.n_heads * d.v_head_dim];
    let first_pos = d.kv_len - d.n_tokens;
    for t in 0..d.n_tokens {
        let pos = first_pos + t;
        let start = d.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..d.n_heads {
            let kvh = h / group;
            let qv = &q[(t * d.n_heads + h) * d.head_dim..][..d.head_dim];
            let scores: Vec<f64> = (start..=pos)
                .map(|j| {
                    let kv = &k[(j * d.n_kv_heads + kvh) * d.head_dim..][..d.head_dim];
                    qv.iter().zip(kv).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * d.scale as f64
                })
                .collect();
            let sink = sinks.map(|s| s[h] as f64);
            let max = scores.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let denom = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
            let o = &mut out[(t * d.n_heads + h) * d.v_head_dim..][..d.v_head_dim];
            for (w, j) in weights.iter().zip(start..=pos) {
                let vv = &v[(j * d.n_kv_heads + kvh) * d.v_head_dim..][..d.v_head_dim];
                for c in 0..d.v_head_dim {
                    o[c] += (w / denom * vv[c] as f64) as f32;
                }
            }
        }
    }
    out
}

/// Element-wise `a = op(a, b)`.
pub fn binary(op: BinaryOp, a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x = op.apply(*x, *y));
}

/// Row-wise softmax in place.
pub fn softmax(x: &mut [f32], rows: usize, cols: usize) {
    for r in 0..rows {
        let row = &mut x[r * cols..(r + 1) * cols];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|v| ((*v - max) as f64).exp()).sum();
        row.iter_mut().for_each(|v| *v = (((*v - max) as f64).exp() / sum) as f32);
    }
}

/// Per row, the `k` largest values, best first; ties go to the lower index.
pub fn top_k(x: &[f32], rows: usize, cols: usize, k: usize) -> TopK {
    let mut out = TopK::default();
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mut idx: Vec<u32> = (0..cols as u32).collect();
        idx.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
        for &i in idx.iter().take(k) {
            out.indices.push(i);
            out.values.push(row[i as usize]);
        }
    }
    out
}

/// `out[i] = src[ids[i]]` for rows of `cols` values.
pub fn gather_rows(src: &[f32], ids: &[u32], cols: usize) -> Vec<f32> {
    ids.iter().flat_map(|&i| src[i as usize * cols..][..cols].iter().copied()).collect()
}

/// `acc[rows[i]] += scales[i] * x[i]`.
pub fn scatter_add_rows(acc: &mut [f32], x: &[f32], rows: &[u32], scales: &[f32], cols: usize) {
    for (i, (&r, &s)) in rows.iter().zip(scales).enumerate() {
        for c in 0..cols {
            acc[r as usize * cols + c] += s * x[i * cols + c];
        }
    }
}
