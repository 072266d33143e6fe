//! Plain reference implementations of every op, on host `f32` slices.
//!
//! They define the semantics of the trait: written for clarity (f64 accumulation where it
//! costs nothing), never for speed. The conformance suite compares backends against them.

use crate::ops::{sigmoid, softplus, AttentionDesc, BinaryOp, ConvDesc, DeltaRuleDesc, RmsNormDesc, RopeDesc, TopK};

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

/// Depthwise causal convolution from carried state; returns the output and updates `state`.
pub fn causal_conv1d(x: &[f32], w: &[f32], state: &mut [f32], d: &ConvDesc) -> Vec<f32> {
    let (c, k) = (d.channels, d.kernel);
    let hist = k - 1;
    // u = state rows followed by x rows.
    let u = |r: usize, ch: usize| if r < hist { state[r * c + ch] } else { x[(r - hist) * c + ch] };
    let mut out = vec![0f32; d.n_tokens * c];
    for t in 0..d.n_tokens {
        for ch in 0..c {
            let acc: f64 = (0..k).map(|j| w[ch * k + j] as f64 * u(t + j, ch) as f64).sum();
            let y = acc as f32;
            out[t * c + ch] = if d.silu { y * sigmoid(y) } else { y };
        }
    }
    let new: Vec<f32> = (0..hist).flat_map(|r| (0..c).map(move |ch| (r, ch))).map(|(r, ch)| u(d.n_tokens + r, ch)).collect();
    state[..hist * c].copy_from_slice(&new);
    out
}

/// The gated delta rule; returns `[n_tokens, n_v_heads, v_head_dim]` and updates `state`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    qkv: &[f32],
    beta_logits: &[f32],
    decay_in: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    d: &DeltaRuleDesc,
) -> Vec<f32> {
    let (hk, hv, dk, dv) = (d.n_k_heads, d.n_v_heads, d.k_head_dim, d.v_head_dim);
    let row = 2 * hk * dk + hv * dv;
    let group = hv / hk;
    let mut out = vec![0f32; d.n_tokens * hv * dv];
    let l2 = |x: &[f32], scale: f64| -> Vec<f64> {
        let ss: f64 = x.iter().map(|v| *v as f64 * *v as f64).sum();
        let inv = 1.0 / (ss + d.l2norm_eps as f64).sqrt();
        x.iter().map(|v| *v as f64 * inv * scale).collect()
    };
    for t in 0..d.n_tokens {
        let r = &qkv[t * row..(t + 1) * row];
        for h in 0..hv {
            let kh = h / group;
            let q = l2(&r[kh * dk..(kh + 1) * dk], d.scale as f64);
            let k = l2(&r[hk * dk + kh * dk..hk * dk + (kh + 1) * dk], 1.0);
            let v = &r[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let beta = sigmoid(beta_logits[t * hv + h]) as f64;
            let g = -(a_log[h] as f64).exp() * softplus(decay_in[t * hv + h] + dt_bias[h]) as f64;
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            let decay = g.exp();
            let mut mem = vec![0f64; dv];
            for i in 0..dk {
                for j in 0..dv {
                    let x = s[i * dv + j] as f64 * decay;
                    s[i * dv + j] = x as f32;
                    mem[j] += k[i] * x;
                }
            }
            let delta: Vec<f64> = (0..dv).map(|j| (v[j] as f64 - mem[j]) * beta).collect();
            let o = &mut out[(t * hv + h) * dv..(t * hv + h + 1) * dv];
            let mut acc = vec![0f64; dv];
            for i in 0..dk {
                for j in 0..dv {
                    let x = s[i * dv + j] as f64 + k[i] * delta[j];
                    s[i * dv + j] = x as f32;
                    acc[j] += q[i] * x;
                }
            }
            o.iter_mut().zip(acc).for_each(|(o, a)| *o = a as f32);
        }
    }
    out
}
