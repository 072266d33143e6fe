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
    // One step (decode) runs the recurrence; several (prefill) run the chunked form.
    let head = |h: usize, s: &mut [f32]| -> Vec<f32> {
        let kh = h / group;
        let a = -a_log[h].exp();
        let step = |t: usize| -> DeltaStep<'_> {
            let r = &qkv[t * row..(t + 1) * row];
            let mut q = vec![0f32; dk];
            let mut k = vec![0f32; dk];
            l2_normalise(&r[kh * dk..(kh + 1) * dk], d.l2norm_eps, d.scale, &mut q);
            l2_normalise(&r[(hk + kh) * dk..(hk + kh + 1) * dk], d.l2norm_eps, 1.0, &mut k);
            DeltaStep {
                q,
                k,
                v: &r[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv],
                beta: sigmoid(beta_logits[t * hv + h]),
                log_decay: a * softplus(decay_in[t * hv + h] + dt_bias[h]),
            }
        };
        if n == 1 {
            recurrent_head(&step(0), s, dv)
        } else {
            let steps: Vec<DeltaStep> = (0..n).map(step).collect();
            chunked_head(&steps, s, dv, DELTA_RULE_CHUNK)
        }
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

/// Tokens per chunk of the chunked (prefill) form of the delta rule.
pub const DELTA_RULE_CHUNK: usize = 64;

/// One token's inputs to the delta rule for one value head.
pub struct DeltaStep<'a> {
    /// L2-normalised, scaled query.
    pub q: Vec<f32>,
    /// L2-normalised key.
    pub k: Vec<f32>,
    /// Value.
    pub v: &'a [f32],
    /// Write strength.
    pub beta: f32,
    /// `ln` of the decay (≤ 0).
    pub log_decay: f32,
}

/// The recurrent form for one token: decay, read, write `k ⊗ δ`, read the output.
pub fn recurrent_head(st: &DeltaStep, s: &mut [f32], dv: usize) -> Vec<f32> {
    let decay = st.log_decay.exp();
    let mut mem = vec![0f32; dv];
    for (srow, ki) in s.chunks_exact_mut(dv).zip(&st.k) {
        srow.iter_mut().zip(mem.iter_mut()).for_each(|(x, m)| {
            *x *= decay;
            *m += ki * *x;
        });
    }
    mem.iter_mut().zip(st.v).for_each(|(m, v)| *m = st.beta * (v - *m));
    let mut o = vec![0f32; dv];
    for (srow, (ki, qi)) in s.chunks_exact_mut(dv).zip(st.k.iter().zip(&st.q)) {
        srow.iter_mut().zip(mem.iter().zip(o.iter_mut())).for_each(|(x, (dl, o))| {
            *x += ki * dl;
            *o += qi * *x;
        });
    }
    o
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The chunked form over many tokens: within a chunk, with `Γ_t` the cumulative log decay
/// from the chunk start and `S₀` the state before it,
///
/// ```text
/// δ_t = β_t (v_t − e^{Γ_t} S₀ᵀk_t) − β_t Σ_{s<t} e^{Γ_t−Γ_s} (k_t·k_s) δ_s   (triangular solve)
/// o_t = e^{Γ_t} S₀ᵀq_t + Σ_{s≤t} e^{Γ_t−Γ_s} (q_t·k_s) δ_s
/// S   = e^{Γ_C} S₀ + Σ_s e^{Γ_C−Γ_s} k_s δ_sᵀ
/// ```
///
/// which is the recurrence unrolled: the state is read and written once per chunk instead of
/// twice per token, and the rest is small dense products (what a GPU kernel tiles).
pub fn chunked_head(steps: &[DeltaStep], s: &mut [f32], dv: usize, chunk: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(steps.len() * dv);
    for block in steps.chunks(chunk.max(1)) {
        let c = block.len();
        let mut gam = Vec::with_capacity(c);
        let mut acc = 0f32;
        for st in block {
            acc += st.log_decay;
            gam.push(acc);
        }
        // S₀ᵀk_t and S₀ᵀq_t for every token of the chunk, in one pass over the state.
        let (mut sk, mut sq) = (vec![0f32; c * dv], vec![0f32; c * dv]);
        for (i, srow) in s.chunks_exact(dv).enumerate() {
            for (t, st) in block.iter().enumerate() {
                let (ki, qi) = (st.k[i], st.q[i]);
                let (skt, sqt) = (&mut sk[t * dv..(t + 1) * dv], &mut sq[t * dv..(t + 1) * dv]);
                for j in 0..dv {
                    skt[j] += srow[j] * ki;
                    sqt[j] += srow[j] * qi;
                }
            }
        }
        let mut delta = vec![0f32; c * dv];
        for t in 0..c {
            let (st, et) = (&block[t], gam[t].exp());
            let (done, rest) = delta.split_at_mut(t * dv);
            let dt = &mut rest[..dv];
            for j in 0..dv {
                dt[j] = st.beta * (st.v[j] - et * sk[t * dv + j]);
            }
            for (si, ds) in done.chunks_exact(dv).enumerate() {
                let w = st.beta * (gam[t] - gam[si]).exp() * dot(&st.k, &block[si].k);
                dt.iter_mut().zip(ds).for_each(|(d, x)| *d -= w * x);
            }
            let mut o: Vec<f32> = sq[t * dv..(t + 1) * dv].iter().map(|x| et * x).collect();
            for si in 0..=t {
                let w = (gam[t] - gam[si]).exp() * dot(&st.q, &block[si].k);
                let ds = &delta[si * dv..(si + 1) * dv];
                o.iter_mut().zip(ds).for_each(|(o, x)| *o += w * x);
            }
            out.extend(o);
        }
        let end = gam[c - 1];
        let decay = end.exp();
        for (i, srow) in s.chunks_exact_mut(dv).enumerate() {
            srow.iter_mut().for_each(|x| *x *= decay);
            for (t, st) in block.iter().enumerate() {
                let w = (end - gam[t]).exp() * st.k[i];
                srow.iter_mut().zip(&delta[t * dv..(t + 1) * dv]).for_each(|(x, d)| *x += w * d);
            }
        }
    }
    out
}

/// `out = x · scale / √(Σx² + eps)`.
fn l2_normalise(x: &[f32], eps: f32, scale: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let f = scale / (ss + eps).sqrt();
    out.iter_mut().zip(x).for_each(|(o, v)| *o = v * f);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked form equals the recurrence for chunk sizes that do and do not divide the
    /// sequence, including chunks of one token.
    #[test]
    fn chunked_form_equals_the_recurrence() {
        let (n, dk, dv) = (130, 16, 12);
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let vs: Vec<Vec<f32>> = (0..n).map(|_| (0..dv).map(|_| rnd()).collect()).collect();
        let steps: Vec<DeltaStep> = (0..n)
            .map(|t| {
                let mut q = vec![0f32; dk];
                let mut k = vec![0f32; dk];
                let (rq, rk): (Vec<f32>, Vec<f32>) = ((0..dk).map(|_| rnd()).collect(), (0..dk).map(|_| rnd()).collect());
                l2_normalise(&rq, 1e-6, 0.25, &mut q);
                l2_normalise(&rk, 1e-6, 1.0, &mut k);
                DeltaStep { q, k, v: &vs[t], beta: sigmoid(3.0 * rnd()), log_decay: -(2.0 * rnd() + 1.0).abs() * 0.3 }
            })
            .collect();
        let s0: Vec<f32> = (0..dk * dv).map(|_| rnd()).collect();
        let mut want_state = s0.clone();
        let want: Vec<f32> = steps.iter().flat_map(|st| recurrent_head(st, &mut want_state, dv)).collect();
        for chunk in [1, 3, 64, 200] {
            let mut state = s0.clone();
            let got = chunked_head(&steps, &mut state, dv, chunk);
            let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let sdiff = state.iter().zip(&want_state).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-4 && sdiff < 1e-4, "chunk {chunk}: outputs differ by {diff}, state by {sdiff}");
        }
    }
}
