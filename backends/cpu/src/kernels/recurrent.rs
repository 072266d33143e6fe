//! Kernels of recurrent (linear-attention) layers: the depthwise causal convolution and the
//! gated delta rule of Gated DeltaNet, both continuing from carried per-sequence state.
//!
//! The delta rule runs its exact recurrence token by token for prefill and decode alike, so
//! the two can never disagree; heads are independent and run in parallel. (A chunked WY
//! form trades that simplicity for matmul-shaped work, which pays on GPUs, not here.)

use super::{need, shape_err};
use ft_backend::{sigmoid, softplus, ConvDesc, DeltaRuleDesc, Result};
use rayon::prelude::*;
use rayon::ThreadPool;

/// Below this many multiply-adds the calling thread does the work alone.
const PARALLEL_MIN: usize = 1 << 15;

/// Depthwise causal convolution per [`ConvDesc`]: `x`, `out` `[n_tokens, channels]`,
/// `w[channels, kernel]` (already f32), `state[kernel - 1, channels]`, updated in place.
pub fn causal_conv1d(
    pool: &ThreadPool,
    x: &[f32],
    w: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    d: &ConvDesc,
) -> Result<()> {
    let (n, c, k) = (d.n_tokens, d.channels, d.kernel);
    if k == 0 {
        return Err(shape_err("causal_conv1d with a zero-length filter"));
    }
    let hist = k - 1;
    let len = need(n, c, "conv tokens")?;
    if x.len() < len
        || out.len() < len
        || w.len() < need(c, k, "conv filter")?
        || state.len() < need(hist, c, "conv state")?
    {
        return Err(shape_err(format!(
            "causal_conv1d {n}×{c} kernel {k}: x {}, w {}, state {}, out {}",
            x.len(),
            w.len(),
            state.len(),
            out.len()
        )));
    }
    if len == 0 {
        return Ok(());
    }
    // Tap-major filter, so each tap is one contiguous multiply-add over a whole row.
    let mut taps = vec![0f32; k * c];
    for ch in 0..c {
        for j in 0..k {
            taps[j * c + ch] = w[ch * k + j];
        }
    }
    let state_rows = &state[..hist * c];
    let row = |r: usize| -> &[f32] {
        if r < hist {
            &state_rows[r * c..(r + 1) * c]
        } else {
            &x[(r - hist) * c..(r - hist + 1) * c]
        }
    };
    let one = |t: usize, o: &mut [f32]| {
        o.fill(0.0);
        for j in 0..k {
            let tap = &taps[j * c..(j + 1) * c];
            o.iter_mut()
                .zip(tap.iter().zip(row(t + j)))
                .for_each(|(o, (w, u))| *o += w * u);
        }
        if d.silu {
            o.iter_mut().for_each(|v| *v *= sigmoid(*v));
        }
    };
    let out = &mut out[..len];
    if pool.current_num_threads() > 1 && len * k >= PARALLEL_MIN && n > 1 {
        pool.install(|| {
            out.par_chunks_mut(c)
                .enumerate()
                .for_each(|(t, o)| one(t, o))
        });
    } else {
        out.chunks_mut(c).enumerate().for_each(|(t, o)| one(t, o));
    }
    // The new history is the last `hist` rows of state ++ x.
    let new: Vec<f32> = (n..n + hist).flat_map(|r| row(r).iter().copied()).collect();
    state[..hist * c].copy_from_slice(&new);
    Ok(())
}

/// The gated delta rule per [`DeltaRuleDesc`] on host slices; `state` is updated in place.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    pool: &ThreadPool,
    qkv: &[f32],
    beta_logits: &[f32],
    decay_in: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    d: &DeltaRuleDesc,
) -> Result<()> {
    let (n, hk, hv, dk, dv) = (
        d.n_tokens,
        d.n_k_heads,
        d.n_v_heads,
        d.k_head_dim,
        d.v_head_dim,
    );
    if hk == 0 || hv == 0 || !hv.is_multiple_of(hk) {
        return Err(shape_err(format!(
            "{hv} value heads cannot share {hk} key heads"
        )));
    }
    let row = need(2, need(hk, dk, "key width")?, "qk width")?
        .checked_add(need(hv, dv, "value width")?)
        .ok_or_else(|| shape_err("delta rule row overflows"))?;
    let per_head = need(dk, dv, "state per head")?;
    let gates = need(n, hv, "gates")?;
    if qkv.len() < need(n, row, "qkv")?
        || beta_logits.len() < gates
        || decay_in.len() < gates
        || a_log.len() < hv
        || dt_bias.len() < hv
        || state.len() < need(hv, per_head, "state")?
        || out.len() < need(gates, dv, "out")?
    {
        return Err(shape_err(format!(
            "gated_delta_rule {n} tokens, heads {hk}/{hv}, dims {dk}/{dv}: qkv {}, beta {}, decay {}, state {}, out {}",
            qkv.len(),
            beta_logits.len(),
            decay_in.len(),
            state.len(),
            out.len()
        )));
    }
    if n == 0 || per_head == 0 {
        return Ok(());
    }
    let group = hv / hk;
    // Each value head owns its state and produces `[n, dv]`, scattered into `out` afterwards.
    let head = |h: usize, s: &mut [f32]| -> Vec<f32> {
        let kh = h / group;
        let a = -a_log[h].exp();
        let mut o = vec![0f32; n * dv];
        let (mut q, mut k, mut mem) = (vec![0f32; dk], vec![0f32; dk], vec![0f32; dv]);
        for t in 0..n {
            let r = &qkv[t * row..(t + 1) * row];
            l2_normalise(&r[kh * dk..(kh + 1) * dk], d.l2norm_eps, d.scale, &mut q);
            l2_normalise(
                &r[(hk + kh) * dk..(hk + kh + 1) * dk],
                d.l2norm_eps,
                1.0,
                &mut k,
            );
            let v = &r[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let beta = sigmoid(beta_logits[t * hv + h]);
            let decay = (a * softplus(decay_in[t * hv + h] + dt_bias[h])).exp();
            // Pass 1: decay the state and read what it recalls for k.
            mem.fill(0.0);
            for (srow, ki) in s.chunks_exact_mut(dv).zip(&k) {
                srow.iter_mut().zip(mem.iter_mut()).for_each(|(x, m)| {
                    *x *= decay;
                    *m += ki * *x;
                });
            }
            // δ = β (v − recalled), reusing `mem`.
            mem.iter_mut()
                .zip(v)
                .for_each(|(m, v)| *m = beta * (v - *m));
            // Pass 2: write k ⊗ δ and read the output for q.
            let ot = &mut o[t * dv..(t + 1) * dv];
            for (srow, (ki, qi)) in s.chunks_exact_mut(dv).zip(k.iter().zip(&q)) {
                srow.iter_mut()
                    .zip(mem.iter().zip(ot.iter_mut()))
                    .for_each(|(x, (dl, o))| {
                        *x += ki * dl;
                        *o += qi * *x;
                    });
            }
        }
        o
    };
    let states = &mut state[..hv * per_head];
    let work = n * hv * per_head;
    let per_head_out: Vec<Vec<f32>> =
        if pool.current_num_threads() > 1 && hv > 1 && work >= PARALLEL_MIN {
            pool.install(|| {
                states
                    .par_chunks_mut(per_head)
                    .enumerate()
                    .map(|(h, s)| head(h, s))
                    .collect()
            })
        } else {
            states
                .chunks_mut(per_head)
                .enumerate()
                .map(|(h, s)| head(h, s))
                .collect()
        };
    for (h, o) in per_head_out.iter().enumerate() {
        for t in 0..n {
            out[(t * hv + h) * dv..(t * hv + h + 1) * dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
    Ok(())
}

/// `out = x · scale / √(Σx² + eps)`.
fn l2_normalise(x: &[f32], eps: f32, scale: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let f = scale / (ss + eps).sqrt();
    out.iter_mut().zip(x).for_each(|(o, v)| *o = v * f);
}
