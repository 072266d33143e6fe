//! Manifold-constrained hyper-connections: each token carries `hc` residual streams; a block
//! reads one mixture of them (`pre`), and its output is spread back over the streams (`post`)
//! while the old streams are mixed through a doubly stochastic matrix (`comb`, Sinkhorn).
//! A few hundred multiply-adds per stream and token: computed on the host in f32.

/// `x · rsqrt(mean(x²) + eps)`, no weight.
pub(super) fn unweighted_rms(x: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().map(|v| v * r).collect()
}

/// RMSNorm with a weight, one row of `w.len()` values at a time (the backends' reference).
pub(super) fn rms_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let desc = ft_backend::RmsNormDesc { rows: x.len() / w.len().max(1), dim: w.len(), eps, unit_offset: false };
    ft_backend::reference::rms_norm(x, w, &desc)
}

/// `y[r] = m[r, ·] · x` for a row-major `[rows, x.len()]` matrix.
fn matvec(m: &[f32], x: &[f32]) -> Vec<f32> {
    m.chunks(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

/// One hyper-connection's weights (`hc_attn_*` or `hc_ffn_*`).
pub struct HyperConnection {
    /// `[(2 + hc)·hc, hc·hidden]`.
    pub fn_w: Vec<f32>,
    /// `[(2 + hc)·hc]`.
    pub base: Vec<f32>,
    /// Scales of the `pre`, `post` and `comb` logits.
    pub scale: [f32; 3],
}

/// What a hyper-connection yields for a batch of tokens.
pub struct Mixing {
    /// `[tokens, hc]` weights of the block output per stream.
    pub post: Vec<f32>,
    /// `[tokens, hc, hc]` doubly stochastic stream mix.
    pub comb: Vec<f32>,
    /// `[tokens, hidden]` the block's input.
    pub collapsed: Vec<f32>,
}

/// Hyper-connection settings shared by every layer.
#[derive(Clone, Copy)]
pub struct HcShape {
    /// Streams.
    pub hc: usize,
    /// Residual width.
    pub hidden: usize,
    /// `rms_norm_eps` of the stream norm.
    pub norm_eps: f32,
    /// `hc_eps`.
    pub eps: f32,
    /// `hc_sinkhorn_iters`.
    pub iters: usize,
}

impl HyperConnection {
    /// The mixing weights and the block input for `x` (`[tokens, hc, hidden]`).
    pub fn mix(&self, x: &[f32], s: HcShape) -> Mixing {
        let (hc, h) = (s.hc, s.hidden);
        let t = x.len() / (hc * h);
        let mut out = Mixing { post: Vec::with_capacity(t * hc), comb: Vec::with_capacity(t * hc * hc), collapsed: vec![0.0; t * h] };
        for tok in 0..t {
            let streams = &x[tok * hc * h..(tok + 1) * hc * h];
            let m = matvec(&self.fn_w, &unweighted_rms(streams, s.norm_eps));
            let pre: Vec<f32> = (0..hc).map(|i| ft_backend::sigmoid(m[i] * self.scale[0] + self.base[i]) + s.eps).collect();
            out.post.extend((0..hc).map(|i| 2.0 * ft_backend::sigmoid(m[hc + i] * self.scale[1] + self.base[hc + i])));
            // Row softmax, then alternate column and row normalisation.
            let mut comb = vec![0f32; hc * hc];
            for r in 0..hc {
                let logits: Vec<f32> = (0..hc).map(|c| m[2 * hc + r * hc + c] * self.scale[2] + self.base[2 * hc + r * hc + c]).collect();
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = logits.iter().map(|v| (v - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                for c in 0..hc {
                    comb[r * hc + c] = e[c] / sum + s.eps;
                }
            }
            normalize_columns(&mut comb, hc, s.eps);
            for _ in 1..s.iters {
                normalize_rows(&mut comb, hc, s.eps);
                normalize_columns(&mut comb, hc, s.eps);
            }
            out.comb.extend(comb);
            let dst = &mut out.collapsed[tok * h..(tok + 1) * h];
            for (n, p) in pre.iter().enumerate() {
                for (d, v) in dst.iter_mut().zip(&streams[n * h..(n + 1) * h]) {
                    *d += p * v;
                }
            }
        }
        out
    }
}

fn normalize_rows(m: &mut [f32], n: usize, eps: f32) {
    for r in 0..n {
        let sum: f32 = m[r * n..(r + 1) * n].iter().sum::<f32>() + eps;
        m[r * n..(r + 1) * n].iter_mut().for_each(|v| *v /= sum);
    }
}

fn normalize_columns(m: &mut [f32], n: usize, eps: f32) {
    for c in 0..n {
        let sum: f32 = (0..n).map(|r| m[r * n + c]).sum::<f32>() + eps;
        (0..n).for_each(|r| m[r * n + c] /= sum);
    }
}

/// The new streams: `x'[k] = post[k] · block + Σ_j comb[j, k] · x[j]`.
pub fn combine(mix: &Mixing, block: &[f32], x: &[f32], hc: usize, h: usize) -> Vec<f32> {
    let t = block.len() / h;
    let mut out = vec![0f32; x.len()];
    for tok in 0..t {
        let xs = &x[tok * hc * h..(tok + 1) * hc * h];
        let b = &block[tok * h..(tok + 1) * h];
        let comb = &mix.comb[tok * hc * hc..(tok + 1) * hc * hc];
        for k in 0..hc {
            let dst = &mut out[(tok * hc + k) * h..(tok * hc + k + 1) * h];
            let p = mix.post[tok * hc + k];
            dst.iter_mut().zip(b).for_each(|(d, v)| *d = p * v);
            for j in 0..hc {
                let c = comb[j * hc + k];
                dst.iter_mut().zip(&xs[j * h..(j + 1) * h]).for_each(|(d, v)| *d += c * v);
            }
        }
    }
    out
}

/// The final collapse of the streams before the last norm (`hc_head_*`).
pub struct HyperHead {
    /// `[hc, hc·hidden]`.
    pub fn_w: Vec<f32>,
    /// `[hc]`.
    pub base: Vec<f32>,
    /// Scale of the logits.
    pub scale: f32,
}

impl HyperHead {
    /// `[tokens, hidden]` from `[tokens, hc, hidden]`.
    pub fn collapse(&self, x: &[f32], s: HcShape) -> Vec<f32> {
        let (hc, h) = (s.hc, s.hidden);
        let t = x.len() / (hc * h);
        let mut out = vec![0f32; t * h];
        for tok in 0..t {
            let streams = &x[tok * hc * h..(tok + 1) * hc * h];
            let m = matvec(&self.fn_w, &unweighted_rms(streams, s.norm_eps));
            for n in 0..hc {
                let pre = ft_backend::sigmoid(m[n] * self.scale + self.base[n]) + s.eps;
                for (d, v) in out[tok * h..(tok + 1) * h].iter_mut().zip(&streams[n * h..(n + 1) * h]) {
                    *d += pre * v;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_makes_comb_doubly_stochastic() {
        let (hc, h) = (4, 3);
        let s = HcShape { hc, hidden: h, norm_eps: 1e-6, eps: 1e-6, iters: 20 };
        let n = (2 + hc) * hc;
        let w = HyperConnection {
            fn_w: (0..n * hc * h).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.1).collect(),
            base: (0..n).map(|i| (i % 3) as f32 * 0.2).collect(),
            scale: [1.0, 0.5, 2.0],
        };
        let x: Vec<f32> = (0..2 * hc * h).map(|i| (i as f32 * 0.7).sin()).collect();
        let m = w.mix(&x, s);
        for tok in 0..2 {
            let c = &m.comb[tok * hc * hc..(tok + 1) * hc * hc];
            for i in 0..hc {
                let row: f32 = c[i * hc..(i + 1) * hc].iter().sum();
                let col: f32 = (0..hc).map(|r| c[r * hc + i]).sum();
                assert!((row - 1.0).abs() < 1e-3 && (col - 1.0).abs() < 1e-5, "row {row} col {col}");
            }
        }
        // Identity-like mixing with zero block output keeps the streams' total.
        let out = combine(&m, &vec![0.0; 2 * h], &x, hc, h);
        for tok in 0..2 {
            for d in 0..h {
                let before: f32 = (0..hc).map(|k| x[(tok * hc + k) * h + d]).sum();
                let after: f32 = (0..hc).map(|k| out[(tok * hc + k) * h + d]).sum();
                assert!((before - after).abs() < 1e-3, "{before} vs {after}");
            }
        }
    }
}
